// fp32_grads — what summing micro-batch gradients in FP32 changes in BF16 training.
//
// examples/char_transformer's model (char_transformer/char_model.hpp) trains `--steps`
// AdamW steps (warm-up, cosine) on the GPL-3 text, each step 4 micro-batches whose
// gradients add up before the update, three ways from the same seed and the same batches:
//   f32                   plain FP32 training (the reference);
//   bf16, bf16 gradients  BF16 autocast, BF16 model copies of FP32 masters, .grad in BF16
//                         (each micro-batch's add rounded to BF16);
//   bf16, fp32_grads      the same with amp::TrainStepOptions::fp32_grads (.grad in FP32).
// Each micro-batch's loss is scaled by 1/4, so the sum is the mean's gradient. It prints
// the training loss (mean over each window of steps) of the three runs, the two BF16 runs'
// difference and each one's distance from the FP32 run, and the held-out loss at the end.
//
//   fp32_grads [--steps 200] [--micro-batches 4] [--batch 4] [--log-every 25] > results/fp32_grads_<machine>_<date>.txt
#include <CLI/CLI.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "char_transformer/char_model.hpp"
#include "common/provenance.hpp"
#include "common/training.hpp"
#include "trainmem/trainmem.hpp"

namespace {

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using char_model::Batch;

struct Settings {
  std::int64_t steps = 200, micro_batches = 4, batch = 4, log_every = 25;
  double lr = 2e-3, weight_decay = 0.01;
  std::uint64_t seed = 1;
  char_model::ModelConfig model;
};

/// \brief One run: the model, AdamW and the precision step.
struct Run {
  Run(const Settings& s, std::int64_t vocabulary, tmem::DType precision, bool fp32_grads)
      : model(s.model, vocabulary, s.seed, tmem::DType::F32),
        optimizer(model.parameters(), {.lr = s.lr, .weight_decay = s.weight_decay}),
        train(optimizer, {.precision = precision, .fp32_grads = fp32_grads}),
        stages(model.stages(true)) {
    tape.manual_seed(s.seed);
  }
  /// One optimizer step over `micro` (the micro-batches' gradients summed); the mean loss.
  double step(const std::vector<Batch>& micro) {
    double loss = 0.0;
    const double share = 1.0 / static_cast<double>(micro.size());
    for (const Batch& b : micro) {
      tmem::Var<B> l = train.forward([&] {
        tmem::Var<B> x = model.embed(tape, b.inputs);
        for (const auto& stage : stages) x = stage(x);
        return tmem::scale(tmem::cross_entropy(x, b.targets), share);
      });
      train.backward(l);
      loss += l.item();
      tape.clear();
    }
    train.update();
    return loss;
  }
  /// Mean loss over `batches` in the run's precision, no graph.
  double evaluate(const std::vector<Batch>& batches) {
    const auto eval_stages = model.stages(false);
    double total = 0.0;
    for (const Batch& b : batches) {
      tmem::NoGradGuard no_grad;
      total += train
                   .forward([&] {
                     tmem::Var<B> x = model.embed(tape, b.inputs);
                     for (const auto& stage : eval_stages) x = stage(x);
                     return tmem::cross_entropy(x, b.targets);
                   })
                   .item();
      tape.clear();
    }
    return total / static_cast<double>(batches.size());
  }

