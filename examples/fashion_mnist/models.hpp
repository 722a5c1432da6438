// examples/fashion_mnist/models.hpp — the Fashion-MNIST classifiers, as lists of stages.
//
// Each model turns normalised 28x28 images into its own input tensor and exposes its
// forward pass as stages (see common/training.hpp), so a checkpoint schedule can cut
// the pass at stage boundaries without the model knowing:
//  - MlpClassifier: 784 -> hidden layers (Linear + ReLU, one stage each) -> 10.
//  - ResMlpClassifier: 784 -> width, residual MLP blocks (one stage each), norm + head;
//    the demo's default, trained under a planner budget.
//  - VitClassifier: the image as 16 patches of 7x7 pixels -> linear patch embedding
//    plus a learned position embedding -> pre-LN transformer blocks (one stage each)
//    -> final LayerNorm, mean over the 16 tokens, linear head. Attention is
//    bidirectional (every patch attends to every patch), as in ViT.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/training.hpp"
#include "trainmem/trainmem.hpp"

namespace examples {

namespace tmem = trainmem;

inline constexpr std::int64_t kImageSide = 28, kPixels = kImageSide * kImageSide, kClasses = 10;

/// \brief 784 -> hidden... -> 10 with ReLU between.
template <class B>
class MlpClassifier {
 public:
  MlpClassifier(const std::vector<std::int64_t>& hidden, std::uint64_t seed, tmem::DType dtype) {
    tmem::nn::Init init(seed);
    std::int64_t in = kPixels;
    for (std::size_t i = 0; i < hidden.size(); ++i) {
      layers_.push_back(
          std::make_unique<tmem::nn::Linear<B>>(in, hidden[i], init, true, dtype, "fc" + std::to_string(i + 1)));
      in = hidden[i];
    }
    layers_.push_back(std::make_unique<tmem::nn::Linear<B>>(in, kClasses, init, true, dtype, "head"));
  }

  /// Images [n, 784], stored in the parameters' dtype: with 16-bit model weights the
  /// batch is uploaded in 16 bits too, so the first layer keeps a 16-bit input for backward.
  tmem::Tensor<B> input(const std::vector<float>& images, std::int64_t n) const {
    return tmem::Tensor<B>::from_host(tmem::Shape{n, kPixels}, images, layers_.front()->weight().dtype());
  }

  /// The input as the first stage sees it: a constant on the tape.
  tmem::Var<B> embed(tmem::Tape<B>& tape, const tmem::Tensor<B>& input) const { return tape.input(input); }

  /// One stage per hidden layer (Linear + ReLU), then the head.
  std::vector<Stage<B>> stages(bool /*training*/) const {
    std::vector<Stage<B>> s;
    for (std::size_t i = 0; i + 1 < layers_.size(); ++i) {
      const tmem::nn::Linear<B>* layer = layers_[i].get();
      s.push_back([layer](const tmem::Var<B>& x) { return tmem::relu((*layer)(x)); });
    }
    const tmem::nn::Linear<B>* head = layers_.back().get();
    s.push_back([head](const tmem::Var<B>& x) { return (*head)(x); });
    return s;
  }

  std::vector<tmem::Var<B>> parameters() const {
    std::vector<tmem::Var<B>> p;
    for (const auto& l : layers_)
      for (auto& v : l->parameters()) p.push_back(v);
    return p;
  }
  /// The parameters of each stage, in stage order (ZeRO-3's units).
  std::vector<std::vector<tmem::Var<B>>> stage_parameters() const {
    std::vector<std::vector<tmem::Var<B>>> units;
    for (const auto& l : layers_) units.push_back(l->parameters());
    return units;
  }

  std::string describe() const {
    std::string text = "mlp 784";
    for (std::size_t i = 0; i + 1 < layers_.size(); ++i) text += "-" + std::to_string(layers_[i]->weight().shape()[0]);
    return text + "-10";
  }

 private:
  std::vector<std::unique_ptr<tmem::nn::Linear<B>>> layers_;
};

/// \brief Shape of the residual MLP.
struct ResMlpConfig {
  std::int64_t width = 128;
  std::int64_t hidden = 512;
  std::int64_t blocks = 6;
};

/// \brief 784 -> width (Linear + ReLU), residual blocks x + Linear(GELU(Linear(LayerNorm x))),
/// LayerNorm + linear head. At a large batch its step is mostly activations (each block keeps
/// about 2·(width + hidden) floats a row for 2·width·hidden parameters), as real training is.
template <class B>
class ResMlpClassifier {
 public:
  ResMlpClassifier(const ResMlpConfig& config, std::uint64_t seed, tmem::DType dtype) : config_(config) {
    tmem::nn::Init init(seed);
    stem_ = std::make_unique<tmem::nn::Linear<B>>(kPixels, config.width, init, true, dtype, "stem");
    for (std::int64_t i = 0; i < config.blocks; ++i) {
      const std::string name = "block" + std::to_string(i);
      norm_.push_back(std::make_unique<tmem::nn::LayerNorm<B>>(config.width, 1e-5, dtype, name + ".ln"));
      up_.push_back(
          std::make_unique<tmem::nn::Linear<B>>(config.width, config.hidden, init, true, dtype, name + ".up"));
      down_.push_back(
          std::make_unique<tmem::nn::Linear<B>>(config.hidden, config.width, init, true, dtype, name + ".down"));
    }
    final_ln_ = std::make_unique<tmem::nn::LayerNorm<B>>(config.width, 1e-5, dtype, "ln_f");
    head_ = std::make_unique<tmem::nn::Linear<B>>(config.width, kClasses, init, true, dtype, "head");
  }

