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
#include <string>

#include "trainmem/backend/cpu/allocator.hpp"
#include "trainmem/backend/cpu/gemm_epilogue.hpp"
#include "trainmem/backend/cpu/workspace.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/gemm_args.hpp"

#if defined(TRAINMEM_WITH_ONEDNN)
#include <oneapi/dnnl/dnnl.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#endif

namespace trainmem::cpu::kernels {

/// Whether this process runs on an AMD CPU (the vendor decides one GEMM rule).
inline bool cpu_is_amd() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();  // safe to repeat; needed when called before static constructors ran
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

#if defined(TRAINMEM_WITH_ONEDNN)

// NOTE [oneDNN's C API]
// This header talks to oneDNN through its C API (dnnl.h), not the C++ one (dnnl.hpp):
// every translation unit that includes trainmem, nvcc's included, must see the same CPU
// backend, and nvcc 13's front end stops with an internal error on dnnl.hpp in C++20.
// The C handles are owned by the small RAII types below.

inline constexpr bool kHaveOneDnn = true;

template <class Handle, dnnl_status_t (*destroy)(Handle)>
struct OneDnnHandle {
  Handle handle = nullptr;
  OneDnnHandle() = default;
  OneDnnHandle(const OneDnnHandle&) = delete;
  OneDnnHandle& operator=(const OneDnnHandle&) = delete;
  OneDnnHandle(OneDnnHandle&& other) noexcept : handle(other.handle) { other.handle = nullptr; }
  ~OneDnnHandle() {
    if (handle) destroy(handle);
  }
};
using OneDnnPrimitiveDesc = OneDnnHandle<dnnl_primitive_desc_t, dnnl_primitive_desc_destroy>;
using OneDnnPrimitive = OneDnnHandle<dnnl_primitive_t, dnnl_primitive_destroy>;
using OneDnnAttr = OneDnnHandle<dnnl_primitive_attr_t, dnnl_primitive_attr_destroy>;
using OneDnnPostOps = OneDnnHandle<dnnl_post_ops_t, dnnl_post_ops_destroy>;
using OneDnnMemory = OneDnnHandle<dnnl_memory_t, dnnl_memory_destroy>;
using OneDnnEngine = OneDnnHandle<dnnl_engine_t, dnnl_engine_destroy>;
using OneDnnStream = OneDnnHandle<dnnl_stream_t, dnnl_stream_destroy>;

inline void onednn_check(dnnl_status_t status, const char* call) {
  if (status != dnnl_success) throw Error(detail::concat("oneDNN: ", call, " failed with status ", status));
}

/// Whether oneDNN's effective ISA on this CPU includes `need` (ONEDNN_MAX_CPU_ISA honoured).
inline bool onednn_isa_has(dnnl_cpu_isa_t need) {
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  return (isa & static_cast<unsigned>(need)) == static_cast<unsigned>(need);
}

/// \brief Whether oneDNN on this CPU multiplies 16-bit operands in AMX tiles.
inline bool onednn_has_amx() {
  static const bool amx = onednn_isa_has(dnnl_cpu_isa_avx512_core_amx);
  return amx;
}

/// \brief Whether oneDNN's BF16 kernels beat widening the operands for Eigen on this CPU.
///
/// With AMX: BF16 5-7x oneDNN's F32 (Xeon, 2 threads). With AVX512-BF16 but no AMX the
/// answer is the core's: an AMD Zen 4 issues VDPBF16PS at the F32 FMA rate, twice the
/// products per instruction, and oneDNN's BF16 measured 1.9-2.0x its F32 (2.7x widening)
/// at 512^3-1024^3 on 2 threads; on an Intel core without AMX it measured ~0.63x F32,
/// slower than widening. Hence AMX, or AVX512-BF16 on an AMD CPU (NOTE [CPU GEMM path]).
inline bool onednn_bf16_wins() {
  static const bool wins = onednn_has_amx() || (onednn_isa_has(dnnl_cpu_isa_avx512_core_bf16) && cpu_is_amd());
  return wins;
}

/// \brief The smallest m, n and k that send an F32 GEMM to oneDNN on this CPU.
///
/// On an AMD Zen 4 core (AVX-512) oneDNN's F32 matmul measured 1.24-1.51x Eigen's at
/// every shape from 64^3 to 4096x512x128 on 2 threads, the step shapes of the MLP chain
/// and the transformer included, so there it takes every product with m, n, k >= 64. On
/// an Intel core without AMX (a Xeon, family 6 model 207) it was measured
/// faster only at 512 and above (1.1-1.3x by best reps). On an Intel Xeon with AMX (family
/// 6 model 167, 2026-12-05) its F32 kernel (brg:avx512_core) measured 1.09-1.94x Eigen's at
/// every shape from 64^3 to 1024^3, the MLP chain's and the transformer's included, so
/// there too it takes every product from 64 up.
inline std::int64_t onednn_f32_min_dim() {
  static const std::int64_t min_dim =
      onednn_isa_has(dnnl_cpu_isa_avx512_core) && (cpu_is_amd() || onednn_has_amx()) ? 64 : 512;
  return min_dim;
}

inline const char* onednn_isa_name() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    default: return "other";
  }
}

