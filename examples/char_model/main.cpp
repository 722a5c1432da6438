// examples/char_model/main.cpp — README.md's "your own model" walk-through, whole: a
// character-level model of four blocks of one's own, trained the way a real run is.
//
// The blocks are written here from library parts (nn::RMSNorm, nn::SelfAttention,
// nn::Linear and the swiglu op); amp::TrainStep runs BF16 autocast over FP32 master
// weights (or FP16 with a loss scaler), two micro-batches per step, gradient clipping and
// AdamW's learning rate on a warm-up + cosine schedule; the checkpoint planner picks
// which activations the blocks keep so the step fits 0.75x the plain step's peak; the
// run is saved at a step and resumed in a new process, bitwise. The batch of a step is
// a pure function of the step, so the step count is all the data position there is.
//
//   char_model [--precision bf16|fp16|fp32] [--steps N] [--save FILE] [--resume FILE]
//
// tests/readme runs it to step 100 in one process and to 50, save, resume to 100 in two,
// and compares what they print bit for bit.
#include <trainmem/trainmem.hpp>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::Var;

namespace {

// The text the model learns to continue (Dickens, A Tale of Two Cities).
const std::string kText =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
    "everything before us, we had nothing before us, we were all going direct to Heaven, we were all going "
    "direct the other way - in short, the period was so far like the present period, that some of its "
    "noisiest authorities insisted on its being received, for good or for evil, in the superlative degree "
    "of comparison only.";

struct Config {
  std::int64_t vocabulary = 0;  // distinct characters in the text
  std::int64_t context = 32;    // characters a window sees
  std::int64_t dim = 32;        // model width
  std::int64_t heads = 4;       // attention heads
  std::int64_t hidden = 64;     // SwiGLU width
  std::int64_t depth = 4;       // blocks
  std::int64_t batch = 8;       // windows per micro-batch
};

/// One block: pre-norm attention, then a pre-norm SwiGLU MLP, each added to its input.
struct Block : tmem::nn::Module<B> {
  Block(const Config& c, tmem::nn::Init& init)
      : tmem::nn::Module<B>("Block"),
        norm1({.dim = c.dim}),
        attn({.dim = c.dim, .heads = c.heads}, init),
        norm2({.dim = c.dim}),
        gate({.in = c.dim, .out = c.hidden, .bias = false}, init),
        up({.in = c.dim, .out = c.hidden, .bias = false}, init),
        down({.in = c.hidden, .out = c.dim, .bias = false}, init) {
    register_module("norm1", norm1);
    register_module("attn", attn);
    register_module("norm2", norm2);
    register_module("gate", gate);
    register_module("up", up);
    register_module("down", down);
  }

  Var<B> operator()(const Var<B>& x) const {
    const Var<B> h = x + attn(norm1(x));
    const Var<B> n = norm2(h);
    return h + down(tmem::swiglu(gate(n), up(n)));
  }

  tmem::nn::RMSNorm<B> norm1;
  tmem::nn::SelfAttention<B> attn;
  tmem::nn::RMSNorm<B> norm2;
  tmem::nn::Linear<B> gate, up, down;
};

/// Token and position embeddings, the blocks, a final norm and the head.
struct CharModel : tmem::nn::Module<B> {
  CharModel(const Config& c, tmem::nn::Init& init)
      : tmem::nn::Module<B>("CharModel"),
        config(c),
        tokens({.count = c.vocabulary, .dim = c.dim, .stddev = 0.02}, init),
        positions({.count = c.context, .dim = c.dim, .stddev = 0.02}, init),
        norm({.dim = c.dim}),
        head({.in = c.dim, .out = c.vocabulary, .bias = false}, init) {
    for (std::int64_t i = 0; i < c.depth; ++i) blocks.emplace_back(c, init);
    register_module("tokens", tokens);
    register_module("positions", positions);
    for (std::size_t i = 0; i < blocks.size(); ++i) register_module("blocks." + std::to_string(i), blocks[i]);
    register_module("norm", norm);
    register_module("head", head);
  }

