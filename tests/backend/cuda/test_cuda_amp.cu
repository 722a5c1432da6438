// tests/backend/cuda/test_cuda_amp.cu — the loss scaler's device kernels and the fused optimizer pass.
//
// References are host computations written out here: the unscaled value of each
// element is narrow(widen(g) * (1/scale)) in the element's accumulator type; the scale
// update is update_scale_state run on the host over the same overflow sequence;
// sum of squares is an FP64 loop; optimizer steps are the CPU backend's apply_update.
// A skipped step (found_inf set) must leave parameter, states and model copy bit for
// bit as they were.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_support.cuh"

namespace {

namespace tmem = trainmem;
using namespace trainmem::cuda_testing;
using tmem::DType;
using tmem::Shape;

tmem::Tensor<Gpu> scalar_f32(float value) {
  return tmem::Tensor<Gpu>::from_host(Shape{}, std::vector<double>{value}, DType::F32);
}
float read_f32(const tmem::Tensor<Gpu>& t) { return t.to_host<float>()[0]; }

/// The host's unscaled element: widened, multiplied in the accumulator type by the
/// reciprocal formed in f64 and rounded to f32 (as both backends form it), rounded back.
double unscaled(double g, float scale, DType dtype) {
  const auto inv = static_cast<float>(1.0 / static_cast<double>(scale));
  if (dtype == DType::F64) return g * static_cast<double>(inv);
  return rounded_to({static_cast<double>(static_cast<float>(g) * inv)}, dtype)[0];
}

}  // namespace

TEST_CASE("cuda amp: unscale_grads over many tensors sets found_inf only on inf/NaN", "[cuda][amp]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16, DType::F64};
  // 61 tensors: more than one launch's 48, sizes across the 16384-element chunk, one empty.
  std::vector<std::vector<double>> values;
  std::vector<tmem::Tensor<Gpu>> grads;
  for (int i = 0; i < 61; ++i) {
    const std::int64_t n = i == 7 ? 0 : (i % 5 == 0 ? 40000 + i : 1 + random.integer(0, 3000));
    const DType dtype = dtypes[i % 4];
    values.push_back(rounded_to(random.uniform(n, -1000.0, 1000.0), dtype));
    grads.push_back(tmem::Tensor<Gpu>::from_host(Shape{n}, values.back(), dtype));
  }
  auto& gpu = Gpu::default_instance();
  auto found_inf = scalar_f32(0.0f);

  for (const float scale : {1024.0f, 3.0f}) {
    INFO("scale " << scale);
    gpu.unscale_grads(grads, scalar_f32(scale), found_inf);
    CHECK(read_f32(found_inf) == 0.0f);
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const auto got = grads[i].to_host<double>();
      for (std::size_t j = 0; j < got.size(); ++j) {
        values[i][j] = unscaled(values[i][j], scale, grads[i].dtype());
        if (got[j] != values[i][j]) {
          INFO("tensor " << i << " (" << dtype_name(grads[i].dtype()) << ") element " << j);
          REQUIRE(got[j] == values[i][j]);
        }
      }
    }
  }

  // One bad element in a tensor of the second launch raises the flag; a clean call never clears it.
  for (const double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    INFO("injected " << bad);
    auto poisoned = values[52];
    poisoned[poisoned.size() / 2] = bad;
    grads[52] =
        tmem::Tensor<Gpu>::from_host(Shape{static_cast<std::int64_t>(poisoned.size())}, poisoned, grads[52].dtype());
    found_inf = scalar_f32(0.0f);
    gpu.unscale_grads(grads, scalar_f32(1.0f), found_inf);
    CHECK(read_f32(found_inf) == 1.0f);
    grads[52] = tmem::Tensor<Gpu>::from_host(Shape{static_cast<std::int64_t>(values[52].size())}, values[52],
                                             grads[52].dtype());
    gpu.unscale_grads(grads, scalar_f32(1.0f), found_inf);
    CHECK(read_f32(found_inf) == 1.0f);
  }

  // A finite f16 gradient that overflows when unscaled (60000 / 0.5) is an overflow too.
  auto big = tmem::Tensor<Gpu>::from_host(Shape{3}, std::vector<double>{1.0, 60000.0, -2.0}, DType::F16);
  found_inf = scalar_f32(0.0f);
  gpu.unscale_grads(std::vector<tmem::Tensor<Gpu>>{big}, scalar_f32(0.5f), found_inf);
  CHECK(read_f32(found_inf) == 1.0f);
}

