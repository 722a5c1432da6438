// trainmem/backend/cpu/onednn_gemm.hpp — GEMM through oneDNN's matmul primitive.
//
// oneDNN multiplies 16-bit operands directly with FP32 accumulation (AMX tiles where the
// CPU has them), so this path needs no widening workspace: C = alpha op(A) op(B)
// (+ beta C) (+ bias) is one primitive, the bias added to the FP32 accumulator before
// the one rounding of C to its storage dtype. A transposed operand is the same matrix
// with swapped strides, a batch is a third dimension, and a batch stride of 0 is
// oneDNN's broadcast (a batch dimension of 1).
//
// Creating a primitive costs far more than a small GEMM (JIT code generation), so
// primitives are cached by everything that shapes them (dtypes, sizes, transposes,
// strides, alpha, beta, bias); a shape oneDNN cannot do (no kernel for the dtype on this
// CPU) is cached as such, and the caller takes another path. Scratchpads come from the
// tracked allocator as workspace for the duration of one call, like the widening path's.
//
// Without TRAINMEM_WITH_ONEDNN (CMake defines it when oneDNN was found) this header
// declares only `kHaveOneDnn = false` and stubs that say no.
#pragma once

#include <cstdint>

#include "trainmem/backend/cpu/allocator.hpp"
#include "trainmem/backend/cpu/gemm_epilogue.hpp"
#include "trainmem/backend/cpu/workspace.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/gemm_args.hpp"

#if defined(TRAINMEM_WITH_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>

#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#endif

namespace trainmem::cpu::detail {

#if defined(TRAINMEM_WITH_ONEDNN)

inline constexpr bool kHaveOneDnn = true;

/// \brief Whether oneDNN on this CPU multiplies 16-bit operands in hardware matrix units.
///
/// AMX (oneDNN's avx512_core_amx and later): BF16 5-7x F32 measured. AVX512-BF16 alone
/// gives oneDNN's BF16 only ~0.6x its F32, slower than widening, so it does not count.
/// The effective ISA honours ONEDNN_MAX_CPU_ISA, which masks AMX off for a measurement.
inline bool onednn_has_amx() {
  static const bool amx = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto need = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_amx);
    return (isa & need) == need;
  }();
  return amx;
}

inline const char* onednn_isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx2: return "avx2";
    default: return "other";
  }
}

template <class T>
constexpr dnnl::memory::data_type onednn_type() {
  if constexpr (std::is_same_v<T, float>) return dnnl::memory::data_type::f32;
  else if constexpr (std::is_same_v<T, BFloat16>) return dnnl::memory::data_type::bf16;
  else if constexpr (std::is_same_v<T, Half>) return dnnl::memory::data_type::f16;
  else return dnnl::memory::data_type::undef;
}

/// Everything a matmul primitive is specialised for.
struct OneDnnKey {
  dnnl::memory::data_type ab, c;
  bool bias, gelu;  // the epilogue (an F32 bias row)
  GemmArgs args;
  bool operator==(const OneDnnKey& o) const {
    const GemmArgs &x = args, &y = o.args;
    return ab == o.ab && c == o.c && bias == o.bias && gelu == o.gelu && x.batch == y.batch && x.m == y.m && x.n == y.n &&
           x.k == y.k && x.trans_a == y.trans_a && x.trans_b == y.trans_b && x.stride_a == y.stride_a &&
           x.stride_b == y.stride_b && x.stride_c == y.stride_c && x.alpha == y.alpha && x.beta == y.beta;
  }
};

