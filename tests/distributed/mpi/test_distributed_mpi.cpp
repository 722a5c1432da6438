// tests/distributed/mpi/test_distributed_mpi.cpp — data parallelism and ZeRO over MPI, one scenario per run.
//
//   mpirun -np N test_distributed_mpi <equivalence|overflow|empty_shard|memory|mismatch|failed_backward|
//                               groups|checkpoint_bf16|fp32_grads|abort|stalled|fewer_steps|early_return|
//                               skipped_step|zero_stages|bucket_bytes|parameter_order|accumulation_steps|
//                               zero_groups|zero3_equivalence|zero3_bf16|zero3_f16|zero3_memory|
//                               zero3_resume|zero3_abort|zero3_keep|zero3_budget|zero3_planned>
//
// Each rank checks its own results and throws on a failure; dist::mpi::run then names
// the rank and aborts the job, so a failed check can never leave the others waiting.
// The references are independent: one process training on the whole global batch
// (no communicator), the ZeRO byte formulas, bitwise snapshots taken before a step,
// the same sharded run without checkpoint regions.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../distributed_model.hpp"
#include "trainmem/checkpoint/planner.hpp"
#include "trainmem/checkpoint/sequential.hpp"
#include "trainmem/distributed/agreed_plan.hpp"
#include "trainmem/distributed/fully_sharded.hpp"
#include "trainmem/distributed/mpi.hpp"

using namespace dist_test;

namespace {

template <class... Args>
void require(bool ok, const Args&... what) {
  trainmem::detail::check(ok, "check failed: ", what...);
}

/// Every rank's `values` equal rank 0's, bit for bit.
void require_same_on_every_rank(dist::Communicator<B>& comm, const std::vector<double>& values, const char* what) {
  std::vector<double> all(values.size() * static_cast<std::size_t>(comm.size()));
  comm.all_gather_host(std::as_bytes(std::span(values)), std::as_writable_bytes(std::span(all)));
  for (int q = 0; q < comm.size(); ++q)
    require(std::memcmp(all.data() + q * values.size(), values.data(), values.size() * sizeof(double)) == 0, what,
            ": rank ", q, " differs from rank ", comm.rank());
}

/// max |got - want| <= 1e-6 max |want|: relative to the weights' scale, since the f32 gradient sums
/// of N ranks round differently from one process's (a weight near 0 differs by a few ulps of the others).
void require_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  require(got.size() == want.size(), what, ": sizes differ");
  double worst = 0, scale = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    if (std::abs(got[i] - want[i]) > worst) worst = std::abs(got[i] - want[i]), at = i;
  }
  require(worst <= 1e-6 * scale, what, ": weight ", at, " is ", got[at], ", one process has ", want[at],
          " (difference ", worst / scale, " of the largest weight, > 1e-6)");
}

/// 20 AdamW steps on N ranks equal one process on the global batch (≤ 1e-6 relative),
/// bitwise between two runs and across ranks; with and without accumulation; buckets
/// (16 elements: four of them for Ψ = 55) sent during backward give bitwise the weights
/// of buckets sent after it.
int equivalence(dist::mpi::Communicator& comm) {
  const std::vector<double> reference = train_reference(20);
  for (int stage : {0, 1, 2}) {
    for (int micro : {1, 2}) {
      const std::string what = "stage " + std::to_string(stage) + ", " + std::to_string(micro) + " micro-batches";
      const std::vector<double> first = train_ranks(comm, stage, 20, 64, micro);
      const std::vector<double> second = train_ranks(comm, stage, 20, 64, micro);
      const std::vector<double> after_backward = train_ranks(comm, stage, 20, 64, micro, false);
      require(first == second, what, ": two runs differ");
      require(first == after_backward, what, ": buckets sent during backward differ from buckets sent after it");
      require_same_on_every_rank(comm, first, what.c_str());
      require_close(first, reference, what);
    }
  }
  return 0;
}

/// The last rank's backward fails part way at step 3 (a changed saved input); every rank
/// still averages, every rank's optimizer refuses the step with its weights unchanged
/// (train_ranks checks both), and after zero_grad the step runs again: the weights are
/// bitwise those of the run without the failure, and the same on every rank.
int failed_backward(dist::mpi::Communicator& comm) {
  for (int stage : {0, 1, 2}) {
    for (int micro : {1, 2}) {
      for (bool overlap : {true, false}) {
        const std::string what = "stage " + std::to_string(stage) + ", " + std::to_string(micro) +
                                 " micro-batches, overlap " + (overlap ? "on" : "off");
        const std::vector<double> clean = train_ranks(comm, stage, 6, 64, micro, overlap);
        const std::vector<double> failed = train_ranks(comm, stage, 6, 64, micro, overlap, 3);
        require(failed == clean, what, ": a refused step left a trace in the weights");
        require_same_on_every_rank(comm, failed, what.c_str());
      }
    }
  }
  return 0;
}

/// Decay / no-decay groups with their own rate and betas, as one process on the global batch
/// trains them.
std::vector<optim::AdamWGroup<B>> tiny_groups(const TinyNet& net) {
  return {{.params = {net.fc1.weight(), net.fc2.weight()}, .weight_decay = 0.1},
          {.params = {net.fc1.bias()}, .lr_scale = 0.5, .beta2 = 0.99, .weight_decay = 0.0}};
}

/// Parameter groups survive sharding: ZeRO-1/2 with two groups (on 2 ranks, rank 0's shard
/// holds only the first group's elements) train as one grouped AdamW on the whole batch
/// (<= 1e-6 relative), bitwise alike on every rank, and unlike the same run without groups.
int groups(dist::mpi::Communicator& comm) {
  std::vector<double> reference, ungrouped;
  {
    TinyNet net;
    optim::AdamW<B> opt(tiny_groups(net), adamw_options());
    for (int s = 0; s < 10; ++s) {
      opt.zero_grad();
      backward(net, 0, kGlobalBatch, s, DType::F32);
      opt.step();
    }
    reference = weights(net);
  }
  ungrouped = train_reference(10);
  for (int stage : {1, 2}) {
    const std::string what = "groups, stage " + std::to_string(stage);
    TinyNet net;
    const std::int64_t rows = kGlobalBatch / comm.size(), first = comm.rank() * rows;
    dist::ZeroOptimizer<B> zero(comm, tiny_groups(net),
                                {.stage = stage, .model_dtype = DType::F32, .data_parallel = {.bucket_bytes = 64}},
                                adamw_options());
    for (int s = 0; s < 10; ++s) {
      zero.zero_grad();
      backward(net, first, first + rows, s, DType::F32);
      zero.reduce_gradients();
      zero.step();
    }
    const std::vector<double> got = weights(net);
    require_same_on_every_rank(comm, got, what.c_str());
    require_close(got, reference, what);
    double apart = 0;
    for (std::size_t i = 0; i < got.size(); ++i) apart = std::max(apart, std::abs(got[i] - ungrouped[i]));
    require(apart > 1e-4, what, ": the groups changed nothing (", apart, " from the run without groups)");
  }
  return 0;
}

/// Everything an overflow must leave unchanged, as raw bits.
std::vector<double> snapshot(const std::vector<Var<B>>& params, const optim::Optimizer<B>& opt) {
  std::vector<double> out;
  const auto add = [&](const Tensor<B>& t) {
    if (!t.defined()) return;
    for (double v : t.to_host<double>()) out.push_back(v);
  };
  for (const auto& p : params) add(p.value());
  for (const auto& e : opt.entries()) {
    add(e.master);
    add(e.first_moment);
    add(e.second_moment);
    add(e.step_state);
  }
  return out;
}

/// FP16 with an overflow on the last rank only at step 3: every rank skips that step and
/// leaves weights, masters and optimizer state bitwise unchanged, and every scaler backs
/// off; the steps around it apply. The overflow is an inf written into a gradient after
/// backward (buckets sent after backward), or an inf in a sample (buckets sent during it).
int overflow(dist::mpi::Communicator& comm) {
  for (const bool overlap : {false, true})
    for (int stage : {0, 1, 2}) {
      TinyNet net;
      amp::GradScaler<B> scaler(DType::F16, {.init_scale = 1024});
      const std::int64_t rows = kGlobalBatch / comm.size(), first = comm.rank() * rows;
      std::unique_ptr<dist::DataParallel<B>> sync;
      std::unique_ptr<amp::MasterWeights<B>> masters;
      std::unique_ptr<optim::AdamW<B>> plain;
      std::unique_ptr<dist::ZeroOptimizer<B>> zero;
      if (stage == 0) {
        sync = std::make_unique<dist::DataParallel<B>>(
            comm, net.parameters(), dist::DataParallelOptions{.bucket_bytes = 64, .overlap_with_backward = overlap});
        masters = std::make_unique<amp::MasterWeights<B>>(net.parameters(),
                                                          amp::MasterWeightsOptions{.model_dtype = DType::F16});
        plain = std::make_unique<optim::AdamW<B>>(net.parameters(), adamw_options());
        masters->attach(*plain);
      } else {
        zero = std::make_unique<dist::ZeroOptimizer<B>>(
            comm, net.parameters(),
            dist::ZeroOptions{.stage = stage,
                              .model_dtype = DType::F16,
                              .data_parallel = {.bucket_bytes = 64, .overlap_with_backward = overlap}},
            adamw_options());
      }
      optim::Optimizer<B>& opt = stage == 0 ? static_cast<optim::Optimizer<B>&>(*plain) : zero->shard_optimizer();
      for (int s = 0; s < 6; ++s) {
        for (const auto& p : net.parameters()) p.zero_grad();
        const bool overflows = s == 3 && comm.rank() == comm.size() - 1;
        backward(net, first, first + rows, s, DType::F16, &scaler, overflows && overlap);
        if (overflows && !overlap) {  // an element of rank 0's shard
          const Var<B> p = net.parameters()[0];
          std::vector<double> g = p.grad().to_host<double>();
          g[0] = INFINITY;
          p.set_grad(Tensor<B>::from_host(p.shape(), g, DType::F16, MemCategory::Gradient));
        }
        const std::vector<double> before = snapshot(net.parameters(), opt);
        bool stepped = false;
        if (stage == 0) {
          sync->average_gradients();
          stepped = scaler.step(*plain);
        } else {
          zero->reduce_gradients();
          stepped = zero->step(scaler);
        }
        scaler.update();
        const std::string what =
            "stage " + std::to_string(stage) + " step " + std::to_string(s) + (overlap ? " (overlapped)" : "");
        require(stepped == (s != 3), what, ": stepped is ", stepped);
        if (s == 3) {
          require(snapshot(net.parameters(), opt) == before, what, ": a skipped step changed the state");
          require(scaler.get_scale() == 512.0, what, ": the scale is ", scaler.get_scale(), ", not 512");
        }
      }
      require_same_on_every_rank(comm, weights(net), ("stage " + std::to_string(stage) + " weights").c_str());
    }
  return 0;
}

