// tests/support/checkpoint_schedule.hpp — how a test runs a chain of layers on a tape.
//
// The one idea: a checkpoint test runs one chain under several schedules and compares
// the results bit for bit with the plain run. A Schedule takes the tape, the layers and
// the input; run_plain is the reference (no region), each_block puts every layer in its
// own checkpoint region with the given options.
#pragma once

#include <functional>
#include <vector>

#include "trainmem/trainmem.hpp"

namespace trainmem::testing {

using Schedule = std::function<Var<cpu::Backend>(Tape<cpu::Backend>&, const std::vector<Layer<cpu::Backend>>&,
                                                 const Var<cpu::Backend>&)>;

/// The layers one after another, no region: what every checkpointed schedule must reproduce.
inline Var<cpu::Backend> run_plain(Tape<cpu::Backend>&, const std::vector<Layer<cpu::Backend>>& layers,
                                   const Var<cpu::Backend>& x) {
  Var<cpu::Backend> h = x;
  for (const auto& layer : layers) h = layer(h);
  return h;
}

/// Each layer in its own checkpoint region under `options`.
inline Schedule each_block(CheckpointOptions options = {}) {
  return
      [options](Tape<cpu::Backend>& tape, const std::vector<Layer<cpu::Backend>>& layers, const Var<cpu::Backend>& x) {
        Var<cpu::Backend> h = x;
        for (const auto& layer : layers) h = checkpoint(tape, options, layer, h);
        return h;
      };
}

}  // namespace trainmem::testing