TEST_CASE("cuda amp: update_scale follows update_scale_state step by step", "[cuda][amp]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  tmem::ScaleUpdateArgs args;
  args.growth_interval = 3;
  args.hysteresis = 2;
  args.min_scale = 1.0f / 64.0f;
  args.max_scale = 1u << 20;
  float scale = 65536.0f;
  std::int32_t growth = 0, hysteresis = args.hysteresis;
  auto d_scale = scalar_f32(scale);
  auto d_growth = tmem::Tensor<Gpu>::from_host(Shape{}, std::vector<double>{0}, DType::I32);
  auto d_hysteresis = tmem::Tensor<Gpu>::from_host(Shape{}, std::vector<double>{double(args.hysteresis)}, DType::I32);
  // Runs of overflows long enough to reach min_scale, and clean runs long enough to grow to max_scale.
  for (int step = 0; step < 400; ++step) {
    const bool overflow = (step / 40) % 2 == 0 ? random.integer(0, 3) != 0 : random.integer(0, 9) == 0;
    auto d_found = scalar_f32(overflow ? 1.0f : 0.0f);
    Gpu::default_instance().update_scale(d_scale, d_growth, d_hysteresis, d_found, args);
    tmem::update_scale_state(scale, growth, hysteresis, overflow, args);
    INFO("step " << step << (overflow ? " (overflow)" : ""));
    REQUIRE(read_f32(d_scale) == scale);
    REQUIRE(d_growth.to_host<double>()[0] == growth);
    REQUIRE(d_hysteresis.to_host<double>()[0] == hysteresis);
  }
  CHECK(scale >= args.min_scale);
  CHECK(scale <= args.max_scale);
}

TEST_CASE("cuda amp: sum_squares accumulates sum(x^2) in the accumulator type", "[cuda][amp]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F64})
    for (std::int64_t n : {1, 1000, 1 << 20}) {
      INFO(dtype_name(dtype) << " n=" << n);
      const auto x = rounded_to(random.uniform(n, -2.0, 2.0), dtype);
      double reference = 1.5;
      for (double v : x) reference += v * v;
      auto acc = scalar_f32(1.5f);
      Gpu::default_instance().sum_squares(tmem::Tensor<Gpu>::from_host(Shape{n}, x, dtype), acc);
      // f32 storage of the total (6e-8) plus a tree of f32 partial sums over up to 2^20 terms.
      CHECK(std::fabs(read_f32(acc) - reference) <= 2e-6 * reference);
    }
}

namespace {

/// An update with no arithmetic: both backends hand the copy step the same f32 value.
struct SetToGrad {
  template <class T>
  TRAINMEM_HOST_DEVICE void operator()(T& p, T g, T&, T&) const {
    p = g;
  }
};

/// One optimizer pass on `backend` over the given host state; returns param, s1, s2, copy.
template <class B, class Update>
std::vector<std::vector<double>> optimizer_pass(B& backend, Update update,
                                                const std::vector<std::vector<double>>& state, DType grad_dtype,
                                                DType copy_dtype, float found_inf, bool use_flag,
                                                tmem::CopyRounding rounding = {}) {
  const auto n = static_cast<std::int64_t>(state[0].size());
  auto make = [&](const std::vector<double>& v, DType dtype) {
    return tmem::Tensor<B>::from_host(Shape{n}, v, dtype, tmem::MemCategory::Temporary, backend);
  };
  auto param = make(state[0], DType::F32), grad = make(state[1], grad_dtype);
  auto s1 = make(state[2], DType::F32), s2 = make(state[3], DType::F32), copy = make(state[4], copy_dtype);
  const auto flag = use_flag ? tmem::Tensor<B>::from_host(Shape{}, std::vector<double>{found_inf}, DType::F32,
                                                          tmem::MemCategory::Temporary, backend)
                             : tmem::Tensor<B>();
  backend.apply_update(update, param, grad, s1, s2, copy, flag, rounding);
  return {param.template to_host<double>(), s1.template to_host<double>(), s2.template to_host<double>(),
          copy.template to_host<double>()};
}

}  // namespace

