// tests/nn/test_options_and_names.cpp — modules built from options structs, names that
// come from register_module alone, and nn::RMSNorm against a hand FP64 computation.
//
// References: the positional constructors (an options struct must build the same
// module, weight for weight, from the same Init seed), the names a user expects from
// the registration paths, and y = x / sqrt(mean(x^2) + eps) * w written out in doubles.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

namespace options_test {

namespace tmem = trainmem;
using Cpu = tmem::cpu::Backend;
using CpuVar = tmem::Var<Cpu>;
using CpuTensor = tmem::Tensor<Cpu>;

std::vector<std::string> names_of(const tmem::nn::Module<Cpu>& m) {
  std::vector<std::string> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.name);
  return out;
}
std::vector<std::string> var_names_of(const tmem::nn::Module<Cpu>& m) {
  std::vector<std::string> out;
  for (const auto& p : m.parameters()) out.push_back(p.name());
  return out;
}

/// A user's block: no name passed to any submodule; register_module alone names them.
struct Block : tmem::nn::Module<Cpu> {
  explicit Block(tmem::nn::Init& init)
      : tmem::nn::Module<Cpu>("Block"),
        norm({.dim = 4}),
        fc({.in = 4, .out = 6, .bias = false}, init),
        proj({.in = 6, .out = 4}, init) {
    register_module("norm", norm);
    register_module("fc", fc);
    register_module("proj", proj);
  }
  CpuVar operator()(const CpuVar& x) const { return x + proj(tmem::silu(fc(norm(x)))); }
  tmem::nn::RMSNorm<Cpu> norm;
  tmem::nn::Linear<Cpu> fc, proj;
};

struct Net : tmem::nn::Module<Cpu> {
  Net() : tmem::nn::Module<Cpu>("Net") {
    tmem::nn::Init init(1);
    for (int i = 0; i < 2; ++i) blocks.emplace_back(init);
    for (int i = 0; i < 2; ++i) register_module("blocks." + std::to_string(i), blocks[i]);
  }
  std::vector<Block> blocks;
};

}  // namespace options_test

TEST_CASE("options structs build the same modules as the positional constructors", "[nn][options]") {
  using namespace options_test;
  namespace nn = tmem::nn;
  SECTION("Linear") {
    nn::Init a(7), b(7);
    const nn::Linear<Cpu> positional(5, 3, a, false, tmem::DType::F64, "fc");
    const nn::Linear<Cpu> options({.in = 5, .out = 3, .bias = false, .dtype = tmem::DType::F64, .name = "fc"}, b);
    CHECK(options.parameters().size() == 1);
    CHECK(options.weight().dtype() == tmem::DType::F64);
    CHECK(options.weight().name() == "fc.weight");
    CHECK(options.weight().value().to_host<double>() == positional.weight().value().to_host<double>());
    nn::Init c(7);
    const nn::Linear<Cpu> defaults({.in = 5, .out = 3}, c);
    CHECK(names_of(defaults) == std::vector<std::string>{"weight", "bias"});
    CHECK(defaults.weight().name() == "linear.weight");
    CHECK_THROWS_WITH(nn::Linear<Cpu>({.out = 3}, c), Catch::Contains("nn::Linear: extents must be positive"));
  }
  SECTION("LayerNorm and RMSNorm") {
    const nn::LayerNorm<Cpu> ln({.dim = 6, .eps = 1e-3, .dtype = tmem::DType::F64});
    CHECK(names_of(ln) == std::vector<std::string>{"weight", "bias"});
    CHECK(ln.parameters()[0].dtype() == tmem::DType::F64);
    CHECK_THROWS_WITH(nn::LayerNorm<Cpu>({.dim = 6, .eps = 0.0}),
                      Catch::Contains("nn::LayerNorm: eps must be positive"));
    const nn::RMSNorm<Cpu> rms({.dim = 6});
    CHECK(rms.parameter_count() == 6);
  }
  SECTION("Embedding") {
    nn::Init a(9), b(9);
    const nn::Embedding<Cpu> positional(10, 4, a, 0.02, tmem::DType::F32, "tokens");
    const nn::Embedding<Cpu> options({.count = 10, .dim = 4, .stddev = 0.02, .name = "tokens"}, b);
    CHECK(options.weight().name() == "tokens.weight");
    CHECK(options.weight().value().to_host<double>() == positional.weight().value().to_host<double>());
  }
  SECTION("SelfAttention and TransformerBlock") {
    nn::Init a(11), b(11);
    const nn::TransformerBlock<Cpu> positional(8, 2, 16, a, 0.0f, tmem::DType::F32, "block",
                                               nn::Masking::Bidirectional);
    const nn::TransformerBlock<Cpu> options({.dim = 8, .heads = 2, .hidden = 16, .masking = nn::Masking::Bidirectional},
                                            b);
    REQUIRE(options.parameters().size() == positional.parameters().size());
    CHECK(names_of(options) == names_of(positional));
    CHECK(var_names_of(options) == var_names_of(positional));
    for (std::size_t i = 0; i < options.parameters().size(); ++i)
      CHECK(options.parameters()[i].value().to_host<double>() == positional.parameters()[i].value().to_host<double>());
    nn::Init c(3);
    CHECK_THROWS_WITH(nn::SelfAttention<Cpu>({.dim = 8, .heads = 3}, c),
                      Catch::Contains("nn::SelfAttention: 3 heads do not divide dim 8"));
    CHECK_THROWS_WITH(nn::SelfAttention<Cpu>({.dim = 8, .heads = 2, .dropout = 1.5f}, c),
                      Catch::Contains("dropout probability"));
  }
}

