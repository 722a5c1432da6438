// tests/state/test_fp8_resume.cpp — FP8 amax histories and scales resume bit for bit.
//
// Reference: the uninterrupted run. A run saved after some steps (model, optimizer and
// TrainStep, whose state holds the FP8 histories and scales) and loaded into freshly
// built objects must continue to the same weights, moments, histories and scales, bit for
// bit; under f16 the run crosses skipped steps (an inf batch) as well.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <vector>

#include "trainmem/trainmem.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;

namespace fp8_resume_test {
namespace {

constexpr std::int64_t kBatch = 8, kIn = 12, kHidden = 16, kClasses = 5;

struct Net : tmem::nn::Module<B> {
  explicit Net(tmem::nn::Init& init)
      : tmem::nn::Module<B>("Net"), fc1(kIn, kHidden, init), fc2(kHidden, kHidden, init), fc3(kHidden, kClasses, init) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  tmem::Var<B> operator()(const tmem::Var<B>& x) const {
    return fc3(tmem::dropout(tmem::gelu(fc2(tmem::relu(fc1(x)))), 0.2f));
  }
  tmem::nn::Linear<B> fc1, fc2, fc3;
};

struct Run {
  explicit Run(DType precision)
      : step(optimizer, [&] {
          tmem::amp::TrainStepOptions o{.precision = precision, .micro_batches = 2};
          o.fp8 = tmem::amp::DelayedScaling{.history_length = 3, .margin = 1};
          o.scaler.init_scale = 4096.0;
          return o;
        }()) {}

  /// Steps [first, last); step k's batch is a function of k (the data position).
  void train(int first, int last) {
    for (int k = first; k < last; ++k) {
      tmem::Tape<B> tape;
      tape.manual_seed(77 + static_cast<std::uint64_t>(k));
      step.run([&](int micro) {
        std::vector<float> x(kBatch * kIn);
        for (std::size_t i = 0; i < x.size(); ++i)
          x[i] = static_cast<float>((1.0 + 0.3 * k) * std::sin(0.7 * static_cast<double>(i) + k + 0.5 * micro));
        if (k == 4 && micro == 1) x[5] = std::numeric_limits<float>::infinity();  // f16: a skipped step
        std::vector<std::int32_t> y(kBatch);
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>((i + k + micro) % kClasses);
        return tmem::cross_entropy(net(tape.input(tmem::Tensor<B>::from_host({kBatch, kIn}, x))),
                                   tmem::Tensor<B>::from_host({kBatch}, y, DType::I32));
      });
    }
  }
  tmem::StateDict everything() const {
    tmem::StateDict all;
    all.insert("model", tmem::state_of(net));
    all.insert("optimizer", tmem::state_of(optimizer));
    all.insert("train", tmem::state_of(step));
    return all;
  }

  tmem::nn::Init init{7};
  Net net{init};
  tmem::optim::AdamW<B> optimizer{net.parameters(), {.lr = 1e-2, .weight_decay = 0.1}};
  tmem::amp::TrainStep<B> step;
};

}  // namespace

TEST_CASE("FP8 histories and scales are saved and resumed bitwise", "[state][fp8]") {
  for (const DType precision : {DType::BF16, DType::F16}) {
    INFO("precision " << precision);
    Run whole(precision);
    whole.train(0, 7);
    const tmem::StateDict reference = whole.everything();
    REQUIRE(reference.contains("train.fp8.fc2.weight.amax_history"));
    if (precision == DType::F16) CHECK(whole.step.skipped_steps() >= 1);

    const auto path = std::filesystem::temp_directory_path() / "trainmem_fp8_resume.tmstate";
    {
      Run first(precision);
      first.train(0, 3);
      tmem::save(path, {{"model", first.net}, {"optimizer", first.optimizer}, {"train", first.step}});
    }
    Run second(precision);
    tmem::load(path, {{"model", second.net}, {"optimizer", second.optimizer}, {"train", second.step}});
    second.train(3, 7);
    const tmem::StateDict resumed = second.everything();
    CHECK(resumed.sub("train.fp8") == reference.sub("train.fp8"));
    CHECK(resumed == reference);

    // The same resume with the FP8 state of a fresh run (scales 1.0, empty histories)
    // differs: the saved FP8 state is what makes the resumed run equal.
    Run third(precision);
    const tmem::StateDict fresh_fp8 = third.step.fp8()->state();
    tmem::load(path, {{"model", third.net}, {"optimizer", third.optimizer}, {"train", third.step}});
    third.step.fp8()->load_state(fresh_fp8);
    third.train(3, 7);
    CHECK_FALSE(third.everything().sub("train.fp8") == reference.sub("train.fp8"));
    CHECK_FALSE(third.everything().sub("model") == reference.sub("model"));
    std::filesystem::remove(path);
  }
}

TEST_CASE("an FP8 state for other weights or another history length is refused, naming the entry",
          "[state][fp8][errors]") {
  Run run(DType::BF16);
  run.train(0, 1);
  tmem::StateDict state = tmem::state_of(run.step);
  tmem::StateDict wrong;
  for (const auto& [name, entry] : state)
    if (name != "fp8.fc3.weight.scale") wrong.set(name, entry);
  CHECK_THROWS_WITH(run.step.load_state(wrong),
                    Catch::Contains("fp8.fc3.weight.scale") || Catch::Contains("fc3.weight.scale"));
  tmem::amp::Fp8Scaling<B> other(run.net.parameters(), {.history_length = 5});
  CHECK_THROWS_WITH(other.load_state(state.sub("fp8")), Catch::Contains("fc1.weight.amax_history"));
}

}  // namespace fp8_resume_test