/// w x ≈ 2x with one weight (Ψ = 1): every rank but 0 has an empty shard.
int empty_shard(dist::mpi::Communicator& comm) {
  const auto train = [&](dist::Communicator<B>* c, int stage) {
    nn::Init init(3);
    nn::Linear<B> fc(1, 1, init, false, DType::F32, "fc");
    const std::int64_t n = c ? c->size() : 1, r = c ? c->rank() : 0, rows = kGlobalBatch / n;
    std::unique_ptr<dist::ZeroOptimizer<B>> zero;
    std::unique_ptr<optim::AdamW<B>> plain;
    if (c) {
      zero = std::make_unique<dist::ZeroOptimizer<B>>(
          *c, fc.parameters(), dist::ZeroOptions{.stage = stage, .model_dtype = DType::F32}, adamw_options());
      require(zero->shard().empty() == (r > 0), "rank ", r, "'s shard is [", zero->shard().begin, ", ",
              zero->shard().end, ")");
    } else {
      plain = std::make_unique<optim::AdamW<B>>(fc.parameters(), adamw_options());
    }
    for (int s = 0; s < 20; ++s) {
      fc.weight().zero_grad();
      std::vector<double> x, y;
      for (std::int64_t i = r * rows; i < (r + 1) * rows; ++i) {
        x.push_back(std::cos(0.5 * static_cast<double>(i + s)));
        y.push_back(2 * x.back());
      }
      Tape<B> tape;
      const Var<B> d = sub(fc(tape.input(Tensor<B>::from_host(Shape{rows, 1}, x))),
                           tape.input(Tensor<B>::from_host(Shape{rows, 1}, y)));
      tape.backward(mean(mul(d, d)));
      if (zero) {
        zero->reduce_gradients();
        zero->step(0.5);  // with global-norm clipping: an empty shard adds 0 to the norm
      } else {
        optim::clip_grad_norm(fc.parameters(), 0.5);
        plain->step();
      }
    }
    return fc.weight().value().to_host<double>();
  };
  const std::vector<double> reference = train(nullptr, 0);
  for (int stage : {1, 2}) {
    const std::vector<double> w = train(&comm, stage);
    require_same_on_every_rank(comm, w, "empty-shard weights");
    require_close(w, reference, "empty shard, stage " + std::to_string(stage));
  }
  return 0;
}

/// Per-rank bytes of weights + gradients + masters + optimizer state, BF16 AdamW, after
/// the gradients are reduced: 4Ψ + 12Ψ/N (ZeRO-1), 2Ψ + 14Ψ/N (ZeRO-2), within one bucket.
int memory(dist::mpi::Communicator& mpi) {
  constexpr std::int64_t kBucket = 256;
  dist::SingleProcess<B> one;
  for (dist::Communicator<B>* comm :
       {static_cast<dist::Communicator<B>*>(&one), static_cast<dist::Communicator<B>*>(&mpi)}) {
    for (int stage : {1, 2}) {
      const MemoryStats& stats = B::default_instance().memory();
      const auto model_state = [&] {
        return stats.live(MemCategory::Parameter) + stats.live(MemCategory::Gradient) +
               stats.live(MemCategory::MasterWeight) + stats.live(MemCategory::OptimizerState);
      };
      const std::int64_t base = model_state();
      nn::Init init(5);
      nn::Linear<B> fc1(64, 48, init, true, DType::F32, "fc1"), fc2(48, 10, init, true, DType::F32, "fc2");
      std::vector<Var<B>> params = fc1.parameters();
      for (const auto& p : fc2.parameters()) params.push_back(p);
      const double psi = 64 * 48 + 48 + 48 * 10 + 10, n = comm->size();
      dist::ZeroOptimizer<B> zero(
          *comm, params, {.stage = stage, .model_dtype = DType::BF16, .data_parallel = {.bucket_bytes = kBucket}},
          adamw_options());
      std::int64_t measured = 0;
      for (int s = 0; s < 2; ++s) {
        zero.zero_grad();
        Tape<B> tape;
        auto [x, labels] = [&] {
          std::vector<double> v(4 * 64), l(4);
          for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.1 * static_cast<double>(i + s));
          for (std::size_t i = 0; i < l.size(); ++i) l[i] = static_cast<double>(i % 10);
          return std::pair{Tensor<B>::from_host(Shape{4, 64}, v), Tensor<B>::from_host(Shape{4}, l, DType::I32)};
        }();
        Var<B> loss;
        {
          amp::Autocast guard(DType::BF16);
          loss = cross_entropy(fc2(tanh(fc1(tape.input(x)))), labels);
        }
        tape.backward(loss);
        zero.reduce_gradients();
        measured = model_state() - base;  // masters and moments exist from the first step on
        zero.step();
      }
      const double formula = stage == 1 ? 4 * psi + 12 * psi / n : 2 * psi + 14 * psi / n;
      std::printf("rank %d of %d, ZeRO-%d: %lld bytes of model state, formula %.1f\n", comm->rank(), comm->size(),
                  stage, static_cast<long long>(measured), formula);
      require(std::abs(static_cast<double>(measured) - formula) <= kBucket, "ZeRO-", stage, " on ", comm->size(),
              " ranks: ", measured, " bytes, formula ", formula);
    }
  }
  return 0;
}

/// The last rank's model differs: every rank throws an Error that names it and how.
int mismatch(dist::mpi::Communicator& comm) {
  const bool odd = comm.rank() == comm.size() - 1;
  nn::Init init(1);
  nn::Linear<B> fc1(7, 5, init, true, DType::F32, "fc1"), fc2(5, odd ? 4 : 3, init, false, DType::F32, "fc2");
  std::vector<Var<B>> params = fc1.parameters();
  for (const auto& p : fc2.parameters()) params.push_back(p);
  const std::string expected = "rank " + std::to_string(comm.size() - 1) +
                               " has parameter 2 'fc2.weight' [4, 5] f32, rank 0 has 'fc2.weight' [3, 5] f32";
  try {
    dist::DataParallel<B> sync(comm, params);
    require(false, "no error for mismatched parameter lists");
  } catch (const Error& e) {
    require(std::string(e.what()).find(expected) != std::string::npos, "the error '", e.what(), "' lacks '", expected,
            "'");
  }
  if (odd) params.pop_back();
  try {
    dist::DataParallel<B> sync(comm, params);
    require(false, "no error for a missing parameter");
  } catch (const Error& e) {
    const std::string count = "rank " + std::to_string(comm.size() - 1) + " has parameter count 2, rank 0 has 3";
    require(std::string(e.what()).find(count) != std::string::npos, "the error '", e.what(), "' lacks '", count, "'");
  }
  return 0;
}

/// A residual MLP: an embedding Linear(7, 16), four blocks x + dropout(fc2(gelu(fc1(layer_norm(x))))),
/// and a head Linear(16, 3). Ψ = 4595, odd, so the two shards split a parameter.
struct BlockNet {
  static constexpr std::int64_t kWidth = 16, kHidden = 32, kBlocks = 4;
  struct Block {
    nn::LayerNorm<B> norm;
    nn::Linear<B> fc1, fc2;
  };
  BlockNet() : init(11), embed(kFeatures, kWidth, init, true, DType::F32, "embed") {
    for (std::int64_t b = 0; b < kBlocks; ++b) {
      const std::string name = "block" + std::to_string(b);
      blocks.push_back({nn::LayerNorm<B>(kWidth, 1e-5, DType::F32, name + ".norm"),
                        nn::Linear<B>(kWidth, kHidden, init, true, DType::F32, name + ".fc1"),
                        nn::Linear<B>(kHidden, kWidth, init, true, DType::F32, name + ".fc2")});
    }
    head.emplace(kWidth, kClasses, init, true, DType::F32, "head");
  }
  std::vector<Var<B>> parameters() const {
    std::vector<Var<B>> ps = embed.parameters();
    for (const Block& b : blocks)
      for (const auto& list : {b.norm.parameters(), b.fc1.parameters(), b.fc2.parameters()})
        for (const auto& p : list) ps.push_back(p);
    for (const auto& p : head->parameters()) ps.push_back(p);
    return ps;
  }
  /// The blocks as layers: copies of the modules share their parameters.
  std::vector<Layer<B>> block_layers() const {
    std::vector<Layer<B>> layers;
    for (const Block& b : blocks)
      layers.push_back([b](const Var<B>& x) { return add(x, dropout(b.fc2(gelu(b.fc1(b.norm(x)))), 0.25f)); });
    return layers;
  }
  nn::Init init;
  nn::Linear<B> embed;
  std::vector<Block> blocks;
  std::optional<nn::Linear<B>> head;  // built after the blocks, so it draws from `init` after them
};

