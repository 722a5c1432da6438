// examples/char_transformer/main.cpp — a small causal transformer that learns to write
// like a text file, one character at a time.
//
// Shows trainmem on a language-model step: token and position embeddings
// (nn::Embedding), a stack of pre-LN causal nn::TransformerBlocks, a final LayerNorm and
// a linear head over the characters, trained with AdamW on random windows of the text
// (default: the GPL-3 text every Debian machine has). The blocks are the stages a
// checkpoint schedule cuts at; their attention scores ([batch * heads, T, T] per
// block) are the activations that schedules save the most on. It prints the training
// and held-out loss every few steps, the peak bytes of one step per memory category next
// to the same model's plain F32 step, and finally a sample of text generated from the
// trained model with a seeded sampler.
//
//   char_transformer                                  # GPL-3, under a minute on 2 cores
//   char_transformer --text book.txt --steps 2000 --temperature 0.8
//   mpirun -np 2 char_transformer --zero 3 --precision bf16   # two ranks, ZeRO-3
//
// Built with MPI, `--zero 0|1|2|3` under mpirun trains data-parallel
// (examples/fashion_mnist/sharded_step.hpp): every rank draws the same windows and trains on
// its slice of them; under ZeRO-3 the embeddings, each block and the final LayerNorm with the
// head are the units. Rank 0 prints its loss, the held-out loss and the sample (every rank
// gathers the units for them), and each rank its model-state bytes after its last reduction.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "char_transformer/char_model.hpp"
#include "common/cli_checks.hpp"
#include "common/memory_report.hpp"
#include "common/settings.hpp"
#include "common/training.hpp"
#include "fashion_mnist/sharded_step.hpp"
#include "trainmem/trainmem.hpp"
#ifdef TRAINMEM_WITH_MPI
#include "trainmem/distributed/mpi.hpp"
#endif

namespace {

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using examples::Stage;
using Clock = std::chrono::steady_clock;
using char_model::Batch;
using char_model::CharText;
using char_model::CharTransformer;
using char_model::make_batch;
using char_model::ModelConfig;
using char_model::random_starts;

/// \brief One training run: the model under its settings, AdamW, the precision step
/// (masters, loss scaling, the learning rate's warm-up and cosine decay) and the tape.
struct Training {
  Training(const ModelConfig& config, std::int64_t vocabulary, std::uint64_t seed,
           const examples::MemorySettings& run_settings, double lr, double weight_decay, std::int64_t steps)
      : settings(run_settings),
        model(config, vocabulary, seed, tmem::DType::F32),  // mixed precision narrows the parameters after
        optimizer(model.parameters(), {.lr = lr, .weight_decay = weight_decay}),
        runner(optimizer, {.precision = examples::dtype_of(settings.precision),
                           .schedule = examples::lr_schedule(lr, steps),
                           .fp8 = examples::fp8_of(settings)}),
        stages(model.stages(true)) {
    tape.manual_seed(seed);
  }
  Training(const Training&) = delete;
  Training& operator=(const Training&) = delete;

  /// One optimizer step on `b` under the run's checkpoint schedule.
  tmem::amp::StepReport<B> step(const Batch& b) {
    return examples::train_step(
        tape, model, stages, b.inputs,
        [&](const tmem::Var<B>& logits) { return tmem::cross_entropy(logits, b.targets); }, settings.checkpoint,
        runner);
  }

