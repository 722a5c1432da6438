// tests/amp/test_grad_scaler.cpp — why loss scaling exists, and the scaler's algorithm.
//
// The scale sequence is checked against a second, independent model of the rule
// (PyTorch's torch.amp.GradScaler plus DeepSpeed's min/max scale and hysteresis),
// written below from their documentation; the optimizer's clean steps against an
// AdamW written out in f64; skipped steps against the bytes from before the step.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <trainmem/amp/grad_scaler.hpp>
#include <trainmem/amp/master_weights.hpp>
#include <trainmem/optim/adamw.hpp>
#include <trainmem/optim/sgd.hpp>
#include <trainmem/trainmem.hpp>

#include "amp_reference.hpp"
#include "error_matchers.hpp"
#include "test_data.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;

namespace {

// --- why scaling exists --------------------------------------------------------------

/// A 3-layer MLP whose loss carries a small weight (as auxiliary losses do), so that
/// its gradients sit below FP16's smallest subnormal (2^-24 ~ 6e-8).
struct TinyMlp {
  tmem::nn::Init init{7};
  tmem::nn::Linear<B> fc1{32, 64, init}, fc2{64, 64, init}, fc3{64, 10, init};
  tmem::Tensor<B> x = tmem::testing::random_tensor<B>(tmem::Shape{128, 32}, 11, -1.0, 1.0, DType::F32);
  tmem::Tensor<B> labels;
  static constexpr double kLossWeight = 0x1p-18;

  TinyMlp() {
    std::vector<double> y(128);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<double>((i * 7 + 3) % 10);
    labels = tmem::Tensor<B>::from_host(tmem::Shape{128}, y, DType::I32);
  }
  std::vector<tmem::Var<B>> parameters() const {
    std::vector<tmem::Var<B>> p;
    for (const auto* layer : {&fc1, &fc2, &fc3})
      for (const auto& v : layer->parameters()) p.push_back(v);
    return p;
  }
  tmem::Var<B> loss(tmem::Tape<B>& tape) const {
    auto h = tmem::relu(fc1(tape.input(x)));
    h = tmem::relu(fc2(h));
    return tmem::scale(tmem::cross_entropy(fc3(h), labels), kLossWeight);
  }
  std::vector<double> grads() const {
    std::vector<double> all;
    for (const auto& p : parameters()) {
      const auto g = p.grad().to_host<double>();
      all.insert(all.end(), g.begin(), g.end());
    }
    return all;
  }
};

double fraction_zero(const std::vector<double>& g, const std::vector<double>& reference) {
  std::size_t lost = 0, nonzero = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (reference[i] == 0) continue;
    ++nonzero;
    if (g[i] == 0) ++lost;
  }
  return static_cast<double>(lost) / static_cast<double>(nonzero);
}

double relative_l2_error(const std::vector<double>& g, const std::vector<double>& reference) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    diff += (g[i] - reference[i]) * (g[i] - reference[i]);
    norm += reference[i] * reference[i];
  }
  return std::sqrt(diff / norm);
}

// --- the independent model of the scale rule ------------------------------------------

struct ScaleRuleModel {
  double scale;
  int growth_tracker = 0;
  int hysteresis_left;
  double growth_factor, backoff_factor, min_scale, max_scale;
  int growth_interval, hysteresis;

  explicit ScaleRuleModel(const tmem::amp::GradScalerOptions& o)
      : scale(o.init_scale),
        hysteresis_left(o.hysteresis),
        growth_factor(o.growth_factor),
        backoff_factor(o.backoff_factor),
        min_scale(o.min_scale),
        max_scale(o.max_scale),
        growth_interval(o.growth_interval),
        hysteresis(o.hysteresis) {}

