// examples/common/chain_models.hpp — two chains of stages the checkpoint planner is measured on.
//
//  - ResidualMlpChain: N blocks x + Linear(GELU(Linear(LayerNorm(x)))), as in
//    benchmarks/checkpoint_schedules; one stage per block.
//  - TransformerStack: token embedding (+ learned positions), pre-LN causal transformer
//    blocks, final LayerNorm and a vocabulary head; one stage each, so the stages differ
//    in width and cost (the embedding keeps almost nothing, the head keeps its logits).
//    With `half_blocks` each block is two stages, its attention half and its MLP half,
//    so a schedule may cut inside a block.
// Each exposes `stages` (a std::vector<trainmem::Layer<B>>), `parameters`, and one
// training step written against a ChainRunner (loss, backward, an SGD update), so
// tests, the planner benchmark and the examples run the same models. `autocast` set to
// bf16 or f16 runs the step's forward under autocast to it (F32 parameters, 16-bit
// products: mixed precision); F32, the default, runs it in F32.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainmem/checkpoint/planner.hpp"
#include "trainmem/trainmem.hpp"

namespace examples {

namespace tmem = trainmem;

/// The SGD update every chain step ends with (what a training step does to the weights).
template <class B>
void sgd_update(const std::vector<tmem::Var<B>>& params, double lr) {
  tmem::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    p.value().backend().map(tmem::math::AddScaled{-lr}, p.value(), p.grad(), p.value());
  }
}

template <class B>
struct ResidualMlpChain {
  ResidualMlpChain(int n, std::int64_t width, std::int64_t hidden, std::int64_t batch, std::uint64_t seed = 2026)
      : batch_(batch), width_(width) {
    tmem::nn::Init init(seed);
    for (int i = 0; i < n; ++i) {
      up.emplace_back(width, hidden, init, true, tmem::DType::F32, "up" + std::to_string(i));
      down.emplace_back(hidden, width, init, true, tmem::DType::F32, "down" + std::to_string(i));
      norm.emplace_back(width, 1e-5, tmem::DType::F32, "norm" + std::to_string(i));
    }
    for (int i = 0; i < n; ++i)
      stages.push_back(
          [this, i](const tmem::Var<B>& x) { return tmem::add(x, down[i](tmem::gelu(up[i](norm[i](x))))); });
    for (int i = 0; i < n; ++i) {
      for (auto* l : {&up[i], &down[i]})
        for (auto& p : l->parameters()) params.push_back(p);
      for (auto& p : norm[i].parameters()) params.push_back(p);
    }
    std::vector<float> values(static_cast<std::size_t>(batch * width));
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = static_cast<float>(std::sin(0.01 * static_cast<double>(i)));
    input = tmem::Tensor<B>::from_host({batch, width}, values);
  }
  ResidualMlpChain(const ResidualMlpChain&) = delete;
  ResidualMlpChain& operator=(const ResidualMlpChain&) = delete;

  /// One training step: mean of the chain's output as the loss, backward, SGD (lr 0: the
  /// weights stay put, so repeated steps measure the same work).
  void step(const tmem::ChainRunner<B>& run, double lr = 0.0) const {
    for (auto& p : params) p.zero_grad();
    {
      tmem::Tape<B> tape;
      auto x = tape.input(input);
      tmem::Var<B> loss;
      {
        tmem::amp::Autocast mixed(autocast, autocast != tmem::DType::F32);
        loss = tmem::mean(run(x));
      }
      run.backward(loss);
    }
    sgd_update(params, lr);
  }

  std::int64_t batch_, width_;
  tmem::DType autocast = tmem::DType::F32;  // bf16 or f16: the forward under autocast to it
  std::vector<tmem::nn::Linear<B>> up, down;
  std::vector<tmem::nn::LayerNorm<B>> norm;
  std::vector<tmem::Layer<B>> stages;
  std::vector<tmem::Var<B>> params;
  tmem::Tensor<B> input;
};