TEST_CASE("a user's module gets path names from register_module alone", "[nn][options][names]") {
  using namespace options_test;
  const Net net;
  const std::vector<std::string> expected = {"blocks.0.norm.weight", "blocks.0.fc.weight",   "blocks.0.proj.weight",
                                             "blocks.0.proj.bias",   "blocks.1.norm.weight", "blocks.1.fc.weight",
                                             "blocks.1.proj.weight", "blocks.1.proj.bias"};
  CHECK(names_of(net) == expected);
  CHECK(var_names_of(net) == expected);  // what state files, optimizers and errors see
  CHECK(net.blocks[1].name() == "blocks.1");
  CHECK(net.blocks[1].fc.weight().name() == "blocks.1.fc.weight");  // the submodule's own handle, renamed too
  // It runs: the registered modules are the ones the forward uses.
  tmem::Tape<Cpu> tape;
  const CpuVar y =
      net.blocks[0](tape.input(CpuTensor::from_host(tmem::Shape{3, 4}, tmem::testing::random_values(12, 2))));
  CHECK(y.shape() == tmem::Shape{3, 4});
}

TEST_CASE("nn::RMSNorm: x / sqrt(mean(x^2) + eps) * weight in FP64, its weight named like LayerNorm's",
          "[nn][rms_norm]") {
  using namespace options_test;
  namespace nn = tmem::nn;
  constexpr std::int64_t rows = 3, dim = 5;
  constexpr double eps = 1e-3;  // large enough that a missing eps would show
  nn::RMSNorm<Cpu> norm(dim, eps, tmem::DType::F64);
  const nn::LayerNorm<Cpu> ln(dim, 1e-5, tmem::DType::F64);

  SECTION("parameter: one 'weight' of ones, registered and named like LayerNorm's") {
    CHECK(norm.type() == "RMSNorm");
    CHECK(names_of(norm) == std::vector<std::string>{"weight"});
    CHECK(names_of(ln).front() == "weight");
    CHECK(norm.weight().name() == "rms_norm.weight");
    CHECK(ln.parameters().front().name() == "layer_norm.weight");
    CHECK(norm.weight().requires_grad());
    CHECK(norm.weight().value().category() == tmem::MemCategory::Parameter);
    CHECK(norm.weight().value().to_host<double>() == std::vector<double>(dim, 1.0));
    CHECK_THROWS_WITH(nn::RMSNorm<Cpu>(dim, 0.0), Catch::Contains("nn::RMSNorm: eps must be positive"));
    CHECK_THROWS_WITH(nn::RMSNorm<Cpu>(0), Catch::Contains("nn::RMSNorm: dim must be positive"));
  }

  SECTION("forward against the formula; gradients against central differences") {
    const std::vector<double> w = {0.5, -1.25, 2.0, 0.75, 1.5};
    tmem::StateDict state;
    state.set("weight", CpuTensor::from_host(tmem::Shape{dim}, w, tmem::DType::F64));
    norm.load_state(state);
    const auto xv = tmem::testing::random_values(rows * dim, 21, -2, 2);
    tmem::Tape<Cpu> tape;
    const auto got =
        norm(tape.input(CpuTensor::from_host(tmem::Shape{rows, dim}, xv, tmem::DType::F64))).value().to_host<double>();
    REQUIRE(got.size() == xv.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      double mean_square = 0.0;
      for (std::int64_t j = 0; j < dim; ++j) mean_square += xv[r * dim + j] * xv[r * dim + j] / dim;
      const double scale = 1.0 / std::sqrt(mean_square + eps);
      for (std::int64_t j = 0; j < dim; ++j) {
        INFO("row " << r << " column " << j);
        CHECK(got[r * dim + j] == Approx(xv[r * dim + j] * scale * w[j]).epsilon(1e-13).margin(1e-14));
      }
    }
    const CpuTensor x = CpuTensor::from_host(tmem::Shape{rows, dim}, xv, tmem::DType::F64);
    const auto r = tmem::testing::check_gradients(
        [&](tmem::Tape<Cpu>& t, const std::vector<CpuVar>& in) { return tmem::testing::weighted_sum(t, norm(in[0])); },
        {x});
    INFO(r.report());
    CHECK(r.ok);
    const auto rp = tmem::testing::check_parameter_gradients(
        [&](tmem::Tape<Cpu>& t) { return tmem::testing::weighted_sum(t, norm(t.input(x))); }, norm.parameters());
    INFO(rp.report());
    CHECK(rp.ok);
  }
}
