// trainmem/checkpoint/detail/replay_state.hpp — everything a region's recompute depends on.
//
// Captured once at region entry, in O(1): the tape's random stream as a (seed,
// offset) pair (dropout redraws the same masks), the thread's autocast state (ops
// recompute in the dtypes the forward chose), the cast-cache generation (so a
// recompute can tell whether the 16-bit weight copies it reuses are the ones the
// forward used), and the FP8 context: the generation of scales the forward quantized
// with, which the recompute quantizes with again, recording no amax (NOTE [FP8 scales
// are replay state]). `Scope` installs a captured state for the duration of a recompute.
#pragma once

#include <cstdint>

#include "trainmem/autocast/autocast.hpp"
#include "trainmem/autocast/cast_cache.hpp"
#include "trainmem/autocast/fp8_autocast.hpp"
#include "trainmem/autograd/tape.hpp"

namespace trainmem {

template <class B>
struct ReplayState {
  RngState rng;
  amp::AutocastState autocast;
  std::uint64_t cast_cache_generation = 0;
  amp::Fp8Context<B> fp8;

  static ReplayState capture(Tape<B>& tape) {
    return {tape.rng().state(), amp::autocast_state(), amp::CastCache<B>::instance().generation(),
            amp::fp8_context<B>()};
  }

  /// \brief RAII: runs a scope under this state, with grad mode on (ops save, and so fill
  /// slots, only while recording) and FP8 amax recording off; restores RNG, autocast, the
  /// FP8 context and grad mode after.
  class Scope {
   public:
    Scope(Tape<B>& tape, const ReplayState& state)
        : tape_(tape),
          saved_rng_(tape.rng().state()),
          autocast_(state.autocast),
          fp8_(replayed(state.fp8)),
          grad_on_(true) {
      tape.rng().set_state(state.rng);
    }
    ~Scope() { tape_.rng().set_state(saved_rng_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    static amp::Fp8Context<B> replayed(amp::Fp8Context<B> forward) {
      forward.record_amax = false;  // a recompute replays the forward's observations, it makes none
      return forward;
    }

    Tape<B>& tape_;
    RngState saved_rng_;
    amp::Autocast autocast_;
    amp::Fp8Autocast<B> fp8_;
    GradModeGuard grad_on_;
  };
};

}  // namespace trainmem