TEST_CASE("cuda amp: fused SGD and AdamW passes match the CPU, and found_inf skips bit for bit", "[cuda][amp][optim]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  const std::int64_t n = 70001;
  const tmem::math::AdamWUpdate adamw{
      1e-3, 0.9, 0.999, 1e-8, 0.01, 1.0 / 1024.0, 1.0 - std::pow(0.9, 3.0), 1.0 - std::pow(0.999, 3.0)};
  const tmem::math::SgdUpdate sgd{0.05, 0.9, 0.1, 1e-4, 1.0 / 1024.0, true, false};
  for (DType grad_dtype : {DType::BF16, DType::F16, DType::F32})
    for (DType copy_dtype : {DType::BF16, DType::F16}) {
      INFO("grad " << dtype_name(grad_dtype) << ", model copy " << dtype_name(copy_dtype));
      const std::vector<std::vector<double>> state{
          rounded_to(random.uniform(n), DType::F32), rounded_to(random.uniform(n, -2000, 2000), grad_dtype),
          rounded_to(random.uniform(n, -0.01, 0.01), DType::F32), rounded_to(random.uniform(n, 0.0, 1e-4), DType::F32),
          rounded_to(random.uniform(n), copy_dtype)};
      auto check_update = [&](auto update, const char* name) {
        INFO(name);
        const auto cpu = optimizer_pass(Cpu::default_instance(), update, state, grad_dtype, copy_dtype, 0.0f, false);
        const auto gpu = optimizer_pass(Gpu::default_instance(), update, state, grad_dtype, copy_dtype, 0.0f, false);
        const auto flag_clear =
            optimizer_pass(Gpu::default_instance(), update, state, grad_dtype, copy_dtype, 0.0f, true);
        const auto flag_set =
            optimizer_pass(Gpu::default_instance(), update, state, grad_dtype, copy_dtype, 1.0f, true);
        // Contraction into FMAs may differ between compilers: f32 rounding, not bits.
        for (std::size_t i = 0; i < 3; ++i) CHECK(relative_error(gpu[i], cpu[i]) <= 1e-6);
        CHECK(relative_error(gpu[3], cpu[3]) <= tolerance(copy_dtype));
        CHECK(flag_clear == gpu);        // a clear flag is no flag
        CHECK(flag_set[0] == state[0]);  // a set flag changes nothing
        CHECK(flag_set[1] == state[2]);
        CHECK(flag_set[2] == state[3]);
        CHECK(flag_set[3] == state[4]);
      };
      check_update(adamw, "AdamW");
      check_update(sgd, "SGD");
    }
}

TEST_CASE("cuda amp: stochastically rounded bf16 copies equal the CPU's bits", "[cuda][amp][optim]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  const std::int64_t n = 50003;
  const std::vector<std::vector<double>> state{std::vector<double>(n, 0.0), rounded_to(random.uniform(n), DType::F32),
                                               std::vector<double>(n, 0.0), std::vector<double>(n, 0.0),
                                               std::vector<double>(n, 0.0)};
  const tmem::CopyRounding rounding{tmem::RoundingMode::Stochastic, {random.seed(), 4 * 1000}};
  const auto cpu =
      optimizer_pass(Cpu::default_instance(), SetToGrad{}, state, DType::F32, DType::BF16, 0.0f, false, rounding);
  const auto gpu =
      optimizer_pass(Gpu::default_instance(), SetToGrad{}, state, DType::F32, DType::BF16, 0.0f, false, rounding);
  CHECK(gpu[0] == state[1]);
  CHECK(gpu[3] == cpu[3]);
  const auto nearest = rounded_to(state[1], DType::BF16);
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < n; ++i) differ += gpu[3][i] != nearest[i];
  CHECK(differ > n / 10);  // about half round the other way; none would under round-to-nearest
}