  examples::MemorySettings settings;
  CharTransformer model;
  tmem::optim::AdamW<B> optimizer;
  tmem::amp::TrainStep<B> runner;
  tmem::Tape<B> tape;
  std::vector<Stage<B>> stages;
};

/// Mean loss over fixed held-out windows (no graph recorded).
double held_out_loss(tmem::Tape<B>& tape, const CharTransformer& model, const std::vector<std::int32_t>& ids,
                     const std::vector<std::int64_t>& starts, std::int64_t batch, tmem::amp::Fp8Scaling<B>* fp8) {
  const auto stages = model.stages(false);
  double total = 0.0;
  std::int64_t batches = 0;
  for (std::size_t begin = 0; begin < starts.size(); begin += static_cast<std::size_t>(batch), ++batches) {
    const std::vector<std::int64_t> chunk(
        starts.begin() + static_cast<std::ptrdiff_t>(begin),
        starts.begin() + static_cast<std::ptrdiff_t>(std::min(starts.size(), begin + static_cast<std::size_t>(batch))));
    const Batch b = make_batch(ids, chunk, model.config().context);
    tmem::NoGradGuard no_grad;
    const tmem::Tensor<B> logits = examples::infer(tape, model, stages, b.inputs, fp8);
    const tmem::Var<B> loss = tmem::cross_entropy(tape.input(logits), b.targets);
    total += loss.value().to_host<double>()[0];
    tape.clear();
  }
  return total / static_cast<double>(batches);
}

/// Continues `prompt` by `count` characters: greedy at temperature 0, else sampled.
std::string generate(tmem::Tape<B>& tape, const CharTransformer& model, const CharText& text, const std::string& prompt,
                     std::int64_t count, double temperature, std::mt19937_64& rng, tmem::amp::Fp8Scaling<B>* fp8) {
  const auto stages = model.stages(false);
  const std::int64_t context = model.config().context;
  std::vector<std::int32_t> ids = text.encode(prompt);
  if (ids.empty()) ids.push_back(0);
  std::string out;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (std::int64_t i = 0; i < count; ++i) {
    const auto window_begin = ids.size() > static_cast<std::size_t>(context) ? ids.end() - context : ids.begin();
    const std::vector<std::int32_t> window(window_begin, ids.end());
    const auto t = static_cast<std::int64_t>(window.size());
    tmem::Tensor<B> input = tmem::Tensor<B>::empty(tmem::Shape{1, t}, tmem::DType::I32);
    input.backend().upload(input.data(), window.data(), input.bytes());
    const std::vector<float> logits = examples::infer(tape, model, stages, input, fp8).to_host();
    const float* last = logits.data() + (t - 1) * text.vocabulary();
    std::int32_t next = static_cast<std::int32_t>(std::max_element(last, last + text.vocabulary()) - last);
    if (temperature > 0.0) {
      std::vector<double> weights(static_cast<std::size_t>(text.vocabulary()));
      double total = 0.0;
      for (std::size_t v = 0; v < weights.size(); ++v)
        total += weights[v] = std::exp((last[v] - last[next]) / temperature);
      double r = uniform(rng) * total;
      for (next = 0; next + 1 < text.vocabulary() && r >= weights[static_cast<std::size_t>(next)]; ++next)
        r -= weights[static_cast<std::size_t>(next)];
    }
    ids.push_back(next);
    out += text.character(next);
  }
  return out;
}

/// What a data-parallel run (--zero) needs besides the model's shape.
struct ShardedRun {
  int zero = -1;
  std::int64_t steps = 0, batch = 0, log_every = 0, sample_chars = 0;
  double lr = 0, weight_decay = 0, temperature = 0;
  std::uint64_t seed = 0;
  std::string prompt;
  examples::MemorySettings settings;
};

/// Trains on this rank's slice of every batch under ZeRO-`r.zero`, the model's stages (the
/// embedding first) each a ZeRO-3 unit.
int run_sharded(const ShardedRun& r, const ModelConfig& config, const CharText& text, std::int64_t split,
                tmem::dist::Communicator<B>& comm) {
  const bool lead = comm.rank() == 0;
  tmem::require(r.batch % comm.size() == 0, "--zero: --batch ", r.batch, " must divide by the ", comm.size(), " ranks");
  tmem::require(r.settings.checkpoint.kind == examples::CheckpointSchedule::Kind::None ||
                    (r.zero == 3 && r.settings.checkpoint.kind == examples::CheckpointSchedule::Kind::Selective),
                "--zero runs the stages one after the other: --checkpoint none, or under --zero 3 selective (a "
                "region inside each unit)");
  const bool selective = r.settings.checkpoint.kind == examples::CheckpointSchedule::Kind::Selective;
  const auto run_start = Clock::now();
  CharTransformer model(config, text.vocabulary(), r.seed, tmem::DType::F32);
  std::int64_t parameter_count = 0;
  for (const auto& p : model.parameters()) parameter_count += p.numel();
  examples::ShardedStep<B> sharded(comm, model.stage_parameters(), r.zero, examples::dtype_of(r.settings.precision),
                                   {.lr = r.lr, .weight_decay = r.weight_decay});
  tmem::Tape<B> tape;
  tape.manual_seed(r.seed);
  // Stage 0 embeds the ids (the unit's input); then the blocks and the head.
  std::vector<Stage<B>> stages{[&model](const tmem::Var<B>& ids) { return model.embed(*ids.tape(), ids.value()); }};
  for (const Stage<B>& s : model.stages(true)) stages.push_back(s);
  const std::vector<Stage<B>> wrapped = sharded.wrap(stages, selective);
  if (lead) {
    std::printf(
        "char_transformer: ZeRO-%d on %d ranks, %lld parameters, dim %lld, %lld blocks, %lld heads, context "
        "%lld; %s\n",
        r.zero, comm.size(), static_cast<long long>(parameter_count), static_cast<long long>(config.dim),
        static_cast<long long>(config.depth), static_cast<long long>(config.heads),
        static_cast<long long>(config.context), r.settings.str().c_str());
    std::printf(
        "  %lld steps of %lld windows (%lld per rank), AdamW lr %g (warm-up, cosine), weight decay %g, seed "
        "%llu\n",
        static_cast<long long>(r.steps), static_cast<long long>(r.batch), static_cast<long long>(r.batch / comm.size()),
        r.lr, r.weight_decay, static_cast<unsigned long long>(r.seed));
    std::fflush(stdout);
  }
  const tmem::optim::LrSchedule schedule = examples::lr_schedule(r.lr, r.steps);
  std::mt19937_64 rng(r.seed), held_out_rng(r.seed + 1);
  const std::vector<std::int64_t> held_out =
      random_starts(held_out_rng, 4 * r.batch, split, text.size(), config.context);
  double loss_sum = 0.0, held = 0.0;
  std::int64_t loss_count = 0;
  for (std::int64_t step = 0; step < r.steps; ++step) {
    // Every rank draws the global batch, then keeps its slice of it.
    std::vector<std::int64_t> starts = random_starts(rng, r.batch, 0, split, config.context);
    const std::int64_t per_rank = r.batch / comm.size();
    starts = std::vector<std::int64_t>(starts.begin() + comm.rank() * per_rank,
                                       starts.begin() + (comm.rank() + 1) * per_rank);
    const Batch b = make_batch(text.ids(), starts, config.context);
    sharded.set_lr(schedule.lr(step));
    const tmem::amp::StepReport<B> report = sharded.run([&] {
      tmem::Var<B> h = tape.input(b.inputs);
      for (const Stage<B>& s : wrapped) h = s(h);
      return tmem::cross_entropy(h, b.targets);
    });
    tape.clear();
    loss_sum += report.loss_value();
    ++loss_count;
    if ((step + 1) % r.log_every == 0 || step + 1 == r.steps) {
      sharded.gather_all();  // a collective: every rank, so rank 0 evaluates the whole model
      if (lead) {
        held = held_out_loss(tape, model, text.ids(), held_out, r.batch, nullptr);  // --fp8 is refused with --zero
        std::printf("step %5lld  train loss %.4f (rank 0)  held-out loss %.4f  %s\n", static_cast<long long>(step + 1),
                    loss_sum / static_cast<double>(loss_count), held, sharded.status().c_str());
        std::fflush(stdout);
      }
      sharded.release_all();
      loss_sum = 0.0;
      loss_count = 0;
    }
  }
  const double train_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  // 16-bit: 2-byte weights and gradients, 12 bytes of f32 master and moments; f32: 4-byte
  // weights and gradients, 8 bytes of moments and no masters.
  const bool half = tmem::is_16bit(examples::dtype_of(r.settings.precision));
  const double p = static_cast<double>(parameter_count), n = comm.size();
  const double w = half ? 2 : 4, g = half ? 2 : 4, state = half ? 12 : 8;
  const double formula = r.zero == 0   ? (w + g + state) * p
                         : r.zero == 1 ? (w + g) * p + state * p / n
                         : r.zero == 2 ? w * p + (g + state) * p / n
                                       : (w + g + state) * p / n;
  for (int rank = 0; rank < comm.size(); ++rank) {  // in rank order
    comm.barrier();
    if (rank == comm.rank()) {
      std::printf("rank %d: model state after the last reduction %lld B (ZeRO-%d formula %.0f B)\n", rank,
                  static_cast<long long>(sharded.model_state_after_reduce()), r.zero, formula);
      std::fflush(stdout);
    }
  }
  comm.barrier();
  sharded.gather_all();
  if (lead) {
    std::mt19937_64 sample_rng(r.seed);
    const std::string sample =
        generate(tape, model, text, r.prompt, r.sample_chars, r.temperature, sample_rng, nullptr);
    std::printf("\nsample (temperature %g, seed %llu):\n%s%s\n", r.temperature, static_cast<unsigned long long>(r.seed),
                r.prompt.c_str(), sample.c_str());
    std::printf("\nheld-out loss %.4f after %lld steps (ZeRO-%d, %d ranks); training %.1f s\n", held,
                static_cast<long long>(r.steps), r.zero, comm.size(), train_seconds);
  }
  sharded.release_all();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path text_path = "/usr/share/common-licenses/GPL-3";
  ModelConfig config;
  std::int64_t steps = 600, batch = 16, log_every = 50, sample_chars = 400;
  double lr = 2e-3, weight_decay = 0.01, temperature = 0.7;
  std::uint64_t seed = 1;
  std::string prompt = "The ", precision = "fp32", checkpoint = "selective";
  bool fp8 = false;

  CLI::App app{"Train a small character-level causal transformer on a text file and let it write."};
  app.option_defaults()->always_capture_default();
  app.add_option("--text", text_path, "text file to learn from");
  app.add_option("--steps", steps, "training steps")->check(examples::kPositive);
  app.add_option("--batch", batch, "windows per step")->check(examples::kPositive);
  app.add_option("--context", config.context, "characters per window")->check(CLI::Range(2, 1024));
  app.add_option("--dim", config.dim, "model width")->check(examples::kPositive);
  app.add_option("--depth", config.depth, "transformer blocks")->check(examples::kPositive);
  app.add_option("--heads", config.heads, "attention heads (must divide --dim)")->check(examples::kPositive);
  app.add_option("--lr", lr, "peak learning rate (AdamW, warm-up then cosine)")->check(examples::kPositive);
  app.add_option("--weight-decay", weight_decay, "AdamW weight decay")->check(examples::kNonNegative);
  app.add_option("--precision", precision, "fp32, bf16 or fp16")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_flag("--fp8", fp8, "linear's GEMMs in FP8 with delayed scaling (emulated on the CPU), on top of --precision");
  app.add_option("--checkpoint", checkpoint, "none, sqrt, every:K or selective (stages are the blocks)");
  app.add_option("--seed", seed, "seed of initialisation, batches and sampling");
  app.add_option("--log-every", log_every, "print the loss every N steps")->check(examples::kPositive);
  app.add_option("--prompt", prompt, "text the sample starts from");
  app.add_option("--sample-chars", sample_chars, "characters to generate at the end")->check(examples::kNonNegative);
  app.add_option("--temperature", temperature, "sampling temperature; 0 picks the likeliest character")
      ->check(examples::kNonNegative);
  int zero = -1;
  app.add_option("--zero", zero,
                 "data-parallel under mpirun, each rank on its slice of every batch: 0 (gradients averaged), 1 "
                 "(masters and AdamW moments sharded), 2 (gradients too) or 3 (weights too, a unit per stage); "
                 "absent: one process")
      ->check(CLI::Range(0, 3))
      ->default_str("");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto run_start = Clock::now();
    examples::MemorySettings settings;
    settings.precision = examples::parse_precision(precision);
    settings.checkpoint = examples::parse_checkpoint(checkpoint);
    settings.fp8 = fp8;
    examples::require_available(settings);

    const CharText text(text_path);
    // The last 10% of the text is held out: its loss shows whether the model generalises.
    const std::int64_t split = text.size() * 9 / 10;
    tmem::require(split - config.context - 1 > 0 && text.size() - split - config.context - 1 > 0, "text file ",
                  text_path.string(), ": ", text.size(), " characters is too short for windows of ", config.context,
                  " (need more than ", 10 * (config.context + 1), ")");

    if (zero >= 0) {
#ifdef TRAINMEM_WITH_MPI
      const ShardedRun r{.zero = zero,
                         .steps = steps,
                         .batch = batch,
                         .log_every = log_every,
                         .sample_chars = sample_chars,
                         .lr = lr,
                         .weight_decay = weight_decay,
                         .temperature = temperature,
                         .seed = seed,
                         .prompt = prompt,
                         .settings = settings};
      tmem::dist::mpi::Environment environment(&argc, &argv);
      return tmem::dist::mpi::run([&] {
        tmem::dist::mpi::Communicator comm;
        return run_sharded(r, config, text, split, comm);
      });
#else
      throw trainmem::Error(
          "--zero needs MPI: this char_transformer was built without it (configure with an MPI found, "
          "-DTRAINMEM_MPI=ON)");
#endif
    }

    // The plain F32 step of the same model, measured first (while no other model is alive)
    // so the memory table can put the chosen settings next to it.
    const examples::MemorySettings plain = settings.plain();
    const examples::StepMemory plain_memory = [&] {
      Training plain_run(config, text.vocabulary(), seed, plain, lr, weight_decay, steps);
      std::mt19937_64 plain_rng(seed);
      const Batch b = make_batch(text.ids(), random_starts(plain_rng, batch, 0, split, config.context), config.context);
      return examples::measure_steady_step(
          B::default_instance().memory(), [&] { plain_run.step(b); }, false);
    }();

    Training run(config, text.vocabulary(), seed, settings, lr, weight_decay, steps);
    std::int64_t parameter_count = 0;
    for (const auto& p : run.model.parameters()) parameter_count += p.numel();
    std::mt19937_64 rng(seed);

    std::printf("char_transformer: %s, %lld characters (%lld distinct)\n", text_path.string().c_str(),
                static_cast<long long>(text.size()), static_cast<long long>(text.vocabulary()));
    std::printf("  context %lld, dim %lld, %lld blocks, %lld heads: %lld parameters; %s\n",
                static_cast<long long>(config.context), static_cast<long long>(config.dim),
                static_cast<long long>(config.depth), static_cast<long long>(config.heads),
                static_cast<long long>(parameter_count), settings.str().c_str());
    std::printf("  %lld steps of %lld windows, AdamW lr %g (warm-up, cosine), weight decay %g, seed %llu\n",
                static_cast<long long>(steps), static_cast<long long>(batch), lr, weight_decay,
                static_cast<unsigned long long>(seed));
    std::fflush(stdout);

    std::mt19937_64 held_out_rng(seed + 1);
    const std::vector<std::int64_t> held_out =
        random_starts(held_out_rng, 4 * batch, split, text.size(), config.context);
    examples::StepMemory step_memory;
    double loss_sum = 0.0;
    std::int64_t loss_count = 0;
    auto window_start = Clock::now();
    for (std::int64_t step = 0; step < steps; ++step) {
      const Batch b = make_batch(text.ids(), random_starts(rng, batch, 0, split, config.context), config.context);
      const auto one_step = [&] {
        loss_sum += run.step(b).loss_value();
        ++loss_count;
      };
      // The second step is measured (the first allocates the optimizer state).
      if (step == 1) step_memory = examples::measure_step(B::default_instance().memory(), one_step, false);
      else one_step();
      if ((step + 1) % log_every == 0 || step + 1 == steps) {
        const double seconds = std::chrono::duration<double>(Clock::now() - window_start).count();
        std::printf("step %5lld  train loss %.4f  held-out loss %.4f  %.0f chars/s\n", static_cast<long long>(step + 1),
                    loss_sum / static_cast<double>(loss_count),
                    held_out_loss(run.tape, run.model, text.ids(), held_out, batch, run.runner.fp8()),
                    static_cast<double>(loss_count * batch * config.context) / seconds);
        std::fflush(stdout);
        loss_sum = 0.0;
        loss_count = 0;
        window_start = Clock::now();
      }
    }
    const double train_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();

    std::printf("\nmemory of one training step (batch %lld x %lld characters), peak bytes per category:\n",
                static_cast<long long>(batch), static_cast<long long>(config.context));
    examples::print_memory_table(step_memory, settings.str(), plain_memory, plain.str() + " (plain)");

    std::mt19937_64 sample_rng(seed);
    const std::string sample =
        generate(run.tape, run.model, text, prompt, sample_chars, temperature, sample_rng, run.runner.fp8());
    std::printf("\nsample (temperature %g, seed %llu):\n%s%s\n", temperature, static_cast<unsigned long long>(seed),
                prompt.c_str(), sample.c_str());
    std::printf("\nwall time %.1f s (training and held-out loss %.1f s)\n",
                std::chrono::duration<double>(Clock::now() - run_start).count(), train_seconds);
    return 0;
  } catch (const trainmem::Error& e) {
    std::fprintf(stderr, "char_transformer: %s\n", e.what());
    return 1;
  }
}