  /// One update(): an overflow resets the clean-step count and, once `hysteresis`
  /// overflows have come in a row, halves the scale (never below min_scale); a clean
  /// step re-arms the hysteresis and, at `growth_interval` clean steps in a row, doubles
  /// the scale if the f32 result is finite (never above max_scale).
  void update(bool overflow) {
    if (overflow) {
      growth_tracker = 0;
      if (hysteresis_left > 1) {
        --hysteresis_left;
      } else {
        scale = std::max(scale * backoff_factor, min_scale);
      }
      return;
    }
    hysteresis_left = hysteresis;
    if (++growth_tracker == growth_interval) {
      growth_tracker = 0;
      const double grown = scale * growth_factor;
      if (grown <= std::numeric_limits<float>::max()) scale = std::min(grown, max_scale);
    }
  }
};

enum class Event { Clean, Inf, NaN };

/// 30 steps mixing clean steps, overflows, runs of overflows and long clean runs.
std::vector<Event> event_sequence() {
  const std::string script = "CCCCICCCCCCCNCCCIICIIICCCCCCCCC";
  std::vector<Event> out;
  for (char c : script) out.push_back(c == 'C' ? Event::Clean : c == 'I' ? Event::Inf : Event::NaN);
  return out;
}

/// The unscaled gradient of parameter p, element i, at step k.
double true_grad(int k, std::size_t p, std::size_t i) {
  return 1e-3 * std::sin(0.7 * k + 1.3 * static_cast<double>(p) + 0.5 * static_cast<double>(i) + 0.1);
}

/// AdamW in f64 (torch.optim.AdamW's formulas), applied to one parameter.
struct AdamWReference {
  std::vector<double> p, m, v;
  int t = 0;
  void step(const std::vector<double>& g, const tmem::optim::AdamWOptions& o) {
    ++t;
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(o.beta1, t)), v_hat = v[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  }
};

enum class StepMode { Step, UnscaleThenStep, StepAsync };

/// Everything an optimizer step may change, as bytes.
std::vector<std::vector<unsigned char>> optimizer_bytes(const tmem::optim::Optimizer<B>& opt) {
  std::vector<std::vector<unsigned char>> out;
  for (const auto& e : opt.entries()) {
    for (const auto* t : {&e.master, &e.first_moment, &e.second_moment, &e.step_state})
      out.push_back(tmem::testing::bytes_of(*t));
    out.push_back(tmem::testing::bytes_of(e.param.value()));
  }
  return out;
}

