// examples/fashion_mnist/sharded_step.hpp — one training step on one rank of a data-parallel job.
//
// Every rank runs forward and backward on its slice of the global batch; what happens
// between backward and the weights' update is the ZeRO stage:
//   0  plain data parallelism: dist::DataParallel averages every gradient, and every
//      rank runs the same amp::TrainStep (AdamW, f32 masters under bf16 / f16) on all
//      of the model state;
//   1  dist::ZeroOptimizer: the gradients are averaged, each rank keeps f32 masters and
//      AdamW moments of its shard only and all-gathers the updated 16-bit weights;
//   2  as 1, and each rank keeps only its shard of the averaged gradient;
//   3  dist::FullyShardedModel: the weights are sharded too, each stage of the model a unit
//      gathered for its forward and its backward (wrap() makes the stages do that), each
//      rank's gradient shard reduce-scattered during backward.
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
#include "trainmem/distributed/fully_sharded.hpp"
#include "trainmem/distributed/zero.hpp"
#include "trainmem/trainmem.hpp"

namespace examples {

/// \brief A training step whose gradients are averaged over the ranks of a communicator.
template <class B>
class ShardedStep {
 public:
  /// A collective. `units` are the model's f32 parameters, stage by stage; under bf16 / f16
  /// they become 16-bit (stage 0: amp::TrainStep's masters; 1 and 2: ZeroOptimizer's flat
  /// buffer; 3: FullyShardedModel's shards).
  ShardedStep(trainmem::dist::Communicator<B>& comm, const std::vector<std::vector<trainmem::Var<B>>>& units, int stage,
              trainmem::DType precision, trainmem::optim::AdamWOptions adamw)
      : stage_(stage), precision_(precision), scaler_(precision, {}) {
    namespace tmem = trainmem;
    tmem::require(stage >= 0 && stage <= 3, "--zero must be 0, 1, 2 or 3, got ", stage);
    std::vector<tmem::Var<B>> params;
    for (const auto& unit : units) params.insert(params.end(), unit.begin(), unit.end());
    if (stage == 3) {
      sharded_ = std::make_unique<tmem::dist::FullyShardedModel<B>>(
          comm, units, tmem::dist::FullyShardedOptions{.model_dtype = precision}, adamw);
    } else if (stage == 0) {
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
    else if (sharded_) sharded_->shard_optimizer().options().lr = lr;
    else zero_->shard_optimizer().options().lr = lr;
  }

  /// The stages as this step runs them: under ZeRO-3 each runs as its unit (gathered for its
  /// forward and backward), as a checkpoint region keeping matmul outputs inside the unit
  /// when `selective`; otherwise the stages themselves.
  std::vector<Stage<B>> wrap(const std::vector<Stage<B>>& stages, bool selective) {
    if (!sharded_) return stages;
    std::vector<Stage<B>> out;
    for (std::size_t u = 0; u < stages.size(); ++u) {
      out.push_back([this, u, stage = stages[u], selective](const trainmem::Var<B>& x) {
        trainmem::Tape<B>& tape = *x.tape();
        return sharded_->forward(
            tape, u,
            [&](const trainmem::Var<B>& in) {
              if (!selective) return stage(in);
              trainmem::CheckpointOptions options;
              options.policy = trainmem::policy::save_matmuls();
              return trainmem::checkpoint(tape, options, stage, in);
            },
            x);
      });
    }
    return out;
  }
  /// ZeRO-3: gathers every unit (a collective), so the model can be evaluated as it is; and
  /// releases them again. Nothing for the other stages, whose ranks hold every weight.
  void gather_all() {
    if (sharded_)
      for (std::size_t u = 0; u < sharded_->units(); ++u) sharded_->gather(u);
  }
  void release_all() {
    if (sharded_)
      for (std::size_t u = 0; u < sharded_->units(); ++u) sharded_->release(u);
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
      if (sharded_) sharded_->micro_batch_done();
      else zero_->reduce_gradients();
      model_state_after_reduce_ = model_state_bytes(backend.memory());
      backend.memory().mark("optimizer");
      report.stepped = sharded_ ? sharded_->step(scaler_) : zero_->step(scaler_);
      scaler_.update();
      if (sharded_) sharded_->zero_grad();
      else zero_->zero_grad();
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
  std::unique_ptr<trainmem::dist::FullyShardedModel<B>> sharded_;
  std::int64_t skipped_ = 0;
  std::int64_t model_state_after_reduce_ = 0;
};

}  // namespace examples