/// How the blocks run: as they are, each block a full-recompute region, or in
/// checkpoint_sequential's two segments keeping matmul outputs (the last not checkpointed).
enum class Regions { None, EveryBlock, SelectiveSegments };

/// Appends the raw bytes of `t` (nothing for an undefined or empty tensor).
void append_bits(std::vector<unsigned char>& out, const Tensor<B>& t) {
  if (!t.defined() || t.numel() == 0) return;
  const std::size_t at = out.size();
  out.resize(at + t.bytes());
  t.backend().download(out.data() + at, t.data(), t.bytes());
}

/// The raw bits after 8 AdamW steps of ZeRO-2 with BF16 weights and f32 masters, BF16
/// autocast, two micro-batches per step, global-norm clipping and dropout: every
/// parameter first, then this rank's masters and moments.
struct BlockRun {
  std::vector<unsigned char> params, shard_state;
  std::vector<double> initial_weights, final_weights;
  std::int64_t recomputes = 0;
};
BlockRun train_blocks(dist::Communicator<B>& comm, Regions regions) {
  BlockNet net;
  BlockRun run;
  for (const auto& p : net.parameters())
    for (double v : p.value().to_host<double>()) run.initial_weights.push_back(v);
  dist::ZeroOptimizer<B> zero(
      comm, net.parameters(),
      {.stage = 2, .model_dtype = DType::BF16, .data_parallel = {.bucket_bytes = 256, .accumulation_steps = 2}},
      adamw_options());
  const std::vector<Layer<B>> layers = net.block_layers();
  CheckpointOptions selective;
  selective.policy = policy::save_matmuls();
  const std::int64_t rows = kGlobalBatch / comm.size(), first = comm.rank() * rows;
  const std::int64_t recomputes_before = checkpoint_stats().recomputes;
  for (int s = 0; s < 8; ++s) {
    zero.zero_grad();
    for (int m = 0; m < 2; ++m) {
      Tape<B> tape;
      tape.manual_seed(static_cast<std::uint64_t>(1000 * comm.rank() + 10 * s + m));  // each rank its own masks
      auto [x, labels] = batch(first + m * rows / 2, first + (m + 1) * rows / 2, s);
      Var<B> loss;
      {
        amp::Autocast guard(DType::BF16);
        Var<B> h = net.embed(tape.input(x));
        switch (regions) {
          case Regions::None:
            for (const auto& layer : layers) h = layer(h);
            break;
          case Regions::EveryBlock:
            for (const auto& layer : layers) h = checkpoint(tape, layer, h);
            break;
          case Regions::SelectiveSegments: h = checkpoint_sequential(tape, layers, 2, h, selective); break;
        }
        loss = cross_entropy((*net.head)(h), labels);
      }
      tape.backward(loss);
      zero.micro_batch_done();
    }
    zero.step(0.05);  // small enough to clip: the global norm enters every update
  }
  run.recomputes = checkpoint_stats().recomputes - recomputes_before;
  for (const auto& p : net.parameters()) {
    require(p.dtype() == DType::BF16, "'", p.name(), "' is ", p.dtype(), ", not bf16");
    append_bits(run.params, p.value());
    for (double v : p.value().to_host<double>()) run.final_weights.push_back(v);
  }
  require(zero.masters().dtype() == DType::F32, "the masters are ", zero.masters().dtype());
  append_bits(run.shard_state, zero.masters());
  for (const auto& e : zero.shard_optimizer().entries()) {
    append_bits(run.shard_state, e.first_moment);
    append_bits(run.shard_state, e.second_moment);
  }
  return run;
}

/// Checkpoint regions (full recompute per block; selective segments) under BF16 autocast
/// with ZeRO-2's f32 masters leave every weight, master and moment bitwise as the same
/// sharded run without regions does: a recompute replays the forward's autocast, casts
/// and dropout masks exactly, so the gradients, their reduce-scatter and the updates match.
int checkpoint_bf16(dist::mpi::Communicator& comm) {
  const BlockRun plain = train_blocks(comm, Regions::None);
  require(plain.recomputes == 0, "the run without regions recomputed ", plain.recomputes, " times");
  double moved = 0;
  for (std::size_t i = 0; i < plain.final_weights.size(); ++i)
    moved = std::max(moved, std::abs(plain.final_weights[i] - plain.initial_weights[i]));
  require(moved > 1e-3, "training moved no weight by more than ", moved);
  require_same_on_every_rank(comm, plain.final_weights, "bf16 weights without regions");
  for (Regions regions : {Regions::EveryBlock, Regions::SelectiveSegments}) {
    const char* what = regions == Regions::EveryBlock ? "every block a region" : "selective segments";
    const BlockRun checkpointed = train_blocks(comm, regions);
    // 8 steps x 2 micro-batches, each recomputing 4 regions (every block) or 1 (the first segment)
    const std::int64_t expected = 16 * (regions == Regions::EveryBlock ? BlockNet::kBlocks : 1);
    require(checkpointed.recomputes == expected, what, ": ", checkpointed.recomputes, " recomputes, expected ",
            expected);
    require(checkpointed.params == plain.params, what, ": the bf16 weights differ from the run without regions");
    require(checkpointed.shard_state == plain.shard_state, what,
            ": the f32 masters or moments differ from the run without regions");
  }
  return 0;
}

/// The f32 values of `t`, in order.
std::vector<float> floats(const Tensor<B>& t) { return t.to_host<float>(); }