TEST_CASE("cuda amp: AdamW and SGD steps under a device StepControl match the CPU", "[cuda][amp][optim]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  const std::int64_t rows = 33, cols = 70;
  const auto initial = random.uniform(rows * cols);
  std::vector<std::vector<double>> grads;
  for (int step = 0; step < 4; ++step) grads.push_back(random.uniform(rows * cols, -500.0, 500.0));
  const double overflow[] = {0.0, 1.0, 0.0, 0.0};  // the second step is cancelled on the device

  // Four steps with the gradient divided by a device loss scale; returns the parameter.
  auto train = [&]<class B>(B& backend, auto make_optimizer) {
    auto param = tmem::Var<B>::parameter(
        tmem::Tensor<B>::from_host(Shape{rows, cols}, initial, DType::F32, tmem::MemCategory::Parameter, backend), "w");
    auto optimizer = make_optimizer(std::vector<tmem::Var<B>>{param});
    auto scalar = [&](double v) {
      return tmem::Tensor<B>::from_host(Shape{}, std::vector<double>{v}, DType::F32, tmem::MemCategory::Temporary,
                                        backend);
    };
    for (int step = 0; step < 4; ++step) {
      param.set_grad(
          tmem::Tensor<B>::from_host(Shape{rows, cols}, grads[step], DType::F32, tmem::MemCategory::Gradient, backend));
      tmem::optim::StepControl<B> control;
      control.grad_divisor = scalar(1024.0);
      control.found_inf = scalar(overflow[step]);
      optimizer.step(control);
    }
    return param.value().template to_host<double>();
  };
  auto adamw = []<class B>(std::vector<tmem::Var<B>> p) {
    return tmem::optim::AdamW<B>(std::move(p), tmem::optim::AdamWOptions{});
  };
  auto sgd = []<class B>(std::vector<tmem::Var<B>> p) {
    tmem::optim::SgdOptions options;
    options.lr = 0.01;
    options.momentum = 0.9;
    return tmem::optim::SGD<B>(std::move(p), options);
  };
  for (const auto& [name, cpu, gpu] :
       {std::tuple{"AdamW", train(Cpu::default_instance(), adamw), train(Gpu::default_instance(), adamw)},
        std::tuple{"SGD", train(Cpu::default_instance(), sgd), train(Gpu::default_instance(), sgd)}}) {
    INFO(name);
    CHECK(relative_error(gpu, cpu) <= 1e-6);
    CHECK(relative_error(gpu, initial) > 1e-4);  // it did move
  }
}

TEST_CASE("cuda amp: GradScaler skips a step with an inf gradient on the device and backs off", "[cuda][amp]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  tmem::nn::Init init(random.seed());
  tmem::nn::Linear<Gpu> fc(16, 8, init);
  tmem::optim::AdamW<Gpu> optimizer(fc.parameters(), tmem::optim::AdamWOptions{});
  tmem::amp::GradScalerOptions options;
  options.init_scale = 1024.0;
  options.growth_interval = 2;
  tmem::amp::GradScaler<Gpu> scaler(DType::F16, options);
  const auto x_values = random.uniform(4 * 16);

  auto train_step = [&](bool poison) {
    optimizer.zero_grad();
    tmem::Tape<Gpu> tape;
    auto x = tape.input(tmem::Tensor<Gpu>::from_host(Shape{4, 16}, x_values, DType::F32));
    {
      tmem::amp::Autocast guard(DType::F16);
      tape.backward(scaler.scale(tmem::mean(fc(x))));
    }
    if (poison) {  // one inf in the weight gradient, as an overflowing backward leaves it
      const auto& grad = fc.weight().grad();
      auto values = grad.to_host<double>();
      values[3] = INFINITY;
      grad.copy_from(tmem::Tensor<Gpu>::from_host(grad.shape(), values, grad.dtype()));
    }
    scaler.step_async(optimizer);  // no host read: the update passes skip on the device
    scaler.update();
  };
  const auto before = fc.weight().value().to_host<double>();
  train_step(true);
  CHECK(fc.weight().value().to_host<double>() == before);  // skipped, bit for bit
  CHECK(scaler.get_scale() == 512.0);
  CHECK(scaler.growth_tracker() == 0);
  train_step(false);
  const auto after = fc.weight().value().to_host<double>();
  CHECK(after != before);
  for (double v : after) CHECK(std::isfinite(v));
  CHECK(scaler.get_scale() == 512.0);
  CHECK(scaler.growth_tracker() == 1);
  train_step(false);
  CHECK(scaler.get_scale() == 1024.0);  // two clean steps: growth
  CHECK(scaler.growth_tracker() == 0);
}

