// tests/support/tiny_training.hpp — one small mixed-precision training set-up, whole.
//
// What the reliability tests drive step after step: a two-layer MLP whose first layer
// runs in a checkpoint region (so backward recomputes it), 16-bit model weights behind
// FP32 masters, AdamW, and an enabled loss scaler, all on one backend the test owns.
// `snapshot()` is every byte a step may change (model copies, masters, optimizer
// states, scaler state), for tests that check a failed step changed nothing.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

namespace trainmem::testing {

template <class B = cpu::Backend>
class TinyTraining {
 public:
  static constexpr std::int64_t kBatch = 8, kIn = 12, kHidden = 16, kClasses = 4;

  explicit TinyTraining(B& backend, DType model_dtype = DType::F16, std::uint64_t seed = 5)
      : backend_(backend),
        w1_(param(Shape{kHidden, kIn}, 1)),
        b1_(param(Shape{kHidden}, 2)),
        w2_(param(Shape{kClasses, kHidden}, 3)),
        b2_(param(Shape{kClasses}, 4)),
        masters_({w1_, b1_, w2_, b2_}, {.model_dtype = model_dtype}),
        optimizer_({w1_, b1_, w2_, b2_}, {.lr = 1e-2}),
        scaler_(model_dtype, {.init_scale = 1024.0, .growth_interval = 7, .scale_bf16 = true}, backend),
        model_dtype_(model_dtype) {
    masters_.attach(optimizer_);
    x_ = random_tensor<B>(Shape{kBatch, kIn}, seed + 10, -1.0, 1.0, DType::F32, backend);
    std::vector<double> y(kBatch);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<double>((i * 3 + seed) % kClasses);
    labels_ = Tensor<B>::from_host(Shape{kBatch}, y, DType::I32, MemCategory::Temporary, backend);
  }

  /// One step: forward (layer 1 checkpointed), scaled backward, scaler step and update.
  /// Returns whether the scaler stepped. The gradients are cleared on the way out,
  /// thrown or not, so the next step starts from none.
  bool step() {
    struct ZeroGrad {
      optim::AdamW<B>& optimizer;
      ~ZeroGrad() { optimizer.zero_grad(); }
    } zero{optimizer_};
    Tape<B> tape(backend_);
    {
      amp::Autocast autocast(model_dtype_);
      auto h = checkpoint(
          tape, [&](const Var<B>& in) { return relu(linear(in, w1_, b1_)); }, tape.input(x_));
      auto loss = cross_entropy(linear(h, w2_, b2_), labels_);
      scaler_.scale(loss).backward();
    }
    const bool stepped = scaler_.step(optimizer_);
    scaler_.update();
    return stepped;
  }

  /// Every byte a step may change, in a fixed order.
  std::vector<unsigned char> snapshot() const {
    std::vector<unsigned char> out;
    auto add = [&](const Tensor<B>& t) {
      if (!t.defined()) {
        out.push_back(0xEE);  // an absent state differs from any present one
        return;
      }
      const std::size_t at = out.size();
      out.resize(at + t.bytes());
      backend_.download(out.data() + at, t.data(), t.bytes());
    };
    for (const Var<B>& p : masters_.params()) add(p.value());
    for (const Tensor<B>& m : masters_.masters()) add(m);
    for (const auto& e : optimizer_.entries()) {
      add(e.first_moment);
      add(e.second_moment);
      add(e.step_state);
    }
    const double scale = scaler_.get_scale();
    const std::int32_t counters[2] = {scaler_.growth_tracker(), scaler_.hysteresis_left()};
    const std::size_t at = out.size();
    out.resize(at + sizeof scale + sizeof counters);
    std::memcpy(out.data() + at, &scale, sizeof scale);
    std::memcpy(out.data() + at + sizeof scale, counters, sizeof counters);
    return out;
  }

  const amp::GradScaler<B>& scaler() const { return scaler_; }
  std::vector<double> master_values(std::size_t i) const { return masters_.master(i).template to_host<double>(); }

 private:
  Var<B> param(Shape shape, std::uint64_t stream) {
    const auto n = static_cast<std::size_t>(shape.numel());
    return Var<B>::parameter(Tensor<B>::from_host(std::move(shape), random_values(n, 100 + stream, -0.5, 0.5),
                                                  DType::F32, MemCategory::Parameter, backend_),
                             "p" + std::to_string(stream));
  }

  B& backend_;
  Var<B> w1_, b1_, w2_, b2_;
  amp::MasterWeights<B> masters_;
  optim::AdamW<B> optimizer_;
  amp::GradScaler<B> scaler_;
  DType model_dtype_;
  Tensor<B> x_, labels_;
};

}  // namespace trainmem::testing
