// examples/char_transformer/char_model.hpp — the character-level transformer and its data.
//
// CharText (a text file as character ids), CharTransformer (token and position
// embeddings, pre-LN causal blocks, final LayerNorm and a vocabulary head; one stage per
// block) and the random next-character batches it trains on. char_transformer trains it;
// benchmarks/fp32_grads trains the same model to compare gradient accumulation.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/training.hpp"
#include "trainmem/trainmem.hpp"

namespace char_model {

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using examples::Stage;

/// \brief The characters of a text as ids 0..V-1 (sorted byte values that occur).
class CharText {
 public:
  explicit CharText(const std::filesystem::path& path) {
    tmem::require(std::filesystem::exists(path), "text file ", path.string(), ": does not exist");
    std::ifstream in(path, std::ios::binary);
    tmem::require(in.good(), "text file ", path.string(), ": cannot be opened");
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    tmem::require(!in.bad(), "text file ", path.string(), ": read failed");
    std::array<bool, 256> seen{};
    for (unsigned char c : text) seen[c] = true;
    std::array<std::int32_t, 256> id{};
    for (int c = 0; c < 256; ++c)
      if (seen[c]) {
        id[c] = static_cast<std::int32_t>(chars_.size());
        chars_.push_back(static_cast<char>(c));
      }
    ids_.reserve(text.size());
    for (unsigned char c : text) ids_.push_back(id[c]);
  }
  std::int64_t vocabulary() const { return static_cast<std::int64_t>(chars_.size()); }
  std::int64_t size() const { return static_cast<std::int64_t>(ids_.size()); }
  const std::vector<std::int32_t>& ids() const { return ids_; }
  char character(std::int32_t id) const { return chars_[static_cast<std::size_t>(id)]; }
  /// Ids of `text`; characters the file never had are skipped.
  std::vector<std::int32_t> encode(const std::string& text) const {
    std::vector<std::int32_t> out;
    for (char c : text) {
      const auto it = std::find(chars_.begin(), chars_.end(), c);
      if (it != chars_.end()) out.push_back(static_cast<std::int32_t>(it - chars_.begin()));
    }
    return out;
  }

 private:
  std::vector<char> chars_;
  std::vector<std::int32_t> ids_;
};

struct ModelConfig {
  std::int64_t context = 64;
  std::int64_t dim = 128;
  std::int64_t depth = 4;
  std::int64_t heads = 4;
};

/// \brief Token + position embedding, causal transformer blocks, LayerNorm, head.
class CharTransformer {
 public:
  CharTransformer(const ModelConfig& c, std::int64_t vocabulary, std::uint64_t seed, tmem::DType dtype) : config_(c) {
    tmem::nn::Init init(seed);
    tokens_ = std::make_unique<tmem::nn::Embedding<B>>(vocabulary, c.dim, init, 0.02, dtype, "tokens");
    positions_ = std::make_unique<tmem::nn::Embedding<B>>(c.context, c.dim, init, 0.02, dtype, "positions");
    for (std::int64_t i = 0; i < c.depth; ++i)
      blocks_.push_back(std::make_unique<tmem::nn::TransformerBlock<B>>(c.dim, c.heads, 4 * c.dim, init, 0.0f, dtype,
                                                                        "block" + std::to_string(i)));
    final_ln_ = std::make_unique<tmem::nn::LayerNorm<B>>(c.dim, 1e-5, dtype, "ln_f");
    head_ = std::make_unique<tmem::nn::Linear<B>>(c.dim, vocabulary, init, true, dtype, "head");
  }

  /// ids [n, t] (t <= context) -> token embedding + position embedding [n, t, dim].
  tmem::Var<B> embed(tmem::Tape<B>& tape, const tmem::Tensor<B>& ids) const {
    const std::int64_t n = ids.shape()[0], t = ids.shape()[1];
    std::vector<std::int32_t> positions(static_cast<std::size_t>(n * t));
    for (std::int64_t i = 0; i < n * t; ++i) positions[i] = static_cast<std::int32_t>(i % t);
    const std::vector<std::int32_t> tokens = host_ids(ids);
    return tmem::reshape(
        tmem::add(lookup(tape, tokens_->weight(), tokens), lookup(tape, positions_->weight(), positions)),
        tmem::Shape{n, t, config_.dim});
  }