/// One process's reference for fp32_grads on 2 ranks, by hand: rank q's micro-batches'
/// bf16 gradients, each computed alone and widened, summed in f32 in order (S_q); the
/// average (S_0 + S_1) * (1/8) in f32, as the buckets compute it; every parameter's in
/// the flat order. Then an AdamW step of `net` on exactly that gradient.
std::vector<float> hand_average(const TinyNet& net, optim::AdamW<B>& opt, int step, int ranks, int micro) {
  const std::int64_t rows = kGlobalBatch / ranks;
  std::vector<float> total;
  for (int q = 0; q < ranks; ++q) {
    std::vector<float> sum;
    for (int m = 0; m < micro; ++m) {
      const std::int64_t first = q * rows;
      opt.zero_grad();
      backward(net, first + m * rows / micro, first + (m + 1) * rows / micro, step, DType::BF16);
      std::vector<float> g;
      for (const auto& p : net.parameters()) {
        require(p.grad().dtype() == DType::BF16, "the reference's gradient is ", p.grad().dtype());
        for (float v : floats(p.grad())) g.push_back(v);
      }
      if (sum.empty()) sum = g;
      else
        for (std::size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
    if (total.empty()) total = sum;
    else
      for (std::size_t i = 0; i < sum.size(); ++i) total[i] += sum[i];
  }
  const auto inverse = static_cast<float>(1.0 / (ranks * micro));
  for (float& v : total) v = inverse * v;
  std::size_t at = 0;
  for (const auto& p : net.parameters()) {
    const auto n = static_cast<std::size_t>(p.numel());
    p.set_grad(Tensor<B>::from_host(p.shape(), std::vector<double>(total.begin() + at, total.begin() + at + n),
                                    DType::F32, MemCategory::Gradient));
    at += n;
  }
  opt.step();
  return total;
}

/// BF16 model copies with f32 masters, 4 micro-batches per step of BF16 autocast, 3 AdamW
/// steps, with gradients summed in f32 (fp32_grads): DataParallel over amp::MasterWeights,
/// ZeRO-1 and ZeRO-2 reduce to the one-process hand-summed average bit for bit and step
/// to its masters and bf16 weights bit for bit. Without fp32_grads (bf16 sums) the
/// reduced gradients differ from it. 2 ranks: a sum of two is the same in either order.
int fp32_grads(dist::mpi::Communicator& comm) {
  require(comm.size() == 2, "fp32_grads runs on 2 ranks, not ", comm.size());
  constexpr int kMicro = 4, kSteps = 3;
  const std::int64_t rows = kGlobalBatch / comm.size(), first = comm.rank() * rows;
  for (int stage : {0, 1, 2}) {
    for (bool f32 : {true, false}) {
      const std::string what = "stage " + std::to_string(stage) + (f32 ? ", fp32_grads" : ", bf16 gradients");
      TinyNet reference_net;
      amp::MasterWeights<B> reference_masters(reference_net.parameters(), {.model_dtype = DType::BF16});
      optim::AdamW<B> reference_opt(reference_net.parameters(), adamw_options());
      reference_masters.attach(reference_opt);

      TinyNet net;
      const dist::DataParallelOptions dp{.bucket_bytes = 64, .accumulation_steps = kMicro};
      std::unique_ptr<amp::MasterWeights<B>> masters;
      std::unique_ptr<dist::DataParallel<B>> sync;
      std::unique_ptr<optim::AdamW<B>> opt;
      std::unique_ptr<dist::ZeroOptimizer<B>> zero;
      if (stage == 0) {
        masters = std::make_unique<amp::MasterWeights<B>>(
            net.parameters(), amp::MasterWeightsOptions{.model_dtype = DType::BF16, .fp32_grads = f32});
        sync = std::make_unique<dist::DataParallel<B>>(comm, net.parameters(), dp);
        opt = std::make_unique<optim::AdamW<B>>(net.parameters(), adamw_options());
        masters->attach(*opt);
      } else {
        zero = std::make_unique<dist::ZeroOptimizer<B>>(
            comm, net.parameters(),
            dist::ZeroOptions{.stage = stage, .model_dtype = DType::BF16, .fp32_grads = f32, .data_parallel = dp},
            adamw_options());
      }
      for (const auto& p : net.parameters())
        require(p.dtype() == DType::BF16 && p.grad_in_f32() == f32, what, ": '", p.name(), "' is ", p.dtype());
      for (int s = 0; s < kSteps; ++s) {
        const std::vector<float> expected = hand_average(reference_net, reference_opt, s, comm.size(), kMicro);
        if (zero) zero->zero_grad();
        else opt->zero_grad();
        for (int m = 0; m < kMicro; ++m) {
          backward(net, first + m * rows / kMicro, first + (m + 1) * rows / kMicro, s, DType::BF16);
          if (zero) zero->micro_batch_done();
          else sync->micro_batch_done();
        }
        // The reduced average: every gradient (data parallel, ZeRO-1) or this rank's shard (ZeRO-2).
        std::vector<float> reduced, wanted;
        if (stage == 2) {
          require(zero->shard_gradient().dtype() == (f32 ? DType::F32 : DType::BF16), what, ": the shard gradient is ",
                  zero->shard_gradient().dtype());
          reduced = floats(zero->shard_gradient());
          wanted.assign(expected.begin() + zero->shard().begin, expected.begin() + zero->shard().end);
        } else {
          for (const auto& p : net.parameters()) {
            require(p.grad().dtype() == (f32 ? DType::F32 : DType::BF16), what, ": a reduced gradient is ",
                    p.grad().dtype());
            for (float v : floats(p.grad())) reduced.push_back(v);
          }
          wanted = expected;
        }
        if (!f32) {
          if (s == 0) require(reduced != wanted, what, ": bf16 sums equal the f32 hand sum (the test cannot fail)");
          break;
        }
        require(reduced == wanted, what, ", step ", s, ": the reduced gradients differ from the f32 hand sum");
        if (zero) zero->step();
        else opt->step();
        // The masters (this rank's shard of them under ZeRO) and the bf16 weights are the reference's.
        std::vector<float> reference_flat, mine;
        for (const auto& master : reference_masters.masters())
          for (float v : floats(master)) reference_flat.push_back(v);
        if (zero) {
          mine = floats(zero->masters());
          reference_flat.assign(reference_flat.begin() + zero->shard().begin,
                                reference_flat.begin() + zero->shard().end);
        } else {
          for (const auto& master : masters->masters())
            for (float v : floats(master)) mine.push_back(v);
        }
        require(mine == reference_flat, what, ", step ", s, ": the masters differ from one process's");
        require(weights(net) == weights(reference_net), what, ", step ", s,
                ": the bf16 weights differ from one process's");
      }
    }
  }
  return 0;
}

// The cross-rank mistakes of issue 55: each scenario is a training loop as a user would
// write it, wrong on the last rank only. None of them may hang or train silently: every
// rank must end with a message naming the rank and what differs (the CTest cases check
// both ranks' lines), so each scenario returns 0 only if no rank noticed.

/// Stage 0 (DataParallel + AdamW) or ZeRO-1/2 on TinyNet for `steps` steps, with `options`.
void train_with(dist::Communicator<B>& comm, int stage, int steps, dist::DataParallelOptions options,
                const std::vector<Var<B>>* order = nullptr) {
  TinyNet net;
  const std::vector<Var<B>> params = order ? *order : net.parameters();
  const std::int64_t rows = kGlobalBatch / comm.size(), first = comm.rank() * rows;
  const auto micro_batches = [&](int s, auto&& done) {
    for (std::int64_t m = 0; m < options.accumulation_steps; ++m) {
      const std::int64_t n = options.accumulation_steps;
      backward(net, first + m * rows / n, first + (m + 1) * rows / n, s, DType::F32);
      done();
    }
  };
  if (stage == 0) {
    dist::DataParallel<B> sync(comm, params, options);
    optim::AdamW<B> opt(params, adamw_options());
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      micro_batches(s, [&] { sync.micro_batch_done(); });
      opt.step();
    }
  } else {
    dist::ZeroOptimizer<B> zero(comm, params, {.stage = stage, .model_dtype = DType::F32, .data_parallel = options},
                                adamw_options());
    for (int s = 0; s < steps; ++s) {
      zero.zero_grad();
      micro_batches(s, [&] { zero.micro_batch_done(); });
      zero.step();
    }
  }
}

bool last_rank(const dist::Communicator<B>& comm) { return comm.rank() == comm.size() - 1; }

/// Groups that differ on the last rank (weight decay 0.05 where the others have 0): ZeRO's
/// construction must name the group on every rank.
int zero_groups(dist::mpi::Communicator& comm) {
  TinyNet net;
  std::vector<optim::AdamWGroup<B>> groups = tiny_groups(net);
  if (last_rank(comm)) groups[1].weight_decay = 0.05;
  dist::ZeroOptimizer<B> zero(
      comm, groups, {.stage = 1, .model_dtype = DType::F32, .data_parallel = {.bucket_bytes = 64}}, adamw_options());
  return 0;
}

/// Case 3: the last rank runs 3 steps, the others 4 (the last rank leaves the job early).
int fewer_steps(dist::mpi::Communicator& comm) {
  train_with(comm, 0, last_rank(comm) ? 3 : 4, {.bucket_bytes = 64});
  return 0;
}

/// Case 3, ZeRO-2: the last rank returns right after building its optimizer.
int early_return(dist::mpi::Communicator& comm) {
  train_with(comm, 2, last_rank(comm) ? 0 : 2, {.bucket_bytes = 64});
  return 0;
}

/// Case 3, a skipped step: the last rank skips step 1 (a loop that `continue`s past a bad
/// batch), so it averages once less than the others and leaves while they wait.
int skipped_step(dist::mpi::Communicator& comm) {
  TinyNet net;
  const std::int64_t rows = kGlobalBatch / comm.size(), first = comm.rank() * rows;
  dist::DataParallel<B> sync(comm, net.parameters(), {.bucket_bytes = 64});
  optim::AdamW<B> opt(net.parameters(), adamw_options());
  for (int s = 0; s < 4; ++s) {
    if (last_rank(comm) && s == 1) continue;
    opt.zero_grad();
    backward(net, first, first + rows, s, DType::F32);
    sync.micro_batch_done();
    opt.step();
  }
  return 0;
}

/// Case 4: ZeRO stage 1 on every rank but the last, stage 2 there.
int zero_stages(dist::mpi::Communicator& comm) {
  train_with(comm, last_rank(comm) ? 2 : 1, 3, {.bucket_bytes = 64});
  return 0;
}

/// Case 5: a different bucket size on the last rank.
int bucket_bytes(dist::mpi::Communicator& comm) {
  train_with(comm, 0, 3, {.bucket_bytes = last_rank(comm) ? 128 : 64});
  return 0;
}

/// Case 6: the same parameters in another order on the last rank; both are [3, 5], so
/// only their names tell them apart.
int parameter_order(dist::mpi::Communicator& comm) {
  nn::Init init(3);
  nn::Linear<B> a(5, 3, init, false, DType::F32, "a"), b(5, 3, init, false, DType::F32, "b");
  std::vector<Var<B>> params{a.weight(), b.weight()};
  if (last_rank(comm)) std::swap(params[0], params[1]);
  dist::DataParallel<B> sync(comm, params, {.bucket_bytes = 64});
  return 0;
}

/// Case 7: two micro-batches per average on the last rank, one on the others.
int accumulation_steps(dist::mpi::Communicator& comm) {
  train_with(comm, 0, 3, {.bucket_bytes = 64, .accumulation_steps = last_rank(comm) ? 2 : 1});
  return 0;
}

/// Rank 1 arrives 3 s late at a barrier, rank 0 gives up after 2 s (run's timeout): rank 0
/// names the collective that timed out, and rank 1, arriving, fails naming rank 0.
int stalled(dist::mpi::Communicator& comm) {
  if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(3));
  comm.barrier();
  return 0;
}

/// Rank 1 throws while the others wait in a collective: the job must end, naming rank 1.
int abort_on_error(dist::mpi::Communicator& comm) {
  if (comm.rank() == 1) throw Error("injected failure");
  comm.barrier();
  return 0;
}

// --- ZeRO-3 (dist::FullyShardedModel) -----------------------------------------------------

