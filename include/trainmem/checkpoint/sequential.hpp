// trainmem/checkpoint/sequential.hpp — checkpointing a chain of layers in segments.
//
// Splitting N layers into k segments and checkpointing each keeps k segment inputs
// during forward and, during backward, the activations of one segment at a time:
// about (k + N/k) layers' worth, smallest at k = sqrt(N) (Chen et al., 2016). As in
// torch.utils.checkpoint.checkpoint_sequential, the last segment is not checkpointed:
// its activations are needed first in backward, so recomputing them would be waste.
#pragma once

#include <cmath>
#include <functional>
#include <vector>

#include "trainmem/checkpoint/region.hpp"

namespace trainmem {

template <class B>
using Layer = std::function<Var<B>(const Var<B>&)>;

/// The default segment count for n layers: round(sqrt(n)), at least 1.
inline std::int64_t sqrt_segments(std::int64_t n) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::llround(std::sqrt(static_cast<double>(n)))));
}

/// Runs layers in order on x, in `segments` contiguous segments (sizes differ by at most
/// one); every segment but the last is a checkpoint region with `options`.
template <class B>
Var<B> checkpoint_sequential(Tape<B>& tape, const std::vector<Layer<B>>& layers, std::int64_t segments, const Var<B>& x,
                             const CheckpointOptions& options = {}) {
  const auto n = static_cast<std::int64_t>(layers.size());
  detail::check(n > 0, "checkpoint_sequential: no layers");
  detail::check(segments >= 1 && segments <= n, "checkpoint_sequential: segments must be in [1, ", n, "], got ",
                segments);
  Var<B> h = x;
  std::int64_t begin = 0;
  for (std::int64_t s = 0; s < segments; ++s) {
    const std::int64_t end = begin + n / segments + (s < n % segments ? 1 : 0);
    // The region replays its segment in backward, after `layers` may be gone (a temporary
    // list): it owns copies of its layers.
    auto run = [segment = std::vector<Layer<B>>(layers.begin() + begin, layers.begin() + end)](const Var<B>& input) {
      Var<B> y = input;
      for (const Layer<B>& layer : segment) y = layer(y);
      return y;
    };
    h = s + 1 < segments ? checkpoint(tape, options, run, h) : run(h);
    begin = end;
  }
  return h;
}

/// checkpoint_sequential with sqrt(N) segments.
template <class B>
Var<B> checkpoint_sequential(Tape<B>& tape, const std::vector<Layer<B>>& layers, const Var<B>& x,
                             const CheckpointOptions& options = {}) {
  return checkpoint_sequential(tape, layers, sqrt_segments(static_cast<std::int64_t>(layers.size())), x, options);
}

}  // namespace trainmem