template <class B>
struct TransformerStack {
  TransformerStack(int blocks, std::int64_t dim, std::int64_t heads, std::int64_t hidden, std::int64_t vocab,
                   std::int64_t batch, std::int64_t tokens, std::uint64_t seed = 7, bool half_blocks = false)
      : batch_(batch), tokens_(tokens), dim_(dim) {
    tmem::nn::Init init(seed);
    embed = std::make_unique<tmem::nn::Embedding<B>>(vocab, dim, init, 0.02);
    position = init.parameter<B>(tmem::Shape{tokens * dim}, init.normal(tokens * dim, 0.0, 0.02), tmem::DType::F32,
                                 "position");
    for (int i = 0; i < blocks; ++i)
      block.push_back(std::make_unique<tmem::nn::TransformerBlock<B>>(dim, heads, hidden, init, 0.0f, tmem::DType::F32,
                                                                      "block" + std::to_string(i)));
    final_ln = std::make_unique<tmem::nn::LayerNorm<B>>(dim, 1e-5, tmem::DType::F32, "ln_f");
    head = std::make_unique<tmem::nn::Linear<B>>(dim, vocab, init, true, tmem::DType::F32, "head");
    stages.push_back([this](const tmem::Var<B>& ids) {
      auto t = tmem::reshape((*embed)(ids), tmem::Shape{batch_, tokens_ * dim_});
      return tmem::reshape(tmem::add(t, position), tmem::Shape{batch_, tokens_, dim_});
    });
    for (auto& b : block) {
      const tmem::nn::TransformerBlock<B>* p = b.get();
      if (half_blocks) {
        stages.push_back([p](const tmem::Var<B>& x) { return p->attention_half(x, true); });
        stages.push_back([p](const tmem::Var<B>& h) { return p->mlp_half(h, true); });
      } else {
        stages.push_back([p](const tmem::Var<B>& x) { return (*p)(x, true); });
      }
    }
    stages.push_back([this](const tmem::Var<B>& x) {
      return (*head)(tmem::reshape((*final_ln)(x), tmem::Shape{batch_ * tokens_, dim_}));
    });
    for (auto& p : embed->parameters()) params.push_back(p);
    params.push_back(position);
    for (auto& b : block)
      for (auto& p : b->parameters()) params.push_back(p);
    for (auto& p : final_ln->parameters()) params.push_back(p);
    for (auto& p : head->parameters()) params.push_back(p);
    std::vector<float> ids(static_cast<std::size_t>(batch * tokens)), next(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<float>((i * 7 + 3) % static_cast<std::size_t>(vocab));
      next[i] = static_cast<float>((i * 7 + 10) % static_cast<std::size_t>(vocab));
    }
    input = tmem::Tensor<B>::from_host({batch, tokens}, ids, tmem::DType::I32);
    labels = tmem::Tensor<B>::from_host({batch * tokens}, next, tmem::DType::I32);
  }
  TransformerStack(const TransformerStack&) = delete;
  TransformerStack& operator=(const TransformerStack&) = delete;

  /// One training step of `micro_batches` micro-batches (the same batch each time): the
  /// gradients of every micro-batch accumulate, then one SGD update (lr 0: the weights stay).
  void step(const tmem::ChainRunner<B>& run, double lr = 0.0, int micro_batches = 1) const {
    for (auto& p : params) p.zero_grad();
    for (int k = 0; k < micro_batches; ++k) {
      tmem::Tape<B> tape;
      auto x = tape.input(input);
      tmem::Var<B> loss;
      {
        tmem::amp::Autocast mixed(autocast, autocast != tmem::DType::F32);
        loss = tmem::cross_entropy(run(x), labels);
      }
      run.backward(loss);
    }
    sgd_update(params, lr);
  }

  std::int64_t batch_, tokens_, dim_;
  tmem::DType autocast = tmem::DType::F32;  // bf16 or f16: the forward under autocast to it
  std::unique_ptr<tmem::nn::Embedding<B>> embed;
  tmem::Var<B> position;
  std::vector<std::unique_ptr<tmem::nn::TransformerBlock<B>>> block;
  std::unique_ptr<tmem::nn::LayerNorm<B>> final_ln;
  std::unique_ptr<tmem::nn::Linear<B>> head;
  std::vector<tmem::Layer<B>> stages;
  std::vector<tmem::Var<B>> params;
  tmem::Tensor<B> input, labels;
};

}  // namespace examples
