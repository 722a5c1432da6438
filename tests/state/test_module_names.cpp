// tests/state/test_module_names.cpp — nn::Module: unique hierarchical names, parameter count
// against the closed form, copy safety, summary, and a model's state round trip.
//
// Closed form of a pre-LN block of width d and MLP width h: two LayerNorms 2·2d, four
// d×d projections with bias 4(d² + d), the MLP (dh + h) + (hd + d): 4d² + 2dh + 9d + h.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include <trainmem/trainmem.hpp>
#include "error_matchers.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::testing::ErrorContains;

namespace {

struct Gpt : tmem::nn::Module<B> {
  Gpt(std::int64_t vocab, std::int64_t context, std::int64_t dim, std::int64_t depth, tmem::nn::Init& init)
      : tmem::nn::Module<B>("Gpt"),
        tokens(vocab, dim, init, 0.02),
        positions(context, dim, init, 0.02),
        ln_f(dim),
        head(dim, vocab, init, false) {
    register_module("tokens", tokens);
    register_module("positions", positions);
    for (std::int64_t i = 0; i < depth; ++i) blocks.emplace_back(dim, 2, 4 * dim, init);  // reallocates
    for (std::int64_t i = 0; i < depth; ++i) register_module("blocks." + std::to_string(i), blocks[i]);
    register_module("ln_f", ln_f);
    register_module("head", head);
  }
  tmem::nn::Embedding<B> tokens, positions;
  std::vector<tmem::nn::TransformerBlock<B>> blocks;
  tmem::nn::LayerNorm<B> ln_f;
  tmem::nn::Linear<B> head;
};

std::int64_t block_count(std::int64_t d, std::int64_t h) { return 4 * d * d + 2 * d * h + 9 * d + h; }

}  // namespace

TEST_CASE("a transformer stack's parameters have unique hierarchical names and the closed-form count", "[state][nn]") {
  constexpr std::int64_t kVocab = 11, kContext = 6, kDim = 8, kDepth = 3;
  tmem::nn::Init init(3);
  Gpt gpt(kVocab, kContext, kDim, kDepth, init);
  std::set<std::string> names;
  for (const auto& p : gpt.named_parameters()) {
    CHECK(p.var.name() == p.name);  // the Var carries its path from the outermost module
    names.insert(p.name);
  }
  CHECK(names.size() == gpt.named_parameters().size());
  CHECK(names.count("blocks.2.attn.q.weight") == 1);
  CHECK(names.count("blocks.0.mlp.down.bias") == 1);
  CHECK(names.count("tokens.weight") == 1);
  CHECK(names.count("positions.weight") == 1);
  CHECK(names.count("head.bias") == 0);  // no bias asked for
  const std::int64_t expected =
      kVocab * kDim + kContext * kDim + kDepth * block_count(kDim, 4 * kDim) + 2 * kDim + kDim * kVocab;
  CHECK(gpt.parameter_count() == expected);
  std::int64_t summed = 0;
  for (const auto& v : gpt.parameters()) summed += v.numel();
  CHECK(summed == expected);
  // The blocks moved when the vector grew; the registrations hold Var handles, so the
  // block objects in the vector still own the very parameters the model lists.
  CHECK(gpt.blocks[1].parameters().front().handle() == gpt.named_parameters()[2 + 16].var.handle());

  const std::string summary = gpt.summary();
  INFO(summary);
  CHECK(summary.find("blocks.2") != std::string::npos);
  CHECK(summary.find("TransformerBlock") != std::string::npos);
  REQUIRE(expected == 2856);  // 88 + 48 + 3 * 872 + 16 + 88
  CHECK(summary.find("2,856 parameters in 53 tensors, 11,424 bytes") != std::string::npos);  // 2 + 3 * 16 + 2 + 1; f32
  CHECK(summary.find("attn.q") == std::string::npos);                                        // depth 1 only
  CHECK(gpt.summary(2).find("blocks.2.attn") != std::string::npos);
}

TEST_CASE("standalone modules keep their names and their parameters() order", "[state][nn]") {
  tmem::nn::Init init(1);
  tmem::nn::TransformerBlock<B> block(4, 2, 8, init);
  std::vector<std::string> names;
  for (const auto& v : block.parameters()) names.push_back(v.name());
  REQUIRE(names.size() == 16);
  CHECK(names.front() == "block.ln1.weight");
  CHECK(names[2] == "block.attn.q.weight");
  CHECK(names.back() == "block.mlp.down.bias");
  CHECK(block.named_parameters()[2].name == "attn.q.weight");
  CHECK(block.parameter_count() == block_count(4, 8));
  tmem::nn::Linear<B> fc(3, 2, init, true, tmem::DType::F32, "fc1");
  CHECK(fc.parameters()[0].name() == "fc1.weight");
  CHECK(fc.weight().handle() == fc.parameters()[0].handle());
}

TEST_CASE("registering the same name or parameter twice is an error", "[state][nn]") {
  tmem::nn::Init init(1);
  tmem::nn::Linear<B> a(2, 2, init), b(2, 2, init);
  tmem::nn::Module<B> m("M");
  m.register_module("a", a);
  CHECK_THROWS_MATCHES(m.register_module("a", b), tmem::Error, ErrorContains("already called 'a'"));
  CHECK_THROWS_MATCHES(m.register_parameter("again", a.weight()), tmem::Error,
                       ErrorContains("'again' is already registered as 'a.weight'"));
}

TEST_CASE("a model's state loads into a fresh model with other weights, and refuses another shape", "[state][nn]") {
  tmem::nn::Init i1(1), i2(2), i3(3);
  Gpt a(7, 4, 8, 2, i1), b(7, 4, 8, 2, i2), other(7, 4, 8, 3, i3);
  b.load_state(a.state());
  for (std::size_t i = 0; i < a.parameters().size(); ++i)
    CHECK(b.parameters()[i].value().to_host<double>() == a.parameters()[i].value().to_host<double>());
  const auto before = other.parameters()[0].value().to_host<double>();
  CHECK_THROWS_MATCHES(other.load_state(a.state()), tmem::Error, ErrorContains("'blocks.2.ln1.weight' is missing"));
  CHECK(other.parameters()[0].value().to_host<double>() == before);
}
