// benchmarks/budget_shootout/gpt.hpp — the shoot-out's model and data, as both sides see them.
//
// A GPT over bytes: token and position embeddings, pre-LN causal transformer blocks
// (nn::TransformerBlock's parts: LayerNorm, SelfAttention, Mlp), a final LayerNorm and a
// linear head over the 256 byte values. Its stages (embedding, each block or each half
// block, head) are what the planner cuts. The data is a text file read as bytes;
// sequence i of step s starts at byte window_offset(s, i, batch) — the formula the
// PyTorch side (torch_side.py) repeats, so both train on the same windows. Weights come
// from one seed and are exported (f32, manifest order and names) for the other side.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "trainmem/trainmem.hpp"

namespace shootout {

namespace tmem = trainmem;

struct GptSizes {
  std::int64_t blocks = 8, dim = 256, heads = 4, hidden = 1024, seq = 128, vocab = 256;
  bool half_block_stages = false;  // each block two stages (attention, MLP) for the planner to cut between
};

/// \brief A pre-LN block (nn::TransformerBlock's parts, so its halves can be stages of their own).
template <class B>
struct GptBlock {
  GptBlock(const GptSizes& s, tmem::nn::Init& init, const std::string& name)
      : ln1(s.dim, 1e-5, tmem::DType::F32, name + ".ln1"),
        ln2(s.dim, 1e-5, tmem::DType::F32, name + ".ln2"),
        attn(s.dim, s.heads, init, 0.0f, tmem::DType::F32, name + ".attn"),
        mlp(s.dim, s.hidden, init, tmem::DType::F32, name + ".mlp") {}
  tmem::Var<B> attention_half(const tmem::Var<B>& x) const { return tmem::add(x, attn(ln1(x))); }
  tmem::Var<B> mlp_half(const tmem::Var<B>& h) const { return tmem::add(h, mlp(ln2(h))); }
  std::vector<tmem::Var<B>> parameters() const {
    std::vector<tmem::Var<B>> p;
    for (const auto* m : std::initializer_list<const tmem::nn::Module<B>*>{&ln1, &attn, &ln2, &mlp})
      for (auto& v : m->parameters()) p.push_back(v);
    return p;
  }
  tmem::nn::LayerNorm<B> ln1, ln2;
  tmem::nn::SelfAttention<B> attn;
  tmem::nn::Mlp<B> mlp;
};

/// First byte of sequence `i` of step `step` in a text of `length` bytes (windows of seq + 1 bytes).
inline std::int64_t window_offset(std::int64_t step, std::int64_t i, std::int64_t batch, std::int64_t seq,
                                  std::int64_t length) {
  return ((step * batch + i) * 7919) % (length - seq - 1);
}

/// \brief The training text as byte values.
inline std::vector<std::int32_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  tmem::require(in.good(), "budget_shootout: cannot open the text ", path.string());
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::vector<std::int32_t> out;
  out.reserve(text.size());
  for (unsigned char c : text) out.push_back(c);
  return out;
}

/// \brief The model, built for one batch size (the position table is added per row).
template <class B>
class Gpt {
 public:
  Gpt(const GptSizes& s, std::int64_t batch, std::uint64_t seed) : s_(s), batch_(batch) {
    tmem::nn::Init init(seed);
    tokens_ = std::make_unique<tmem::nn::Embedding<B>>(s.vocab, s.dim, init, 0.02, tmem::DType::F32, "tokens");
    position_ = init.parameter<B>(tmem::Shape{s.seq * s.dim}, init.normal(s.seq * s.dim, 0.0, 0.02), tmem::DType::F32,
                                  "position");
    for (std::int64_t i = 0; i < s.blocks; ++i)
      blocks_.push_back(std::make_unique<GptBlock<B>>(s, init, "blocks." + std::to_string(i)));
    final_ln_ = std::make_unique<tmem::nn::LayerNorm<B>>(s.dim, 1e-5, tmem::DType::F32, "ln_f");
    head_ = std::make_unique<tmem::nn::Linear<B>>(s.dim, s.vocab, init, true, tmem::DType::F32, "head");

    stages_.push_back([this](const tmem::Var<B>& ids) {
      auto t = tmem::reshape((*tokens_)(ids), tmem::Shape{batch_, s_.seq * s_.dim});
      return tmem::reshape(tmem::add(t, position_), tmem::Shape{batch_, s_.seq, s_.dim});
    });
    for (const auto& b : blocks_) {
      const GptBlock<B>* block = b.get();
      if (s.half_block_stages) {
        stages_.push_back([block](const tmem::Var<B>& x) { return block->attention_half(x); });
        stages_.push_back([block](const tmem::Var<B>& h) { return block->mlp_half(h); });
      } else {
        stages_.push_back([block](const tmem::Var<B>& x) { return block->mlp_half(block->attention_half(x)); });
      }
    }
    stages_.push_back([this](const tmem::Var<B>& x) {
      return (*head_)(tmem::reshape((*final_ln_)(x), tmem::Shape{batch_ * s_.seq, s_.dim}));
    });
    for (auto& p : tokens_->parameters()) params_.push_back(p);
    params_.push_back(position_);
    for (const auto& b : blocks_)
      for (auto& p : b->parameters()) params_.push_back(p);
    for (auto& p : final_ln_->parameters()) params_.push_back(p);
    for (auto& p : head_->parameters()) params_.push_back(p);
  }
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const std::vector<tmem::Layer<B>>& stages() const { return stages_; }
  const std::vector<tmem::Var<B>>& parameters() const { return params_; }
  std::int64_t batch() const { return batch_; }
  /// The batch the stages and batch_of() use from now on (one model serves every batch size).
  void set_batch(std::int64_t batch) { batch_ = batch; }
  std::int64_t tokens_per_step() const { return batch_ * s_.seq; }

  /// The ids and next-byte labels of step `step` (I32 tensors [batch, seq] and [batch * seq]).
  std::pair<tmem::Tensor<B>, tmem::Tensor<B>> batch_of(const std::vector<std::int32_t>& text, std::int64_t step) const {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(batch_ * s_.seq)), next(ids.size());
    const auto length = static_cast<std::int64_t>(text.size());
    for (std::int64_t i = 0; i < batch_; ++i) {
      const std::int64_t o = window_offset(step, i, batch_, s_.seq, length);
      for (std::int64_t t = 0; t < s_.seq; ++t) {
        ids[static_cast<std::size_t>(i * s_.seq + t)] = text[static_cast<std::size_t>(o + t)];
        next[static_cast<std::size_t>(i * s_.seq + t)] = text[static_cast<std::size_t>(o + t + 1)];
      }
    }
    return {tmem::Tensor<B>::from_host({batch_, s_.seq}, ids, tmem::DType::I32),
            tmem::Tensor<B>::from_host({batch_ * s_.seq}, next, tmem::DType::I32)};
  }

 private:
  GptSizes s_;
  std::int64_t batch_;
  std::unique_ptr<tmem::nn::Embedding<B>> tokens_;
  tmem::Var<B> position_;
  std::vector<std::unique_ptr<GptBlock<B>>> blocks_;
  std::unique_ptr<tmem::nn::LayerNorm<B>> final_ln_;
  std::unique_ptr<tmem::nn::Linear<B>> head_;
  std::vector<tmem::Layer<B>> stages_;
  std::vector<tmem::Var<B>> params_;
};

}  // namespace shootout
