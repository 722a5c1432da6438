// tests/amp/test_fp8_device_skip.cpp — bf16 + FP8 without a loss scaler: the step that an
// inf or NaN amax must skip is skipped on the device, and update() reads nothing back.
//
// References: the host-read count of the CPU backend (cpu::Backend::host_reads(), every
// download), which on a GPU is a wait for the device: 0 in update() under bf16 + FP8, as
// under plain bf16, against the one read f16's GradScaler::step is documented to make. The
// skipped step against the state before it, bit for bit, and the run with the skip against
// a run that never saw the poisoned batch (a skipped step is as if it had not happened,
// but for the step counters). Fp8Scaling::update(flag) against update(bool), the host
// decision it replaces, over a history ring that wraps.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;
using tmem::Tensor;
using tmem::Var;

namespace fp8_device_skip_test {
namespace {

constexpr std::int64_t kRows = 6, kIn = 8, kHidden = 7, kOut = 5;

std::vector<float> values(std::size_t n, std::uint64_t seed, double gain) {
  std::vector<float> out;
  for (double v : tmem::testing::random_values(n, seed)) out.push_back(static_cast<float>(gain * v));
  return out;
}

/// Every bit of a tensor.
std::vector<std::byte> bits(const Tensor<B>& t) {
  std::vector<std::byte> out(t.bytes());
  if (!out.empty()) t.backend().download(out.data(), t.data(), t.bytes());
  return out;
}

/// Every bit of a StateDict's entries but those named in `except`.
std::vector<std::byte> bits(const tmem::StateDict& state, const std::vector<std::string>& except = {}) {
  std::vector<std::byte> out;
  for (const auto& [name, entry] : state)
    if (std::find(except.begin(), except.end(), name) == except.end())
      out.insert(out.end(), entry.bytes.begin(), entry.bytes.end());
  return out;
}

/// Two linears (AdamW, bf16 model copies of f32 masters) trained by a bf16 + FP8 TrainStep.
struct Run {
  explicit Run(DType precision = DType::BF16, int micro_batches = 2)
      : w1(Var<B>::parameter(Tensor<B>::from_host({kHidden, kIn}, values(kHidden * kIn, 1, 0.5)), "w1")),
        b1(Var<B>::parameter(Tensor<B>::from_host({kHidden}, values(kHidden, 2, 0.1)), "b1")),
        w2(Var<B>::parameter(Tensor<B>::from_host({kOut, kHidden}, values(kOut * kHidden, 3, 0.5)), "w2")),
        optimizer({w1, b1, w2}, {.lr = 1e-2, .weight_decay = 0.01}),
        step(optimizer, options(precision, micro_batches)) {}

  static tmem::amp::TrainStepOptions options(DType precision, int micro_batches) {
    tmem::amp::TrainStepOptions o{.precision = precision, .micro_batches = micro_batches};
    o.fp8 = tmem::amp::DelayedScaling{.history_length = 3};
    o.scaler.init_scale = 16.0;  // f16: small enough that the clean steps do not overflow
    return o;
  }

  /// The loss of batch `k`, micro-batch `micro`; `poisoned`: one input is inf.
  Var<B> loss(tmem::Tape<B>& tape, int k, int micro, bool poisoned) {
    std::vector<float> x = values(kRows * kIn, 100 + static_cast<std::uint64_t>(2 * k + micro), 1.0);
    if (poisoned) x[5] = std::numeric_limits<float>::infinity();
    const Var<B> h = tmem::linear(tape.input(Tensor<B>::from_host({kRows, kIn}, x)), w1, b1);
    const Var<B> c = tape.input(Tensor<B>::from_host({kRows, kOut}, values(kRows * kOut, 7, 1.0), DType::BF16));
    return tmem::sum(tmem::mul(tmem::linear(h, w2), c));
  }
  /// The forwards and backwards of batch `k` (the second micro-batch poisoned when asked), not the update.
  void backwards(int k, bool poisoned = false) {
    for (int micro = 0; micro < step.options().micro_batches; ++micro) {
      tmem::Tape<B> tape;
      const Var<B> l = step.forward([&] { return tmem::scale(loss(tape, k, micro, poisoned && micro == 1), 0.5); });
      step.backward(l);
    }
  }
  tmem::amp::StepReport<B> run(int k, bool poisoned = false) {
    tmem::Tape<B> tape;
    return step.run([&](int micro) { return loss(tape, k, micro, poisoned && micro == 1); });
  }

