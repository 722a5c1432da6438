// tests/reliability/test_soak.cpp — 1,000 training steps hold their memory.
//
// Checkpointing, 16-bit weights with FP32 masters and the loss scaler, step after
// step: after every step the live bytes must equal those after the first (no tensor
// is kept from one step to the next), each step's peak must equal the second step's
// (the first also allocates the optimizer states), and the allocator's block cache
// must not grow (no size is requested that was not requested before).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>

#include <trainmem/trainmem.hpp>

#include "tiny_training.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;

TEST_CASE("soak: 1000 steps with checkpointing, bf16 and the scaler keep live, peak and cached bytes flat",
          "[reliability][soak]") {
  constexpr int kSteps = 1000;
  B be;
  tmem::testing::TinyTraining<B> run(be, tmem::DType::BF16);
  auto& stats = be.memory();
  std::int64_t live_after_first = 0, peak_of_second = 0;
  std::size_t cached_after_second = 0;
  int stepped = 0, live_mismatches = 0, peak_mismatches = 0, cache_growths = 0;
  for (int step = 0; step < kSteps; ++step) {
    stats.reset_peak();
    stepped += run.step() ? 1 : 0;
    const std::int64_t live = stats.live_total(), peak = stats.peak_total();
    const std::size_t cached = be.allocator().cached_bytes();
    if (step == 0) live_after_first = live;
    if (step == 1) {
      peak_of_second = peak;
      cached_after_second = cached;
    }
    if (live != live_after_first) ++live_mismatches;
    if (step >= 1 && peak != peak_of_second) ++peak_mismatches;
    if (step >= 1 && cached != cached_after_second) ++cache_growths;
  }
  CHECK(live_mismatches == 0);
  CHECK(peak_mismatches == 0);
  CHECK(cache_growths == 0);
  CHECK(stepped >= kSteps * 3 / 4);  // the scale doubles every 7 clean steps, so some overflow and are skipped
  CHECK(std::isfinite(run.master_values(0)[0]));
  WARN("soak: " << kSteps << " steps (" << stepped << " stepped), live " << live_after_first << " bytes after each, "
                << "peak " << peak_of_second << " bytes each step, cached " << cached_after_second << " bytes");
}
