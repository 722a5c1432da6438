// tests/state/resume_training.hpp — the small FP16 training run that the resume test interrupts.
//
// A two-layer model (nn::Module) with dropout, f16 autocast, f16 model copies behind f32
// masters, AdamW, and a loss scaler started high enough that some steps overflow and are
// skipped (growth_interval 3 grows it back into overflow, hysteresis 2 delays the backoff).
// Batches are a pure function of the step index, so the data order is the step count
// saved with the state. `run(first, last)` trains steps [first, last).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <trainmem/trainmem.hpp>

#include "test_data.hpp"

namespace resume {

namespace tmem = trainmem;
using B = tmem::cpu::Backend;

constexpr std::int64_t kBatch = 8, kIn = 12, kHidden = 16, kClasses = 5;

struct Net : tmem::nn::Module<B> {
  explicit Net(tmem::nn::Init& init)
      : tmem::nn::Module<B>("Net"), fc1(kIn, kHidden, init), fc2(kHidden, kClasses, init) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  tmem::Var<B> operator()(const tmem::Var<B>& x) const { return fc2(tmem::dropout(tmem::relu(fc1(x)), 0.25f)); }
  tmem::nn::Linear<B> fc1, fc2;
};

/// Everything the run holds; constructed identically in every process.
struct Run {
  tmem::nn::Init init{7};
  Net net{init};
  tmem::amp::MasterWeights<B> masters{net.parameters(), {.model_dtype = tmem::DType::F16}};
  tmem::optim::AdamW<B> optimizer{net.parameters(), {.lr = 3e-2, .weight_decay = 0.1}};
  tmem::amp::GradScaler<B> scaler{tmem::DType::F16, {.init_scale = 1048576.0, .growth_interval = 3, .hysteresis = 2}};
  tmem::Tape<B> tape;
  std::int64_t step = 0;  // the data position: the next batch to train on
  int skipped = 0;

  Run() {
    masters.attach(optimizer);
    tape.manual_seed(1234);
  }

  /// The batch of step `k`: inputs and labels from a stream seeded by k (the data
  /// position is all a resume needs to know to continue the data order).
  static std::pair<std::vector<double>, std::vector<double>> batch(std::int64_t k) {
    trainmem::testing::SplitMix64 rng(99 + static_cast<std::uint64_t>(k));
    std::vector<double> x(kBatch * kIn), y(kBatch);
    for (double& v : x) v = 2.0 * rng.uniform() - 1.0;
    for (double& v : y) v = static_cast<double>(rng.next() % kClasses);
    return {x, y};
  }

  void train_until(std::int64_t last) {
    for (; step < last; ++step) {
      const auto [x, y] = batch(step);
      tape.clear();
      optimizer.zero_grad();
      tmem::Var<B> loss;
      {
        tmem::amp::Autocast guard(tmem::DType::F16);
        auto input = tape.input(tmem::Tensor<B>::from_host(tmem::Shape{kBatch, kIn}, x));
        loss = tmem::cross_entropy(net(input), tmem::Tensor<B>::from_host(tmem::Shape{kBatch}, y, tmem::DType::I32));
      }
      scaler.scale(loss).backward();
      if (!scaler.step(optimizer)) ++skipped;
      scaler.update();
    }
  }

  void save(const std::string& path) const {
    tmem::StateDict data;
    data.set_i64("step", step);
    tmem::save(path, {{"model", net},
                      {"masters", masters},
                      {"optimizer", optimizer},
                      {"scaler", scaler},
                      {"rng", tape},
                      {"data", data}});
  }
  void load(const std::string& path) {
    tmem::StateDict data;
    tmem::load(path, {{"model", net},
                      {"masters", masters},
                      {"optimizer", optimizer},
                      {"scaler", scaler},
                      {"rng", tape},
                      {"data", data}});
    step = data.get_i64("step");
  }

  /// The raw bytes of every model copy and master, in order.
  std::vector<std::byte> weight_bytes() const {
    std::vector<std::byte> out;
    auto append = [&](const tmem::Tensor<B>& t) {
      const tmem::StateEntry e = tmem::StateEntry::of(t);
      out.insert(out.end(), e.bytes.begin(), e.bytes.end());
    };
    for (const auto& p : net.parameters()) append(p.value());
    for (const auto& m : masters.masters()) append(m);
    return out;
  }
};

}  // namespace resume
