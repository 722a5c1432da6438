// tests/backend/cuda/test_cuda_fp8_recipe.cu — the FP8 recipe on the GPU (amax and scales
// on the device, cuBLASLt's FP8 GEMMs), runs where a GPU is lent.
//
// References: the delayed-scaling rule in closed form on the host for the roles whose
// tensors are known exactly on both sides (the first linear's input and every weight:
// amax = max |t|, scale = 448 / amax after one step of history); and the plain FP8 step
// for checkpointed ones, bit for bit (the recompute quantizes with the forward's scales,
// and the GPU's GEMMs are deterministic for one shape and stream).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.cuh"

namespace fp8_recipe_cuda_test {
namespace {

namespace tmem = trainmem;
using namespace trainmem::cuda_testing;
using tmem::DType;
using tmem::Shape;

constexpr std::int64_t kBatch = 64, kWidth = 64, kHidden = 128, kClasses = 16;
constexpr int kBlocks = 3, kSteps = 3;

/// n values uniform in [low, high) from a stream seeded by `seed` (the same in every run).
std::vector<double> seeded_uniform(std::uint64_t seed, std::int64_t n, double low, double high) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<double> dist(low, high);
  std::vector<double> out(static_cast<std::size_t>(n));
  for (auto& v : out) v = dist(engine);
  return out;
}

/// Residual blocks x + dropout(down(gelu(up(x)))) and a head, trained by an FP8 TrainStep.
struct Fp8Net {
  explicit Fp8Net(bool checkpointed) : checkpointed(checkpointed) {
    for (int i = 0; i < kBlocks; ++i) {
      up.push_back(param({kHidden, kWidth}, 10 + i, "up" + std::to_string(i)));
      down.push_back(param({kWidth, kHidden}, 20 + i, "down" + std::to_string(i)));
    }
    head = param({kClasses, kWidth}, 30, "head");
    for (int i = 0; i < kBlocks; ++i) {
      params.push_back(up[static_cast<std::size_t>(i)]);
      params.push_back(down[static_cast<std::size_t>(i)]);
    }
    params.push_back(head);
    optimizer = std::make_unique<tmem::optim::AdamW<Gpu>>(params, tmem::optim::AdamWOptions{.lr = 1e-2});
    tmem::amp::TrainStepOptions options{.precision = DType::BF16};
    options.fp8 = tmem::amp::DelayedScaling{.history_length = 2};
    step = std::make_unique<tmem::amp::TrainStep<Gpu>>(*optimizer, options);
  }
  static tmem::Var<Gpu> param(Shape shape, std::uint64_t seed, const std::string& name) {
    const auto n = shape.numel();
    return tmem::Var<Gpu>::parameter(
        tmem::Tensor<Gpu>::from_host(std::move(shape), seeded_uniform(seed, n, -0.2, 0.2), DType::F32), name);
  }
  static std::vector<double> input(int k) {
    return seeded_uniform(100 + static_cast<std::uint64_t>(k), kBatch * kWidth, -2.0 - k, 2.0 + k);
  }

  /// One step; returns the gradients before the update, as bits.
  std::vector<std::vector<std::uint32_t>> train(int k) {
    backward(k);
    std::vector<std::vector<std::uint32_t>> grads;
    for (const auto& p : params) {
      std::vector<std::uint32_t> bits;
      for (float v : p.grad().to_host<float>()) bits.push_back(std::bit_cast<std::uint32_t>(v));
      grads.push_back(std::move(bits));
    }
    step->update();
    return grads;
  }
  /// Step k's forward and backward (`poisoned`: one input is inf), not its update.
  void backward(int k, bool poisoned = false) {
    tmem::Tape<Gpu> tape;
    tape.manual_seed(7 + static_cast<std::uint64_t>(k));
    std::vector<std::int32_t> labels(kBatch);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>((i * 5 + k) % kClasses);
    const tmem::Var<Gpu> loss = step->forward([&] {
      std::vector<double> x = input(k);
      if (poisoned) x[3] = std::numeric_limits<double>::infinity();
      tmem::Var<Gpu> h = tape.input(tmem::Tensor<Gpu>::from_host(Shape{kBatch, kWidth}, x, DType::F32));
      for (int i = 0; i < kBlocks; ++i) {
        auto block = [this, i](const tmem::Var<Gpu>& x) {
          return tmem::add(x, tmem::dropout(tmem::linear(tmem::gelu(tmem::linear(x, up[static_cast<std::size_t>(i)])),
                                                         down[static_cast<std::size_t>(i)]),
                                            0.1f));
        };
        h = checkpointed ? tmem::checkpoint(tape, block, h) : block(h);
      }
      return tmem::cross_entropy(tmem::linear(h, head),
                                 tmem::Tensor<Gpu>::from_host(Shape{kBatch}, labels, DType::I32));
    });
    step->backward(loss);
  }