/// TinyNet as two units ({fc1}, {fc2}) under ZeRO-3 in f32: `micro` micro-batches a step.
std::vector<double> train_zero3_tiny(dist::Communicator<B>& comm, int steps, int micro, int prefetch) {
  TinyNet net;
  dist::FullyShardedModel<B> model(
      comm, {net.fc1.parameters(), net.fc2.parameters()},
      {.model_dtype = DType::F32, .prefetch_depth = prefetch, .bucket_bytes = 64, .accumulation_steps = micro},
      adamw_options());
  const std::int64_t rows = kGlobalBatch / comm.size(), first = comm.rank() * rows;
  for (int s = 0; s < steps; ++s) {
    model.zero_grad();
    for (int m = 0; m < micro; ++m) {
      Tape<B> tape;
      auto [x, labels] = batch(first + m * rows / micro, first + (m + 1) * rows / micro, s);
      Var<B> h = model.forward(
          tape, 0, [&](const Var<B>& in) { return tanh(net.fc1(in)); }, tape.input(x));
      Var<B> logits = model.forward(
          tape, 1, [&](const Var<B>& in) { return net.fc2(in); }, h);
      tape.backward(cross_entropy(logits, labels));
      model.micro_batch_done();
    }
    model.step();
  }
  return model.full_weights();
}

/// ZeRO-3 in f32, 20 AdamW steps, with and without accumulation and prefetch: equal to one
/// process on the global batch and to ZeRO-2 (<= 1e-6 relative), bitwise between two runs,
/// with prefetch and without, and on every rank.
int zero3_equivalence(dist::mpi::Communicator& comm) {
  const std::vector<double> reference = train_reference(20);
  const std::int64_t rows = kGlobalBatch / comm.size();
  for (int micro : {1, rows % 2 == 0 ? 2 : 3}) {
    const std::string what = "ZeRO-3, " + std::to_string(micro) + " micro-batches";
    const std::vector<double> first = train_zero3_tiny(comm, 20, micro, 1);
    const std::vector<double> second = train_zero3_tiny(comm, 20, micro, 1);
    const std::vector<double> no_prefetch = train_zero3_tiny(comm, 20, micro, 0);
    require(first == second, what, ": two runs differ");
    require(first == no_prefetch, what, ": prefetch changed the weights");
    require_same_on_every_rank(comm, first, what.c_str());
    require_close(first, reference, what + " vs one process");
    require_close(first, train_ranks(comm, 2, 20, 64, micro), what + " vs ZeRO-2");
  }
  return 0;
}

/// BlockNet's units: the embedding, each block, the head.
std::vector<std::vector<Var<B>>> block_units(const BlockNet& net) {
  std::vector<std::vector<Var<B>>> units{net.embed.parameters()};
  for (const BlockNet::Block& b : net.blocks) {
    std::vector<Var<B>> u;
    for (const auto& list : {b.norm.parameters(), b.fc1.parameters(), b.fc2.parameters()})
      u.insert(u.end(), list.begin(), list.end());
    units.push_back(u);
  }
  units.push_back(net.head->parameters());
  return units;
}

/// BlockNet trained in `dtype` (bf16 or f16, autocast alike) for `steps` AdamW steps of
/// `micro` micro-batches with global-norm clipping: ZeRO-2 (`stage` 2, regions None) or
/// ZeRO-3 (`stage` 3) with each block its own unit, run as it is, as a full-recompute
/// region or as a selective region keeping matmul outputs. With f16 a GradScaler runs the
/// steps, and at step `overflow_at` the last rank's input holds an inf.
struct ShardedRun {
  std::vector<double> weights;
  std::vector<unsigned char> shard_state;  // this rank's masters and moments, raw
  std::int64_t recomputes = 0;
  int skipped = 0;
};
ShardedRun train_blocks_sharded(dist::Communicator<B>& comm, int stage, Regions regions, DType dtype, int micro,
                                int steps, int overflow_at = -1) {
  BlockNet net;
  std::unique_ptr<dist::ZeroOptimizer<B>> zero;
  std::unique_ptr<dist::FullyShardedModel<B>> model;
  if (stage == 2)
    zero = std::make_unique<dist::ZeroOptimizer<B>>(
        comm, net.parameters(),
        dist::ZeroOptions{
            .stage = 2, .model_dtype = dtype, .data_parallel = {.bucket_bytes = 256, .accumulation_steps = micro}},
        adamw_options());
  else
    model = std::make_unique<dist::FullyShardedModel<B>>(
        comm, block_units(net),
        dist::FullyShardedOptions{.model_dtype = dtype, .bucket_bytes = 256, .accumulation_steps = micro},
        adamw_options());
  amp::GradScalerOptions scaler_options;
  scaler_options.init_scale = 1024;
  scaler_options.enabled = dtype == DType::F16;
  amp::GradScaler<B> scaler(DType::F16, scaler_options);
  const std::vector<Layer<B>> layers = net.block_layers();
  CheckpointOptions selective;
  selective.policy = policy::save_matmuls();
  const std::int64_t rows = kGlobalBatch / comm.size(), first = comm.rank() * rows;
  ShardedRun run;
  const auto optimizer = [&]() -> const optim::Optimizer<B>& {
    if (zero) return zero->shard_optimizer();
    return model->shard_optimizer();
  };
  // This rank's weights (its shard under ZeRO-3), masters and moments, raw.
  const auto shard_bits = [&] {
    std::vector<unsigned char> out;
    if (zero)
      for (const auto& p : net.parameters()) append_bits(out, p.value());
    else append_bits(out, model->shard_weights());
    append_bits(out, zero ? zero->masters() : model->masters());
    for (const auto& e : optimizer().entries()) {
      append_bits(out, e.first_moment);
      append_bits(out, e.second_moment);
    }
    return out;
  };
  const std::int64_t recomputes_before = checkpoint_stats().recomputes;
  for (int s = 0; s < steps; ++s) {
    if (zero) zero->zero_grad();
    else model->zero_grad();
    for (int m = 0; m < micro; ++m) {
      Tape<B> tape;
      tape.manual_seed(static_cast<std::uint64_t>(1000 * comm.rank() + 10 * s + m));
      auto [x, labels] = batch(first + m * rows / micro, first + (m + 1) * rows / micro, s);
      if (s == overflow_at && m == 0 && comm.rank() == comm.size() - 1) {
        std::vector<double> values = x.to_host<double>();
        values[0] = INFINITY;
        x = Tensor<B>::from_host(x.shape(), values);
      }
      Var<B> loss;
      {
        amp::Autocast guard(dtype);
        if (zero) {
          Var<B> h = net.embed(tape.input(x));
          for (const auto& layer : layers) h = layer(h);
          loss = cross_entropy((*net.head)(h), labels);
        } else {
          Var<B> h = model->forward(
              tape, 0, [&](const Var<B>& in) { return net.embed(in); }, tape.input(x));
          for (std::size_t b = 0; b < layers.size(); ++b) {
            h = model->forward(
                tape, 1 + b,
                [&](const Var<B>& in) {
                  switch (regions) {
                    case Regions::None: return layers[b](in);
                    case Regions::EveryBlock: return checkpoint(tape, layers[b], in);
                    default: return checkpoint(tape, selective, layers[b], in);
                  }
                },
                h);
          }
          loss = cross_entropy(model->forward(
                                   tape, 1 + layers.size(), [&](const Var<B>& in) { return (*net.head)(in); }, h),
                               labels);
        }
      }
      tape.backward(scaler.scale(loss));
      if (zero) zero->micro_batch_done();
      else model->micro_batch_done();
    }
    const std::vector<unsigned char> before = shard_bits();
    const bool stepped = zero ? zero->step(scaler, 0.05) : model->step(scaler, 0.05);
    scaler.update();
    run.skipped += stepped ? 0 : 1;
    require(stepped || shard_bits() == before, "stage ", stage, " step ", s,
            ": a skipped step changed the weights, masters or moments");
  }
  run.recomputes = checkpoint_stats().recomputes - recomputes_before;
  if (zero) {
    for (const auto& p : net.parameters())
      for (double v : p.value().to_host<double>()) run.weights.push_back(v);
  } else {
    run.weights = model->full_weights();
  }
  run.shard_state = shard_bits();
  return run;
}

/// ZeRO-3 under BF16 autocast (bf16 weights, f32 masters), 8 AdamW steps of 2 micro-batches
/// with global-norm clipping and dropout: with every block a full-recompute region or a
/// selective one, every weight, master and moment is bitwise the run's without regions;
/// two runs and every rank agree bitwise. With one micro-batch a step it equals ZeRO-2's
/// run (<= 1e-6 relative: the same bf16 gradients, summed in f32 over the ranks).
int zero3_bf16(dist::mpi::Communicator& comm) {
  const ShardedRun plain = train_blocks_sharded(comm, 3, Regions::None, DType::BF16, 2, 8);
  require(plain.recomputes == 0, "the run without regions recomputed ", plain.recomputes, " times");
  require_same_on_every_rank(comm, plain.weights, "ZeRO-3 bf16 weights");
  require(train_blocks_sharded(comm, 3, Regions::None, DType::BF16, 2, 8).shard_state == plain.shard_state,
          "ZeRO-3 bf16: two runs differ");
  for (Regions regions : {Regions::EveryBlock, Regions::SelectiveSegments}) {
    const char* what = regions == Regions::EveryBlock ? "every block a region" : "selective regions";
    const ShardedRun checkpointed = train_blocks_sharded(comm, 3, regions, DType::BF16, 2, 8);
    require(checkpointed.recomputes == 16 * BlockNet::kBlocks, what, ": ", checkpointed.recomputes,
            " recomputes, expected ", 16 * BlockNet::kBlocks);
    require(checkpointed.weights == plain.weights, what, ": the bf16 weights differ from the run without regions");
    require(checkpointed.shard_state == plain.shard_state, what,
            ": the f32 masters or moments differ from the run without regions");
  }
  const ShardedRun zero2 = train_blocks_sharded(comm, 2, Regions::None, DType::BF16, 1, 8);
  const ShardedRun zero3 = train_blocks_sharded(comm, 3, Regions::EveryBlock, DType::BF16, 1, 8);
  require_close(zero3.weights, zero2.weights, "ZeRO-3 bf16 (regions) vs ZeRO-2");
  require_same_on_every_rank(comm, zero3.weights, "ZeRO-3 bf16 weights, one micro-batch");
  return 0;
}