template <class T>
constexpr dnnl_data_type_t onednn_type() {
  if constexpr (std::is_same_v<T, float>) return dnnl_f32;
  else if constexpr (std::is_same_v<T, BFloat16>) return dnnl_bf16;
  else if constexpr (std::is_same_v<T, Half>) return dnnl_f16;
  else return dnnl_data_type_undef;
}

/// Everything a matmul primitive is specialised for.
struct OneDnnKey {
  dnnl_data_type_t ab, c;
  bool bias, gelu;  // the epilogue (an F32 bias row)
  GemmArgs args;
  bool operator==(const OneDnnKey& o) const {
    const GemmArgs &x = args, &y = o.args;
    return ab == o.ab && c == o.c && bias == o.bias && gelu == o.gelu && x.batch == y.batch && x.m == y.m &&
           x.n == y.n && x.k == y.k && x.trans_a == y.trans_a && x.trans_b == y.trans_b && x.stride_a == y.stride_a &&
           x.stride_b == y.stride_b && x.stride_c == y.stride_c && x.alpha == y.alpha && x.beta == y.beta;
  }
};

struct OneDnnKeyHash {
  std::size_t operator()(const OneDnnKey& key) const {
    std::size_t h = 1469598103934665603ull;
    auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    const GemmArgs& g = key.args;
    mix(static_cast<std::uint64_t>(key.ab) | static_cast<std::uint64_t>(key.c) << 8 | std::uint64_t{key.bias} << 16 |
        std::uint64_t{key.gelu} << 17 | std::uint64_t{g.trans_a} << 18 | std::uint64_t{g.trans_b} << 19);
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

/// A matmul primitive with the descriptors its execution binds (operands, bias, scratchpad).
struct OneDnnMatmul {
  OneDnnPrimitiveDesc pd;
  OneDnnPrimitive primitive;
  dnnl_memory_desc_t a{}, b{}, c{}, scratchpad{}, bias{};
  int bias_arg = 0;
  std::string kernel;  // oneDNN's name for the implementation, e.g. "brg:avx512_core_bf16"
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

  dnnl_engine_t engine() { return engine_.handle; }
  dnnl_stream_t stream() { return stream_.handle; }

 private:
  static constexpr std::size_t kMaxEntries = 4096;

  OneDnnMatmuls() {
    onednn_check(dnnl_engine_create(&engine_.handle, dnnl_cpu, 0), "dnnl_engine_create");
    onednn_check(dnnl_stream_create(&stream_.handle, engine_.handle, dnnl_stream_default_flags), "dnnl_stream_create");
  }

  /// A memory descriptor of `ndims` dims with the given strides (dense where oneDNN wants).
  static bool describe(dnnl_memory_desc_t& md, std::initializer_list<std::int64_t> dims,
                       std::initializer_list<std::int64_t> strides, dnnl_data_type_t type) {
    dnnl_dims_t d{}, s{};
    int i = 0;
    for (const std::int64_t v : dims) d[i++] = v;
    i = 0;
    for (const std::int64_t v : strides) s[i++] = v;
    return dnnl_memory_desc_init_by_strides(&md, static_cast<int>(dims.size()), d, type, s) == dnnl_success;
  }

  /// op(X) of a batch as rows x cols with X stored [rows, cols] (or [cols, rows] when trans).
  static bool operand(dnnl_memory_desc_t& md, std::int64_t batch, std::int64_t stride, std::int64_t rows,
                      std::int64_t cols, bool trans, dnnl_data_type_t type) {
    const std::int64_t row_stride = trans ? 1 : cols, col_stride = trans ? rows : 1;
    if (batch == 1) return describe(md, {rows, cols}, {row_stride, col_stride}, type);
    if (stride == 0) return describe(md, {1, rows, cols}, {rows * cols, row_stride, col_stride}, type);
    return describe(md, {batch, rows, cols}, {stride, row_stride, col_stride}, type);
  }

  /// oneDNN's name for the implementation it chose ("" if it will not say).
  static std::string kernel_name(dnnl_primitive_desc_t pd) {
    const char* impl = nullptr;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || impl == nullptr) return {};
    return impl;
  }
  /// Whether that is the reference (plain C++) implementation: 10-100x slower than either
  /// path here, so it does not count as a kernel.
  static bool reference_kernel(std::string_view name) {
    return name.empty() || name.substr(0, 3) == "ref" || name.find(":ref") != std::string_view::npos;
  }

  /// The primitive for key, or null where oneDNN has no kernel (dtypes, strides, attributes).
  std::unique_ptr<OneDnnMatmul> create(const OneDnnKey& key) const {
    const GemmArgs& g = key.args;
    auto matmul = std::make_unique<OneDnnMatmul>();
    if (!operand(matmul->a, g.batch, g.stride_a, g.m, g.k, g.trans_a, key.ab) ||
        !operand(matmul->b, g.batch, g.stride_b, g.k, g.n, g.trans_b, key.ab) ||
        !operand(matmul->c, g.batch, g.stride_c, g.m, g.n, false, key.c))
      return nullptr;
    // oneDNN scales its own bias with alpha (dst = alpha (A B + bias)), so with alpha != 1
    // the bias is a binary post-op after the scaling instead.
    const bool has_bias = key.bias, bias_post_op = has_bias && g.alpha != 1.0;
    if (has_bias && !(g.batch == 1 ? describe(matmul->bias, {1, g.n}, {g.n, 1}, dnnl_f32)
                                   : describe(matmul->bias, {1, 1, g.n}, {g.n, g.n, 1}, dnnl_f32)))
      return nullptr;
    OneDnnAttr attr;
    OneDnnPostOps ops;
    if (dnnl_primitive_attr_create(&attr.handle) != dnnl_success || dnnl_post_ops_create(&ops.handle) != dnnl_success)
      return nullptr;
    bool ok = dnnl_primitive_attr_set_scratchpad_mode(attr.handle, dnnl_scratchpad_mode_user) == dnnl_success;
    const float alpha = static_cast<float>(g.alpha);
    if (g.alpha != 1.0) ok = ok && dnnl_primitive_attr_set_output_scales(attr.handle, 1, 0, &alpha) == dnnl_success;
    if (g.beta != 0.0) ok = ok && dnnl_post_ops_append_sum(ops.handle, static_cast<float>(g.beta)) == dnnl_success;
    if (bias_post_op)
      ok = ok && dnnl_post_ops_append_binary(ops.handle, dnnl_binary_add, &matmul->bias) == dnnl_success;
    if (key.gelu)
      ok = ok && dnnl_post_ops_append_eltwise(ops.handle, 1.0f, dnnl_eltwise_gelu_tanh, 0.0f, 0.0f) == dnnl_success;
    ok = ok && dnnl_primitive_attr_set_post_ops(attr.handle, ops.handle) == dnnl_success;
    dnnl_matmul_desc_t desc;
    ok = ok && dnnl_matmul_desc_init(&desc, &matmul->a, &matmul->b, has_bias && !bias_post_op ? &matmul->bias : nullptr,
                                     &matmul->c) == dnnl_success;
    ok = ok &&
         dnnl_primitive_desc_create(&matmul->pd.handle, &desc, attr.handle, engine_.handle, nullptr) == dnnl_success;
    if (ok) matmul->kernel = kernel_name(matmul->pd.handle);
    ok = ok && !reference_kernel(matmul->kernel);
    ok = ok && dnnl_primitive_create(&matmul->primitive.handle, matmul->pd.handle) == dnnl_success;
    if (!ok) return nullptr;  // no kernel for these dtypes, strides or attributes on this CPU
    matmul->scratchpad = *dnnl_primitive_desc_query_md(matmul->pd.handle, dnnl_query_scratchpad_md, 0);
    matmul->bias_arg = !has_bias      ? 0
                       : bias_post_op ? DNNL_ARG_ATTR_MULTIPLE_POST_OP(g.beta != 0.0 ? 1 : 0) | DNNL_ARG_SRC_1
                                      : DNNL_ARG_BIAS;
    return matmul;
  }

  OneDnnEngine engine_;
  OneDnnStream stream_;
  std::mutex mutex_;
  std::unordered_map<OneDnnKey, std::unique_ptr<OneDnnMatmul>, OneDnnKeyHash> cache_;
};

/// The primitive for C = act(alpha op(A) op(B) + beta C + bias) in these storage types, or null.
template <class TA, class TC>
const OneDnnMatmul* onednn_matmul(const GemmArgs& g, const Epilogue<float>& epilogue) {
  if constexpr (onednn_type<TA>() == dnnl_data_type_undef || onednn_type<TC>() == dnnl_data_type_undef) {
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

/// oneDNN's name for the kernel this GEMM would run ("" where it has none).
template <class TA, class TC>
std::string onednn_kernel_name(const GemmArgs& g, const Epilogue<AccumulatorOf<TA>>& epilogue = {}) {
  if constexpr (std::is_same_v<AccumulatorOf<TA>, float>) {
    const OneDnnMatmul* matmul = onednn_matmul<TA, TC>(g, epilogue);
    return matmul ? matmul->kernel : std::string();
  } else {
    return {};
  }
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
    const Workspace<unsigned char> scratch(allocator, dnnl_memory_desc_get_size(&matmul->scratchpad));
    OneDnnMemory memories[5];
    dnnl_exec_arg_t args[5];
    int count = 0;
    auto bind = [&](int arg, const dnnl_memory_desc_t& desc, const void* data) {
      onednn_check(dnnl_memory_create(&memories[count].handle, &desc, matmuls.engine(), const_cast<void*>(data)),
                   "dnnl_memory_create");
      args[count] = dnnl_exec_arg_t{arg, memories[count].handle};
      ++count;
    };
    bind(DNNL_ARG_SRC, matmul->a, a);
    bind(DNNL_ARG_WEIGHTS, matmul->b, b);
    bind(DNNL_ARG_DST, matmul->c, c);
    bind(DNNL_ARG_SCRATCHPAD, matmul->scratchpad, scratch.get());
    if (epilogue.bias) bind(matmul->bias_arg, matmul->bias, epilogue.bias);
    onednn_check(dnnl_primitive_execute(matmul->primitive.handle, matmuls.stream(), count, args),
                 "dnnl_primitive_execute");
    onednn_check(dnnl_stream_wait(matmuls.stream()), "dnnl_stream_wait");
    return true;
  }
}

#else  // no oneDNN

inline constexpr bool kHaveOneDnn = false;
inline bool onednn_has_amx() { return false; }
inline bool onednn_bf16_wins() { return false; }
inline std::int64_t onednn_f32_min_dim() { return 512; }
inline const char* onednn_isa_name() { return "none"; }
template <class TA, class TC>
std::string onednn_kernel_name(const GemmArgs&, const Epilogue<AccumulatorOf<TA>>& = {}) {
  return {};
}
template <class TA, class TC>
bool onednn_can_gemm(const GemmArgs&, const Epilogue<AccumulatorOf<TA>>& = {}) {
  return false;
}
template <class TA, class TC>
bool onednn_gemm(const GemmArgs&, const TA*, const TA*, TC*, const Epilogue<AccumulatorOf<TA>>&, Allocator&) {
  return false;
}

#endif

}  // namespace trainmem::cpu::kernels
