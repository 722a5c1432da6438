// trainmem/backend/cuda/cudnn_attention.cuh — attention on Tensor Cores through cuDNN's fused SDPA.
//
// cuDNN's scaled-dot-product attention (the FlashAttention-2 algorithm: an online softmax
// over key tiles on Tensor Cores with FP32 accumulation, no [T, T] tensor) is the route
// PyTorch and XLA take on Hopper. It is reached through the header-only cuDNN frontend,
// found by CMake (TRAINMEM_HAS_CUDNN_FRONTEND), and libcudnn is opened when the program
// runs (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING): a build needs headers only, and a machine
// without cuDNN runs the own kernels (kernels/attention.cuh) with the reason recorded.
//
// One fused call per direction, as the op expects: the forward writes O and each row's
// log-sum-exp (cuDNN's "Stats", [n, 1, tq, 1] f32, the accumulator layout the op saves);
// the backward needs O as well, which the op does not keep (it saves q, k, v and the
// log-sum-exp, as on the CPU), so the backward first re-runs the forward into scratch —
// about a third of the backward's work, paid to keep the op's saved bytes the same on
// every backend. The backward runs cuDNN's deterministic algorithm (no atomics), so a
// step gives the same bits on every run, as the own kernels do; the forward is
// deterministic too, which a checkpoint recompute needs.
//
// A graph is built once per (dtype, sizes, direction) and kept; a shape cuDNN does not
// support is remembered as refused and runs the own kernel. F32, F64, a head dimension
// cuDNN refuses, or TRAINMEM_CUDNN=off take the own kernel. Which path ran is counted
// (AttentionPaths), and the refusal or load failure is kept as text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/core/attention_sizes.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/error.hpp"

#if defined(TRAINMEM_HAS_CUDNN_FRONTEND)
#ifndef NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#endif
#ifndef CUDNN_FRONTEND_SKIP_JSON_LIB
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#endif
#include <dlfcn.h>

#include <cudnn_frontend.h>

namespace cudnn_frontend {
// The frontend declares the handle of the dlopen-ed library and leaves its definition to
// the program; an inline variable gives every translation unit the same one.
inline void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend
#endif

namespace trainmem::cuda {

/// \brief How many attention calls took each path, and why cuDNN did not run when it did not.
struct AttentionPaths {
  std::uint64_t cudnn_forward = 0, cudnn_backward = 0;    // cuDNN's fused SDPA (Tensor Cores)
  std::uint64_t kernel_forward = 0, kernel_backward = 0;  // kernels/attention.cuh (CUDA cores)
  std::string cudnn_status;                               // "cuDNN 9.x.y loaded", or why it is not used
};

#if defined(TRAINMEM_HAS_CUDNN_FRONTEND)

/// \brief cuDNN's fused attention for one device: the library, a handle, and a graph per shape.
class CudnnAttention {
 public:
  CudnnAttention() = default;
  ~CudnnAttention() {
    if (handle_ != nullptr) cudnn_frontend::detail::destroy_handle(handle_);
  }
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  /// Runs the forward through cuDNN; false (nothing written) when cuDNN cannot take it.
  bool forward(const kernels::KernelContext& ctx, DType dtype, const void* q, const void* k, const void* v, void* out,
               float* lse, const AttentionSizes& s, AttentionPaths& paths) {
    if (!aligned({q, k, v, out, lse})) return false;
    Graph* g = graph(ctx, dtype, s, Direction::Forward, paths);
    if (g == nullptr) return false;
    std::unordered_map<std::int64_t, void*> pack{
        {kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)}, {kO, out}, {kStats, lse}};
    execute(ctx, *g, pack, "forward");
    ++paths.cudnn_forward;
    return true;
  }

  /// Runs the backward through cuDNN (the forward again for O, then the fused backward).
  bool backward(const kernels::KernelContext& ctx, DType dtype, const void* q, const void* k, const void* v,
                const void* dout, void* dq, void* dk, void* dv, const AttentionSizes& s, AttentionPaths& paths) {
    if (!aligned({q, k, v, dout, dq, dk, dv})) return false;
    Graph* fwd = graph(ctx, dtype, s, Direction::Forward, paths);
    Graph* bwd = fwd == nullptr ? nullptr : graph(ctx, dtype, s, Direction::Backward, paths);
    if (bwd == nullptr) return false;
    const std::size_t out_bytes = static_cast<std::size_t>(s.n * s.tq * s.d) * size_of(dtype);
    kernels::ScratchBuffer out(ctx, out_bytes);
    kernels::ScratchBuffer stats(ctx, static_cast<std::size_t>(s.n * s.tq) * sizeof(float));
    std::unordered_map<std::int64_t, void*> fwd_pack{{kQ, const_cast<void*>(q)},
                                                     {kK, const_cast<void*>(k)},
                                                     {kV, const_cast<void*>(v)},
                                                     {kO, out.as<void>()},
                                                     {kStats, stats.as<void>()}};
    execute(ctx, *fwd, fwd_pack, "forward (for the backward's O)");
    std::unordered_map<std::int64_t, void*> pack{{kQ, const_cast<void*>(q)},
                                                 {kK, const_cast<void*>(k)},
                                                 {kV, const_cast<void*>(v)},
                                                 {kO, out.as<void>()},
                                                 {kStats, stats.as<void>()},
                                                 {kDO, const_cast<void*>(dout)},
                                                 {kDQ, dq},
                                                 {kDK, dk},
                                                 {kDV, dv}};
    execute(ctx, *bwd, pack, "backward");
    ++paths.cudnn_backward;
    return true;
  }

