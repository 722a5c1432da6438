// tests/core/test_tensor_memory.cpp — tensor views and host transfer, MemoryStats accounting.
//
// The closed-form test is the one the memory claims rest on: a Linear + ReLU forward
// must keep exactly the bytes its backward needs (x for dW, the ReLU output for its
// mask), counted by a fresh backend's MemoryStats, and backward must give them back.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "error_matchers.hpp"
#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;
using testing::ErrorContains;

TEST_CASE("Tensor: reshape is a view of the same storage", "[core][tensor]") {
  B be;
  const auto values = testing::random_values(12, 1);
  const T t = T::from_host(Shape{2, 6}, values, DType::F32, MemCategory::Temporary, be);
  const T r = t.reshape(Shape{3, 4});
  CHECK(r.shape() == Shape{3, 4});
  CHECK(r.same_storage(t));
  CHECK(r.data() == t.data());
  CHECK(r.to_host<double>() == t.to_host<double>());
  CHECK(be.memory().live(MemCategory::Temporary) == 12 * 4);  // no copy was made
  // A write through the view is seen by the original and bumps the shared version.
  const auto before = t.version();
  r.zero_();
  CHECK(t.version() == before + 1);
  CHECK(t.to_host<double>() == std::vector<double>(12, 0.0));

  CHECK_THROWS_MATCHES(t.reshape(Shape{5}), Error,
                       ErrorContains("cannot view [2, 6] (12 elements) as [5] (5 elements)"));
  CHECK_THROWS_AS(T().reshape(Shape{1}), Error);
}

TEST_CASE("Tensor: slice of the leading dimension is an offset view", "[core][tensor]") {
  B be;
  std::vector<double> values(12);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i);
  for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    INFO("dtype " << dtype);
    const T t = T::from_host(Shape{4, 3}, values, dtype, MemCategory::Temporary, be);
    const T s = t.slice(1, 3);
    CHECK(s.shape() == Shape{2, 3});
    CHECK(s.same_storage(t));
    CHECK(static_cast<const std::byte*>(s.data()) - static_cast<const std::byte*>(t.data()) ==
          static_cast<std::ptrdiff_t>(3 * size_of(dtype)));
    CHECK(s.to_host<double>() == std::vector<double>{3, 4, 5, 6, 7, 8});
    CHECK(t.slice(4, 4).numel() == 0);
    // Writing the slice changes rows 1..2 of the parent only.
    s.copy_from(T::from_host(Shape{2, 3}, std::vector<double>(6, -1.0), dtype, MemCategory::Temporary, be));
    CHECK(t.to_host<double>() == std::vector<double>{0, 1, 2, -1, -1, -1, -1, -1, -1, 9, 10, 11});
    CHECK(t.version() == 1);
    // A slice of a reshaped view addresses the same bytes.
    CHECK(t.reshape(Shape{2, 6}).slice(1, 2).to_host<double>() == std::vector<double>{-1, -1, -1, 9, 10, 11});
  }
  const T t = T::zeros(Shape{4, 3}, DType::F32, MemCategory::Temporary, be);
  CHECK_THROWS_MATCHES(t.slice(2, 5), Error, ErrorContains("range [2, 5) is outside the leading dimension of [4, 3]"));
  CHECK_THROWS_MATCHES(t.slice(3, 1), Error, ErrorContains("slice: range [3, 1)"));
  CHECK_THROWS_AS(t.slice(-1, 2), Error);
  CHECK_THROWS_AS(T::zeros(Shape{}, DType::F32, MemCategory::Temporary, be).slice(0, 1), Error);
}

