// tests/core/test_memory_stats.cpp — peak windows: the most bytes live since a mark.
//
// Every figure is a byte count written out by hand from the allocations the test makes
// (MemoryStats directly, then a backend's tensors, whose bytes are numel * dtype size).
#include <catch2/catch.hpp>

#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;

TEST_CASE("PeakWindow: peaks since it opened, per category and in total", "[core][memory]") {
  MemoryStats m;
  m.on_allocate(MemCategory::Parameter, 1000);
  m.on_allocate(MemCategory::Temporary, 500);
  m.on_free(MemCategory::Temporary, 500);  // an earlier high point of 1500 the window must not see
  {
    const PeakWindow window(m);
    CHECK(window.peaks().total == 1000);  // starts at what is live
    CHECK(window.peaks()[MemCategory::Parameter] == 1000);
    CHECK(window.peaks()[MemCategory::Temporary] == 0);
    m.on_allocate(MemCategory::Temporary, 300);
    m.on_retag(MemCategory::Temporary, MemCategory::SavedActivation, 300);
    m.on_allocate(MemCategory::Gradient, 200);
    m.on_free(MemCategory::SavedActivation, 300);
    const PeakBytes p = window.peaks();
    CHECK(p[MemCategory::Parameter] == 1000);
    CHECK(p[MemCategory::Temporary] == 300);
    CHECK(p[MemCategory::SavedActivation] == 300);
    CHECK(p[MemCategory::Gradient] == 200);
    CHECK(p[MemCategory::Workspace] == 0);
    CHECK(p.total == 1500);  // parameter 1000 + saved 300 + gradient 200
    CHECK(m.live_total() == 1200);
  }
  // Closing the window gives the stats' own window back, with the larger of both peaks.
  CHECK(m.peak(MemCategory::Temporary) == 500);
  CHECK(m.peak(MemCategory::Gradient) == 200);
  CHECK(m.peak_total() == 1500);
}

TEST_CASE("MemoryStats: the device count is every category but HostOffload", "[core][memory]") {
  MemoryStats m;
  m.on_allocate(MemCategory::Parameter, 100);
  m.on_allocate(MemCategory::Temporary, 400);
  m.on_retag(MemCategory::Temporary, MemCategory::SavedActivation, 400);
  m.reset_peak();
  // An offload: the host copy appears, then the device copy is freed.
  m.on_allocate(MemCategory::HostOffload, 400);
  m.on_free(MemCategory::SavedActivation, 400);
  CHECK(m.live_total() == 500);
  CHECK(m.live_device() == 100);
  CHECK(m.peak_total() == 900);   // both copies at once
  CHECK(m.peak_device() == 500);  // the device held the activation until its copy was made
  {
    const PeakWindow window(m);
    m.on_allocate(MemCategory::SavedActivation, 400);  // the fetch back
    m.on_free(MemCategory::HostOffload, 400);
    CHECK(window.peaks().device == 500);
    CHECK(window.peaks().total == 900);
  }
  CHECK(m.peak_device() == 500);
  CHECK(m.live_device() == m.live_total());
}

TEST_CASE("PeakWindow: windows nest, the outer one sees the inner one's high point", "[core][memory]") {
  MemoryStats m;
  m.on_allocate(MemCategory::Parameter, 100);
  const PeakWindow outer(m);
  m.on_allocate(MemCategory::Temporary, 40);
  m.on_free(MemCategory::Temporary, 40);  // outer: 140
  {
    const PeakWindow inner(m);
    CHECK(inner.peaks().total == 100);
    m.on_allocate(MemCategory::Workspace, 70);
    m.on_free(MemCategory::Workspace, 70);  // inner and outer: 170
    m.on_allocate(MemCategory::Temporary, 10);
    CHECK(inner.peaks().total == 170);
    CHECK(inner.peaks()[MemCategory::Temporary] == 10);
    CHECK(inner.peaks()[MemCategory::Workspace] == 70);
  }
  const PeakBytes p = outer.peaks();
  CHECK(p.total == 170);
  CHECK(p[MemCategory::Temporary] == 40);  // before the inner window, not forgotten by it
  CHECK(p[MemCategory::Workspace] == 70);  // inside it
  CHECK(p[MemCategory::Parameter] == 100);
}

TEST_CASE("PeakWindow: a backend's tensors, one window per step, merged over steps", "[core][memory]") {
  B backend;
  const Tensor<B> weight = Tensor<B>::zeros(Shape{8, 4}, DType::F32, MemCategory::Parameter, backend);  // 128 B
  PeakBytes over_steps;
  constexpr std::int64_t first_total = 128 + 16 * 8 * 4 + 16 * 4 * 2, second_total = 128 + 2 * 8 * 4 + 2 * 4 * 2;
  const PeakBytes first_expected{{128, 16 * 4 * 2, 0, 0, 0, 16 * 8 * 4, 0, 0}, first_total, first_total};
  const PeakBytes second_expected{{128, 2 * 4 * 2, 0, 0, 0, 2 * 8 * 4, 0, 0}, second_total, second_total};
  for (std::int64_t rows : {16, 2}) {
    const PeakWindow window(backend.memory());
    {
      const Tensor<B> activations = Tensor<B>::empty(Shape{rows, 8}, DType::F32, MemCategory::Temporary, backend);
      const Tensor<B> grad = Tensor<B>::empty(Shape{rows, 4}, DType::BF16, MemCategory::Gradient, backend);
    }
    const PeakBytes p = window.peaks();
    CHECK(p == (rows == 16 ? first_expected : second_expected));
    over_steps.merge(p);
  }
  CHECK(over_steps == first_expected);  // the larger step's, category by category
  CHECK(backend.memory().live_total() == 128);
  CHECK(weight.bytes() == 128);
}