/// ZeRO-3 in F16 with the GradScaler, regions in every block: at step 3 the last rank's
/// first micro-batch holds an inf; every rank skips that step (found-inf agreed) and only
/// that one, leaving its weight shard, masters and moments bitwise unchanged (checked in
/// train_blocks_sharded), and the weights are bitwise the same on every rank and in two
/// runs. With 2 micro-batches a step and with one; with one micro-batch a step the run
/// equals ZeRO-2's with the same overflow (<= 1e-6 relative: the same f16 gradients summed
/// in f32; with two, ZeRO-2 sums the micro-batches in the f16 .grad and ZeRO-3 sums their
/// reduced averages in the f16 shard, which differ by an f16 rounding).
int zero3_f16(dist::mpi::Communicator& comm) {
  for (int micro : {2, 1}) {
    const std::string what = "ZeRO-3 f16, " + std::to_string(micro) + " micro-batches";
    const ShardedRun zero3 = train_blocks_sharded(comm, 3, Regions::EveryBlock, DType::F16, micro, 6, 3);
    require(zero3.skipped == 1, what, ": skipped ", zero3.skipped, " steps, expected 1");
    require_same_on_every_rank(comm, zero3.weights, what.c_str());
    require(
        train_blocks_sharded(comm, 3, Regions::EveryBlock, DType::F16, micro, 6, 3).shard_state == zero3.shard_state,
        what, ": two runs differ");
    const ShardedRun clean = train_blocks_sharded(comm, 3, Regions::EveryBlock, DType::F16, micro, 6);
    require(clean.skipped == 0, what, " without the overflow: skipped ", clean.skipped, " steps");
    require(clean.weights != zero3.weights, what, ": the skipped step changed nothing (the test cannot fail)");
    if (micro == 1) {
      const ShardedRun zero2 = train_blocks_sharded(comm, 2, Regions::None, DType::F16, micro, 6, 3);
      require(zero2.skipped == 1, "ZeRO-2 f16: skipped ", zero2.skipped, " steps, expected 1");
      require_close(zero3.weights, zero2.weights, what + " vs ZeRO-2");
    }
  }
  return 0;
}

/// Per-rank model state and gathered weights under ZeRO-3, BF16 AdamW, four units of
/// Linear(32, 32) (Ψ_u = 1056, a multiple of 1, 2 and 4), on one process and on N ranks,
/// prefetch depth 0, 1, 2:
///  - weights + gradient + masters + moments = 16Ψ/N bytes, plus AdamW's scalars (16 bytes
///    a segment, one segment per parameter piece of the shard, and 40 an optimizer), to the byte;
///  - the most gathered bytes live at once, over forward and backward, = (1 + depth) units;
///  - after the forward, with the tape holding every op's saved tensors, no gathered byte is
///    live (MemCategory::Workspace back where it started): no saved tensor pins a gathered
///    weight past its unit; at each unit's end only the prefetched units are.
int zero3_memory(dist::mpi::Communicator& mpi) {
  constexpr std::int64_t kWidth = 32, kUnits = 4;
  dist::SingleProcess<B> one;
  for (dist::Communicator<B>* comm :
       {static_cast<dist::Communicator<B>*>(&one), static_cast<dist::Communicator<B>*>(&mpi)}) {
    for (int depth : {0, 1, 2}) {
      const MemoryStats& stats = B::default_instance().memory();
      const auto model_state = [&] {
        return stats.live(MemCategory::Parameter) + stats.live(MemCategory::Gradient) +
               stats.live(MemCategory::MasterWeight) + stats.live(MemCategory::OptimizerState);
      };
      const std::int64_t base = model_state(), workspace = stats.live(MemCategory::Workspace);
      nn::Init init(5);
      std::vector<nn::Linear<B>> layers;
      std::vector<std::vector<Var<B>>> units;
      for (std::int64_t u = 0; u < kUnits; ++u) {
        layers.emplace_back(kWidth, kWidth, init, true, DType::F32, "fc" + std::to_string(u));
        units.push_back(layers.back().parameters());
      }
      const std::int64_t psi = kUnits * (kWidth * kWidth + kWidth), n = comm->size();
      dist::FullyShardedModel<B> model(
          *comm, units, {.model_dtype = DType::BF16, .prefetch_depth = depth, .bucket_bytes = 256}, adamw_options());
      const std::string what = "ZeRO-3 on " + std::to_string(n) + " ranks, prefetch " + std::to_string(depth);
      std::int64_t measured = 0;
      for (int s = 0; s < 2; ++s) {
        model.zero_grad();
        model.reset_gathered_peak();
        Tape<B> tape;
        std::vector<double> v(4 * kWidth), l(4);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.1 * static_cast<double>(i + s));
        for (std::size_t i = 0; i < l.size(); ++i) l[i] = static_cast<double>(i % kWidth);
        Var<B> h = tape.input(Tensor<B>::from_host(Shape{4, kWidth}, v));
        Var<B> loss;
        {
          amp::Autocast guard(DType::BF16);
          for (std::size_t u = 0; u < layers.size(); ++u) {
            h = model.forward(
                tape, u, [&](const Var<B>& in) { return tanh(layers[u](in)); }, h);
            const std::int64_t prefetched = std::min<std::int64_t>(depth, kUnits - 1 - static_cast<std::int64_t>(u));
            require(model.gathered_live() == prefetched * model.unit_bytes(0) &&
                        stats.live(MemCategory::Workspace) - workspace == model.gathered_live(),
                    what, ": after unit ", u, " ", stats.live(MemCategory::Workspace) - workspace,
                    " bytes of workspace and ", model.gathered_live(), " gathered are live, expected ",
                    prefetched * model.unit_bytes(0), " (the prefetched units)");
          }
          loss = cross_entropy(h, Tensor<B>::from_host(Shape{4}, l, DType::I32));
        }
        tape.backward(loss);
        model.micro_batch_done();
        require(stats.live(MemCategory::Workspace) == workspace, what, ": ",
                stats.live(MemCategory::Workspace) - workspace, " gathered bytes live after backward");
        measured = model_state() - base;  // masters and moments exist from the first step on
        model.step();
      }
      // AdamW's scalars: a step state of two f64 per segment, and per optimizer an f64 one and
      // two f64 pairs (betas - 1, their powers): 16 bytes a segment + 40.
      const auto segments = static_cast<std::int64_t>(model.shard_optimizer().entries().size());
      const std::int64_t scalars = 16 * segments + 40;
      const std::int64_t formula = 16 * psi / n;
      const std::int64_t peak = std::min<std::int64_t>(1 + depth, kUnits) * model.unit_bytes(0);
      std::printf(
          "rank %d of %lld, ZeRO-3 prefetch %d: %lld bytes of model state (16 psi/N = %lld + %lld of step "
          "scalars), gathered high-water %lld bytes (%lld units)\n",
          comm->rank(), static_cast<long long>(n), depth, static_cast<long long>(measured),
          static_cast<long long>(formula), static_cast<long long>(scalars),
          static_cast<long long>(model.gathered_peak()),
          static_cast<long long>(model.gathered_peak() / model.unit_bytes(0)));
      require(measured == formula + scalars, what, ": ", measured, " bytes of model state, 16Ψ/N = ", formula, " plus ",
              scalars, " of step scalars");
      require(model.gathered_peak() == peak, what, ": gathered high-water ", model.gathered_peak(), " bytes, expected ",
              peak);
    }
  }
  return 0;
}

/// TinyNet in bf16 (bf16 autocast) under ZeRO-3, steps [from, to); loads `load_from` first
/// and saves to `save_to` last when given. Returns the full weights.
std::vector<double> train_zero3_bf16(dist::Communicator<B>& comm, int from, int to,
                                     const std::filesystem::path* load_from, const std::filesystem::path* save_to,
                                     std::vector<unsigned char>* shard = nullptr) {
  TinyNet net;
  dist::FullyShardedModel<B> model(comm, {net.fc1.parameters(), net.fc2.parameters()},
                                   {.model_dtype = DType::BF16, .bucket_bytes = 64}, adamw_options());
  if (load_from) trainmem::load(*load_from, {{"model", model}});
  const std::int64_t rows = kGlobalBatch / comm.size(), first = comm.rank() * rows;
  for (int s = from; s < to; ++s) {
    model.zero_grad();
    Tape<B> tape;
    auto [x, labels] = batch(first, first + rows, s);
    Var<B> loss;
    {
      amp::Autocast guard(DType::BF16);
      Var<B> h = model.forward(
          tape, 0, [&](const Var<B>& in) { return tanh(net.fc1(in)); }, tape.input(x));
      loss = cross_entropy(model.forward(
                               tape, 1, [&](const Var<B>& in) { return net.fc2(in); }, h),
                           labels);
    }
    tape.backward(loss);
    model.micro_batch_done();
    model.step();
  }
  if (save_to) trainmem::save(*save_to, {{"model", model}});
  if (shard) {
    shard->clear();
    append_bits(*shard, model.shard_weights());
    append_bits(*shard, model.masters());
    for (const auto& e : model.shard_optimizer().entries()) {
      append_bits(*shard, e.first_moment);
      append_bits(*shard, e.second_moment);
    }
  }
  return model.full_weights();
}