TEST_CASE("Tensor: from_host / to_host round trip per dtype", "[core][tensor]") {
  B be;
  const auto values = testing::random_values(37, 5, -300.0, 300.0);
  SECTION("f64 is exact") {
    const T t = T::from_host(Shape{37}, values, DType::F64, MemCategory::Temporary, be);
    CHECK(t.bytes() == 37 * 8);
    CHECK(t.to_host<double>() == values);
  }
  SECTION("f32, f16, bf16 round each value to nearest even once") {
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
      INFO("dtype " << dtype);
      std::vector<float> floats(values.begin(), values.end());  // float sources: no double rounding involved
      const T t = T::from_host(Shape{37}, floats, dtype, MemCategory::Temporary, be);
      CHECK(t.bytes() == 37 * size_of(dtype));
      const auto back = t.to_host<float>();
      int wrong = 0;
      for (std::size_t i = 0; i < floats.size(); ++i) {
        const float expected = dtype == DType::F32   ? floats[i]
                               : dtype == DType::F16 ? Half::to_float(Half::from_float(floats[i]))
                                                     : BFloat16::to_float(BFloat16::from_float(floats[i]));
        if (back[i] != expected) ++wrong;
      }
      CHECK(wrong == 0);
      // Exactly representable values come back unchanged.
      const std::vector<double> exact = {0.0, -0.0, 1.0, -2.5, 0.125, 96.0, -1024.0};
      CHECK(T::from_host(Shape{7}, exact, dtype, MemCategory::Temporary, be).to_host<double>() == exact);
    }
  }
  SECTION("i32 holds integers") {
    const std::vector<double> ids = {0, 3, -7, 2000000};
    const T t = T::from_host(Shape{2, 2}, ids, DType::I32, MemCategory::Temporary, be);
    CHECK(t.data_as<std::int32_t>()[3] == 2000000);
    CHECK(t.to_host<double>() == ids);
  }
  SECTION("wrong value count and wrong data_as dtype throw") {
    CHECK_THROWS_MATCHES(T::from_host(Shape{2, 3}, std::vector<double>(5), DType::F32, MemCategory::Temporary, be),
                         Error, ErrorContains("shape [2, 3] needs 6 values, got 5"));
    const T t = T::zeros(Shape{2}, DType::F16, MemCategory::Temporary, be);
    CHECK_THROWS_MATCHES(t.data_as<float>(), Error, ErrorContains("tensor is f16, asked for f32"));
  }
}

// from_host of double values into f16/bf16 narrows double -> float -> 16 bit, rounding
// twice. 1 + 2^-11 + 2^-40 is above the f16 midpoint 1 + 2^-11 and must round up to
// 1 + 2^-10, but the float step drops 2^-40 and the half step then ties to even (1.0).
// Same for bf16 with 1 + 2^-8 + 2^-40. Fix: narrow double to 16 bit in one rounding
// (e.g. round the double to float with the sticky bit kept: round-to-odd, then RNE).
TEST_CASE("Tensor::from_host rounds double values to f16/bf16 once", "[core][tensor]") {
  B be;
  const double above_half_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  CHECK(T::from_host(Shape{1}, std::vector<double>{above_half_tie}, DType::F16, MemCategory::Temporary, be)
            .to_host<double>()[0] == 1.0 + std::ldexp(1.0, -10));
  const double above_bf16_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  CHECK(T::from_host(Shape{1}, std::vector<double>{above_bf16_tie}, DType::BF16, MemCategory::Temporary, be)
            .to_host<double>()[0] == 1.0 + std::ldexp(1.0, -7));
}

// to_host widens each element through detail::widen, whose accumulator for int32 is
// float (AccumulatorOf<int32_t> = float): i32 values above 2^24 come back rounded
// (16777217 -> 16777216, 2147483647 -> 2147483648). Labels and token ids read back,
// and embedding's id range check (which reads ids through to_host<double>), see wrong
// values. Fix: widen integers to double (or int64), not float.
TEST_CASE("Tensor::to_host returns i32 values exactly", "[core][tensor]") {
  B be;
  const std::vector<double> ids = {16777217.0, 2147483647.0, -2147483647.0};
  const T t = T::from_host(Shape{3}, ids, DType::I32, MemCategory::Temporary, be);
  CHECK(t.data_as<std::int32_t>()[0] == 16777217);  // stored exactly
  CHECK(t.to_host<double>() == ids);
}

