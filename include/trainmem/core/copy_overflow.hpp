// trainmem/core/copy_overflow.hpp — a 16-bit model copy that an update made inf.
//
// NOTE [Model copies that overflow]
// With FP32 master weights, each optimizer update writes the 16-bit model copy from the
// new master in the same pass. f16's largest finite value is 65504 (from 65520 up, the
// nearest-even f16 is inf); bf16's is 3.39e38, just under f32's. A finite master beyond
// that becomes inf in the copy: every forward through it overflows, a loss scaler then
// skips every step while it shrinks its scale to the minimum, and training stalls without
// a word. MasterWeights refuses such values when it takes the model (amp/narrowing.hpp);
// this is the same check for the values updates make.
//
// The update pass counts the elements whose master is finite and whose copy is inf. Undoing
// the step is not on offer: the pass is fused (master, moments and copy in one sweep) and on
// a GPU runs with no host wait, so by the time the count is known the step is done. So the
// step is taken in full and the overflow is an error, CopyOverflowError, naming the
// parameter, the count and the limit: on the CPU at the end of that step (after every
// parameter's update), on a GPU at the next host wait (a download or synchronize), as
// other checks made on the device are raised (NOTE [Checks without a host wait] in
// backend/cuda/index_checks.cuh), with no wait of its own. The masters stay finite and
// right, so a caller that catches the error may lower the learning rate or rescale, then
// rewrite the copies (MasterWeights::copy_to_model) and go on.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "trainmem/core/dtype.hpp"
#include "trainmem/error.hpp"

namespace trainmem::detail {

/// The message of a CopyOverflowError: `count` says how many elements (a number, or a
/// number and what it counts), `copy` is the model copy's dtype.
inline std::string copy_overflow_message(std::string_view name, std::string_view count, DType copy) {
  const bool f16 = copy == DType::F16;
  return concat("optimizer step: '", name.empty() ? std::string_view("(unnamed)") : name, "': ", count, " of its ",
                copy, " copy overflowed to inf (the f32 master holds values beyond ", copy, "'s largest finite one, ",
                f16 ? "65504" : "3.39e38",
                "); the step was taken and the master is finite, but every forward through the copy overflows: ",
                f16 ? "lower the learning rate, scale the weights down, or use bf16 model copies"
                    : "lower the learning rate or scale the weights down");
}

}  // namespace trainmem::detail