struct OneDnnKeyHash {
  std::size_t operator()(const OneDnnKey& key) const {
    std::size_t h = 1469598103934665603ull;
    auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    const GemmArgs& g = key.args;
    mix(static_cast<std::uint64_t>(key.ab) | static_cast<std::uint64_t>(key.c) << 8 |
        std::uint64_t{key.bias} << 16 | std::uint64_t{key.gelu} << 17 | std::uint64_t{g.trans_a} << 18 |
        std::uint64_t{g.trans_b} << 19);
    for (const std::int64_t v : {g.batch, g.m, g.n, g.k, g.stride_a, g.stride_b, g.stride_c})
      mix(static_cast<std::uint64_t>(v));
    std::uint64_t bits;
    std::memcpy(&bits, &g.alpha, sizeof bits);
    mix(bits);
    std::memcpy(&bits, &g.beta, sizeof bits);
    mix(bits);
    return h;
  }
};

/// A matmul primitive with the descriptor it was made from (memory descs, scratchpad size).
struct OneDnnMatmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
  dnnl::memory::desc bias;  // the bias row, and the execute argument it binds to
  int bias_arg;
};

/// \brief The engine, its stream and the primitive cache (one per process).
class OneDnnMatmuls {
 public:
  static OneDnnMatmuls& instance() {
    static OneDnnMatmuls matmuls;
    return matmuls;
  }

  /// The cached primitive for key, or null when oneDNN has no kernel for it.
  const OneDnnMatmul* find(const OneDnnKey& key) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      if (cache_.size() >= kMaxEntries) cache_.clear();  // a shape-churning caller; keep memory bounded
      it = cache_.emplace(key, create(key)).first;
    }
    return it->second.get();
  }

  dnnl::engine& engine() { return engine_; }
  dnnl::stream& stream() { return stream_; }

 private:
  static constexpr std::size_t kMaxEntries = 4096;

  OneDnnMatmuls() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  /// op(X) of a batch as rows x cols with X stored [rows, cols] (or [cols, rows] when trans).
  static dnnl::memory::desc operand(std::int64_t batch, std::int64_t stride, std::int64_t rows, std::int64_t cols,
                                    bool trans, dnnl::memory::data_type type) {
    const std::int64_t row_stride = trans ? 1 : cols, col_stride = trans ? rows : 1;
    if (batch == 1) return dnnl::memory::desc({rows, cols}, type, {row_stride, col_stride});
    if (stride == 0) return dnnl::memory::desc({1, rows, cols}, type, {rows * cols, row_stride, col_stride});
    return dnnl::memory::desc({batch, rows, cols}, type, {stride, row_stride, col_stride});
  }

  std::unique_ptr<OneDnnMatmul> create(const OneDnnKey& key) const {
    const GemmArgs& g = key.args;
    using dt = dnnl::memory::data_type;
    try {
      const auto a = operand(g.batch, g.stride_a, g.m, g.k, g.trans_a, key.ab);
      const auto b = operand(g.batch, g.stride_b, g.k, g.n, g.trans_b, key.ab);
      const auto c = operand(g.batch, g.stride_c, g.m, g.n, false, key.c);
      // oneDNN scales its own bias with alpha (dst = alpha (A B + bias)), so with alpha != 1
      // the bias is a binary post-op after the scaling instead.
      const bool has_bias = key.bias, bias_post_op = has_bias && g.alpha != 1.0;
      const auto bias = !has_bias      ? dnnl::memory::desc()
                        : g.batch == 1 ? dnnl::memory::desc({1, g.n}, dt::f32, {g.n, 1})
                                       : dnnl::memory::desc({1, 1, g.n}, dt::f32, {g.n, g.n, 1});
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (g.alpha != 1.0) attr.set_output_scales(0, {static_cast<float>(g.alpha)});
      dnnl::post_ops ops;
      if (g.beta != 0.0) ops.append_sum(static_cast<float>(g.beta));
      if (bias_post_op) ops.append_binary(dnnl::algorithm::binary_add, bias);
    if (key.gelu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
      attr.set_post_ops(ops);
      dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(a, b, has_bias && !bias_post_op ? bias : dnnl::memory::desc(), c), attr, engine_);
      dnnl::matmul primitive(pd);
      const int bias_arg = !has_bias      ? 0
                           : bias_post_op ? DNNL_ARG_ATTR_MULTIPLE_POST_OP(g.beta != 0.0 ? 1 : 0) | DNNL_ARG_SRC_1
                                          : DNNL_ARG_BIAS;
      return std::make_unique<OneDnnMatmul>(OneDnnMatmul{std::move(pd), std::move(primitive), bias, bias_arg});
    } catch (const dnnl::error&) {
      return nullptr;  // no kernel for these dtypes, strides or attributes on this CPU
    }
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::mutex mutex_;
  std::unordered_map<OneDnnKey, std::unique_ptr<OneDnnMatmul>, OneDnnKeyHash> cache_;
};