  char_model::CharTransformer model;
  tmem::optim::AdamW<B> optimizer;
  tmem::amp::TrainStep<B> train;
  tmem::Tape<B> tape;
  std::vector<examples::Stage<B>> stages;
};

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  std::string text_path = "/usr/share/common-licenses/GPL-3";
  CLI::App app{"BF16 training of the char transformer with micro-batch gradients summed in BF16 or in FP32."};
  app.option_defaults()->always_capture_default();
  app.add_option("--text", text_path, "text file to learn from");
  app.add_option("--steps", s.steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--micro-batches", s.micro_batches, "micro-batches per step")->check(CLI::PositiveNumber);
  app.add_option("--batch", s.batch, "windows per micro-batch")->check(CLI::PositiveNumber);
  app.add_option("--log-every", s.log_every, "steps per printed window")->check(CLI::PositiveNumber);
  app.add_option("--seed", s.seed, "seed of initialisation and batches");
  CLI11_PARSE(app, argc, argv);

  try {
    std::printf("%s", benchmarks::provenance(argc, argv, tmem::num_threads()).text().c_str());
    const char_model::CharText text(text_path);
    const std::int64_t split = text.size() * 9 / 10, context = s.model.context;
    std::printf("# char_transformer model: context %lld, dim %lld, %lld blocks, %lld heads; %s\n",
                static_cast<long long>(context), static_cast<long long>(s.model.dim),
                static_cast<long long>(s.model.depth), static_cast<long long>(s.model.heads), text_path.c_str());
    std::printf(
        "# %lld AdamW steps (lr %g, warm-up then cosine, weight decay %g), %lld micro-batches of %lld windows "
        "per step, seed %llu\n",
        static_cast<long long>(s.steps), s.lr, s.weight_decay, static_cast<long long>(s.micro_batches),
        static_cast<long long>(s.batch), static_cast<unsigned long long>(s.seed));

    std::array<Run, 3> runs{Run(s, text.vocabulary(), tmem::DType::F32, false),
                            Run(s, text.vocabulary(), tmem::DType::BF16, false),
                            Run(s, text.vocabulary(), tmem::DType::BF16, true)};
    std::mt19937_64 rng(s.seed), held_out_rng(s.seed + 1);
    std::vector<Batch> held_out;
    for (int i = 0; i < 4; ++i)
      held_out.push_back(char_model::make_batch(
          text.ids(), char_model::random_starts(held_out_rng, 16, split, text.size(), context), context));

    std::printf(
        "# train loss: mean over each window of steps; diff = (bf16, fp32_grads) - (bf16, bf16 grads);\n"
        "# |bf16 - f32|: each BF16 run's distance from the FP32 run's loss\n");
    std::printf("%6s %10s %12s %12s %11s %12s %12s\n", "steps", "f32", "bf16 grads", "fp32_grads", "diff",
                "|bf16g-f32|", "|fp32g-f32|");
    std::array<double, 3> window{}, total_abs{};
    double total_diff = 0.0;
    const trainmem::optim::LrSchedule schedule = examples::lr_schedule(s.lr, s.steps);
    for (std::int64_t step = 0; step < s.steps; ++step) {
      std::vector<Batch> micro;
      for (std::int64_t m = 0; m < s.micro_batches; ++m)
        micro.push_back(
            char_model::make_batch(text.ids(), char_model::random_starts(rng, s.batch, 0, split, context), context));
      std::array<double, 3> loss{};
      for (std::size_t r = 0; r < runs.size(); ++r) {
        runs[r].optimizer.options().lr = schedule.lr(step);
        loss[r] = runs[r].step(micro);
        window[r] += loss[r];
      }
      total_diff += loss[2] - loss[1];
      total_abs[1] += std::abs(loss[1] - loss[0]);
      total_abs[2] += std::abs(loss[2] - loss[0]);
      if ((step + 1) % s.log_every == 0 || step + 1 == s.steps) {
        const double n = static_cast<double>((step % s.log_every) + 1);
        std::printf("%6lld %10.5f %12.5f %12.5f %+11.5f %12.5f %12.5f\n", static_cast<long long>(step + 1),
                    window[0] / n, window[1] / n, window[2] / n, (window[2] - window[1]) / n,
                    std::abs(window[1] - window[0]) / n, std::abs(window[2] - window[0]) / n);
        std::fflush(stdout);
        window = {};
      }
    }
    const double steps = static_cast<double>(s.steps);
    std::printf("mean over all %lld steps: diff %+.5f, |bf16 grads - f32| %.5f, |fp32_grads - f32| %.5f\n",
                static_cast<long long>(s.steps), total_diff / steps, total_abs[1] / steps, total_abs[2] / steps);
    std::printf("held-out loss after %lld steps: f32 %.5f, bf16 grads %.5f, fp32_grads %.5f\n",
                static_cast<long long>(s.steps), runs[0].evaluate(held_out), runs[1].evaluate(held_out),
                runs[2].evaluate(held_out));
    return 0;
  } catch (const trainmem::Error& e) {
    std::fprintf(stderr, "fp32_grads: %s\n", e.what());
    return 1;
  }
}
