// trainmem/autocast/fp8_autocast.hpp — the FP8 guard, layered on 16-bit autocast.
//
//   amp::Fp8Scaling<B> fp8(model.parameters(), amp::DelayedScaling{.history_length = 16});
//   {
//     amp::Fp8Autocast guard(fp8);      // bf16 autocast, plus FP8 GEMMs for linear
//     loss = cross_entropy(model(x), y);
//   }
//   scaler.scale(loss).backward();      // the backward GEMMs take E5M2 gradients
//   fp8.update(scaler.step(optimizer)); // after the skip decision (amp::TrainStep does this)
//
// Under the guard, linear's GEMMs (forward, and the dx and dW GEMMs of its backward)
// run on FP8 operands with per-tensor scales and f32 accumulation, producing the 16-bit
// autocast dtype; every other op runs as under Autocast(dtype). matmul and bmm of two
// activations (attention's scores and values) stay 16-bit: both operands would need
// just-in-time scales, and their GEMMs are a small part of a transformer's.
//
// The thread's Fp8Context is what an op entry reads: which Fp8Scaling, which generation
// of scales, and whether quantizations record amax. A checkpoint region captures it with
// the rest of its replay state and its recompute runs under the captured scales with
// recording off (NOTE [FP8 scales are replay state]).
#pragma once

#include <memory>

#include "trainmem/autocast/autocast.hpp"
#include "trainmem/autocast/fp8_scaling.hpp"

namespace trainmem::amp {

/// \brief What the op entry needs to run FP8: the state, the scales, whether to record amax.
template <class B>
struct Fp8Context {
  Fp8Scaling<B>* scaling = nullptr;            // null: FP8 is off
  std::shared_ptr<const Fp8Scales<B>> scales;  // the generation this scope quantizes with
  bool record_amax = true;                     // false while a region recomputes

  bool active() const { return scaling != nullptr; }
};

}  // namespace trainmem::amp

namespace trainmem::detail {
/// The calling thread's FP8 context for backend B.
template <class B>
amp::Fp8Context<B>& thread_fp8_context() {
  thread_local amp::Fp8Context<B> context;
  return context;
}
}  // namespace trainmem::detail

namespace trainmem::amp {

/// The calling thread's FP8 context.
template <class B>
const Fp8Context<B>& fp8_context() {
  return detail::thread_fp8_context<B>();
}

/// \brief RAII: FP8 GEMMs under `scaling`'s current scales, on top of Autocast(dtype).
///
/// dtype (bf16 by default, or f16 with a GradScaler) is what the FP8 GEMMs produce and
/// every other op computes in. Nestable; `Autocast::disabled()` inside turns both off.
template <class B>
class Fp8Autocast {
 public:
  explicit Fp8Autocast(Fp8Scaling<B>& scaling, DType dtype = DType::BF16)
      : previous_(detail::thread_fp8_context<B>()), autocast_(dtype) {
    detail::thread_fp8_context<B>() = Fp8Context<B>{&scaling, scaling.scales(), true};
  }
  /// Installs an exact captured context (checkpoint recompute), leaving autocast as it is.
  explicit Fp8Autocast(const Fp8Context<B>& context)
      : previous_(detail::thread_fp8_context<B>()), autocast_(autocast_state()) {
    detail::thread_fp8_context<B>() = context;
  }
  ~Fp8Autocast() { detail::thread_fp8_context<B>() = previous_; }
  Fp8Autocast(const Fp8Autocast&) = delete;
  Fp8Autocast& operator=(const Fp8Autocast&) = delete;

 private:
  Fp8Context<B> previous_;
  Autocast autocast_;
};

}  // namespace trainmem::amp