TEST_CASE("Tensor: copy_from and zero_ bump the version, clone does not share", "[core][tensor]") {
  B be;
  const T a = testing::random_tensor(Shape{3, 2}, 3, -1, 1, DType::F32, be);
  const T b = testing::random_tensor(Shape{3, 2}, 4, -1, 1, DType::F32, be);
  CHECK(a.version() == 0);
  a.copy_from(b);
  CHECK(a.version() == 1);
  CHECK(b.version() == 0);
  CHECK(a.to_host<double>() == b.to_host<double>());
  const T c = a.clone();
  CHECK_FALSE(c.same_storage(a));
  CHECK(c.version() == 0);
  a.zero_();
  CHECK(a.version() == 2);
  CHECK(c.to_host<double>() == b.to_host<double>());
  CHECK_THROWS_MATCHES(a.copy_from(T::zeros(Shape{2, 3}, DType::F32, MemCategory::Temporary, be)), Error,
                       ErrorContains("destination is [3, 2] f32, source is [2, 3] f32"));
  CHECK_THROWS_MATCHES(a.copy_from(T::zeros(Shape{3, 2}, DType::F64, MemCategory::Temporary, be)), Error,
                       ErrorContains("source is [3, 2] f64"));
}

TEST_CASE("MemoryStats: live, peak, retag, reset_peak and the timeline", "[core][memory]") {
  MemoryStats m;
  m.record_timeline(true);
  m.on_allocate(MemCategory::Parameter, 1000);
  m.on_allocate(MemCategory::Temporary, 300);
  m.mark("forward");
  m.on_retag(MemCategory::Temporary, MemCategory::SavedActivation, 300);
  m.on_allocate(MemCategory::Temporary, 200);
  m.on_free(MemCategory::Temporary, 200);
  CHECK(m.live(MemCategory::Parameter) == 1000);
  CHECK(m.live(MemCategory::Temporary) == 0);
  CHECK(m.peak(MemCategory::Temporary) == 300);
  CHECK(m.live(MemCategory::SavedActivation) == 300);
  CHECK(m.live_total() == 1300);
  CHECK(m.peak_total() == 1500);
  CHECK(m.allocations() == 3);
  CHECK(m.live(MemCategory::Gradient) == 0);

  const auto& tl = m.timeline();
  REQUIRE(tl.size() == 7);  // 3 allocations, 1 mark, a retag as two entries, 1 free
  CHECK(tl[0].event == MemoryStats::Event::Allocate);
  CHECK(tl[0].category == MemCategory::Parameter);
  CHECK(tl[0].bytes == 1000);
  CHECK(tl[1].live_total == 1300);
  CHECK(tl[2].event == MemoryStats::Event::Mark);
  CHECK(tl[2].label == "forward");
  CHECK(tl[2].bytes == 0);
  CHECK(tl[3].event == MemoryStats::Event::Retag);
  CHECK(tl[3].category == MemCategory::Temporary);
  CHECK(tl[3].bytes == -300);
  CHECK(tl[4].category == MemCategory::SavedActivation);
  CHECK(tl[4].bytes == 300);
  CHECK(tl[4].live_total == 1300);  // a retag moves bytes, it does not add any
  CHECK(tl[6].event == MemoryStats::Event::Free);
  CHECK(tl[6].bytes == -200);
  CHECK(tl[6].live_total == 1300);
  std::int64_t sum = 0;
  for (const auto& e : tl) sum += e.bytes;
  CHECK(sum == m.live_total());

  m.reset_peak();
  CHECK(m.peak(MemCategory::Temporary) == 0);
  CHECK(m.peak_total() == 1300);
  m.on_allocate(MemCategory::Workspace, 64);
  m.on_free(MemCategory::Workspace, 64);
  CHECK(m.peak(MemCategory::Workspace) == 64);
  CHECK(m.peak_total() == 1364);

  m.record_timeline(false);
  m.on_allocate(MemCategory::Temporary, 8);
  m.mark("ignored");
  CHECK(m.timeline().size() == 9);
  m.clear_timeline();
  CHECK(m.timeline().empty());
  CHECK(name_of(MemCategory::SavedActivation) == "saved_activation");
}

