// The default recompute check (DeterminismCheck::Fingerprint) against the changes it
// claims to catch: one changed element anywhere in a large tensor, changes that cancel in
// a plain sum (one element up by d, another down by d; two elements swapped), and a
// recompute after backward(retain_graph) whose captured state changed in between.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;

namespace {

constexpr std::size_t kMaskSize = 1 << 16;  // 64k floats: 32k words, far more than a sample of 1,024

std::vector<float> positive_wave(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 1.5f + static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  return v;
}

/// Runs a region relu(x * mask) whose fn reads `mask` by reference (a host cutout mask, as
/// an augmentation would draw it); `change` edits the mask between forward and backward.
/// Returns the error message, empty when backward ran without one.
template <class Change>
std::string masked_region(DeterminismCheck check, Change change) {
  std::vector<float> mask(kMaskSize, 1.0f);
  for (std::size_t i = 0; i < kMaskSize; i += 7) mask[i] = 0.25f * static_cast<float>(i % 5);
  Tape<B> tape;
  auto x = tape.input(T::from_host({static_cast<std::int64_t>(kMaskSize)}, positive_wave(kMaskSize)), true, "x");
  auto fn = [&](const Var<B>& in) {
    return relu(mul(in, tape.input(T::from_host({static_cast<std::int64_t>(kMaskSize)}, mask))));
  };
  CheckpointOptions options;
  options.determinism = check;
  auto loss = sum(checkpoint(tape, options, fn, x));
  change(mask);
  try {
    tape.backward(loss);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("the default check catches one changed element of a 64k-float tensor, wherever it is",
          "[checkpoint][errors]") {
  // Words 2,000 and 30,000 (floats 4,000 and 60,001) lie outside any eight runs of 128 words.
  for (std::size_t at : {std::size_t{4000}, std::size_t{60001}, std::size_t{0}, kMaskSize - 1}) {
    INFO("changed element " << at);
    const std::string message = masked_region(DeterminismCheck::Fingerprint, [at](std::vector<float>& m) {
      m[at] = m[at] == 0.0f ? 1.0f : 0.0f;  // a cutout that moved by one element
    });
    CHECK_THAT(message, Catch::Contains("values of saved tensor") && Catch::Contains("fingerprint"));
  }
  // The same region with an unchanged mask passes: the check is about values, not the capture.
  CHECK(masked_region(DeterminismCheck::Fingerprint, [](std::vector<float>&) {}).empty());
  // Checksum (every byte, on the host) sees the same change: the two levels agree.
  CHECK_THAT(masked_region(DeterminismCheck::Checksum, [](std::vector<float>& m) { m[4000] = 0.0f; }),
             Catch::Contains("values of saved tensor"));
}

TEST_CASE("the default check catches changes that cancel in a sum: +d and -d, and two swapped elements",
          "[checkpoint][errors]") {
  SECTION("one element up by 0.5, another down by 0.5: the mask's sum is unchanged") {
    const std::string message = masked_region(DeterminismCheck::Fingerprint, [](std::vector<float>& m) {
      m[4001] += 0.5f;
      m[40003] -= 0.5f;
    });
    CHECK_THAT(message, Catch::Contains("values of saved tensor"));
  }
  SECTION("two elements swapped, far apart and within one word") {
    // mask[4011] is 0.25, mask[4010] and mask[50000] are 1.0; floats 4010 and 4011 share word 2,005.
    for (auto [a, b] : {std::pair<std::size_t, std::size_t>{4011, 50000}, {4010, 4011}}) {
      INFO("swapped " << a << " and " << b);
      const std::string message =
          masked_region(DeterminismCheck::Fingerprint, [a, b](std::vector<float>& m) { std::swap(m[a], m[b]); });
      CHECK_THAT(message, Catch::Contains("values of saved tensor"));
    }
  }
  SECTION("two sign flips") {
    const std::string message = masked_region(DeterminismCheck::Fingerprint, [](std::vector<float>& m) {
      m[4001] = -m[4001];
      m[40003] = -m[40003];
    });
    CHECK_THAT(message, Catch::Contains("values of saved tensor"));
  }
}

TEST_CASE("every recompute is checked: a second backward after retain_graph sees a changed capture",
          "[checkpoint][errors]") {
  const auto w = Var<B>::parameter(T::from_host({64}, positive_wave(64)), "w");
  double factor = 2.0;
  auto fn = [&](const Var<B>& in) { return mul(w, scale(in, factor)); };  // dw = factor * x, x = 1
  for (auto check : {DeterminismCheck::Fingerprint, DeterminismCheck::Checksum, DeterminismCheck::Bitwise}) {
    INFO("check " << static_cast<int>(check));
    w.zero_grad();
    factor = 2.0;
    Tape<B> tape;
    auto x = tape.input(T::from_host({64}, std::vector<float>(64, 1.0f)), true, "x");
    CheckpointOptions options;
    options.determinism = check;
    auto loss = sum(checkpoint(tape, options, fn, x));
    tape.backward(loss, {}, true);
    CHECK(w.grad().to_host() == std::vector<float>(64, 2.0f));
    // Unchanged, a second recompute passes and adds the same gradient again.
    tape.backward(loss, {}, true);
    CHECK(w.grad().to_host() == std::vector<float>(64, 4.0f));
    factor = 3.0;  // the [&] capture changed: the third recompute computes something else
    try {
      tape.backward(loss);
      FAIL("no error");
    } catch (const CheckpointError& e) {
      CHECK_THAT(e.what(), Catch::Contains("values of saved tensor"));
    }
    CHECK(w.grad_incomplete());  // the gradient is not applied by mistake
  }
}

TEST_CASE("a full fingerprint sees a flipped bit at every sampled position of a large tensor", "[checkpoint][errors]") {
  B& be = B::default_instance();
  const std::vector<float> values = positive_wave(kMaskSize);
  const T reference = T::from_host({static_cast<std::int64_t>(kMaskSize)}, values);
  const auto base = be.fingerprint(reference);
  for (std::size_t at = 3; at < kMaskSize; at += 251) {
    std::vector<float> changed = values;
    std::uint32_t bits = 0;
    std::memcpy(&bits, &changed[at], 4);
    bits ^= 1u << (at % 32);  // every bit position is hit over the loop
    std::memcpy(&changed[at], &bits, 4);
    if (be.fingerprint(T::from_host({static_cast<std::int64_t>(kMaskSize)}, changed)) == base) {
      FAIL("flipping bit " << at % 32 << " of element " << at << " left the fingerprint unchanged");
    }
  }
  SUCCEED();
}

TEST_CASE("a tensor several ops save is checked through its first save, and still caught when it changes",
          "[checkpoint][errors]") {
  // h feeds three products, as a normalised input feeds q, k and v: the forward saves it
  // three times. The recompute's h is the same tensor three times (checked once), or, for
  // the last product, a new tensor scale(h, s): it is compared with h's values.
  std::vector<Var<B>> w;
  for (int i = 0; i < 3; ++i) w.push_back(Var<B>::parameter(T::from_host({256}, positive_wave(256)), "w"));
  for (auto check : {DeterminismCheck::Fingerprint, DeterminismCheck::Checksum, DeterminismCheck::Bitwise}) {
    const auto run = [&](bool changed_h, double last_scale) {
      int calls = 0;
      auto fn = [&](const Var<B>& in) {
        const bool recompute = ++calls > 1;
        const Var<B> h = relu(scale(in, recompute && changed_h ? 1.25 : 1.0));
        const Var<B> h_last = recompute ? scale(h, last_scale) : h;
        return add(add(mul(h, w[0]), mul(h, w[1])), mul(h_last, w[2]));
      };
      Tape<B> tape;
      auto x = tape.input(T::from_host({256}, positive_wave(256)), true, "x");
      CheckpointOptions options;
      options.determinism = check;
      tape.backward(sum(checkpoint(tape, options, fn, x)));
    };
    INFO("check " << static_cast<int>(check));
    CHECK_NOTHROW(run(false, 1.0));
    CHECK_THROWS_AS(run(true, 1.0), CheckpointError);
    CHECK_THROWS_AS(run(false, 1.5), CheckpointError);
  }
}