/// Save/resume of a sharded run: each rank saves its shard to its own file (trainmem::save,
/// atomic), 3 + 3 steps resumed equal 6 steps straight bitwise (weights, masters, moments);
/// a state from a run of another number of ranks is refused naming both numbers.
int zero3_resume(dist::mpi::Communicator& comm) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("trainmem_zero3_resume_" + std::to_string(::getppid()) + "_rank" + std::to_string(comm.rank()) + ".tmstate");
  std::vector<unsigned char> straight_shard, resumed_shard;
  const std::vector<double> straight = train_zero3_bf16(comm, 0, 6, nullptr, nullptr, &straight_shard);
  train_zero3_bf16(comm, 0, 3, nullptr, &path);
  const std::vector<double> resumed = train_zero3_bf16(comm, 3, 6, &path, nullptr, &resumed_shard);
  require(resumed == straight, "resumed weights differ from the straight run's");
  require(resumed_shard == straight_shard, "the resumed shard's masters or moments differ from the straight run's");
  require(resumed != train_zero3_bf16(comm, 3, 6, nullptr, nullptr), "resuming changed nothing (the test cannot fail)");
  // A state saved at another number of ranks.
  TinyNet net;
  dist::FullyShardedModel<B> model(comm, {net.fc1.parameters(), net.fc2.parameters()},
                                   {.model_dtype = DType::BF16, .bucket_bytes = 64}, adamw_options());
  StateDict state = trainmem::load(path).sub("model");
  state.set_i64("ranks", comm.size() + 2);
  const std::string expected =
      "saved by a run of " + std::to_string(comm.size() + 2) + " ranks and this run has " + std::to_string(comm.size());
  std::string message = "no error";
  try {
    model.load_state(state);
  } catch (const Error& e) {
    message = e.what();
  }
  require(message.find(expected) != std::string::npos, "the error '", message, "' lacks '", expected, "'");
  std::filesystem::remove(path);
  return 0;
}

/// Rank 1 throws inside unit 1's forward at step 2 while rank 0 goes on into the unit's
/// collectives: the job ends on every rank with rank 1's message (CTest checks both lines).
int zero3_abort(dist::mpi::Communicator& comm) {
  TinyNet net;
  dist::FullyShardedModel<B> model(comm, {net.fc1.parameters(), net.fc2.parameters()},
                                   {.model_dtype = DType::F32, .bucket_bytes = 64}, adamw_options());
  const std::int64_t rows = kGlobalBatch / comm.size(), first = comm.rank() * rows;
  for (int s = 0; s < 4; ++s) {
    model.zero_grad();
    Tape<B> tape;
    auto [x, labels] = batch(first, first + rows, s);
    Var<B> h = model.forward(
        tape, 0, [&](const Var<B>& in) { return tanh(net.fc1(in)); }, tape.input(x));
    Var<B> logits = model.forward(
        tape, 1,
        [&](const Var<B>& in) {
          if (s == 2 && comm.rank() == 1) throw Error("injected failure in unit 1 at step 2");
          return net.fc2(in);
        },
        h);
    tape.backward(cross_entropy(logits, labels));
    model.micro_batch_done();
    model.step();
  }
  return 0;
}

/// Four units of Linear(16, 16) + tanh, each run as a full-recompute checkpoint region (or as
/// it is), f32, prefetch 1, 3 AdamW steps; `keep` keeps every unit gathered through backward.
struct KeepRun {
  std::vector<double> weights;
  std::int64_t gathers_per_step = 0, gathered_peak = 0, unit_bytes = 0, recomputes = 0;
};
KeepRun train_units(dist::Communicator<B>& comm, bool regions, bool keep) {
  constexpr std::int64_t kWidth = 16, kUnits = 4, kRows = 8;
  nn::Init init(9);
  std::vector<nn::Linear<B>> layers;
  std::vector<std::vector<Var<B>>> units;
  for (std::int64_t u = 0; u < kUnits; ++u) {
    layers.emplace_back(kWidth, kWidth, init, true, DType::F32, "fc" + std::to_string(u));
    units.push_back(layers.back().parameters());
  }
  dist::FullyShardedOptions options{.model_dtype = DType::F32, .bucket_bytes = 256};
  if (keep) options.keep_gathered = {0, 1, 2, 3};
  dist::FullyShardedModel<B> model(comm, units, options, adamw_options());
  KeepRun run;
  run.unit_bytes = model.unit_bytes(0);
  const std::int64_t recomputes_before = checkpoint_stats().recomputes;
  for (int s = 0; s < 3; ++s) {
    model.zero_grad();
    model.reset_gathered_peak();
    const std::int64_t gathers_before = model.gathers();
    Tape<B> tape;
    std::vector<double> v(kRows * kWidth), l(kRows);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::cos(0.3 * static_cast<double>(i) + s + comm.rank());
    for (std::size_t i = 0; i < l.size(); ++i) l[i] = static_cast<double>((i + s) % kWidth);
    Var<B> h = tape.input(Tensor<B>::from_host(Shape{kRows, kWidth}, v));
    for (std::size_t u = 0; u < layers.size(); ++u) {
      const auto layer = [&layers, u](const Var<B>& in) { return tanh(layers[u](in)); };
      h = model.forward(
          tape, u, [&](const Var<B>& in) { return regions ? checkpoint(tape, layer, in) : layer(in); }, h);
    }
    tape.backward(cross_entropy(h, Tensor<B>::from_host(Shape{kRows}, l, DType::I32)));
    model.micro_batch_done();
    model.step();
    run.gathers_per_step = model.gathers() - gathers_before;
    run.gathered_peak = std::max(run.gathered_peak, model.gathered_peak());
  }
  run.recomputes = checkpoint_stats().recomputes - recomputes_before;
  run.weights = model.full_weights();
  return run;
}

/// Checkpoint regions inside ZeRO-3 units: the recompute runs inside the unit's backward,
/// after the boundary op gathered the unit, so it gathers nothing itself: 2 gathers a unit a
/// step with regions as without (one forward, one backward, in unit order on every rank),
/// and the weights bitwise those of the run without regions. With keep_gathered the
/// backward gathers nothing (1 a unit a step), at the price of holding every unit's
/// weights from its forward to its backward (high-water = all units' bytes, not 2), and
/// the weights are again bitwise the same.
int zero3_keep(dist::mpi::Communicator& comm) {
  const KeepRun plain = train_units(comm, false, false);
  const KeepRun regions = train_units(comm, true, false);
  const KeepRun kept = train_units(comm, true, true);
  require(regions.recomputes == 12 && kept.recomputes == 12, "recomputes: ", regions.recomputes, " and ",
          kept.recomputes, ", expected 12 (4 regions, 3 steps)");
  require(plain.gathers_per_step == 8 && regions.gathers_per_step == 8, "gathers a step: ", plain.gathers_per_step,
          " without regions, ", regions.gathers_per_step, " with them; expected 8 (2 a unit)");
  require(kept.gathers_per_step == 4, "gathers a step with keep_gathered: ", kept.gathers_per_step, ", expected 4");
  require(regions.gathered_peak == 2 * regions.unit_bytes && kept.gathered_peak == 4 * kept.unit_bytes,
          "gathered high-water: ", regions.gathered_peak, " and ", kept.gathered_peak,
          " bytes, expected 2 and 4 units (", regions.unit_bytes, " bytes each)");
  require(regions.weights == plain.weights, "regions changed the weights");
  require(kept.weights == plain.weights, "keep_gathered changed the weights");
  require_same_on_every_rank(comm, kept.weights, "keep_gathered weights");
  return 0;
}

/// Four ZeRO-3 units of tanh(tanh(Linear(16, 16))) in f32 as the stages of a chain; step s
/// trains on this rank's batch s.
struct PlannedUnits {
  static constexpr std::int64_t kWidth = 16, kUnits = 4, kRows = 8;
  explicit PlannedUnits(dist::Communicator<B>& comm) : comm(comm) {
    std::vector<std::vector<Var<B>>> units;
    for (std::int64_t u = 0; u < kUnits; ++u) {
      layers.push_back(
          std::make_unique<nn::Linear<B>>(kWidth, kWidth, init, true, DType::F32, "fc" + std::to_string(u)));
      units.push_back(layers.back()->parameters());
    }
    model = std::make_unique<dist::FullyShardedModel<B>>(
        comm, std::move(units), dist::FullyShardedOptions{.model_dtype = DType::F32, .bucket_bytes = 256},
        adamw_options());
    for (std::int64_t u = 0; u < kUnits; ++u)
      stages.push_back([this, u](const Var<B>& x) {
        const auto layer = [this, u](const Var<B>& in) {
          return tanh(tanh((*layers[static_cast<std::size_t>(u)])(in)));
        };
        return model->forward(*x.tape(), static_cast<std::size_t>(u), layer, x);
      });
  }
  void step(const ChainRunner<B>& run) {
    model->zero_grad();
    Tape<B> tape;
    std::vector<double> v(kRows * kWidth), l(kRows);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::cos(0.3 * static_cast<double>(i) + steps + comm.rank());
    for (std::size_t i = 0; i < l.size(); ++i) l[i] = static_cast<double>((i + steps) % kWidth);
    const Var<B> y = run(tape.input(Tensor<B>::from_host(Shape{kRows, kWidth}, v)));
    run.backward(cross_entropy(y, Tensor<B>::from_host(Shape{kRows}, l, DType::I32)));
    model->micro_batch_done();
    model->step();
    ++steps;
  }
  dist::Communicator<B>& comm;
  nn::Init init{5};
  std::vector<std::unique_ptr<nn::Linear<B>>> layers;
  std::unique_ptr<dist::FullyShardedModel<B>> model;
  std::vector<Layer<B>> stages;
  int steps = 0;
};