TEST_CASE("cpu::Backend: tensors are counted by category, 64-byte aligned, and freed", "[core][memory]") {
  B be;
  auto& m = be.memory();
  {
    const T p = T::empty(Shape{10, 10}, DType::F32, MemCategory::Parameter, be);
    const T g = T::zeros(Shape{7}, DType::F16, MemCategory::Gradient, be);
    CHECK(reinterpret_cast<std::uintptr_t>(p.data()) % 64 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(g.data()) % 64 == 0);
    CHECK(m.live(MemCategory::Parameter) == 400);
    CHECK(m.live(MemCategory::Gradient) == 14);  // exact bytes, not the rounded block
    CHECK(m.live_total() == 414);
    const T view = p.reshape(Shape{100});
    CHECK(m.live_total() == 414);  // views cost nothing
    // Var::parameter re-tags a temporary's bytes.
    const T t = T::zeros(Shape{4}, DType::F64, MemCategory::Temporary, be);
    const auto param = Var<B>::parameter(t, "w");
    CHECK(m.live(MemCategory::Temporary) == 0);
    CHECK(m.live(MemCategory::Parameter) == 432);
  }
  CHECK(m.live_total() == 0);
  CHECK(m.peak_total() == 446);
  CHECK(m.peak(MemCategory::Parameter) == 432);
  // Freed blocks are cached for reuse but are not live.
  CHECK(be.allocator().cached_bytes() > 0);
  be.allocator().release_cached();
  CHECK(be.allocator().cached_bytes() == 0);
}

TEST_CASE("cpu::Allocator: the cache reuses a repeated step's blocks and stays bounded when sizes change",
          "[core][memory]") {
  MemoryStats stats;
  cpu::Allocator allocator(stats);
  constexpr std::size_t kMiB = 1 << 20;
  // A "step" allocates `count` blocks of `size` at once and frees them.
  const auto step = [&](std::size_t size, int count) {
    std::vector<void*> blocks;
    for (int i = 0; i < count; ++i) blocks.push_back(allocator.allocate(size, MemCategory::Temporary));
    for (void* b : blocks) allocator.deallocate(b, size, MemCategory::Temporary);
  };
  step(kMiB, 8);
  CHECK(allocator.high_water_bytes() == 8 * kMiB);
  CHECK(allocator.cached_bytes() == 8 * kMiB);
  step(kMiB, 8);  // the same step again: every block from the cache, nothing new
  CHECK(allocator.cached_bytes() == 8 * kMiB);
  CHECK(allocator.high_water_bytes() == 8 * kMiB);
  // A search over batch sizes: every step a new block size. Without a bound the cache
  // would hold every size tried (here 8 + 9 + ... + 20 MiB = 182 MiB).
  std::size_t worst = 0;
  for (int k = 1; k <= 12; ++k) {
    step(kMiB + static_cast<std::size_t>(k) * kMiB / 8, 8);
    worst = std::max(worst, allocator.cached_bytes());
  }
  const std::size_t high_water = allocator.high_water_bytes();
  CHECK(high_water == 8 * (kMiB + 12 * kMiB / 8));  // the largest step: 20 MiB
  CHECK(worst <= cpu::Allocator::kCacheBound * high_water);
  CHECK(allocator.cached_bytes() >= 8 * (kMiB + 12 * kMiB / 8));  // the last size is still warm
  CHECK(stats.live_total() == 0);
  allocator.release_cached();
  CHECK(allocator.cached_bytes() == 0);
}