/// Drives a scaler over event_sequence() on two f16 parameters with f32 masters and
/// AdamW; checks every skip decision, scale, growth count and hysteresis count against
/// ScaleRuleModel, clean steps against AdamWReference, skipped steps bitwise. Returns
/// the final masters.
std::vector<std::vector<double>> run_sequence(const tmem::amp::GradScalerOptions& options, StepMode mode) {
  const std::vector<std::vector<double>> initial = {{0.5, -0.25, 0.125, 1.0, -2.0}, {0.75, 0.3, -0.6}};
  std::vector<tmem::Var<B>> params;
  for (std::size_t p = 0; p < initial.size(); ++p)
    params.push_back(tmem::Var<B>::parameter(
        tmem::Tensor<B>::from_host(tmem::Shape{static_cast<std::int64_t>(initial[p].size())}, initial[p]),
        "w" + std::to_string(p)));
  tmem::amp::MasterWeights<B> masters(params, {.model_dtype = DType::F16});
  const tmem::optim::AdamWOptions adam{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
  tmem::optim::AdamW<B> opt(params, adam);
  masters.attach(opt);
  tmem::amp::GradScaler<B> scaler(options);
  ScaleRuleModel model(options);
  std::vector<AdamWReference> reference;
  for (const auto& w : initial) reference.push_back({w, std::vector<double>(w.size()), std::vector<double>(w.size())});

  const auto events = event_sequence();
  for (int k = 0; k < static_cast<int>(events.size()); ++k) {
    INFO("step " << k << ", scale " << model.scale);
    const Event event = events[static_cast<std::size_t>(k)];
    std::vector<std::vector<double>> seen_grads;  // the 16-bit gradients, unscaled, as the optimizer sees them
    for (std::size_t p = 0; p < params.size(); ++p) {
      std::vector<double> g(initial[p].size());
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = true_grad(k, p, i) * model.scale;
      if (p == static_cast<std::size_t>(k) % 2 && event == Event::Inf) g[1] = std::numeric_limits<double>::infinity();
      if (p == static_cast<std::size_t>(k) % 2 && event == Event::NaN) g[2] = std::nan("");
      const auto grad16 = tmem::Tensor<B>::from_host(params[p].shape(), g, DType::F16, tmem::MemCategory::Gradient);
      params[p].set_grad(grad16);
      auto stored = grad16.to_host<double>();
      for (double& v : stored) v /= model.scale;
      seen_grads.push_back(stored);
    }
    const auto before = optimizer_bytes(opt);
    bool stepped = true;
    switch (mode) {
      case StepMode::Step: stepped = scaler.step(opt); break;
      case StepMode::UnscaleThenStep:
        scaler.unscale_(opt);
        CHECK(params[0].grad().dtype() == DType::F32);  // widened, so small unscaled values survive
        stepped = scaler.step(opt);
        break;
      case StepMode::StepAsync: scaler.step_async(opt); break;
    }
    scaler.update();
    const bool overflow = event != Event::Clean;
    if (mode != StepMode::StepAsync) CHECK(stepped == !overflow);
    model.update(overflow);
    CHECK(scaler.get_scale() == model.scale);
    CHECK(scaler.growth_tracker() == model.growth_tracker);
    CHECK(scaler.hysteresis_left() == model.hysteresis_left);

    if (overflow) {
      CHECK(optimizer_bytes(opt) == before);  // weights, model copies, moments, step powers: untouched
    } else {
      for (std::size_t p = 0; p < params.size(); ++p) {
        reference[p].step(seen_grads[p], adam);
        const auto master = masters.master(p).to_host<double>();
        const auto model_copy = params[p].value().to_host<double>();
        for (std::size_t i = 0; i < master.size(); ++i) {
          CHECK(master[i] == Approx(reference[p].p[i]).epsilon(2e-6));
          CHECK(model_copy[i] == tmem::testing::round_to_significant_bits(master[i], 11));  // f16: 11 bits
        }
      }
    }
    opt.zero_grad();
  }
  std::vector<std::vector<double>> out;
  for (const auto& m : masters.masters()) out.push_back(m.to_host<double>());
  return out;
}

}  // namespace

TEST_CASE("without loss scaling FP16 gradients underflow, the scaler keeps them", "[amp][grad_scaler]") {
  TinyMlp model;
  auto run = [&](DType autocast_dtype, bool autocast_on, tmem::amp::GradScaler<B>* scaler,
                 tmem::optim::Optimizer<B>* opt) {
    for (auto& p : model.parameters()) p.zero_grad();
    tmem::Tape<B> tape;
    tmem::Var<B> loss;
    {
      tmem::amp::Autocast guard(autocast_dtype, autocast_on);
      loss = model.loss(tape);
    }
    if (scaler) {
      scaler->scale(loss).backward();
      scaler->unscale_(*opt);
    } else {
      loss.backward();
    }
    return model.grads();
  };
  const auto reference = run(DType::F16, false, nullptr, nullptr);  // f32 throughout
  const auto plain_f16 = run(DType::F16, true, nullptr, nullptr);
  tmem::optim::SGD<B> sgd(model.parameters(), {.lr = 0.1});
  tmem::amp::GradScaler<B> scaler;
  const auto scaled_f16 = run(DType::F16, true, &scaler, &sgd);
  const auto bf16 = run(DType::BF16, true, nullptr, nullptr);

  const double lost_plain = fraction_zero(plain_f16, reference), lost_scaled = fraction_zero(scaled_f16, reference);
  const double lost_bf16 = fraction_zero(bf16, reference);
  WARN("fraction of nonzero f32 gradient elements that are zero: fp16 autocast unscaled "
       << lost_plain << ", fp16 with GradScaler (scale 65536) " << lost_scaled << ", bf16 unscaled " << lost_bf16
       << "; relative L2 error of the unscaled fp16 gradients " << relative_l2_error(scaled_f16, reference));
  CHECK(lost_plain > 0.5);
  CHECK(lost_scaled < 0.01);
  CHECK(lost_bf16 < 0.01);  // bf16 has f32's exponent range: why the scaler is off for bf16
  CHECK(relative_l2_error(scaled_f16, reference) < 0.02);
}

