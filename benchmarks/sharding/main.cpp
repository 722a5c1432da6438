// sharding — what ZeRO saves per rank, measured, next to the formulas.
//
//   for n in 1 2 4; do mpirun -np $n build/bin/sharding --json sharding_np$n.json; done
//   mpirun -np 2 build/bin/sharding --zero3-overlap --blocks 4 --dim 384 --json overlap.json
//   mpirun -np 2 build/bin/sharding --zero3-plan --blocks 6 --dim 128 --json plan.json
//
// A stack of pre-LN transformer blocks, BF16 weights with FP32 masters and AdamW, trained
// data-parallel four ways: ZeRO-0 (DataParallel: every rank holds everything, 16Ψ),
// ZeRO-1 (masters and moments sharded, 4Ψ + 12Ψ/N), ZeRO-2 (gradients too,
// 2Ψ + 14Ψ/N) and ZeRO-3 (dist::FullyShardedModel, each block a unit: the weights too,
// 16Ψ/N). After the gradients are reduced in the last step, each rank reads its
// live bytes per category from MemoryStats; rank 0 prints them with the formula of each
// category (weights 2Ψ; gradients 2Ψ or 2Ψ/N; masters 4Ψ or 4Ψ/N; moments 8Ψ or 8Ψ/N)
// and the median step time per rank. Bytes beyond the formulas are the optimizer's
// per-tensor step scalars (16 bytes per parameter or shard segment, a few more per optimizer),
// ceil(Ψ/N) rounding and, in the weight row, the cast cache's f32 copies of the LayerNorm
// weights (4 × dim × 4 bytes a block; ZeRO-3: one unit's, the others' dropped with their
// gathered sources; the cache is cleared before each configuration's baseline). Each stage runs twice: buckets sent
// during backward (the default) and after it; the second table gives each way's peak gradient bytes within a step
// (ZeRO-2 frees a full gradient once its buckets are reduced, so sending during
// backward lowers it) and median step time. Ranks share this machine's cores, so with
// more ranks than cores the times measure correctness and memory, not speed.
//
// --zero3-overlap measures what prefetch hides instead: ZeRO-3 with prefetch depth 1 and
// with none, steps alternating between the two, and the same all-gathers alone (each
// unit's gather, waited on, twice a step: forward's and backward's). Without prefetch
// every gather waits in line with compute, so the time prefetch saves over the gathers'
// own time is the share of gather time it hides: (ms without - ms with) / gather ms.
// The ranks start each step together (a barrier), but a rank that computes slower (a
// core shared with other work) makes the other wait inside a gather, prefetch or not:
// on a loaded machine that wait is in both step times and the difference is noisy.
//
// --zero3-plan runs the checkpoint planner over ZeRO-3 units (each block a unit and a
// stage, bf16, prefetch 1, the planner's StageHold = keep a unit gathered through
// backward): every rank profiles, rank 0 plans (dist::agreed_plan) for whole-step budgets
// from the least that fits to the all-held step's predicted peak, and every rank runs each
// plan once, measured. Rank 0 prints each stage's hold price as profiled (bytes its forward
// leaves more, backward ms saved) and, per budget, the plan, its predicted and measured
// whole-step peak and time, and the gathers of the step.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/provenance.hpp"
#include "trainmem/checkpoint/planner.hpp"
#include "trainmem/distributed/agreed_plan.hpp"
#include "trainmem/distributed/fully_sharded.hpp"
#include "trainmem/distributed/mpi.hpp"
#include "trainmem/distributed/zero.hpp"
#include "trainmem/trainmem.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;