  /// What a skipped step must leave bitwise: the model copies, the masters, the moments
  /// and bias-correction powers, the FP8 amax history and scales.
  std::vector<std::byte> trained_state() const {
    std::vector<std::byte> out;
    for (const Var<B>* p : {&w1, &b1, &w2}) {
      const auto b = bits(p->value());
      out.insert(out.end(), b.begin(), b.end());
    }
    for (const auto& e : optimizer.entries())
      for (const Tensor<B>* t : {&e.first_moment, &e.second_moment, &e.step_state}) {
        const auto b = bits(*t);
        out.insert(out.end(), b.begin(), b.end());
      }
    const auto masters = bits(step.state().sub("masters"));
    out.insert(out.end(), masters.begin(), masters.end());
    const auto& fp8 = *step.fp8();
    for (const Tensor<B>* t : {&fp8.history(), &fp8.scales()->scale, &fp8.scales()->scale_inv}) {
      const auto b = bits(*t);
      out.insert(out.end(), b.begin(), b.end());
    }
    return out;
  }

  Var<B> w1, b1, w2;
  tmem::optim::AdamW<B> optimizer;
  tmem::amp::TrainStep<B> step;
};

}  // namespace

TEST_CASE("bf16 + FP8 without a scaler: update() reads nothing from the device", "[amp][fp8]") {
  B& backend = B::default_instance();
  {
    Run r(DType::BF16);
    REQUIRE_FALSE(r.step.scaler().is_enabled());
    for (int k = 0; k < 3; ++k) {
      r.backwards(k, k == 1);
      const std::uint64_t before = backend.host_reads();
      r.step.update();
      CHECK(backend.host_reads() == before);  // the old update read the FP8 probe here: one read
    }
    CHECK(r.step.skipped_steps() == 1);  // counted at this read
  }
  {  // The witness sees reads: f16's GradScaler::step reads the scale and its found-inf flag.
    Run r(DType::F16);
    REQUIRE(r.step.scaler().is_enabled());
    r.backwards(0);
    const std::uint64_t before = backend.host_reads();
    r.step.update();
    CHECK(backend.host_reads() > before);
  }
}

TEST_CASE("bf16 + FP8: an inf amax skips the step on the device, bitwise, and skipped_steps() counts it",
          "[amp][fp8]") {
  Run r;
  REQUIRE(r.run(0).stepped);
  const std::vector<std::byte> before = r.trained_state();
  const auto report = r.run(1, /*poisoned=*/true);  // FP8 saturates the inf: only the amax shows it
  CHECK(std::isfinite(report.loss_value()));
  REQUIRE(report.stepped.decided_on_device());  // the step's flag, not a host decision
  CHECK_FALSE(report.stepped);
  CHECK(r.trained_state() == before);  // weights, masters, moments, amax history, scales
  CHECK(r.step.skipped_steps() == 1);
  CHECK(r.step.step_count() == 2);
  CHECK(r.step.state().get_i64("skipped_steps") == 1);
  for (std::size_t role = 0; role < r.step.fp8()->role_count(); ++role)
    CHECK(r.step.fp8()->amax_slot(role).to_host<float>()[0] == 0.0f);  // the poisoned amaxes are dropped
  REQUIRE(r.run(2).stepped);
  CHECK(r.trained_state() != before);
  CHECK(r.step.skipped_steps() == 1);

  // The reference: a run that never saw the poisoned batch. Bit for bit the same weights,
  // masters, moments (with their bias-correction powers), history and scales.
  Run clean;
  REQUIRE(clean.run(0).stepped);
  REQUIRE(clean.run(2).stepped);
  CHECK(r.trained_state() == clean.trained_state());
  CHECK(clean.step.skipped_steps() == 0);

  // The count resumes: a loaded state's count plus the skips counted on the device since.
  const tmem::StateDict saved = r.step.state();
  clean.step.load_state(saved);
  CHECK(clean.step.skipped_steps() == 1);
  CHECK_FALSE(clean.run(3, /*poisoned=*/true).stepped);
  CHECK(clean.step.skipped_steps() == 2);
  clean.step.load_state(saved);  // the device's count starts again from the loaded one
  CHECK(clean.step.skipped_steps() == 1);
}

}  // namespace fp8_device_skip_test