/// The primitive for C = act(alpha op(A) op(B) + beta C + bias) in these storage types, or null.
template <class TA, class TC>
const OneDnnMatmul* onednn_matmul(const GemmArgs& g, const Epilogue<float>& epilogue) {
  if constexpr (onednn_type<TA>() == dnnl::memory::data_type::undef ||
                onednn_type<TC>() == dnnl::memory::data_type::undef) {
    return nullptr;
  } else {
    if (g.k <= 0) return nullptr;  // C = beta C (+ bias): oneDNN wants a non-empty reduction
    const OneDnnKey key{onednn_type<TA>(), onednn_type<TC>(), epilogue.bias != nullptr, epilogue.gelu, g};
    return OneDnnMatmuls::instance().find(key);
  }
}

/// Whether oneDNN has a kernel for this GEMM (dtypes, strides) on this CPU.
template <class TA, class TC>
bool onednn_can_gemm(const GemmArgs& g, const Epilogue<AccumulatorOf<TA>>& epilogue = {}) {
  if constexpr (std::is_same_v<AccumulatorOf<TA>, float>) return onednn_matmul<TA, TC>(g, epilogue) != nullptr;
  else return false;
}

/// Runs the GEMM through oneDNN; returns false (and does nothing) where it has no kernel.
template <class TA, class TC>
bool onednn_gemm(const GemmArgs& g, const TA* a, const TA* b, TC* c, const Epilogue<AccumulatorOf<TA>>& epilogue,
                 Allocator& allocator) {
  if constexpr (!std::is_same_v<AccumulatorOf<TA>, float>) {
    return false;
  } else {
    const OneDnnMatmul* matmul = onednn_matmul<TA, TC>(g, epilogue);
    if (!matmul) return false;
    auto& matmuls = OneDnnMatmuls::instance();
    const dnnl::matmul::primitive_desc& pd = matmul->pd;
    auto memory = [&](const dnnl::memory::desc& desc, const void* data) {
      return dnnl::memory(desc, matmuls.engine(), const_cast<void*>(data));
    };
    const dnnl::memory::desc scratch_desc = pd.scratchpad_desc();
    const Workspace<unsigned char> scratch(allocator, scratch_desc.get_size());
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, memory(pd.src_desc(), a)},
                                               {DNNL_ARG_WEIGHTS, memory(pd.weights_desc(), b)},
                                               {DNNL_ARG_DST, memory(pd.dst_desc(), c)},
                                               {DNNL_ARG_SCRATCHPAD, memory(scratch_desc, scratch.get())}};
    if (epilogue.bias) args.emplace(matmul->bias_arg, memory(matmul->bias, epilogue.bias));
    matmul->primitive.execute(matmuls.stream(), args);
    matmuls.stream().wait();
    return true;
  }
}

#else  // no oneDNN

inline constexpr bool kHaveOneDnn = false;
inline bool onednn_has_amx() { return false; }
inline const char* onednn_isa_name() { return "none"; }
template <class TA, class TC>
bool onednn_can_gemm(const GemmArgs&, const Epilogue<AccumulatorOf<TA>>& = {}) {
  return false;
}
template <class TA, class TC>
bool onednn_gemm(const GemmArgs&, const TA*, const TA*, TC*, const Epilogue<AccumulatorOf<TA>>&, Allocator&) {
  return false;
}

#endif

}  // namespace trainmem::cpu::detail