  bool checkpointed;
  std::vector<tmem::Var<Gpu>> up, down, params;
  tmem::Var<Gpu> head;
  std::unique_ptr<tmem::optim::AdamW<Gpu>> optimizer;
  std::unique_ptr<tmem::amp::TrainStep<Gpu>> step;
};

float amax_of(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(static_cast<double>(static_cast<float>(x))));
  return static_cast<float>(m);
}

}  // namespace

TEST_CASE("cuda fp8 recipe: scales from device amaxes follow the closed form", "[cuda][fp8]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Fp8Net net(false);
  const auto up0 = net.up[0].value().to_host<double>();  // f32 before the first step writes it
  net.train(0);
  const auto& s = *net.step->fp8();
  const auto scale = s.scales()->scale.to_host<float>();
  const std::size_t w_up0 = *s.find_weight(net.up[0].value());
  CHECK(scale[s.role_index(w_up0, tmem::amp::Fp8Role::Input)] == 448.0f / amax_of(Fp8Net::input(0)));
  CHECK(scale[s.role_index(w_up0, tmem::amp::Fp8Role::Weight)] == 448.0f / amax_of(up0));
  for (std::size_t r = 0; r < s.role_count(); ++r) {
    INFO("role " << r);
    CHECK(std::isfinite(scale[r]));
    CHECK(scale[r] > 0.0f);
  }
}

TEST_CASE("cuda fp8 recipe: checkpointed FP8 steps equal the plain FP8 steps bitwise", "[cuda][fp8]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Fp8Net plain(false), checkpointed(true);
  for (int k = 0; k < kSteps; ++k) {
    INFO("step " << k);
    CHECK(checkpointed.train(k) == plain.train(k));
    CHECK(checkpointed.step->fp8()->scales()->scale.to_host<float>() ==
          plain.step->fp8()->scales()->scale.to_host<float>());
  }
}

TEST_CASE("cuda fp8 recipe: a bf16 + FP8 update waits for nothing, and an inf amax skips it on the device, bitwise",
          "[cuda][fp8]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  Fp8Net net(false);
  net.train(0);
  const auto weights = [&] {
    std::vector<std::vector<float>> out;
    for (const auto& p : net.params) out.push_back(p.value().to_host<float>());
    out.push_back(net.step->fp8()->scales()->scale.to_host<float>());
    return out;
  };
  for (int k = 1; k <= 2; ++k) {
    const bool poisoned = k == 2;
    INFO("step " << k << (poisoned ? ", poisoned" : ""));
    net.backward(k, poisoned);
    const auto before = weights();
    gpu.synchronize();
    const auto syncs = gpu.host_syncs();
    const auto stepped = net.step->update();
    CHECK(gpu.host_syncs() == syncs);  // before: one, the host read of the FP8 amax flag
    CHECK(stepped.decided_on_device());
    CHECK(static_cast<bool>(stepped) == !poisoned);
    CHECK((weights() == before) == poisoned);
  }
  CHECK(net.step->skipped_steps() == 1);
}

}  // namespace fp8_recipe_cuda_test