namespace {

constexpr std::array<tmem::MemCategory, 4> kCategories = {tmem::MemCategory::Parameter, tmem::MemCategory::Gradient,
                                                          tmem::MemCategory::MasterWeight,
                                                          tmem::MemCategory::OptimizerState};

struct Settings {
  std::int64_t blocks = 2, dim = 64, heads = 4, hidden = 256, batch = 2, tokens = 16, steps = 4;
  std::int64_t bucket_bytes = std::int64_t{1} << 16;
};

/// Per category, the bytes the ZeRO paper's accounting gives one rank of n.
std::array<double, 4> formula(int stage, double psi, double n) {
  return {stage == 3 ? 2 * psi / n : 2 * psi, stage >= 2 ? 2 * psi / n : 2 * psi, stage >= 1 ? 4 * psi / n : 4 * psi,
          stage >= 1 ? 8 * psi / n : 8 * psi};
}

struct Measured {
  std::array<double, 4> bytes{};
  double step_ms = 0;
  double peak_gradient_bytes = 0;  // the most gradient bytes live at once in a step (the last)
};

Measured run(tmem::dist::Communicator<B>& comm, const Settings& s, int stage, bool overlap, double& psi) {
  tmem::MemoryStats& stats = B::default_instance().memory();
  // The cast cache's copies count as parameters, and those of the configuration before this
  // one (their sources gone) are dropped only by the next lookup, inside this run: clear them
  // before the baseline, or this run's parameter row reads them as freed.
  tmem::amp::CastCache<B>::instance().clear();
  std::array<std::int64_t, 4> base{};
  for (std::size_t c = 0; c < 4; ++c) base[c] = stats.live(kCategories[c]);
  tmem::nn::Init init(11);
  std::vector<std::unique_ptr<tmem::nn::TransformerBlock<B>>> blocks;
  std::vector<tmem::Var<B>> params;
  for (std::int64_t b = 0; b < s.blocks; ++b) {
    blocks.push_back(std::make_unique<tmem::nn::TransformerBlock<B>>(s.dim, s.heads, s.hidden, init, 0.0f,
                                                                     tmem::DType::F32, "block" + std::to_string(b)));
    for (const auto& p : blocks.back()->parameters()) params.push_back(p);
  }
  psi = 0;
  for (const auto& p : params) psi += static_cast<double>(p.numel());
  const tmem::optim::AdamWOptions adamw{.lr = 1e-3};
  std::unique_ptr<tmem::dist::DataParallel<B>> sync;
  std::unique_ptr<tmem::amp::MasterWeights<B>> masters;
  std::unique_ptr<tmem::optim::AdamW<B>> plain;
  std::unique_ptr<tmem::dist::ZeroOptimizer<B>> zero;
  std::unique_ptr<tmem::dist::FullyShardedModel<B>> sharded;
  const tmem::dist::DataParallelOptions dp{.bucket_bytes = s.bucket_bytes, .overlap_with_backward = overlap};
  if (stage == 3) {  // `overlap`: prefetch the next block's gather
    std::vector<std::vector<tmem::Var<B>>> units;
    for (const auto& block : blocks) units.push_back(block->parameters());
    sharded = std::make_unique<tmem::dist::FullyShardedModel<B>>(
        comm, units,
        tmem::dist::FullyShardedOptions{
            .model_dtype = tmem::DType::BF16, .prefetch_depth = overlap ? 1 : 0, .bucket_bytes = s.bucket_bytes},
        adamw);
  } else if (stage == 0) {
    sync = std::make_unique<tmem::dist::DataParallel<B>>(comm, params, dp);
    masters = std::make_unique<tmem::amp::MasterWeights<B>>(params);
    plain = std::make_unique<tmem::optim::AdamW<B>>(params, adamw);
    masters->attach(*plain);
  } else {
    zero = std::make_unique<tmem::dist::ZeroOptimizer<B>>(
        comm, params, tmem::dist::ZeroOptions{.stage = stage, .model_dtype = tmem::DType::BF16, .data_parallel = dp},
        adamw);
  }
  Measured out;
  std::vector<double> times;
  for (std::int64_t step = 0; step < s.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    tmem::PeakWindow window(stats);
    if (sharded) sharded->zero_grad();
    else
      for (const auto& p : params) p.zero_grad();
    tmem::Tape<B> tape;
    std::vector<float> x(static_cast<std::size_t>(s.batch * s.tokens * s.dim));
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = 0.1f * static_cast<float>((i * 7 + static_cast<std::size_t>(step + comm.rank())) % 13) - 0.6f;
    tmem::Var<B> h = tape.input(tmem::Tensor<B>::from_host({s.batch, s.tokens, s.dim}, x));
    tmem::Var<B> loss;
    {
      tmem::amp::Autocast autocast(tmem::DType::BF16);
      for (std::size_t b = 0; b < blocks.size(); ++b) {
        if (sharded)
          h = sharded->forward(
              tape, b, [&](const tmem::Var<B>& in) { return (*blocks[b])(in); }, h);
        else h = (*blocks[b])(h);
      }
      loss = tmem::mean(tmem::mul(h, h));
    }
    tape.backward(loss);
    if (stage == 0) sync->average_gradients();
    else if (sharded) sharded->micro_batch_done();
    else zero->reduce_gradients();
    for (std::size_t c = 0; c < 4; ++c)
      out.bytes[c] = static_cast<double>(stats.live(kCategories[c]) - base[c]);  // final at the last step
    if (stage == 0) plain->step();
    else if (sharded) sharded->step();
    else zero->step();
    out.peak_gradient_bytes = static_cast<double>(window.peaks()[tmem::MemCategory::Gradient] - base[1]);
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  out.step_ms = times[times.size() / 2];
  return out;
}

/// ZeRO-3 with prefetch (depth 1) and without, steps alternating, and the gathers alone:
/// medians per step over `steps` steps of each.
struct Overlap {
  double with_prefetch_ms = 0, without_prefetch_ms = 0, gathers_ms = 0;
};
Overlap zero3_overlap(tmem::dist::Communicator<B>& comm, const Settings& s) {
  struct Run {
    std::vector<std::unique_ptr<tmem::nn::TransformerBlock<B>>> blocks;
    std::unique_ptr<tmem::dist::FullyShardedModel<B>> model;
  };
  const auto make = [&](int depth) {
    Run r;
    tmem::nn::Init init(11);
    std::vector<std::vector<tmem::Var<B>>> units;
    for (std::int64_t b = 0; b < s.blocks; ++b) {
      r.blocks.push_back(std::make_unique<tmem::nn::TransformerBlock<B>>(
          s.dim, s.heads, s.hidden, init, 0.0f, tmem::DType::F32, "block" + std::to_string(b)));
      units.push_back(r.blocks.back()->parameters());
    }
    r.model = std::make_unique<tmem::dist::FullyShardedModel<B>>(
        comm, units,
        tmem::dist::FullyShardedOptions{
            .model_dtype = tmem::DType::BF16, .prefetch_depth = depth, .bucket_bytes = s.bucket_bytes},
        tmem::optim::AdamWOptions{.lr = 1e-3});
    return r;
  };
  Run with = make(1), without = make(0);
  const auto step = [&](Run& r, std::int64_t i) {
    comm.barrier();  // both ranks start together: a step's time is its own
    const auto start = std::chrono::steady_clock::now();
    r.model->zero_grad();
    tmem::Tape<B> tape;
    std::vector<float> x(static_cast<std::size_t>(s.batch * s.tokens * s.dim));
    for (std::size_t k = 0; k < x.size(); ++k)
      x[k] = 0.1f * static_cast<float>((k * 7 + static_cast<std::size_t>(i + comm.rank())) % 13) - 0.6f;
    tmem::Var<B> h = tape.input(tmem::Tensor<B>::from_host({s.batch, s.tokens, s.dim}, x));
    tmem::Var<B> loss;
    {
      tmem::amp::Autocast autocast(tmem::DType::BF16);
      for (std::size_t b = 0; b < r.blocks.size(); ++b)
        h = r.model->forward(
            tape, b, [&](const tmem::Var<B>& in) { return (*r.blocks[b])(in); }, h);
      loss = tmem::mean(tmem::mul(h, h));
    }
    tape.backward(loss);
    r.model->micro_batch_done();
    r.model->step();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  const auto gathers = [&](Run& r) {  // a step's gathers alone: each unit twice
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t u = 0; u < r.model->units(); ++u) {
        r.model->gather(u);
        r.model->release(u);
      }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<double> a, b, g;
  step(with, -1);  // warm-up: moments, caches
  step(without, -1);
  for (std::int64_t i = 0; i < s.steps; ++i) {
    a.push_back(step(with, i));
    b.push_back(step(without, i));
    g.push_back(gathers(with));
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(a), median(b), median(g)};
}

/// The planner over ZeRO-3 units (see the file comment); the report's "zero3_plan" part.
nlohmann::json zero3_plan(tmem::dist::Communicator<B>& comm, const Settings& s) {
  tmem::nn::Init init(11);
  std::vector<std::unique_ptr<tmem::nn::TransformerBlock<B>>> blocks;
  std::vector<std::vector<tmem::Var<B>>> units;
  for (std::int64_t b = 0; b < s.blocks; ++b) {
    blocks.push_back(std::make_unique<tmem::nn::TransformerBlock<B>>(s.dim, s.heads, s.hidden, init, 0.0f,
                                                                     tmem::DType::F32, "block" + std::to_string(b)));
    units.push_back(blocks.back()->parameters());
  }
  tmem::dist::FullyShardedModel<B> model(
      comm, units, tmem::dist::FullyShardedOptions{.model_dtype = tmem::DType::BF16, .bucket_bytes = s.bucket_bytes},
      tmem::optim::AdamWOptions{.lr = 1e-3});
  std::vector<tmem::Layer<B>> stages;
  for (std::size_t b = 0; b < blocks.size(); ++b)
    stages.push_back([&model, &blocks, b](const tmem::Var<B>& x) {
      return model.forward(
          *x.tape(), b, [&blocks, b](const tmem::Var<B>& in) { return (*blocks[b])(in); }, x);
    });
  std::int64_t step_index = 0;
  const tmem::ChainStep<B> step = [&](const tmem::ChainRunner<B>& run) {
    model.zero_grad();
    tmem::Tape<B> tape;
    std::vector<float> x(static_cast<std::size_t>(s.batch * s.tokens * s.dim));
    for (std::size_t k = 0; k < x.size(); ++k)
      x[k] = 0.1f * static_cast<float>((k * 7 + static_cast<std::size_t>(step_index + comm.rank())) % 13) - 0.6f;
    tmem::Var<B> loss;
    {
      tmem::amp::Autocast autocast(tmem::DType::BF16);
      const tmem::Var<B> h = run(tape.input(tmem::Tensor<B>::from_host({s.batch, s.tokens, s.dim}, x)));
      loss = tmem::mean(tmem::mul(h, h));
    }
    run.backward(loss);
    model.micro_batch_done();
    model.step();
    ++step_index;
  };
  tmem::PlannerOptions options;
  options.hold = model.stage_hold();
  const tmem::Planner<B> planner(stages, step, options);
  const tmem::ChainProfile& p = planner.profile();
  nlohmann::json out;
  const bool print = comm.rank() == 0;
  if (print)
    std::printf("hold price per stage (rank 0's profile): %6s %14s %14s %12s %12s\n", "stage", "unit bytes",
                "kept more", "fwd ms", "bwd ms");
  for (std::size_t k = 0; k < stages.size(); ++k) {
    const tmem::StageCosts &held = p.held[k], &plain = p.stages[k];
    const double fwd = held.fwd_ms[0] - plain.fwd_ms[0], bwd = held.bwd_ms[0] - plain.bwd_ms[0];
    out["hold_price"].push_back({{"stage", k},
                                 {"unit_bytes", model.unit_bytes(k)},
                                 {"kept_more_bytes", held.kept[0][0] - plain.kept[0][0]},
                                 {"fwd_ms", fwd},
                                 {"bwd_ms", bwd}});
    if (print)
      std::printf("%48zu %14lld %14lld %+12.3f %+12.3f\n", k, static_cast<long long>(model.unit_bytes(k)),
                  static_cast<long long>(held.kept[0][0] - plain.kept[0][0]), fwd, bwd);
  }
  std::vector<tmem::Segment> all_held;
  for (std::int64_t k = 0; k < p.size(); ++k) all_held.push_back({k, k + 1, tmem::StageMode::Keep, true});
  const std::int64_t least = planner.smallest_budget(tmem::MemChannel::Total), plain_peak = p.plain_peak[0];
  const std::int64_t held_peak = tmem::predict(p, all_held).peak[0];
  if (print)
    std::printf("\n%-12s %12s %12s %12s %10s %9s %9s %8s  plan\n", "budget", "bytes", "predicted", "measured",
                "pred-meas", "pred ms", "meas ms", "gathers");
  for (const auto& [name, bytes] :
       std::vector<std::pair<std::string, std::int64_t>>{{"least", least},
                                                         {"midway", (least + plain_peak) / 2},
                                                         {"plain peak", plain_peak},
                                                         {"all held", held_peak}}) {
    const tmem::CheckpointPlan<B> plan = tmem::dist::agreed_plan(comm, planner, tmem::Budget::whole_step(bytes));
    const std::int64_t gathers_before = model.gathers();
    const tmem::StepMeasurement m = planner.measure(plan);
    const std::int64_t gathers = model.gathers() - gathers_before;
    std::string summary;
    for (const tmem::Segment& seg : plan.segments())
      summary += std::to_string(seg.begin) + "-" + std::to_string(seg.end - 1) + ":" + tmem::name_of(seg.mode) +
                 (seg.hold ? "+hold " : " ");
    const std::int64_t predicted = plan.prediction().peak[0];
    out["plans"].push_back({{"budget", name},
                            {"budget_bytes", bytes},
                            {"predicted_peak", predicted},
                            {"measured_peak", m.peak[0]},
                            {"predicted_ms", plan.prediction().ms},
                            {"measured_ms", m.ms},
                            {"gathers", gathers},
                            {"segments", summary}});
    if (print)
      std::printf("%-12s %12lld %12lld %12lld %+10lld %9.2f %9.2f %8lld  %s\n", name.c_str(),
                  static_cast<long long>(bytes), static_cast<long long>(predicted), static_cast<long long>(m.peak[0]),
                  static_cast<long long>(predicted - m.peak[0]), plan.prediction().ms, m.ms,
                  static_cast<long long>(gathers), summary.c_str());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  tmem::dist::mpi::Environment environment(&argc, &argv);
  return tmem::dist::mpi::run([&] {
    Settings s;
    std::string json_path;
    CLI::App app(
        "Per-rank model-state bytes of ZeRO-0/1/2/3 against the formulas, or what ZeRO-3 prefetch hides (run under "
        "mpirun)");
    app.add_option("--json", json_path, "write the figures to this file (rank 0)");
    app.add_option("--blocks", s.blocks, "transformer blocks");
    app.add_option("--dim", s.dim, "model width");
    app.add_option("--steps", s.steps, "steps per configuration");
    app.add_option("--bucket-bytes", s.bucket_bytes, "communication bucket (bytes)");
    app.add_option("--batch", s.batch, "sequences per rank");
    app.add_option("--tokens", s.tokens, "tokens per sequence");
    bool overlap_only = false, plan_only = false;
    app.add_flag("--zero3-overlap", overlap_only, "measure what ZeRO-3's prefetch hides instead of the bytes");
    app.add_flag("--zero3-plan", plan_only, "plan ZeRO-3 units with the checkpoint planner instead of the bytes");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    s.hidden = 4 * s.dim;
    tmem::dist::mpi::Communicator comm;
    const int n = comm.size();
    const benchmarks::Provenance provenance = benchmarks::provenance(argc, argv, tmem::num_threads());
    if (comm.rank() == 0) {
      if (!json_path.empty()) benchmarks::check_writable(json_path, provenance);
      std::printf("%s# ranks: %d (rank 0's machine above)\n", provenance.text().c_str(), n);
    }
    nlohmann::json report = {{"benchmark", "sharding"},
                             {"provenance", nlohmann::json::parse(provenance.json())},
                             {"ranks", n},
                             {"blocks", s.blocks},
                             {"dim", s.dim},
                             {"bucket_bytes", s.bucket_bytes}};
    if (plan_only) {
      report["batch"] = s.batch;
      report["tokens"] = s.tokens;
      if (comm.rank() == 0)
        std::printf(
            "ZeRO-3 under the checkpoint planner: %lld blocks of width %lld (a unit and a stage each), %lld x "
            "%lld tokens a rank, bf16, prefetch 1\n",
            static_cast<long long>(s.blocks), static_cast<long long>(s.dim), static_cast<long long>(s.batch),
            static_cast<long long>(s.tokens));
      report["zero3_plan"] = zero3_plan(comm, s);
      if (comm.rank() == 0 && !json_path.empty()) std::ofstream(json_path) << report.dump(2) << "\n";
      return 0;
    }
    if (overlap_only) {
      report["batch"] = s.batch;
      report["tokens"] = s.tokens;
      report["steps"] = s.steps;
      const Overlap mine = zero3_overlap(comm, s);
      std::vector<Overlap> all(static_cast<std::size_t>(n));
      comm.all_gather_host(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)));
      if (comm.rank() == 0)
        std::printf(
            "ZeRO-3, %lld blocks of width %lld (a unit each), %lld x %lld tokens, median of %lld steps\n"
            "%4s %16s %16s %14s %8s\n",
            static_cast<long long>(s.blocks), static_cast<long long>(s.dim), static_cast<long long>(s.batch),
            static_cast<long long>(s.tokens), static_cast<long long>(s.steps), "rank", "ms, prefetch 1",
            "ms, prefetch 0", "gathers ms", "hidden");
      for (int r = 0; r < n; ++r) {
        const Overlap& o = all[static_cast<std::size_t>(r)];
        const double hidden = (o.without_prefetch_ms - o.with_prefetch_ms) / o.gathers_ms;
        report["zero3_overlap"].push_back({{"rank", r},
                                           {"with_prefetch_ms", o.with_prefetch_ms},
                                           {"without_prefetch_ms", o.without_prefetch_ms},
                                           {"gathers_ms", o.gathers_ms},
                                           {"hidden_fraction", hidden}});
        if (comm.rank() == 0)
          std::printf("%4d %16.2f %16.2f %14.2f %7.0f%%\n", r, o.with_prefetch_ms, o.without_prefetch_ms, o.gathers_ms,
                      100 * hidden);
      }
      if (comm.rank() == 0 && !json_path.empty()) std::ofstream(json_path) << report.dump(2) << "\n";
      return 0;
    }
    const char* names[] = {"parameter", "gradient", "master_weight", "optimizer_state"};
    if (comm.rank() == 0)
      std::printf("%d rank(s), %lld blocks of width %lld, bucket %lld bytes\n%-6s %4s %-16s %12s %14s %10s\n", n,
                  static_cast<long long>(s.blocks), static_cast<long long>(s.dim),
                  static_cast<long long>(s.bucket_bytes), "stage", "rank", "category", "bytes", "formula", "step ms");
    std::vector<std::string> overlap_rows;
    for (int stage : {0, 1, 2, 3}) {
      double psi = 0;
      const Measured mine = run(comm, s, stage, true, psi);
      const Measured after = run(comm, s, stage, false, psi);
      std::vector<Measured> all(static_cast<std::size_t>(n)), all_after(static_cast<std::size_t>(n));
      comm.all_gather_host(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)));
      comm.all_gather_host(std::as_bytes(std::span(&after, 1)), std::as_writable_bytes(std::span(all_after)));
      report["psi"] = psi;
      for (int r = 0; r < n; ++r) {
        const Measured& during = all[static_cast<std::size_t>(r)];
        const Measured& later = all_after[static_cast<std::size_t>(r)];
        report["overlap"][std::to_string(stage)].push_back(
            {{"rank", r},
             {"during_backward", {{"peak_gradient_bytes", during.peak_gradient_bytes}, {"step_ms", during.step_ms}}},
             {"after_backward", {{"peak_gradient_bytes", later.peak_gradient_bytes}, {"step_ms", later.step_ms}}}});
        char row[160];
        std::snprintf(row, sizeof row, "ZeRO-%d %4d %14.0f %14.0f %10.2f %10.2f", stage, r, during.peak_gradient_bytes,
                      later.peak_gradient_bytes, during.step_ms, later.step_ms);
        overlap_rows.emplace_back(row);
      }
      const std::array<double, 4> f = formula(stage, psi, n);
      for (int r = 0; r < n; ++r) {
        nlohmann::json rank = {{"rank", r}, {"step_ms", all[static_cast<std::size_t>(r)].step_ms}};
        double total = 0, total_formula = 0;
        for (std::size_t c = 0; c < 4; ++c) {
          const double b = all[static_cast<std::size_t>(r)].bytes[c];
          rank["bytes"][names[c]] = b;
          rank["formula"][names[c]] = f[c];
          total += b;
          total_formula += f[c];
          if (comm.rank() == 0)
            std::printf("ZeRO-%d %4d %-16s %12.0f %14.1f %10.2f\n", stage, r, names[c], b, f[c],
                        all[static_cast<std::size_t>(r)].step_ms);
        }
        rank["bytes"]["total"] = total;
        rank["formula"]["total"] = total_formula;
        if (comm.rank() == 0) std::printf("ZeRO-%d %4d %-16s %12.0f %14.1f\n", stage, r, "total", total, total_formula);
        report["stages"][std::to_string(stage)].push_back(rank);
      }
    }
    if (comm.rank() == 0) {
      std::printf(
          "\nbuckets sent during backward vs after it (ZeRO-3: prefetch 1 vs none): peak gradient bytes in a "
          "step, median step ms\n");
      std::printf("%-6s %4s %14s %14s %10s %10s\n", "stage", "rank", "peak, during", "peak, after", "ms, during",
                  "ms, after");
      for (const std::string& row : overlap_rows) std::printf("%s\n", row.c_str());
    }
    if (comm.rank() == 0 && !json_path.empty()) std::ofstream(json_path) << report.dump(2) << "\n";
    return 0;
  });
}
