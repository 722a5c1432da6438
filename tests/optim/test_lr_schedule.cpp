// tests/optim/test_lr_schedule.cpp — learning-rate schedules against their closed forms.
#include <catch2/catch.hpp>
#include <cmath>

#include "error_matchers.hpp"
#include "trainmem/trainmem.hpp"

using trainmem::optim::LrSchedule;
using trainmem::testing::ErrorContains;

TEST_CASE("LrSchedule: constant, warm-up and cosine follow their closed forms", "[optim][lr]") {
  const auto constant = LrSchedule::constant(0.1);
  CHECK(constant.lr(0) == 0.1);
  CHECK(constant.lr(1'000'000) == 0.1);

  const auto warmup = LrSchedule::linear_warmup(1.0, 4);
  CHECK(warmup.lr(0) == 0.25);  // the first step already moves
  CHECK(warmup.lr(3) == 1.0);   // the last warm-up step reaches the peak
  CHECK(warmup.lr(10) == 1.0);

  const double pi = 3.14159265358979323846;
  const auto cosine = LrSchedule::warmup_cosine(2.0, 10, 110, 0.2);
  CHECK(cosine.lr(4) == Approx(2.0 * 5 / 10));
  CHECK(cosine.lr(10) == Approx(2.0));
  for (int step : {10, 35, 60, 85, 109}) {
    const double progress = (step - 10) / 100.0;
    CHECK(cosine.lr(step) == Approx(0.2 + 1.8 * 0.5 * (1 + std::cos(pi * progress))).epsilon(1e-12));
  }
  CHECK(cosine.lr(60) == Approx(1.1));  // halfway: the mean of peak and floor
  CHECK(cosine.lr(110) == 0.2);
  CHECK(cosine.lr(5000) == 0.2);
  for (int step = 11; step < 110; ++step) CHECK(cosine.lr(step) < cosine.lr(step - 1));
}

TEST_CASE("LrSchedule: bad settings are errors naming the setting", "[optim][lr]") {
  CHECK_THROWS_MATCHES(LrSchedule::warmup_cosine(1.0, 10, 10), trainmem::Error, ErrorContains("total_steps"));
  CHECK_THROWS_MATCHES(LrSchedule::constant(-1.0), trainmem::Error, ErrorContains("rate"));
  CHECK_THROWS_MATCHES(LrSchedule::constant(NAN), trainmem::Error, ErrorContains("finite"));
  CHECK_THROWS_MATCHES(LrSchedule::linear_warmup(1.0, -1), trainmem::Error, ErrorContains("warmup_steps"));
  CHECK_THROWS_MATCHES(LrSchedule::warmup_cosine(1.0, 0, 10, 2.0), trainmem::Error, ErrorContains("min_lr"));
  CHECK_THROWS_MATCHES(LrSchedule::constant(1.0).lr(-1), trainmem::Error, ErrorContains("step"));
}