  /// The blocks as the chain of stages a checkpoint schedule cuts.
  std::vector<tmem::Layer<B>> stages() const {
    std::vector<tmem::Layer<B>> out;
    for (const Block& block : blocks) out.push_back([&block](const Var<B>& x) { return block(x); });
    return out;
  }

  /// Mean cross-entropy of the next character over a batch of windows; `run` runs the
  /// blocks under the checkpoint schedule.
  Var<B> loss(tmem::Tape<B>& tape, const tmem::ChainRunner<B>& run, const std::vector<std::int32_t>& inputs,
              const std::vector<std::int32_t>& targets) const {
    const auto n = static_cast<std::int64_t>(inputs.size());
    std::vector<std::int32_t> where(inputs.size());
    for (std::size_t i = 0; i < where.size(); ++i) where[i] = static_cast<std::int32_t>(i % config.context);
    const Var<B> x = tokens(tape.input(tmem::Tensor<B>::from_host({n}, inputs))) +
                     positions(tape.input(tmem::Tensor<B>::from_host({n}, where)));
    const Var<B> h = run(tmem::reshape(x, {n / config.context, config.context, config.dim}));
    const Var<B> logits = head(norm(tmem::reshape(h, {n, config.dim})));
    return tmem::cross_entropy(logits, tmem::Tensor<B>::from_host({n}, targets));
  }

  Config config;
  tmem::nn::Embedding<B> tokens, positions;
  std::vector<Block> blocks;
  tmem::nn::RMSNorm<B> norm;
  tmem::nn::Linear<B> head;
};

/// \brief The text as ids, and the windows of a step's micro-batches.
struct Text {
  explicit Text(const std::string& text) {
    for (char c : text)
      if (alphabet.find(c) == std::string::npos) alphabet += c;
    for (char c : text) ids.push_back(static_cast<std::int32_t>(alphabet.find(c)));
  }

  /// Micro-batch `micro` of step `step`: random windows, drawn from a seed that is a
  /// function of (step, micro) alone, so a resumed run sees the batches it would have.
  void windows(std::int64_t step, int micro, const Config& c, std::vector<std::int32_t>& inputs,
               std::vector<std::int32_t>& targets) const {
    std::mt19937_64 rng(static_cast<std::uint64_t>(step) * 2 + static_cast<std::uint64_t>(micro));
    std::uniform_int_distribution<std::size_t> start(0, ids.size() - static_cast<std::size_t>(c.context) - 1);
    inputs.clear();
    targets.clear();
    for (std::int64_t w = 0; w < c.batch; ++w) {
      const std::size_t s = start(rng);
      inputs.insert(inputs.end(), ids.begin() + s, ids.begin() + s + c.context);
      targets.insert(targets.end(), ids.begin() + s + 1, ids.begin() + s + c.context + 1);
    }
  }

  std::string alphabet;
  std::vector<std::int32_t> ids;
};

/// CRC-32 of every byte of a state: equal only when the states are bitwise equal.
std::uint32_t crc_of(const tmem::StateDict& state) {
  tmem::Crc32 crc;
  for (const auto& [name, entry] : state) {
    crc.update(name.data(), name.size());
    crc.update(entry.bytes.data(), entry.bytes.size());
  }
  return crc.value();
}

}  // namespace