 private:
  using Graph = cudnn_frontend::graph::Graph;
  enum class Direction : int { Forward, Backward };
  // Tensor ids in the variant packs.
  static constexpr std::int64_t kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kDO = 6, kDQ = 7, kDK = 8, kDV = 9;
  using Key = std::tuple<int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, double, bool>;

  /// cuDNN reads and writes 16-byte vectors; a view off that boundary takes the own kernel.
  static bool aligned(std::initializer_list<const void*> pointers) {
    for (const void* p : pointers)
      if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
    return true;
  }

  /// The built graph for this call, or nullptr when cuDNN is off, missing or refuses the shape.
  Graph* graph(const kernels::KernelContext& ctx, DType dtype, const AttentionSizes& s, Direction direction,
               AttentionPaths& paths) {
    if (dtype != DType::F16 && dtype != DType::BF16) return nullptr;
    if (!loaded(paths)) return nullptr;
    const Key key{static_cast<int>(dtype), static_cast<int>(direction), s.n, s.tq, s.tk, s.d, s.scale, s.causal};
    auto found = graphs_.find(key);
    if (found == graphs_.end()) found = graphs_.emplace(key, build(dtype, s, direction, paths)).first;
    if (found->second == nullptr) return nullptr;
    cudnn_frontend::detail::set_stream(handle_, ctx.stream);
    return found->second.get();
  }

  /// TRAINMEM_CUDNN=off (or 0) turns the cuDNN path off; anything but on/auto/1/off/0 is an Error.
  static bool wanted() {
    const char* value = std::getenv("TRAINMEM_CUDNN");
    if (value == nullptr) return true;
    const std::string_view v(value);
    if (v == "off" || v == "0") return false;
    if (v == "on" || v == "auto" || v == "1" || v.empty()) return true;
    throw Error(std::string("TRAINMEM_CUDNN must be on, auto or off, got '") + value + "'");
  }

  /// Opens libcudnn once (TRAINMEM_CUDNN_LIBRARY names another file) and creates the handle.
  bool loaded(AttentionPaths& paths) {
    if (tried_) return handle_ != nullptr;
    tried_ = true;
    if (!wanted()) {
      paths.cudnn_status = "cuDNN off (TRAINMEM_CUDNN=off)";
      return false;
    }
    const char* name = std::getenv("TRAINMEM_CUDNN_LIBRARY");
    if (name == nullptr || *name == '\0') name = "libcudnn.so.9";
    if (cudnn_frontend::cudnn_dlhandle == nullptr)
      cudnn_frontend::cudnn_dlhandle = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
    if (cudnn_frontend::cudnn_dlhandle == nullptr) {
      const char* why = dlerror();
      paths.cudnn_status = std::string("cuDNN not loaded: ") + (why != nullptr ? why : name) +
                           " (set LD_LIBRARY_PATH or TRAINMEM_CUDNN_LIBRARY)";
      return false;
    }
    try {
      const std::size_t version = cudnn_frontend::detail::get_backend_version();
      if (cudnn_frontend::detail::create_handle(&handle_) != CUDNN_STATUS_SUCCESS) {
        handle_ = nullptr;
        paths.cudnn_status = "cuDNN loaded, but cudnnCreate failed";
        return false;
      }
      paths.cudnn_status = "cuDNN " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) +
                           "." + std::to_string(version % 100) + " loaded";
    } catch (const std::exception& e) {
      handle_ = nullptr;
      paths.cudnn_status = std::string("cuDNN not usable: ") + e.what();
    }
    return handle_ != nullptr;
  }