TEST_CASE("scale(loss) multiplies the loss and every gradient by the scale", "[amp][grad_scaler]") {
  auto w = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{3}, std::vector<double>{0.5, -1.0, 2.0}));
  tmem::amp::GradScaler<B> scaler({.init_scale = 1024.0});
  tmem::Tape<B> tape;
  auto x = tape.input(tmem::Tensor<B>::from_host(tmem::Shape{3}, std::vector<double>{1.0, 2.0, 3.0}));
  auto loss = tmem::sum(tmem::mul(x, w));  // d loss / d w = x
  auto scaled = scaler.scale(loss);
  CHECK(scaled.value().to_host<double>()[0] == (0.5 - 2.0 + 6.0) * 1024.0);
  scaled.backward();
  CHECK(w.grad().to_host<double>() == std::vector<double>{1024.0, 2048.0, 3072.0});
}

TEST_CASE("scale sequence and skip decisions match an independent model, skipped steps change nothing",
          "[amp][grad_scaler]") {
  SECTION("PyTorch's rule: growth_interval 3, no hysteresis") {
    const tmem::amp::GradScalerOptions options{.growth_interval = 3};
    const auto sync = run_sequence(options, StepMode::Step);
    const auto unscaled = run_sequence(options, StepMode::UnscaleThenStep);
    const auto async = run_sequence(options, StepMode::StepAsync);
    CHECK(async == sync);  // the device-side skip gives the same weights, bit for bit
    for (std::size_t p = 0; p < sync.size(); ++p)
      for (std::size_t i = 0; i < sync[p].size(); ++i) CHECK(unscaled[p][i] == Approx(sync[p][i]).epsilon(1e-6));
  }
  SECTION("hysteresis 2, min and max scale") {
    const tmem::amp::GradScalerOptions options{
        .init_scale = 4096.0, .growth_interval = 3, .min_scale = 2048.0, .max_scale = 16384.0, .hysteresis = 2};
    const auto sync = run_sequence(options, StepMode::Step);
    const auto async = run_sequence(options, StepMode::StepAsync);
    CHECK(async == sync);
  }
  SECTION("growth stops where the f32 scale would overflow") {
    const tmem::amp::GradScalerOptions options{.init_scale = 0x1p126, .growth_interval = 1};
    tmem::amp::GradScaler<B> scaler(options);
    auto w = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{1}, std::vector<double>{1.0}));
    tmem::optim::SGD<B> sgd({w}, {.lr = 0.0});
    ScaleRuleModel model(options);
    for (int k = 0; k < 3; ++k) {
      w.set_grad(tmem::Tensor<B>::from_host(tmem::Shape{1}, std::vector<double>{1.0}));
      CHECK(scaler.step(sgd));
      scaler.update();
      model.update(false);
      CHECK(scaler.get_scale() == model.scale);
    }
    CHECK(scaler.get_scale() == 0x1p127);  // 2^128 is inf in f32: kept at 2^127
  }
}

