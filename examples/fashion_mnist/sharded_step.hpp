// examples/fashion_mnist/sharded_step.hpp — one training step on one rank of a data-parallel job.
//
// Every rank runs forward and backward on its slice of the global batch; what happens
// between backward and the weights' update is the ZeRO stage:
//   0  plain data parallelism: dist::DataParallel averages every gradient, and every
//      rank runs the same amp::TrainStep (AdamW, f32 masters under bf16 / f16) on all
//      of the model state;
//   1  dist::ZeroOptimizer: the gradients are averaged, each rank keeps f32 masters and
//      AdamW moments of its shard only and all-gathers the updated 16-bit weights;
//   2  as 1, and each rank keeps only its shard of the averaged gradient.
// The communicator is the abstract one: under mpirun it is MPI's, and nothing here
// needs MPI itself. The loss scaler (f16) is one per rank; ZeroOptimizer makes the
// ranks agree on skipping, and under stage 0 the averaged gradients are the same on
// every rank, so every rank decides the same.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/training.hpp"
#include "trainmem/distributed/data_parallel.hpp"
#include "trainmem/distributed/zero.hpp"
#include "trainmem/trainmem.hpp"

namespace examples {

/// \brief A training step whose gradients are averaged over the ranks of a communicator.
template <class B>
class ShardedStep {
 public:
  /// A collective. `params` are the model's f32 parameters; under bf16 / f16 they become
  /// 16-bit (stage 0: amp::TrainStep's masters; 1 and 2: ZeroOptimizer's flat buffer).
  ShardedStep(trainmem::dist::Communicator<B>& comm, const std::vector<trainmem::Var<B>>& params, int stage,
              trainmem::DType precision, trainmem::optim::AdamWOptions adamw)
      : stage_(stage), precision_(precision), scaler_(precision, {}) {
    namespace tmem = trainmem;
    tmem::require(stage >= 0 && stage <= 2, "--zero must be 0, 1 or 2, got ", stage);
    if (stage == 0) {
      adamw_ = std::make_unique<tmem::optim::AdamW<B>>(params, adamw);
      train_ = std::make_unique<tmem::amp::TrainStep<B>>(*adamw_, tmem::amp::TrainStepOptions{.precision = precision});
      sync_ = std::make_unique<tmem::dist::DataParallel<B>>(comm, params);
    } else {
      zero_ = std::make_unique<tmem::dist::ZeroOptimizer<B>>(
          comm, params, tmem::dist::ZeroOptions{.stage = stage, .model_dtype = precision}, adamw);
    }
  }

  /// Sets the learning rate of the next steps.
  void set_lr(double lr) {
    if (adamw_) adamw_->options().lr = lr;
    else zero_->shard_optimizer().options().lr = lr;
  }

  /// Forward (`forward` returns this rank's mean loss) under the precision's autocast,
  /// backward, the average over ranks and the update.
  template <class Forward>
  trainmem::amp::StepReport<B> run(Forward&& forward) {
    namespace tmem = trainmem;
    tmem::amp::StepReport<B> report;
    B& backend = B::default_instance();
    if (train_) {
      const tmem::Var<B> loss = train_->forward(std::forward<Forward>(forward));
      report.loss = loss.value();
      train_->backward(loss);
      sync_->average_gradients();
      model_state_after_reduce_ = model_state_bytes(backend.memory());
      report.stepped = train_->update();
    } else {
      backend.memory().mark("forward");
      tmem::Var<B> loss;
      {
        std::unique_ptr<tmem::amp::Autocast> autocast;
        if (tmem::is_16bit(precision_)) autocast = std::make_unique<tmem::amp::Autocast>(precision_);
        loss = std::forward<Forward>(forward)();
      }
      report.loss = loss.value();
      backend.memory().mark("backward");
      scaler_.scale(loss).backward();
      zero_->reduce_gradients();
      model_state_after_reduce_ = model_state_bytes(backend.memory());
      backend.memory().mark("optimizer");
      report.stepped = zero_->step(scaler_);
      scaler_.update();
      zero_->zero_grad();
    }
    skipped_ += report.stepped ? 0 : 1;
    return report;
  }

  /// Live bytes of parameters, gradients, masters and optimizer state (what the ZeRO
  /// formulas count), read by the last step right after its gradients were reduced.
  std::int64_t model_state_after_reduce() const { return model_state_after_reduce_; }
  static std::int64_t model_state_bytes(const trainmem::MemoryStats& stats) {
    using trainmem::MemCategory;
    return stats.live(MemCategory::Parameter) + stats.live(MemCategory::Gradient) +
           stats.live(MemCategory::MasterWeight) + stats.live(MemCategory::OptimizerState);
  }

  int stage() const { return stage_; }
  std::int64_t skipped_steps() const { return train_ ? train_->skipped_steps() : skipped_; }
  /// The loss scale and skipped steps under f16 (empty otherwise), for the progress line.
  std::string status() const {
    if (train_) return precision_status(*train_);
    if (!scaler_.is_enabled()) return {};
    return "scale " + std::to_string(static_cast<long long>(scaler_.get_scale())) + ", skipped " +
           std::to_string(skipped_);
  }

 private:
  int stage_;
  trainmem::DType precision_;
  trainmem::amp::GradScaler<B> scaler_;  // stages 1 and 2 (stage 0: the TrainStep's)
  std::unique_ptr<trainmem::optim::AdamW<B>> adamw_;
  std::unique_ptr<trainmem::amp::TrainStep<B>> train_;
  std::unique_ptr<trainmem::dist::DataParallel<B>> sync_;
  std::unique_ptr<trainmem::dist::ZeroOptimizer<B>> zero_;
  std::int64_t skipped_ = 0;
  std::int64_t model_state_after_reduce_ = 0;
};

}  // namespace examples