namespace fp8_device_skip_test {
namespace {

/// y = linear(x, w) under FP8 with `scaling`, then backward from sum(y * c): records the
/// three roles' amaxes (x's is inf when `poisoned`).
void fp8_pass(const Var<B>& w, tmem::amp::Fp8Scaling<B>& scaling, int k, bool poisoned) {
  std::vector<float> x = values(kRows * kIn, 200 + static_cast<std::uint64_t>(k), 1.0 + k);
  if (poisoned) x[3] = std::numeric_limits<float>::infinity();
  tmem::Tape<B> tape;
  Var<B> loss;
  {
    tmem::amp::Fp8Autocast guard(scaling);
    const Var<B> y = tmem::linear(tape.input(Tensor<B>::from_host({kRows, kIn}, x)), w);
    loss = tmem::sum(tmem::mul(
        y, tape.input(Tensor<B>::from_host({kRows, kOut}, values(kRows * kOut, 300 + k, 0.5 + k), DType::BF16))));
  }
  tape.backward(loss);
}

/// The history's rows oldest to latest (the ring read from position()), as bits.
std::vector<std::byte> history_in_order(const tmem::amp::Fp8Scaling<B>& s) {
  const std::vector<std::byte> all = bits(s.history());
  const std::int64_t h = s.recipe().history_length;
  const std::size_t row = all.size() / static_cast<std::size_t>(h);
  std::vector<std::byte> out;
  for (std::int64_t i = 0; i < h; ++i) {
    const auto at = static_cast<std::size_t>((s.position() + i) % h) * row;
    out.insert(out.end(), all.begin() + static_cast<std::ptrdiff_t>(at),
               all.begin() + static_cast<std::ptrdiff_t>(at + row));
  }
  return out;
}

}  // namespace

TEST_CASE("Fp8Scaling::update(found_inf) on the device does what update(bool) does with the host's decision",
          "[amp][fp8]") {
  for (const auto rule : {tmem::amp::AmaxRule::Max, tmem::amp::AmaxRule::MostRecent}) {
    INFO("rule " << (rule == tmem::amp::AmaxRule::Max ? "max" : "most recent"));
    const Var<B> w = Var<B>::parameter(Tensor<B>::from_host({kOut, kIn}, values(kOut * kIn, 9, 0.7)), "w");
    const tmem::amp::DelayedScaling recipe{.history_length = 3, .margin = 1, .rule = rule};
    tmem::amp::Fp8Scaling<B> host({w}, recipe), device({w}, recipe);
    // Steps 2 and 5 skipped: 2 by an inf amax (its flag NaN, as nonfinite_probe makes it),
    // 5 by a flag of 1 (another reason, e.g. ranks' flags summed) over finite amaxes. Seven
    // steps wrap the ring of 3 twice.
    for (int k = 0; k < 7; ++k) {
      INFO("step " << k);
      const bool poisoned = k == 2, skipped = k == 2 || k == 5;
      w.value().bump_version();  // as each step's optimizer would: the weight is quantized (and its amax taken) afresh
      fp8_pass(w, host, k, poisoned);
      fp8_pass(w, device, k, poisoned);
      const Tensor<B> flag =
          skipped && !poisoned ? Tensor<B>::full(tmem::Shape{1}, 1.0, DType::F32) : device.nonfinite_probe();
      const std::vector<std::byte> scale = bits(device.scales()->scale), inv = bits(device.scales()->scale_inv),
                                   history = history_in_order(device);
      const std::uint64_t reads = B::default_instance().host_reads();
      host.update(!skipped);
      device.update(flag);
      CHECK(B::default_instance().host_reads() == reads);
      CHECK(bits(device.scales()->scale) == bits(host.scales()->scale));
      CHECK(bits(device.scales()->scale_inv) == bits(host.scales()->scale_inv));
      CHECK(history_in_order(device) == history_in_order(host));
      if (skipped) {  // as it was, bit for bit
        CHECK(bits(device.scales()->scale) == scale);
        CHECK(bits(device.scales()->scale_inv) == inv);
        CHECK(history_in_order(device) == history);
      } else {
        CHECK(bits(device.scales()->scale) != scale);
      }
      for (std::size_t role = 0; role < device.role_count(); ++role)
        CHECK(device.amax_slot(role).to_host<float>()[0] == 0.0f);
    }
    CHECK(device.position() == 0);  // the device's update moves rows, not the position
    CHECK(host.position() == 5 % 3);
  }
  const Var<B> w = Var<B>::parameter(Tensor<B>::from_host({kOut, kIn}, values(kOut * kIn, 9, 0.7)), "w");
  tmem::amp::Fp8Scaling<B> s({w});
  CHECK_THROWS_WITH(s.update(Tensor<B>::zeros(tmem::Shape{2}, DType::F32)),
                    Catch::Contains("amp::Fp8Scaling::update: found_inf must be an f32 scalar"));
}

}  // namespace fp8_device_skip_test