TEST_CASE("the scaler enforces its per-step protocol", "[amp][grad_scaler]") {
  auto w = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{2}, std::vector<double>{1.0, 2.0}));
  tmem::optim::SGD<B> sgd({w}, {.lr = 0.1});
  tmem::amp::GradScaler<B> scaler;
  auto set_grad = [&] { w.set_grad(tmem::Tensor<B>::from_host(tmem::Shape{2}, std::vector<double>{1.0, 1.0})); };

  CHECK_THROWS_AS(scaler.update(), tmem::Error);   // no step recorded
  CHECK_THROWS_AS(scaler.step(sgd), tmem::Error);  // no gradient
  set_grad();
  scaler.unscale_(sgd);
  CHECK_THROWS_WITH(scaler.unscale_(sgd), Catch::Contains("already called"));
  CHECK(scaler.step(sgd));
  CHECK_THROWS_WITH(scaler.step(sgd), Catch::Contains("already called"));
  CHECK_THROWS_WITH(scaler.unscale_(sgd), Catch::Contains("after step"));
  scaler.update();
  CHECK_THROWS_AS(scaler.update(), tmem::Error);  // once per step
  set_grad();
  CHECK(scaler.step(sgd));
  scaler.update(512.0);
  CHECK(scaler.get_scale() == 512.0);
  CHECK_THROWS_AS(tmem::amp::GradScaler<B>({.growth_factor = 1.0}), tmem::Error);
  CHECK_THROWS_AS(tmem::amp::GradScaler<B>({.min_scale = 4.0, .max_scale = 2.0}), tmem::Error);
}

TEST_CASE("the scaler is a no-op when disabled, for f32, and for bf16 unless asked", "[amp][grad_scaler]") {
  auto w = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{2}, std::vector<double>{1.0, 2.0}));
  tmem::optim::SGD<B> sgd({w}, {.lr = 0.5});
  tmem::amp::GradScaler<B> bf16(DType::BF16, {});
  tmem::amp::GradScaler<B> off({.enabled = false});
  tmem::amp::GradScaler<B> bf16_asked(DType::BF16, {.scale_bf16 = true});
  CHECK_FALSE(bf16.is_enabled());
  CHECK_FALSE(off.is_enabled());
  CHECK(bf16_asked.is_enabled());
  CHECK(tmem::amp::GradScaler<B>(DType::F16, {}).is_enabled());
  // No autocast, nothing to underflow: an f32 (or f64) run needs no scaler.
  CHECK_FALSE(tmem::amp::GradScaler<B>(DType::F32, {}).is_enabled());
  CHECK_FALSE(tmem::amp::GradScaler<B>(DType::F64, {}).is_enabled());
  CHECK(bf16.get_scale() == 1.0);

  tmem::Tape<B> tape;
  auto x = tape.input(tmem::Tensor<B>::from_host(tmem::Shape{2}, std::vector<double>{3.0, 4.0}));
  auto loss = tmem::sum(tmem::mul(x, w));
  CHECK(bf16.scale(loss).handle() == loss.handle());
  bf16.scale(loss).backward();
  bf16.unscale_(sgd);
  CHECK(bf16.step(sgd));
  bf16.update();
  CHECK(w.value().to_host<double>() == std::vector<double>{1.0 - 0.5 * 3.0, 2.0 - 0.5 * 4.0});
}