  tmem::Tensor<B> input(const std::vector<float>& images, std::int64_t n) const {
    return tmem::Tensor<B>::from_host(tmem::Shape{n, kPixels}, images, stem_->weight().dtype());
  }
  tmem::Var<B> embed(tmem::Tape<B>& tape, const tmem::Tensor<B>& input) const { return tape.input(input); }

  /// Stem, one stage per residual block, then norm + head.
  std::vector<Stage<B>> stages(bool /*training*/) const {
    std::vector<Stage<B>> s;
    s.push_back([this](const tmem::Var<B>& x) { return tmem::relu((*stem_)(x)); });
    for (std::size_t i = 0; i < up_.size(); ++i)
      s.push_back([this, i](const tmem::Var<B>& x) {
        return tmem::add(x, (*down_[i])(tmem::gelu((*up_[i])((*norm_[i])(x)))));
      });
    s.push_back([this](const tmem::Var<B>& x) { return (*head_)((*final_ln_)(x)); });
    return s;
  }

  std::vector<tmem::Var<B>> parameters() const {
    std::vector<tmem::Var<B>> p = stem_->parameters();
    for (std::size_t i = 0; i < up_.size(); ++i) {
      for (auto& v : norm_[i]->parameters()) p.push_back(v);
      for (auto& v : up_[i]->parameters()) p.push_back(v);
      for (auto& v : down_[i]->parameters()) p.push_back(v);
    }
    for (auto& v : final_ln_->parameters()) p.push_back(v);
    for (auto& v : head_->parameters()) p.push_back(v);
    return p;
  }
  /// The parameters of each stage, in stage order (ZeRO-3's units).
  std::vector<std::vector<tmem::Var<B>>> stage_parameters() const {
    std::vector<std::vector<tmem::Var<B>>> units{stem_->parameters()};
    for (std::size_t i = 0; i < up_.size(); ++i) {
      std::vector<tmem::Var<B>> u = norm_[i]->parameters();
      for (auto& v : up_[i]->parameters()) u.push_back(v);
      for (auto& v : down_[i]->parameters()) u.push_back(v);
      units.push_back(u);
    }
    std::vector<tmem::Var<B>> last = final_ln_->parameters();
    for (auto& v : head_->parameters()) last.push_back(v);
    units.push_back(last);
    return units;
  }

  std::string describe() const {
    return "residual mlp 784-" + std::to_string(config_.width) + ", " + std::to_string(config_.blocks) +
           " blocks of hidden " + std::to_string(config_.hidden) + ", head 10";
  }

 private:
  ResMlpConfig config_;
  std::unique_ptr<tmem::nn::Linear<B>> stem_, head_;
  std::vector<std::unique_ptr<tmem::nn::LayerNorm<B>>> norm_;
  std::vector<std::unique_ptr<tmem::nn::Linear<B>>> up_, down_;
  std::unique_ptr<tmem::nn::LayerNorm<B>> final_ln_;
};

/// \brief Shape of the small vision transformer.
struct VitConfig {
  std::int64_t dim = 64;
  std::int64_t depth = 4;
  std::int64_t heads = 4;
  std::int64_t mlp_hidden = 128;
};

/// \brief A small vision transformer over 7x7 patches.
template <class B>
class VitClassifier {
 public:
  static constexpr std::int64_t kPatch = 7, kGrid = kImageSide / kPatch, kTokens = kGrid * kGrid,
                                kPatchPixels = kPatch * kPatch;

  VitClassifier(const VitConfig& config, std::uint64_t seed, tmem::DType dtype) : config_(config) {
    tmem::nn::Init init(seed);
    patch_embed_ = std::make_unique<tmem::nn::Linear<B>>(kPatchPixels, config.dim, init, true, dtype, "patch_embed");
    // Learned position embedding, one row of dim per token, flattened so that it adds
    // to [n, tokens * dim] as a row broadcast. N(0, 0.02) as in GPT-2 and ViT.
    position_ = init.parameter<B>(tmem::Shape{kTokens * config.dim}, init.normal(kTokens * config.dim, 0.0, 0.02),
                                  dtype, "position");
    for (std::int64_t i = 0; i < config.depth; ++i)
      blocks_.push_back(std::make_unique<tmem::nn::TransformerBlock<B>>(config.dim, config.heads, config.mlp_hidden,
                                                                        init, 0.0f, dtype, "block" + std::to_string(i),
                                                                        tmem::nn::Masking::Bidirectional));
    final_ln_ = std::make_unique<tmem::nn::LayerNorm<B>>(config.dim, 1e-5, dtype, "ln_f");
    head_ = std::make_unique<tmem::nn::Linear<B>>(config.dim, kClasses, init, true, dtype, "head");
  }