  /// Builds the graph of one direction; nullptr (and the reason in paths) when cuDNN refuses.
  std::unique_ptr<Graph> build(DType dtype, const AttentionSizes& s, Direction direction, AttentionPaths& paths) {
    namespace fe = cudnn_frontend;
    auto g = std::make_unique<Graph>();
    g->set_io_data_type(dtype == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    // Each slice is one "batch" of one head: [n, 1, t, d], rows of d contiguous.
    auto tensor = [&](const char* name, std::int64_t uid, std::int64_t t, std::int64_t d) {
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim({s.n, 1, t, d})
                           .set_stride({t * d, t * d, d, 1}));
    };
    auto q = tensor("q", kQ, s.tq, s.d), k = tensor("k", kK, s.tk, s.d), v = tensor("v", kV, s.tk, s.d);
    const float scale = static_cast<float>(s.scale);
    // The op's causal mask: query i sees keys up to tk - tq + i, the bottom-right diagonal.
    if (direction == Direction::Forward) {
      auto options = fe::graph::SDPA_attributes().set_name("trainmem_attention").set_generate_stats(true);
      options.set_attn_scale(scale);
      if (s.causal) options.set_causal_mask_bottom_right(true);
      auto [o, stats] = g->sdpa(q, k, v, options);
      o->set_output(true).set_uid(kO).set_dim({s.n, 1, s.tq, s.d}).set_stride({s.tq * s.d, s.tq * s.d, s.d, 1});
      stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
      stats->set_dim({s.n, 1, s.tq, 1}).set_stride({s.tq, s.tq, 1, 1});
    } else {
      auto o = tensor("o", kO, s.tq, s.d), dout = tensor("dout", kDO, s.tq, s.d);
      auto stats = g->tensor(fe::graph::Tensor_attributes()
                                 .set_name("stats")
                                 .set_uid(kStats)
                                 .set_dim({s.n, 1, s.tq, 1})
                                 .set_stride({s.tq, s.tq, 1, 1})
                                 .set_data_type(fe::DataType_t::FLOAT));
      auto options = fe::graph::SDPA_backward_attributes().set_name("trainmem_attention_backward");
      options.set_attn_scale(scale).set_deterministic_algorithm(true);
      if (s.causal) options.set_causal_mask_bottom_right(true);
      auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, options);
      dq->set_output(true).set_uid(kDQ).set_dim({s.n, 1, s.tq, s.d}).set_stride({s.tq * s.d, s.tq * s.d, s.d, 1});
      dk->set_output(true).set_uid(kDK).set_dim({s.n, 1, s.tk, s.d}).set_stride({s.tk * s.d, s.tk * s.d, s.d, 1});
      dv->set_output(true).set_uid(kDV).set_dim({s.n, 1, s.tk, s.d}).set_stride({s.tk * s.d, s.tk * s.d, s.d, 1});
    }
    auto status = g->build(handle_, {fe::HeurMode_t::A});
    if (!status.is_good()) {
      paths.cudnn_status += std::string("; refused ") + (direction == Direction::Forward ? "forward" : "backward") +
                            " n=" + std::to_string(s.n) + " tq=" + std::to_string(s.tq) +
                            " tk=" + std::to_string(s.tk) + " d=" + std::to_string(s.d) + ": " + status.get_message();
      return nullptr;
    }
    return g;
  }

  /// Executes a built graph on the context's stream with a tracked workspace; a failure here
  /// (after the graph was built for this shape) is an Error, not a silent fallback.
  void execute(const kernels::KernelContext& ctx, Graph& g, std::unordered_map<std::int64_t, void*>& pack,
               const char* what) {
    std::int64_t workspace_bytes = 0;
    check(g.get_workspace_size(workspace_bytes), what);
    kernels::ScratchBuffer workspace(ctx, static_cast<std::size_t>(workspace_bytes > 0 ? workspace_bytes : 1));
    check(g.execute(handle_, pack, workspace.as<void>()), what);
  }
  static void check(cudnn_frontend::error_t status, const char* what) {
    if (!status.is_good()) throw Error(std::string("cuDNN attention ") + what + " failed: " + status.get_message());
  }

  bool tried_ = false;
  cudnnHandle_t handle_ = nullptr;
  std::map<Key, std::unique_ptr<Graph>> graphs_;
};

#else

/// \brief Without the cuDNN frontend at build time: every call takes the own kernels.
class CudnnAttention {
 public:
  bool forward(const kernels::KernelContext&, DType, const void*, const void*, const void*, void*, float*,
               const AttentionSizes&, AttentionPaths& paths) {
    note(paths);
    return false;
  }
  bool backward(const kernels::KernelContext&, DType, const void*, const void*, const void*, const void*, void*, void*,
                void*, const AttentionSizes&, AttentionPaths& paths) {
    note(paths);
    return false;
  }

 private:
  static void note(AttentionPaths& paths) {
    if (paths.cudnn_status.empty()) paths.cudnn_status = "cuDNN frontend not found when this program was built";
  }
};

#endif

}  // namespace trainmem::cuda