  /// One stage per block, then LayerNorm + head: logits [n * t, vocabulary].
  std::vector<Stage<B>> stages(bool training) const {
    std::vector<Stage<B>> s;
    for (const auto& block : blocks_) {
      const tmem::nn::TransformerBlock<B>* b = block.get();
      s.push_back([b, training](const tmem::Var<B>& x) { return (*b)(x, training); });
    }
    s.push_back([this](const tmem::Var<B>& x) {
      auto logits = (*head_)((*final_ln_)(x));
      return tmem::reshape(logits, tmem::Shape{x.shape()[0] * x.shape()[1], logits.shape()[2]});
    });
    return s;
  }

  std::vector<tmem::Var<B>> parameters() const {
    std::vector<tmem::Var<B>> p = tokens_->parameters();
    for (auto& v : positions_->parameters()) p.push_back(v);
    for (const auto& b : blocks_)
      for (auto& v : b->parameters()) p.push_back(v);
    for (auto& v : final_ln_->parameters()) p.push_back(v);
    for (auto& v : head_->parameters()) p.push_back(v);
    return p;
  }
  /// The parameters stage by stage, the embeddings first (the units of a ZeRO-3 run:
  /// embeddings, each block, the final LayerNorm with the head).
  std::vector<std::vector<tmem::Var<B>>> stage_parameters() const {
    std::vector<std::vector<tmem::Var<B>>> units{tokens_->parameters()};
    for (auto& v : positions_->parameters()) units.front().push_back(v);
    for (const auto& b : blocks_) units.push_back(b->parameters());
    std::vector<tmem::Var<B>> last = final_ln_->parameters();
    for (auto& v : head_->parameters()) last.push_back(v);
    units.push_back(last);
    return units;
  }
  const ModelConfig& config() const { return config_; }

 private:
  static std::vector<std::int32_t> host_ids(const tmem::Tensor<B>& ids) {
    std::vector<std::int32_t> out(static_cast<std::size_t>(ids.numel()));
    ids.backend().download(out.data(), ids.data(), ids.bytes());
    return out;
  }
  /// Rows `ids` of `table` [V, dim]: the embedding op on the ids brought onto the tape.
  static tmem::Var<B> lookup(tmem::Tape<B>& tape, const tmem::Var<B>& table, const std::vector<std::int32_t>& ids) {
    std::vector<float> values(ids.begin(), ids.end());
    const auto rows = static_cast<std::int64_t>(ids.size());
    return tmem::embedding(table, tape.input(tmem::Tensor<B>::from_host(tmem::Shape{rows}, values, tmem::DType::I32)));
  }

  ModelConfig config_;
  std::unique_ptr<tmem::nn::Embedding<B>> tokens_, positions_;
  std::vector<std::unique_ptr<tmem::nn::TransformerBlock<B>>> blocks_;
  std::unique_ptr<tmem::nn::LayerNorm<B>> final_ln_;
  std::unique_ptr<tmem::nn::Linear<B>> head_;
};

/// \brief `batch` windows of context + 1 characters: inputs and next-character targets.
struct Batch {
  tmem::Tensor<B> inputs, targets;
};

inline Batch make_batch(const std::vector<std::int32_t>& ids, const std::vector<std::int64_t>& starts,
                        std::int64_t context) {
  const auto n = static_cast<std::int64_t>(starts.size());
  std::vector<std::int32_t> in(static_cast<std::size_t>(n * context)), out(in.size());
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t t = 0; t < context; ++t) {
      in[i * context + t] = ids[starts[i] + t];
      out[i * context + t] = ids[starts[i] + t + 1];
    }
  Batch b{tmem::Tensor<B>::empty(tmem::Shape{n, context}, tmem::DType::I32),
          tmem::Tensor<B>::empty(tmem::Shape{n * context}, tmem::DType::I32)};
  b.inputs.backend().upload(b.inputs.data(), in.data(), b.inputs.bytes());
  b.targets.backend().upload(b.targets.data(), out.data(), b.targets.bytes());
  return b;
}

/// Window starts in [begin, end - context - 1], uniformly at random.
inline std::vector<std::int64_t> random_starts(std::mt19937_64& rng, std::int64_t count, std::int64_t begin,
                                               std::int64_t end, std::int64_t context) {
  std::uniform_int_distribution<std::int64_t> pick(begin, end - context - 1);
  std::vector<std::int64_t> starts(static_cast<std::size_t>(count));
  for (auto& s : starts) s = pick(rng);
  return starts;
}

}  // namespace char_model
