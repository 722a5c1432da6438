// trainmem/nn/attention.hpp — multi-head self-attention and the pre-LN block.
//
// Attention over x [batch, T, D]: q, k, v projections, heads split to [batch*H, T, Dh],
// scores = q k^T / sqrt(Dh), the causal mask (language models; Masking::Bidirectional
// leaves it out, for vision transformers), softmax, optional dropout, weighted sum of v,
// heads merged, output projection. The block is pre-LN (GPT-2, ViT):
//   x = x + attn(ln1(x));  x = x + mlp(ln2(x)).
// Without dropout on the probabilities (dropout 0, or evaluation) the middle is one fused
// op, scaled_dot_product_attention, which never stores the [batch*H, T, T] scores; with
// it, the scores and probabilities are tensors, the activations that checkpointing
// saves the most on. Submodules (nn::Module): attention "q", "k", "v",
// "out"; block "ln1", "attn", "ln2", "mlp". Both are built from positional arguments or
// from options: nn::TransformerBlock<B> block({.dim = 256, .heads = 4, .hidden = 1024}, init).
#pragma once

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/nn/layer_norm.hpp"
#include "trainmem/nn/linear.hpp"
#include "trainmem/nn/mlp.hpp"
#include "trainmem/nn/module.hpp"
#include "trainmem/ops/attention.hpp"
#include "trainmem/ops/dropout.hpp"
#include "trainmem/ops/elementwise.hpp"
#include "trainmem/ops/shape.hpp"
#include "trainmem/ops/softmax.hpp"

namespace trainmem::nn {

/// Whether a position attends to later positions too.
enum class Masking {
  Causal,         // position i sees positions 0..i (language models)
  Bidirectional,  // every position sees every position (vision transformers)
};

/// SelfAttention's settings by name; `dim` and `heads` must be given.
struct SelfAttentionOptions {
  std::int64_t dim = 0;
  std::int64_t heads = 0;
  float dropout = 0.0f;
  Masking masking = Masking::Causal;
  DType dtype = DType::F32;
  std::string name = "attn";  // until a parent's register_module renames it
};

/// TransformerBlock's settings by name; `dim`, `heads` and `hidden` must be given.
struct TransformerBlockOptions {
  std::int64_t dim = 0;
  std::int64_t heads = 0;
  std::int64_t hidden = 0;  // the MLP's width
  float dropout = 0.0f;
  Masking masking = Masking::Causal;
  DType dtype = DType::F32;
  std::string name = "block";  // until a parent's register_module renames it
};

template <class B>
class SelfAttention : public Module<B> {
 public:
  using Options = SelfAttentionOptions;
  SelfAttention(std::int64_t dim, std::int64_t heads, Init& init, float dropout = 0.0f, DType dtype = DType::F32,
                std::string name = "attn", Masking masking = Masking::Causal)
      : SelfAttention(SelfAttentionOptions{dim, heads, dropout, masking, dtype, std::move(name)}, init) {}
  SelfAttention(const SelfAttentionOptions& o, Init& init)
      : Module<B>("SelfAttention", o.name),
        heads_(o.heads),
        dropout_(checked_dropout_probability(o.dropout, "nn::SelfAttention")),
        masking_(o.masking),
        q_(o.dim, o.dim, init, true, o.dtype, o.name + ".q"),
        k_(o.dim, o.dim, init, true, o.dtype, o.name + ".k"),
        v_(o.dim, o.dim, init, true, o.dtype, o.name + ".v"),
        out_(o.dim, o.dim, init, true, o.dtype, o.name + ".out") {
    detail::check(o.heads > 0 && o.dim % o.heads == 0, "nn::SelfAttention: ", o.heads, " heads do not divide dim ",
                  o.dim);
    this->register_module("q", q_);
    this->register_module("k", k_);
    this->register_module("v", v_);
    this->register_module("out", out_);
  }

  Var<B> operator()(const Var<B>& x, bool training = true) const {
    detail::check(x.shape().rank() == 3, "nn::SelfAttention: x must be [batch, T, D], got ", x.shape());
    const double inv_sqrt_dh = 1.0 / std::sqrt(static_cast<double>(x.shape()[2] / heads_));
    auto q = split_heads(q_(x), heads_), k = split_heads(k_(x), heads_), v = split_heads(v_(x), heads_);
    const bool causal = masking_ == Masking::Causal;
    if (dropout_ == 0.0f || !training)
      return out_(merge_heads(scaled_dot_product_attention(q, k, v, causal, inv_sqrt_dh), heads_));
    auto scores = scale(bmm(q, k, false, true), inv_sqrt_dh);
    if (causal) scores = causal_mask(scores);
    auto probs = dropout(softmax(scores), dropout_, training);
    return out_(merge_heads(bmm(probs, v), heads_));
  }

 private:
  std::int64_t heads_;
  float dropout_;
  Masking masking_;
  Linear<B> q_, k_, v_, out_;
};

template <class B>
class TransformerBlock : public Module<B> {
 public:
  using Options = TransformerBlockOptions;
  TransformerBlock(std::int64_t dim, std::int64_t heads, std::int64_t hidden, Init& init, float dropout = 0.0f,
                   DType dtype = DType::F32, std::string name = "block", Masking masking = Masking::Causal)
      : TransformerBlock(TransformerBlockOptions{dim, heads, hidden, dropout, masking, dtype, std::move(name)}, init) {}
  TransformerBlock(const TransformerBlockOptions& o, Init& init)
      : Module<B>("TransformerBlock", o.name),
        dropout_(o.dropout),
        ln1_(o.dim, 1e-5, o.dtype, o.name + ".ln1"),
        ln2_(o.dim, 1e-5, o.dtype, o.name + ".ln2"),
        attn_(o.dim, o.heads, init, o.dropout, o.dtype, o.name + ".attn", o.masking),
        mlp_(o.dim, o.hidden, init, o.dtype, o.name + ".mlp") {
    this->register_module("ln1", ln1_);
    this->register_module("attn", attn_);
    this->register_module("ln2", ln2_);
    this->register_module("mlp", mlp_);
  }

  Var<B> operator()(const Var<B>& x, bool training = true) const {
    return mlp_half(attention_half(x, training), training);
  }

  /// The block's two residual halves, h = x + attn(ln1(x)) and h + mlp(ln2(h)): a
  /// checkpoint schedule may cut between them (a chain of half blocks).
  Var<B> attention_half(const Var<B>& x, bool training = true) const {
    return add(x, dropout(attn_(ln1_(x), training), dropout_, training));
  }
  Var<B> mlp_half(const Var<B>& h, bool training = true) const {
    return add(h, dropout(mlp_(ln2_(h)), dropout_, training));
  }

 private:
  float dropout_;
  LayerNorm<B> ln1_, ln2_;
  SelfAttention<B> attn_;
  Mlp<B> mlp_;
};

}  // namespace trainmem::nn