TEST_CASE("cuda amp: fp32_grads sums 4 bf16 micro-batches into the f32 hand sum bit for bit",
          "[cuda][amp][fp32_grads]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  constexpr std::int64_t kIn = 24, kHidden = 40, kOut = 8, kRows = 16;
  constexpr int kMicro = 4;
  struct Net {
    explicit Net(bool fp32_grads)
        : init(11),
          fc1(kIn, kHidden, init, true, DType::F32, "fc1"),
          fc2(kHidden, kOut, init, true, DType::F32, "fc2") {
      std::vector<tmem::Var<Gpu>> ps = params();
      masters = std::make_unique<tmem::amp::MasterWeights<Gpu>>(
          ps, tmem::amp::MasterWeightsOptions{.model_dtype = DType::BF16, .fp32_grads = fp32_grads});
    }
    std::vector<tmem::Var<Gpu>> params() const {
      std::vector<tmem::Var<Gpu>> ps = fc1.parameters();
      for (const auto& p : fc2.parameters()) ps.push_back(p);
      return ps;
    }
    void backward(int k) const {
      std::vector<double> x, y;
      for (std::int64_t i = 0; i < kRows * kIn; ++i) x.push_back(std::sin(0.37 * static_cast<double>(i) + 1.3 * k));
      for (std::int64_t r = 0; r < kRows; ++r) y.push_back(static_cast<double>((3 * r + k) % kOut));
      tmem::Tape<Gpu> tape;
      auto input = tape.input(tmem::Tensor<Gpu>::from_host(Shape{kRows, kIn}, x));
      const auto labels = tmem::Tensor<Gpu>::from_host(Shape{kRows}, y, DType::I32);
      tmem::Var<Gpu> loss;
      {
        tmem::amp::Autocast guard(DType::BF16);
        loss = tmem::cross_entropy(fc2(tmem::tanh(fc1(input))), labels);
      }
      tape.backward(loss);
    }
    std::vector<std::vector<float>> grads() const {
      std::vector<std::vector<float>> out;
      for (const auto& p : params()) out.push_back(p.grad().to_host<float>());
      return out;
    }
    tmem::nn::Init init;
    tmem::nn::Linear<Gpu> fc1, fc2;
    std::unique_ptr<tmem::amp::MasterWeights<Gpu>> masters;
  };
  // The hand sum: each micro-batch's bf16 gradient alone, widened, added in f32 on the host in order.
  Net alone(false);
  std::vector<std::vector<float>> reference;
  for (int k = 0; k < kMicro; ++k) {
    for (const auto& p : alone.params()) p.zero_grad();
    alone.backward(k);
    for (const auto& p : alone.params()) REQUIRE(p.grad().dtype() == DType::BF16);
    const auto g = alone.grads();
    if (k == 0) reference = g;
    else
      for (std::size_t i = 0; i < g.size(); ++i)
        for (std::size_t j = 0; j < g[i].size(); ++j) reference[i][j] += g[i][j];
  }
  Net bf16_sum(false), f32_sum(true);
  for (int k = 0; k < kMicro; ++k) {
    bf16_sum.backward(k);
    f32_sum.backward(k);
  }
  for (const auto& p : f32_sum.params()) CHECK(p.grad().dtype() == DType::F32);
  CHECK(bf16_sum.grads() != reference);
  CHECK(f32_sum.grads() == reference);
}