int main(int argc, char** argv) {
  std::string precision = "bf16", save_path, resume_path;
  std::int64_t steps = 100;
  bool usage = argc % 2 == 0;  // flags come with a value each
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--precision") precision = value;
    else if (flag == "--steps") steps = std::stoll(value);
    else if (flag == "--save") save_path = value;
    else if (flag == "--resume") resume_path = value;
    else usage = true;
  }
  if (usage || (precision != "bf16" && precision != "fp16" && precision != "fp32")) {
    std::fprintf(stderr, "usage: char_model [--precision bf16|fp16|fp32] [--steps N] [--save FILE] [--resume FILE]\n");
    return 2;
  }
  try {
    const Text text(kText);
    Config config;
    config.vocabulary = static_cast<std::int64_t>(text.alphabet.size());
    tmem::nn::Init init(/*seed=*/7);
    CharModel model(config, init);
    const std::vector<tmem::Layer<B>> stages = model.stages();

    const tmem::DType dtype = precision == "fp16"   ? tmem::DType::F16
                              : precision == "bf16" ? tmem::DType::BF16
                                                    : tmem::DType::F32;
    tmem::optim::AdamW<B> optimizer(model.parameters(), {.lr = 3e-3, .weight_decay = 0.01});
    tmem::amp::TrainStep<B> train(optimizer, {.precision = dtype,  // BF16/FP16 copies of FP32 masters
                                              .micro_batches = 2,
                                              .clip_grad_norm = 1.0,
                                              .schedule = tmem::optim::LrSchedule::warmup_cosine(3e-3, 10, 100)});
    tmem::Tape<B> tape;

    if (!resume_path.empty()) {
      tmem::load(resume_path, {{"model", model}, {"optimizer", optimizer}, {"train", train}});
      std::printf("resumed %s at step %lld\n", resume_path.c_str(), static_cast<long long>(train.step_count()));
    }

    // The planner profiles the whole step, both micro-batches, run through a ChainRunner,
    // in every way of running the blocks; `restore` puts back everything those steps change.
    std::vector<std::int32_t> inputs, targets;
    const tmem::ChainStep<B> profiled = [&](const tmem::ChainRunner<B>& run) {
      for (int micro = 0; micro < 2; ++micro) {
        text.windows(0, micro, config, inputs, targets);
        const Var<B> loss = train.forward([&] { return model.loss(tape, run, inputs, targets); });
        run.backward_with([&] { train.backward(tmem::scale(loss, 0.5)); });  // the mean of two
        tape.clear();
      }
      train.update();
    };
    const tmem::Planner<B> planner(stages, profiled, {.restore = {model, optimizer, train, tape}, .micro_batches = 2});
    const std::int64_t plain_peak = planner.profile().plain_peak[0];
    const tmem::CheckpointPlan<B> plan = planner.plan(tmem::Budget::whole_step(plain_peak * 3 / 4));
    const tmem::ChainRunner<B> run = plan.runner();
    std::printf("char model: %lld blocks, %lld characters of context, dim %lld, %s, 2 micro-batches of %lld\n",
                static_cast<long long>(config.depth), static_cast<long long>(config.context),
                static_cast<long long>(config.dim), precision.c_str(), static_cast<long long>(config.batch));
    std::printf("plain step's peak %s; planned within 0.75x:\n%s", tmem::format_bytes(plain_peak).c_str(),
                plan.str().c_str());

    while (train.step_count() < steps) {
      const std::int64_t step = train.step_count();
      const tmem::amp::StepReport<B> report = train.run([&](int micro) {
        text.windows(step, micro, config, inputs, targets);
        return model.loss(tape, run, inputs, targets);
      });
      if ((step + 1) % 10 == 0)
        std::printf("step %3lld  loss %.9g  lr %.3e  grad norm %.4f%s\n", static_cast<long long>(step + 1),
                    report.loss_value(), report.lr, *report.grad_norm, report.stepped ? "" : "  (skipped)");
    }
    if (!save_path.empty()) {
      tmem::save(save_path, {{"model", model}, {"optimizer", optimizer}, {"train", train}});
      std::printf("saved %s at step %lld\n", save_path.c_str(), static_cast<long long>(train.step_count()));
    }
    std::printf("final: step %lld, %lld skipped, state crc32 %08x\n", static_cast<long long>(train.step_count()),
                static_cast<long long>(train.skipped_steps()),
                crc_of(tmem::state_of(model)) ^ crc_of(optimizer.state()) ^ crc_of(train.state()));
    return 0;
  } catch (const tmem::Error& e) {
    std::fprintf(stderr, "char_model: %s\n", e.what());
    return 1;
  }
}