  /// Images [n, 28, 28] -> patches [n, 16, 49]: patch (r, c) holds rows 7r..7r+6, columns 7c..7c+6.
  tmem::Tensor<B> input(const std::vector<float>& images, std::int64_t n) const {
    std::vector<float> patches(images.size());
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t y = 0; y < kImageSide; ++y)
        for (std::int64_t x = 0; x < kImageSide; ++x) {
          const std::int64_t token = (y / kPatch) * kGrid + x / kPatch, within = (y % kPatch) * kPatch + x % kPatch;
          patches[(i * kTokens + token) * kPatchPixels + within] = images[i * kPixels + y * kImageSide + x];
        }
    return tmem::Tensor<B>::from_host(tmem::Shape{n, kTokens, kPatchPixels}, patches);
  }

  /// The input as the first stage sees it: a constant on the tape.
  tmem::Var<B> embed(tmem::Tape<B>& tape, const tmem::Tensor<B>& input) const { return tape.input(input); }

  /// Embedding, one stage per transformer block, then norm + pool + head.
  std::vector<Stage<B>> stages(bool training) const {
    std::vector<Stage<B>> s;
    s.push_back([this](const tmem::Var<B>& patches) {
      const std::int64_t n = patches.shape()[0], d = config_.dim;
      auto tokens = tmem::reshape((*patch_embed_)(patches), tmem::Shape{n, kTokens * d});
      return tmem::reshape(tmem::add(tokens, position_), tmem::Shape{n, kTokens, d});
    });
    for (const auto& block : blocks_) {
      const tmem::nn::TransformerBlock<B>* b = block.get();
      s.push_back([b, training](const tmem::Var<B>& x) { return (*b)(x, training); });
    }
    s.push_back([this](const tmem::Var<B>& x) { return (*head_)(mean_over_tokens((*final_ln_)(x))); });
    return s;
  }

  std::vector<tmem::Var<B>> parameters() const {
    std::vector<tmem::Var<B>> p = patch_embed_->parameters();
    p.push_back(position_);
    for (const auto& b : blocks_)
      for (auto& v : b->parameters()) p.push_back(v);
    for (auto& v : final_ln_->parameters()) p.push_back(v);
    for (auto& v : head_->parameters()) p.push_back(v);
    return p;
  }
  /// The parameters of each stage, in stage order (ZeRO-3's units).
  std::vector<std::vector<tmem::Var<B>>> stage_parameters() const {
    std::vector<tmem::Var<B>> first = patch_embed_->parameters();
    first.push_back(position_);
    std::vector<std::vector<tmem::Var<B>>> units{first};
    for (const auto& b : blocks_) units.push_back(b->parameters());
    std::vector<tmem::Var<B>> last = final_ln_->parameters();
    for (auto& v : head_->parameters()) last.push_back(v);
    units.push_back(last);
    return units;
  }

  std::string describe() const {
    return "vit 16 patches of 7x7, dim " + std::to_string(config_.dim) + ", " + std::to_string(config_.depth) +
           " blocks, " + std::to_string(config_.heads) + " heads, mlp " + std::to_string(config_.mlp_hidden);
  }

 private:
  /// x [n, T, d] -> [n, d]: swap to [n, d, T] and multiply by a column of 1/T.
  static tmem::Var<B> mean_over_tokens(const tmem::Var<B>& x) {
    const std::int64_t n = x.shape()[0], t = x.shape()[1], d = x.shape()[2];
    auto columns = tmem::reshape(tmem::transpose(x), tmem::Shape{n * d, t});
    auto weights = x.tape()->input(tmem::Tensor<B>::from_host(
        tmem::Shape{t, 1}, std::vector<float>(static_cast<std::size_t>(t), 1.0f / static_cast<float>(t))));
    return tmem::reshape(tmem::matmul(columns, weights), tmem::Shape{n, d});
  }

  VitConfig config_;
  std::unique_ptr<tmem::nn::Linear<B>> patch_embed_;
  std::unique_ptr<tmem::nn::LayerNorm<B>> final_ln_;
  tmem::Var<B> position_;
  std::vector<std::unique_ptr<tmem::nn::TransformerBlock<B>>> blocks_;
  std::unique_ptr<tmem::nn::Linear<B>> head_;
};

}  // namespace examples