TEST_CASE("scaler state saves and loads exactly, through a map and through text", "[amp][grad_scaler]") {
  const tmem::amp::GradScalerOptions options{
      .init_scale = 1024.0, .growth_interval = 3, .min_scale = 4.0, .max_scale = 0x1p20, .hysteresis = 2};
  auto w = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{1}, std::vector<double>{1.0}));
  tmem::optim::SGD<B> sgd({w}, {.lr = 0.0});
  tmem::amp::GradScaler<B> original(options);
  ScaleRuleModel model(options);
  auto drive = [&](tmem::amp::GradScaler<B>& scaler, bool overflow) {
    w.set_grad(tmem::Tensor<B>::from_host(
        tmem::Shape{1}, std::vector<double>{overflow ? std::numeric_limits<double>::infinity() : 1.0}));
    scaler.step(sgd);
    scaler.update();
  };
  for (bool overflow : {false, false, false, false, true, false}) {
    drive(original, overflow);
    model.update(overflow);
  }
  const tmem::amp::GradScalerState state = original.state();
  const auto map = state.to_map();
  CHECK(map.at("scale") == model.scale);
  CHECK(map.at("_growth_tracker") == model.growth_tracker);
  CHECK(map.at("hysteresis_left") == model.hysteresis_left);
  CHECK(map.at("growth_interval") == 3);
  CHECK(map.at("hysteresis") == 2);
  CHECK(tmem::amp::GradScalerState::from_map(map) == state);
  const std::string text = state.to_string();
  INFO(text);
  CHECK(tmem::amp::GradScalerState::from_string(text) == state);

  tmem::amp::GradScaler<B> from_map, from_text;  // default options, replaced by the loaded ones
  from_map.load_state(tmem::amp::GradScalerState::from_map(map));
  from_text.load_state(tmem::amp::GradScalerState::from_string(text));
  for (auto* loaded : {&from_map, &from_text}) {
    CHECK(loaded->state() == state);
    CHECK(loaded->options().growth_interval == 3);
  }
  for (bool overflow : {true, true, false, false, false, false, false, false, true}) {
    model.update(overflow);
    for (auto* scaler : {&original, &from_map, &from_text}) {
      drive(*scaler, overflow);
      CHECK(scaler->get_scale() == model.scale);
      CHECK(scaler->hysteresis_left() == model.hysteresis_left);
    }
  }
  CHECK_THROWS_AS(tmem::amp::GradScalerState::from_string("scale=abc\n"), tmem::Error);
  auto incomplete = map;
  incomplete.erase("hysteresis_left");
  CHECK_THROWS_WITH(tmem::amp::GradScalerState::from_map(incomplete), Catch::Contains("hysteresis_left"));
}

TEST_CASE("unscale_ and step refuse what the optimizer would refuse, before any gradient changes",
          "[amp][grad_scaler][errors]") {
  using tmem::testing::ErrorContains;
  B be;
  auto param = [&](const char* name) {
    return tmem::Var<B>::parameter(tmem::testing::random_tensor<B>(tmem::Shape{3, 3}, 31, -1.0, 1.0, DType::F32, be),
                                   name);
  };
  // An integer gradient on the second parameter: the first stays scaled.
  const auto a = param("a"), b = param("b");
  tmem::optim::SGD<B> sgd({a, b}, {.lr = 0.1});
  tmem::amp::GradScaler<B> scaler({.init_scale = 4.0});
  a.set_grad(tmem::Tensor<B>::full(tmem::Shape{3, 3}, 4.0, DType::F16, tmem::MemCategory::Gradient, be));
  b.set_grad(tmem::Tensor<B>::zeros(tmem::Shape{3, 3}, DType::I32, tmem::MemCategory::Gradient, be));
  CHECK_THROWS_MATCHES(scaler.unscale_(sgd), tmem::Error,
                       ErrorContains("GradScaler::unscale_: the gradient of 'b' is i32"));
  CHECK(a.grad().dtype() == DType::F16);
  CHECK(a.grad().to_host<double>() == std::vector<double>(9, 4.0));
  CHECK_THROWS_MATCHES(scaler.step(sgd), tmem::Error, ErrorContains("GradScaler::step: the gradient of 'b' is i32"));

  // A backward that failed part way: unscale_ would otherwise replace the partial
  // gradients (set_grad keeps the mark, so the optimizer would refuse them too).
  const auto w1 = param("w1"), w2 = param("w2");
  tmem::optim::SGD<B> both({w1, w2}, {.lr = 0.1});
  const auto input = tmem::testing::random_tensor<B>(tmem::Shape{2, 3}, 32, -1.0, 1.0, DType::F32, be);
  auto micro_batch = [&](bool spoil) {
    tmem::Tape<B> tape(be);
    const auto x = input.clone();
    const auto loss = scaler.scale(tmem::sum(tmem::matmul(tmem::matmul(tape.input(x), w1), w2)));
    if (spoil) x.copy_from(tmem::testing::random_tensor<B>(tmem::Shape{2, 3}, 33, -1.0, 1.0, DType::F32, be));
    tape.backward(loss);
  };
  micro_batch(false);
  CHECK_THROWS_AS(micro_batch(true), tmem::Error);
  const auto w2_partial = w2.grad().to_host<double>();
  for (int use_unscale = 0; use_unscale < 2; ++use_unscale) {
    CHECK_THROWS_MATCHES(use_unscale ? scaler.unscale_(both) : static_cast<void>(scaler.step(both)), tmem::Error,
                         ErrorContains("is from a backward that failed part way"));
    CHECK(w2.grad().to_host<double>() == w2_partial);
  }
  w2.set_grad(w2.grad().clone(tmem::MemCategory::Gradient));
  CHECK(w2.grad_incomplete());  // set_grad keeps the mark; only zero_grad clears it
  both.zero_grad();
  micro_batch(false);
  scaler.unscale_(both);
  CHECK(scaler.step(both));
}