/// The checkpoint planner over ZeRO-3 units on N ranks: every rank profiles (the profiled
/// steps are collective), rank 0 plans and every rank runs its plan (dist::agreed_plan), a
/// schedule with regions over several units and held units included (each changes which
/// gathers run). Planned steps must train bitwise as plain ones, the same on every rank;
/// a plan of inner-unit regions gathers each inner unit once more, a held unit once less.
int zero3_planned(dist::mpi::Communicator& comm) {
  PlannedUnits planned(comm), plain(comm);
  PlannerOptions options;
  options.hold = planned.model->stage_hold();
  options.profile_reps = 2;
  Planner<B> planner(
      planned.stages, [&planned](const ChainRunner<B>& run) { planned.step(run); }, options);
  const ChainProfile& p = planner.profile();
  // Rank 0's plans for the smallest whole-step budget and a loose one, then a fixed one that
  // holds and spans units, saved and loaded as rank 0's.
  const std::int64_t least =
      dist::agreed_plan(comm, planner, Budget::whole_step(planner.smallest_budget(MemChannel::Total)))
          .prediction()
          .peak[0];
  std::vector<CheckpointPlan<B>> plans;
  plans.push_back(dist::agreed_plan(comm, planner, Budget::whole_step(least)));
  plans.push_back(dist::agreed_plan(comm, planner, Budget::whole_step(2 * p.plain_peak[0])));
  const std::vector<Segment> mixed = {
      {0, 2, StageMode::Recompute, true}, {2, 3, StageMode::Keep, true}, {3, 4, StageMode::Selective}};
  plans.push_back(
      CheckpointPlan<B>(planned.stages, mixed, predict(p, mixed), Budget::whole_step(0), p, "", options.hold));
  for (const CheckpointPlan<B>& plan : plans) {
    const std::int64_t before = planned.model->gathers();
    planned.step(plan.runner());
    if (&plan == &plans.back())
      require(planned.model->gathers() - before == 5, "the mixed plan gathered ", planned.model->gathers() - before,
              " times in a step, expected 5: 4 in forward, and in backward unit 3's only (units 0-2 are held)");
  }
  const std::string agreed = dist::agreed_plan(comm, planner, Budget::whole_step(least)).to_json();
  require_same_on_every_rank(comm, std::vector<double>(agreed.begin(), agreed.end()), "the agreed plan");
  const ChainRunner<B> keep(plain.stages, {{0, PlannedUnits::kUnits, StageMode::Keep}});
  while (plain.steps < planned.steps) plain.step(keep);
  const std::vector<double> a = planned.model->full_weights(), b = plain.model->full_weights();
  require(a == b, "planned steps trained other weights than plain ones");
  require_same_on_every_rank(comm, a, "planned weights");
  try {
    dist::agreed_plan(comm, planner, Budget::whole_step(1));
    require(false, "a budget of 1 byte was planned");
  } catch (const Error& e) {
    require(std::string(e.what()).find("rank 0 could not plan: checkpoint planner: no schedule") != std::string::npos,
            "the error was: ", e.what());
  }
  return 0;
}

/// A model whose unsharded model state exceeds the budget trains within it on 4 ranks: eight
/// units of Linear(64, 64) in bf16 with AdamW, Ψ = 33,280, unsharded 16Ψ = 532,480 bytes;
/// budget 16Ψ/2 = 266,240 bytes of everything a rank allocates (every category), from
/// building the model (its f32 values, 4Ψ, exist until the shards are made) through 3 steps.
int zero3_budget(dist::mpi::Communicator& comm) {
  constexpr std::int64_t kWidth = 64, kUnits = 8, kRows = 16;
  constexpr std::int64_t kPsi = kUnits * (kWidth * kWidth + kWidth), kBudget = 16 * kPsi / 2;
  require(comm.size() == 4, "zero3_budget runs on 4 ranks, not ", comm.size());
  MemoryStats& stats = B::default_instance().memory();
  const std::int64_t base = stats.live_total();
  PeakWindow window(stats);
  {
    nn::Init init(13);
    std::vector<nn::Linear<B>> layers;
    std::vector<std::vector<Var<B>>> units;
    for (std::int64_t u = 0; u < kUnits; ++u) {
      layers.emplace_back(kWidth, kWidth, init, true, DType::F32, "fc" + std::to_string(u));
      units.push_back(layers.back().parameters());
    }
    dist::FullyShardedModel<B> model(comm, units, {.model_dtype = DType::BF16, .bucket_bytes = 1024}, adamw_options());
    for (int s = 0; s < 3; ++s) {
      model.zero_grad();
      Tape<B> tape;
      std::vector<double> v(kRows * kWidth), l(kRows);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.01 * static_cast<double>(i) + s + comm.rank());
      for (std::size_t i = 0; i < l.size(); ++i) l[i] = static_cast<double>((3 * i + s) % kWidth);
      Var<B> h = tape.input(Tensor<B>::from_host(Shape{kRows, kWidth}, v));
      Var<B> loss;
      {
        amp::Autocast guard(DType::BF16);
        for (std::size_t u = 0; u < layers.size(); ++u)
          h = model.forward(
              tape, u, [&](const Var<B>& in) { return tanh(layers[u](in)); }, h);
        loss = cross_entropy(h, Tensor<B>::from_host(Shape{kRows}, l, DType::I32));
      }
      tape.backward(loss);
      model.micro_batch_done();
      model.step();
    }
  }
  const std::int64_t peak = window.peaks().total - base;
  std::printf("rank %d of 4: peak %lld bytes, budget %lld (16 psi/2), unsharded model state 16 psi = %lld\n",
              comm.rank(), static_cast<long long>(peak), static_cast<long long>(kBudget),
              static_cast<long long>(16 * kPsi));
  require(16 * kPsi > kBudget && peak <= kBudget, "rank ", comm.rank(), ": peak ", peak, " bytes over the budget ",
          kBudget);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dist::mpi::Environment environment(&argc, &argv);
  const std::string scenario = argc > 1 ? argv[1] : "";
  // The cross-rank scenarios must end within CTest's 30 s; the others keep the default.
  dist::mpi::RunOptions options;
  if (scenario == "stalled") options.timeout = std::chrono::seconds(2);
  for (const char* name : {"fewer_steps", "early_return", "skipped_step", "zero_stages", "bucket_bytes",
                           "parameter_order", "accumulation_steps", "zero_groups", "abort", "zero3_abort"})
    if (scenario == name) options.timeout = std::chrono::seconds(10);
  return dist::mpi::run(
      [&] {
        dist::mpi::Communicator comm;
        if (scenario == "equivalence") return equivalence(comm);
        if (scenario == "overflow") return overflow(comm);
        if (scenario == "empty_shard") return empty_shard(comm);
        if (scenario == "memory") return memory(comm);
        if (scenario == "mismatch") return mismatch(comm);
        if (scenario == "checkpoint_bf16") return checkpoint_bf16(comm);
        if (scenario == "fp32_grads") return fp32_grads(comm);
        if (scenario == "abort") return abort_on_error(comm);
        if (scenario == "failed_backward") return failed_backward(comm);
        if (scenario == "groups") return groups(comm);
        if (scenario == "fewer_steps") return fewer_steps(comm);
        if (scenario == "early_return") return early_return(comm);
        if (scenario == "skipped_step") return skipped_step(comm);
        if (scenario == "zero_stages") return zero_stages(comm);
        if (scenario == "bucket_bytes") return bucket_bytes(comm);
        if (scenario == "parameter_order") return parameter_order(comm);
        if (scenario == "accumulation_steps") return accumulation_steps(comm);
        if (scenario == "zero_groups") return zero_groups(comm);
        if (scenario == "stalled") return stalled(comm);
        if (scenario == "zero3_equivalence") return zero3_equivalence(comm);
        if (scenario == "zero3_bf16") return zero3_bf16(comm);
        if (scenario == "zero3_f16") return zero3_f16(comm);
        if (scenario == "zero3_memory") return zero3_memory(comm);
        if (scenario == "zero3_resume") return zero3_resume(comm);
        if (scenario == "zero3_abort") return zero3_abort(comm);
        if (scenario == "zero3_keep") return zero3_keep(comm);
        if (scenario == "zero3_planned") return zero3_planned(comm);
        if (scenario == "zero3_budget") return zero3_budget(comm);
        throw Error("test_distributed_mpi: unknown scenario '" + scenario + "'");
      },
      options);
}
