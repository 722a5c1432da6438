// tests/nn/test_custom_layer.cpp — a layer a user writes from the public API alone: an
// RMSNorm + SwiGLU feed-forward block (LLaMA's: x + W2 (silu(W1 rms(x)) * W3 rms(x))) as an
// nn::Module, run under checkpoint_sequential with save_matmuls. Checked against
// independent references: its gradients against F64 central differences; the selective
// checkpointed step's gradients bitwise equal to the plain step's; what save_matmuls keeps
// lies strictly between full recompute and no checkpointing; names are hierarchical.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "trainmem/trainmem.hpp"

namespace custom_layer_test {

namespace tmem = trainmem;
using Backend = tmem::cpu::Backend;
using Var = tmem::Var<Backend>;

/// \brief The user's block: RMSNorm, then a gated (SwiGLU) MLP, with a residual.
struct SwiGluBlock : tmem::nn::Module<Backend> {
  SwiGluBlock(std::int64_t dim, std::int64_t hidden, tmem::nn::Init& init, tmem::DType dtype)
      : tmem::nn::Module<Backend>("SwiGluBlock"),
        gate(dim, hidden, init, false, dtype, "gate"),
        up(dim, hidden, init, false, dtype, "up"),
        down(hidden, dim, init, false, dtype, "down") {
    norm_weight = register_parameter(
        "norm.weight", init.parameter<Backend>(tmem::Shape{dim}, init.uniform(dim, 0.5, 1.5), dtype, "norm.weight"));
    register_module("gate", gate);
    register_module("up", up);
    register_module("down", down);
  }
  Var operator()(const Var& x) const {
    const Var h = tmem::rms_norm(x, norm_weight);
    const Var g = gate(h);
    return x + down(g * tmem::sigmoid(g) * up(h));
  }
  Var norm_weight;
  tmem::nn::Linear<Backend> gate, up, down;
};

/// \brief Blocks as the stages of a chain.
struct Stack : tmem::nn::Module<Backend> {
  Stack(int depth, std::int64_t dim, std::int64_t hidden, tmem::DType dtype) : tmem::nn::Module<Backend>("Stack") {
    tmem::nn::Init init(5);
    for (int i = 0; i < depth; ++i) blocks.emplace_back(dim, hidden, init, dtype);
    for (int i = 0; i < depth; ++i) register_module("blocks." + std::to_string(i), blocks[i]);
    for (int i = 0; i < depth; ++i) layers.push_back([this, i](const Var& x) { return blocks[i](x); });
  }
  std::vector<SwiGluBlock> blocks;
  std::vector<tmem::Layer<Backend>> layers;
};

std::vector<double> wave(std::size_t n) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(0.61 * static_cast<double>(i) + 0.3);
  return v;
}

}  // namespace custom_layer_test

TEST_CASE("a user's RMSNorm + SwiGLU block: F64 gradients, bitwise under save_matmuls, kept bytes", "[nn][custom]") {
  using namespace custom_layer_test;
  constexpr std::int64_t rows = 6, dim = 8, hidden = 12;

  SECTION("names are hierarchical") {
    const Stack stack(2, dim, hidden, tmem::DType::F32);
    std::vector<std::string> names;
    for (const auto& p : stack.named_parameters()) names.push_back(p.name);
    CHECK(names == std::vector<std::string>{"blocks.0.norm.weight", "blocks.0.gate.weight", "blocks.0.up.weight",
                                            "blocks.0.down.weight", "blocks.1.norm.weight", "blocks.1.gate.weight",
                                            "blocks.1.up.weight", "blocks.1.down.weight"});
    CHECK(stack.parameter_count() == 2 * (dim + 3 * dim * hidden));
  }

  SECTION("F64 gradients of every parameter and the input against central differences") {
    Stack stack(2, dim, hidden, tmem::DType::F64);
    const auto input = tmem::Tensor<Backend>::from_host({rows, dim}, wave(rows * dim), tmem::DType::F64);
    auto loss = [&](tmem::Tape<Backend>& tape) {
      const Var y = tmem::checkpoint_sequential(tape, stack.layers, 2, tape.input(input),
                                                {.policy = tmem::policy::save_matmuls()});
      return tmem::sum(y * y);
    };
    const auto params = trainmem::testing::check_parameter_gradients(loss, stack.parameters());
    INFO(params.report());
    CHECK(params.ok);
    const auto inputs = trainmem::testing::check_gradients(
        [&](tmem::Tape<Backend>& tape, const std::vector<Var>& in) {
          const Var y =
              tmem::checkpoint_sequential(tape, stack.layers, 2, in[0], {.policy = tmem::policy::save_matmuls()});
          return tmem::sum(y * y);
        },
        {input});
    INFO(inputs.report());
    CHECK(inputs.ok);
  }

  SECTION("save_matmuls: gradients bitwise those of the plain step; kept bytes between the extremes") {
    // Counts the activations only (parameters live on the default backend); declared
    // first, as the parameters' gradients are allocated on it.
    Backend backend;
    Stack stack(4, dim, hidden, tmem::DType::F32);
    const std::vector<double> values = wave(rows * dim);
    const std::vector<float> x_values(values.begin(), values.end());
    // Gradients (input first) and the peak saved bytes of one step under `options`, or plain.
    auto step = [&](const tmem::CheckpointOptions* options) {
      for (auto& p : stack.parameters()) p.zero_grad();
      backend.memory().reset_peak();
      tmem::Tape<Backend> tape(backend);
      const Var x = tape.input(tmem::Tensor<Backend>::from_host({rows, dim}, x_values, tmem::DType::F32,
                                                                tmem::MemCategory::Temporary, backend),
                               true, "x");
      Var h = x;
      if (options) h = tmem::checkpoint_sequential(tape, stack.layers, 4, x, *options);
      else
        for (const auto& layer : stack.layers) h = layer(h);
      const Var loss = tmem::mean(h * h);
      const std::int64_t saved = backend.memory().peak(tmem::MemCategory::SavedActivation);
      tape.backward(loss);
      std::vector<std::vector<float>> grads{x.grad().to_host()};
      for (const auto& p : stack.parameters()) grads.push_back(p.grad().to_host());
      return std::pair{grads, saved};
    };
    const tmem::CheckpointOptions selective{.policy = tmem::policy::save_matmuls()}, full{};
    const auto [plain_grads, plain_saved] = step(nullptr);
    const auto [selective_grads, selective_saved] = step(&selective);
    const auto [full_grads, full_saved] = step(&full);
    CHECK(selective_grads == plain_grads);  // float vectors compared element by element, exactly
    CHECK(full_grads == plain_grads);
    // Three of the four blocks are regions (the last segment is not): under save_matmuls
    // they keep their input and the matmul outputs later ops save, under full recompute
    // their input only.
    CHECK(full_saved < selective_saved);
    CHECK(selective_saved < plain_saved);
    // The matmul outputs a region keeps: gate's (sigmoid and the product save it) and up's
    // (the product saves it), [rows, hidden] f32 each; down's output is saved by nothing.
    CHECK(selective_saved - full_saved == 3 * 2 * rows * hidden * 4);
  }
}