TEST_CASE("a new optimizer at a destroyed one's address gets its own scaler record", "[amp][grad_scaler]") {
  B be;
  const auto w = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{1}, std::vector<double>{1.0}), "w");
  tmem::amp::GradScaler<B> scaler({.init_scale = 2.0});
  std::optional<tmem::optim::SGD<B>> sgd;
  sgd.emplace(std::vector<tmem::Var<B>>{w}, tmem::optim::SgdOptions{.lr = 1.0});
  const auto* address = &*sgd;
  w.set_grad(tmem::Tensor<B>::from_host(tmem::Shape{1}, std::vector<double>{2.0}));
  CHECK(scaler.step(*sgd));  // stepped, no update() yet
  sgd.emplace(std::vector<tmem::Var<B>>{w}, tmem::optim::SgdOptions{.lr = 1.0});
  REQUIRE(&*sgd == address);
  w.set_grad(tmem::Tensor<B>::from_host(tmem::Shape{1}, std::vector<double>{2.0}));
  CHECK(scaler.step(*sgd));  // not "already called": another optimizer
  scaler.update();
  CHECK(w.value().to_host<double>() == std::vector<double>{-1.0});  // 1 - 2/2 - 2/2
}

TEST_CASE("scaler settings and loaded states that contradict each other are refused", "[amp][grad_scaler][errors]") {
  using tmem::testing::ErrorContains;
  CHECK_THROWS_MATCHES(tmem::amp::GradScaler<B>({.max_scale = 1024.0}), tmem::Error,
                       ErrorContains("init_scale 65536 is outside [min_scale, max_scale]"));
  CHECK_THROWS_MATCHES(tmem::amp::GradScaler<B>({.init_scale = 1.0, .min_scale = 1024.0}), tmem::Error,
                       ErrorContains("init_scale 1 is outside"));
  tmem::amp::GradScaler<B> scaler({.growth_interval = 100, .hysteresis = 2});
  const tmem::amp::GradScalerState good = scaler.state();
  auto refused = [&](auto change, const char* message) {
    tmem::amp::GradScalerState bad = good;
    change(bad);
    CHECK_THROWS_MATCHES(scaler.load_state(bad), tmem::Error, ErrorContains(message));
    CHECK_THROWS_MATCHES(tmem::amp::GradScalerState::from_map(bad.to_map()), tmem::Error, ErrorContains(message));
    CHECK(scaler.state() == good);
  };
  refused([](auto& s) { s.hysteresis_left = 3; }, "hysteresis_left 3 must be in [1, hysteresis = 2]");
  refused([](auto& s) { s.growth_tracker = 100; }, "_growth_tracker 100 must be in [0, growth_interval = 100)");
  refused([](auto& s) { s.options.max_scale = 16.0; }, "scale 65536 is outside [min_scale, max_scale]");
  // A bound that f32 cannot hold: the scale is kept in f32, so it is compared in f32.
  tmem::amp::GradScaler<B> odd({.init_scale = 1000.3, .max_scale = 1000.3});
  tmem::amp::GradScaler<B> reloaded;
  reloaded.load_state(odd.state());
  CHECK(reloaded.get_scale() == odd.get_scale());
}
