// trainmem/core/attention_sizes.hpp — the shape of one fused attention call, as every backend reads it.
//
// n independent slices (batch * heads), each queries [tq, d] against keys and values
// [tk, d], scores scaled by `scale`. Under the causal mask the queries are the last tq
// positions of the tk keys, so query i sees keys 0 .. tk - tq + i (tq == tk: 0 .. i).
#pragma once

#include <cstdint>

#include "trainmem/config.hpp"

namespace trainmem {

/// \brief Sizes and settings of scaled-dot-product attention over n slices.
struct AttentionSizes {
  std::int64_t n = 0, tq = 0, tk = 0, d = 0;
  double scale = 1.0;
  bool causal = false;

  /// How many keys (from the first) query row i sees.
  TRAINMEM_HOST_DEVICE std::int64_t visible(std::int64_t i) const {
    if (!causal) return tk;
    const std::int64_t last = tk - tq + i + 1;
    return last < tk ? last : tk;
  }
};

}  // namespace trainmem