TEST_CASE("MemoryStats: Linear + ReLU forward keeps exactly x and the ReLU output", "[core][memory]") {
  // Closed form: linear saves x (batch*in floats, needed for dW = dy^T x) and, only if x
  // needs a gradient, W (a parameter, not an activation); relu saves its output
  // (batch*out floats, its mask); sum saves nothing. Every other forward tensor is a
  // temporary that dies with its last handle.
  const std::int64_t batch = 8, in = 16, out = 12;
  const std::int64_t saved_bytes = batch * in * 4 + batch * out * 4;
  const bool x_requires_grad = GENERATE(false, true);
  INFO("x requires grad: " << x_requires_grad);

  B be;
  auto& m = be.memory();
  const auto w = Var<B>::parameter(
      T::from_host(Shape{out, in}, testing::random_values(out * in, 11), DType::F32, MemCategory::Parameter, be), "W");
  const auto b = Var<B>::parameter(
      T::from_host(Shape{out}, testing::random_values(out, 12), DType::F32, MemCategory::Parameter, be), "b");
  const std::int64_t parameter_bytes = (out * in + out) * 4;
  REQUIRE(m.live(MemCategory::Parameter) == parameter_bytes);
  REQUIRE(m.live(MemCategory::SavedActivation) == 0);

  Tape<B> tape(be);
  m.reset_peak();
  m.record_timeline(true);
  Var<B> loss;
  {
    const auto x = tape.input(
        T::from_host(Shape{batch, in}, testing::random_values(batch * in, 13), DType::F32, MemCategory::Temporary, be),
        x_requires_grad, "x");
    const auto h = relu(linear(x, w, b));
    CHECK(m.live(MemCategory::SavedActivation) == saved_bytes);
    loss = sum(h);
    CHECK(m.live(MemCategory::SavedActivation) == saved_bytes);
  }
  m.record_timeline(false);
  // With the x and h handles gone, only the tape holds those bytes.
  CHECK(m.live(MemCategory::SavedActivation) == saved_bytes);
  CHECK(m.live(MemCategory::Parameter) == parameter_bytes);
  CHECK(m.live(MemCategory::Temporary) == 4);  // the loss scalar
  std::int64_t saved_in_timeline = 0;
  for (const auto& e : m.timeline())
    if (e.category == MemCategory::SavedActivation) saved_in_timeline += e.bytes;
  CHECK(saved_in_timeline == saved_bytes);

  tape.backward(loss);
  CHECK(m.live(MemCategory::SavedActivation) == 0);  // released as backward passed each node
  CHECK(m.peak(MemCategory::SavedActivation) == saved_bytes);
  CHECK(m.live(MemCategory::Gradient) == parameter_bytes + (x_requires_grad ? batch * in * 4 : 0));
  CHECK(m.live(MemCategory::Parameter) == parameter_bytes);
}

TEST_CASE("MemoryStats: retain_graph keeps saved bytes until the tape is cleared", "[core][memory]") {
  const std::int64_t batch = 4, in = 5, out = 3;
  B be;
  auto& m = be.memory();
  const auto w = Var<B>::parameter(
      T::from_host(Shape{out, in}, testing::random_values(out * in, 21), DType::F32, MemCategory::Parameter, be), "W");
  Tape<B> tape(be);
  Var<B> loss;
  {
    const auto x = tape.input(
        T::from_host(Shape{batch, in}, testing::random_values(batch * in, 22), DType::F32, MemCategory::Temporary, be));
    loss = sum(relu(linear(x, w)));
  }
  const std::int64_t saved_bytes = (batch * in + batch * out) * 4;
  CHECK(m.live(MemCategory::SavedActivation) == saved_bytes);
  tape.backward(loss, {}, /*retain_graph=*/true);
  CHECK(m.live(MemCategory::SavedActivation) == saved_bytes);
  tape.clear();
  CHECK(m.live(MemCategory::SavedActivation) == 0);
}
