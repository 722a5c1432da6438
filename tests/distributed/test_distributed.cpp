// tests/distributed/test_distributed.cpp — data parallelism and ZeRO in one process (no MPI needed).
//
// With one rank every collective is a copy, so DataParallel and ZeroOptimizer must
// reproduce plain single-process training bit for bit: the reference is AdamW (with
// MasterWeights for 16-bit models) on the same parameters. The layout's pieces and
// shards are checked against closed forms. The multi-rank cases are in mpi/.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "distributed_model.hpp"
#include "error_matchers.hpp"
#include "trainmem/distributed/communicator.hpp"
#include "trainmem/distributed/flat_layout.hpp"
#include "trainmem/distributed/fully_sharded.hpp"

using namespace trainmem;
using namespace dist_test;
using testing::ErrorContains;

namespace {

/// A one-rank communicator that counts the collectives it is asked for.
class CountingCommunicator final : public dist::Communicator<B> {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int calls = 0;

 protected:
  void do_all_reduce_sum(const Tensor<B>&) override { ++calls; }
  void do_reduce_scatter_sum(const Tensor<B>& in, const Tensor<B>& out, std::span<const std::int64_t>) override {
    ++calls;
    out.copy_from(in);
  }
  void do_all_gather(const Tensor<B>&, std::span<const std::int64_t>) override { ++calls; }
  void do_broadcast(const Tensor<B>&, int) override { ++calls; }
  void do_barrier() override { ++calls; }
  void do_broadcast_host(std::span<std::byte>, int) override { ++calls; }
  void do_all_gather_host(std::span<const std::byte> mine, std::span<std::byte> all) override {
    ++calls;
    std::copy(mine.begin(), mine.end(), all.begin());
  }
};

/// A one-rank communicator that writes down each collective of a bucket as it is asked
/// for: "rs" or "ag" and the element count, and whether fc1.weight had a gradient yet.
class RecordingCommunicator final : public dist::Communicator<B> {
 public:
  explicit RecordingCommunicator(const Var<B>& first_layer) : first_layer_(first_layer) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::vector<std::string> log;

 protected:
  void do_all_reduce_sum(const Tensor<B>&) override {}
  void do_reduce_scatter_sum(const Tensor<B>& in, const Tensor<B>& out, std::span<const std::int64_t>) override {
    log.push_back("rs" + std::to_string(in.numel()) + (first_layer_.grad().defined() ? "" : " (fc1 in backward)"));
    out.copy_from(in);
  }
  void do_all_gather(const Tensor<B>& buffer, std::span<const std::int64_t>) override {
    log.push_back("ag" + std::to_string(buffer.numel()));
  }
  void do_broadcast(const Tensor<B>&, int) override {}
  void do_barrier() override {}
  void do_broadcast_host(std::span<std::byte>, int) override {}
  void do_all_gather_host(std::span<const std::byte> mine, std::span<std::byte> all) override {
    std::copy(mine.begin(), mine.end(), all.begin());
  }

 private:
  Var<B> first_layer_;
};

}  // namespace

TEST_CASE("dist: shards are ceil(Ψ/N)-element ranges, the last ones empty when Ψ is small", "[dist]") {
  CHECK(dist::shard_range(55, 0, 2).begin == 0);
  CHECK(dist::shard_range(55, 0, 2).end == 28);
  CHECK(dist::shard_range(55, 1, 2).end == 55);
  CHECK(dist::shard_range(4, 2, 3).empty());  // c = 2: [0, 2), [2, 4), [4, 4)
  CHECK(dist::shard_range(4, 1, 3).size() == 2);
  CHECK(dist::shard_counts({3, 9}, 10, 3) == std::vector<std::int64_t>{1, 4, 1});  // shards [0,4) [4,8) [8,10)
}

TEST_CASE("dist: a window's pieces name each parameter part once, in order", "[dist]") {
  TinyNet net;  // fc1.weight 35, fc1.bias 5, fc2.weight 15
  const dist::FlatLayout layout(net.parameters());
  REQUIRE(layout.total() == 55);
  std::vector<dist::Piece> pieces;
  layout.for_each_piece({30, 42}, [&](const dist::Piece& p) { pieces.push_back(p); });
  REQUIRE(pieces.size() == 3);
  CHECK((pieces[0].param == 0 && pieces[0].param_offset == 30 && pieces[0].window_offset == 0 && pieces[0].count == 5));
  CHECK((pieces[1].param == 1 && pieces[1].param_offset == 0 && pieces[1].window_offset == 5 && pieces[1].count == 5));
  CHECK((pieces[2].param == 2 && pieces[2].param_offset == 0 && pieces[2].window_offset == 10 && pieces[2].count == 2));
}

TEST_CASE("dist: one rank reproduces single-process AdamW bit for bit (F32, DP and ZeRO-1/2)", "[dist]") {
  const std::vector<double> reference = train_reference(20);
  dist::SingleProcess<B> comm;
  for (int stage : {0, 1, 2}) {
    for (std::int64_t bucket : {std::int64_t{4}, std::int64_t{64}, std::int64_t{1} << 20}) {
      INFO("stage " << stage << ", bucket " << bucket << " bytes");
      CHECK(train_ranks(comm, stage, 20, bucket) == reference);
    }
  }
}

TEST_CASE("dist: after a backward that failed part way, no optimizer steps on the average until zero_grad", "[dist]") {
  // train_ranks checks that the step is refused with the weights unchanged; run again
  // after zero_grad, it leaves no trace: the weights are the clean run's, bit for bit.
  const std::vector<double> reference = train_reference(4);
  dist::SingleProcess<B> comm;
  for (int stage : {0, 1, 2}) {
    for (int micro : {1, 2}) {
      for (bool overlap : {true, false}) {
        INFO("stage " << stage << ", " << micro << " micro-batches, overlap " << overlap);
        const std::vector<double> clean = train_ranks(comm, stage, 4, 64, micro, overlap);
        CHECK(train_ranks(comm, stage, 4, 64, micro, overlap, 2) == clean);
        if (micro == 1) CHECK(clean == reference);
      }
    }
  }
}

TEST_CASE("dist: accumulating two micro-batches matches the whole batch", "[dist]") {
  const std::vector<double> reference = train_reference(20);
  dist::SingleProcess<B> comm;
  for (int stage : {0, 1, 2}) {
    const std::vector<double> w = train_ranks(comm, stage, 20, 64, 2);
    REQUIRE(w.size() == reference.size());
    for (std::size_t i = 0; i < w.size(); ++i)
      CHECK(std::abs(w[i] - reference[i]) <= 1e-6 * std::abs(reference[i]) + 1e-7);
  }
}

TEST_CASE("dist: no collective runs before the last micro-batch", "[dist]") {
  TinyNet net;
  CountingCommunicator comm;
  dist::DataParallel<B> sync(comm, net.parameters(), {.bucket_bytes = 64, .accumulation_steps = 3});
  for (int m = 0; m < 2; ++m) {
    const int before = comm.calls;
    backward(net, 0, 4, 0, DType::F32);
    CHECK_FALSE(sync.micro_batch_done());
    CHECK(comm.calls == before);
  }
  const int before = comm.calls;
  backward(net, 0, 4, 0, DType::F32);
  CHECK(sync.micro_batch_done());
  // 55 f32 in buckets of 16: 4 windows, each a reduce-scatter and an all-gather; then one
  // byte per rank says whether some rank's backward failed part way.
  CHECK(comm.calls == before + 2 * 4 + 1);
}

TEST_CASE("dist: buckets go out during backward, last first, each all-gather after the next reduce-scatter", "[dist]") {
  // Ψ = 55 in windows of 16: [0, 16) [16, 32) [32, 48) [48, 55); fc1.weight is [0, 35),
  // fc1.bias [35, 40), fc2.weight [40, 55). Only the last window lies in fc2 alone, so it
  // goes while fc1's backward has not run; the others wait for fc1.weight, made last.
  TinyNet net;
  RecordingCommunicator comm(net.fc1.weight());
  dist::DataParallel<B> sync(comm, net.parameters(), {.bucket_bytes = 64});
  backward(net, 0, 4, 0, DType::F32);
  const std::vector<std::string> during = comm.log;
  sync.average_gradients();
  CHECK(during == std::vector<std::string>{"rs7 (fc1 in backward)", "rs16", "ag7", "rs16", "ag16", "rs16", "ag16"});
  CHECK(comm.log.size() == 8);
  CHECK(comm.log.back() == "ag16");

  // Overlap off: the same collectives, all after backward.
  TinyNet net2;
  RecordingCommunicator comm2(net2.fc1.weight());
  dist::DataParallel<B> after(comm2, net2.parameters(), {.bucket_bytes = 64, .overlap_with_backward = false});
  backward(net2, 0, 4, 0, DType::F32);
  CHECK(comm2.log.empty());
  after.average_gradients();
  CHECK(comm2.log == std::vector<std::string>{"rs7", "rs16", "ag7", "rs16", "ag16", "rs16", "ag16", "ag16"});
}

TEST_CASE("dist: a second backward in one micro-batch is an error while buckets go out during backward", "[dist]") {
  TinyNet net;
  dist::SingleProcess<B> comm;
  dist::DataParallel<B> sync(comm, net.parameters(), {.bucket_bytes = 64});
  backward(net, 0, 4, 0, DType::F32);
  CHECK_THROWS_MATCHES(backward(net, 4, 8, 0, DType::F32), Error,
                       ErrorContains("was made final twice before the gradients were averaged"));
  CHECK_THROWS_MATCHES(dist::DataParallel<B>(comm, net.parameters()), Error,
                       ErrorContains("'fc1.weight' already has a grad-ready hook"));
}

TEST_CASE("dist: ZeRO with 16-bit weights matches MasterWeights + AdamW bit for bit on one rank", "[dist]") {
  for (DType dtype : {DType::BF16, DType::F16}) {
    std::vector<double> reference;
    {
      TinyNet net;
      amp::MasterWeights<B> masters(net.parameters(), {.model_dtype = dtype});
      optim::AdamW<B> opt(net.parameters(), adamw_options());
      masters.attach(opt);
      for (int s = 0; s < 10; ++s) {
        opt.zero_grad();
        backward(net, 0, kGlobalBatch, s, dtype);
        opt.step();
      }
      reference = weights(net);
    }
    for (int stage : {1, 2}) {
      INFO(name_of(dtype) << " stage " << stage);
      TinyNet net;
      dist::SingleProcess<B> comm;
      dist::ZeroOptimizer<B> zero(comm, net.parameters(),
                                  {.stage = stage, .model_dtype = dtype, .data_parallel = {.bucket_bytes = 40}},
                                  adamw_options());
      for (int s = 0; s < 10; ++s) {
        zero.zero_grad();
        backward(net, 0, kGlobalBatch, s, dtype);
        zero.reduce_gradients();
        zero.step();
      }
      CHECK(weights(net) == reference);
    }
  }
}

TEST_CASE("dist: a parameter list DataParallel cannot use is refused before any hook is set", "[dist]") {
  TinyNet net;
  dist::SingleProcess<B> comm;
  const Var<B> w = net.fc1.weight(), b = net.fc1.bias();
  Tape<B> tape;
  const Var<B> not_a_leaf = tanh(tape.input(Tensor<B>::zeros(Shape{2}, DType::F32)));
  const Var<B> view = Var<B>::parameter(w.value().reshape(Shape{35}).slice(0, 7), "view of fc1.weight");
  CHECK_THROWS_MATCHES(dist::DataParallel<B>(comm, {w, b, w}), Error,
                       ErrorContains("parameters 0 ('fc1.weight') and 2 ('fc1.weight') share values"));
  CHECK_THROWS_MATCHES(dist::DataParallel<B>(comm, {w, view}), Error, ErrorContains("share values"));
  CHECK_THROWS_MATCHES(dist::DataParallel<B>(comm, {w, b, not_a_leaf}), Error,
                       ErrorContains("(parameter 2) is not a parameter"));
  CHECK_THROWS_MATCHES(dist::DataParallel<B>(comm, {w, Var<B>()}), Error,
                       ErrorContains("parameter 1 is an undefined Var"));
  CHECK_THROWS_MATCHES(dist::ZeroOptimizer<B>(comm, {b, b}, {}, adamw_options()), Error, ErrorContains("share values"));
  for (const Var<B>& p : net.parameters()) CHECK_FALSE(p.has_grad_ready_hook());
  // The same parameters are free for a DataParallel that trains them.
  dist::DataParallel<B> sync(comm, net.parameters(), {.bucket_bytes = 64});
  backward(net, 0, 4, 0, DType::F32);
  CHECK(sync.micro_batch_done());
}

TEST_CASE("dist: a gradient of the wrong shape or dtype is refused, and the next average starts afresh", "[dist]") {
  // The plain gradient of one backward: with one rank the average is that gradient.
  std::vector<std::vector<double>> expected;
  {
    TinyNet plain;
    backward(plain, 0, 4, 0, DType::F32);
    for (const auto& p : plain.parameters()) expected.push_back(p.grad().to_host<double>());
  }
  TinyNet net;
  dist::SingleProcess<B> comm;
  dist::DataParallel<B> sync(comm, net.parameters(), {.bucket_bytes = 64});
  const Var<B> bias = net.fc1.bias();
  // Buckets went out during backward (fc2's); then a bad gradient stops the average.
  backward(net, 0, 4, 0, DType::F32);
  bias.set_grad(Tensor<B>::zeros(Shape{2}, DType::F32));
  CHECK_THROWS_MATCHES(sync.average_gradients(), Error,
                       ErrorContains("the gradient of 'fc1.bias' is [2] f32; the parameter is [5] f32"));
  bias.set_grad(Tensor<B>::zeros(Shape{5}, DType::I32));
  CHECK_THROWS_MATCHES(sync.average_gradients(), Error,
                       ErrorContains("must have its parameter's shape and be floating"));
  // The failed averages left nothing armed: a new backward sends its buckets again, and
  // its average is the plain gradient.
  for (const auto& p : net.parameters()) p.zero_grad();
  backward(net, 0, 4, 0, DType::F32);
  sync.average_gradients();
  const auto params = net.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) CHECK(params[i].grad().to_host<double>() == expected[i]);
}

TEST_CASE("dist: ZeroOptimizer checks its settings before it changes the model", "[dist]") {
  TinyNet net;
  const std::vector<double> before = weights(net);
  dist::SingleProcess<B> comm;
  // Bad AdamW options are found after the flat buffer is made, before the parameters
  // become views of it: the model keeps its f32 weights, and no hook is left behind.
  CHECK_THROWS_MATCHES(
      dist::ZeroOptimizer<B>(comm, net.parameters(), {.model_dtype = DType::BF16}, optim::AdamWOptions{.lr = -1.0}),
      Error, ErrorContains("AdamW: lr >= 0"));
  for (const auto& p : net.parameters()) {
    CHECK(p.dtype() == DType::F32);
    CHECK_FALSE(p.has_grad_ready_hook());
  }
  CHECK(weights(net) == before);
  // A weight beyond f16's range would be inf in the f16 model: refused, the model as it was.
  const Tensor<B> w = net.fc2.weight().value();
  const Tensor<B> original = w.clone();
  w.copy_from(Tensor<B>::full(w.shape(), 1e5, DType::F32));
  CHECK_THROWS_MATCHES(dist::ZeroOptimizer<B>(comm, net.parameters(), {.model_dtype = DType::F16}, adamw_options()),
                       Error, ErrorContains("'fc2.weight' holds values beyond f16's largest finite one"));
  CHECK(net.fc2.weight().value().dtype() == DType::F32);
  w.copy_from(original);
  CHECK(weights(net) == before);

  dist::ZeroOptimizer<B> zero(comm, net.parameters(), {.model_dtype = DType::F32}, adamw_options());
  backward(net, 0, 4, 0, DType::F32);
  zero.reduce_gradients();
  for (double bad : {std::nan(""), static_cast<double>(INFINITY)}) {
    CHECK_THROWS_MATCHES(zero.step(bad), Error, ErrorContains("max_grad_norm must be finite"));
    CHECK(weights(net) == before);
  }
  CHECK(zero.step(1e-3));
  CHECK(weights(net) != before);
}

TEST_CASE("dist: bad settings are errors that name them", "[dist]") {
  TinyNet net;
  dist::SingleProcess<B> comm;
  CHECK_THROWS_MATCHES(dist::DataParallel<B>(comm, net.parameters(), {.bucket_bytes = 2}), Error,
                       ErrorContains("bucket_bytes must be at least 4"));
  CHECK_THROWS_MATCHES(dist::DataParallel<B>(comm, net.parameters(), {.buckets_in_flight = 1}), Error,
                       ErrorContains("buckets_in_flight must be at least 2, got 1"));
  CHECK_THROWS_MATCHES(dist::ZeroOptimizer<B>(comm, net.parameters(), {.stage = 3}, adamw_options()), Error,
                       ErrorContains("stage must be 1 or 2, got 3"));
  dist::ZeroOptimizer<B> zero(comm, net.parameters(), {.stage = 2}, adamw_options());
  CHECK_THROWS_MATCHES(zero.step(), Error, ErrorContains("has no reduced gradient; call reduce_gradients()"));
  const auto half = Tensor<B>::zeros(Shape{4}, DType::BF16);
  CHECK_THROWS_MATCHES(comm.all_reduce_sum(half), Error, ErrorContains("sums run on f32 or f64 tensors"));
}

// --- ZeRO-3 (dist::FullyShardedModel) in one process ---------------------------------------

namespace {
/// TinyNet as two ZeRO-3 units on one rank, `steps` AdamW steps of the whole batch in f32.
std::vector<double> train_fully_sharded_one_rank(int steps) {
  TinyNet net;
  dist::SingleProcess<B> one;
  dist::FullyShardedModel<B> model(one, {net.fc1.parameters(), net.fc2.parameters()},
                                   {.model_dtype = DType::F32, .bucket_bytes = 64}, adamw_options());
  for (int s = 0; s < steps; ++s) {
    model.zero_grad();
    Tape<B> tape;
    auto [x, labels] = batch(0, kGlobalBatch, s);
    const Var<B> h = model.forward(
        tape, 0, [&](const Var<B>& in) { return tanh(net.fc1(in)); }, tape.input(x));
    tape.backward(cross_entropy(model.forward(
                                    tape, 1, [&](const Var<B>& in) { return net.fc2(in); }, h),
                                labels));
    model.micro_batch_done();
    model.step();
  }
  return model.full_weights();
}
}  // namespace

TEST_CASE("dist: ZeRO-3 on one rank reproduces single-process AdamW bit for bit (F32)", "[dist]") {
  CHECK(train_fully_sharded_one_rank(5) == train_reference(5));
}

TEST_CASE("dist: ZeRO-3 refuses an autocast dtype other than the model's, an unknown unit and bad options", "[dist]") {
  TinyNet net;
  dist::SingleProcess<B> one;
  CHECK_THROWS_MATCHES(
      (dist::FullyShardedModel<B>(one, {net.fc1.parameters()}, {.prefetch_depth = -1}, adamw_options())), Error,
      ErrorContains("prefetch_depth must be at least 0, got -1"));
  CHECK_THROWS_MATCHES((dist::FullyShardedModel<B>(one, {net.fc1.parameters(), {}}, {}, adamw_options())), Error,
                       ErrorContains("unit 1 has no parameters"));
  dist::FullyShardedModel<B> model(one, {net.fc1.parameters(), net.fc2.parameters()}, {.model_dtype = DType::F32},
                                   adamw_options());
  Tape<B> tape;
  const Var<B> x = tape.input(batch(0, 4, 0).first);
  CHECK_THROWS_MATCHES(model.forward(
                           tape, 2, [&](const Var<B>& in) { return in; }, x),
                       Error, ErrorContains("unit 2 of 2"));
  amp::Autocast bf16(DType::BF16);
  CHECK_THROWS_MATCHES(model.forward(
                           tape, 0, [&](const Var<B>& in) { return net.fc1(in); }, x),
                       Error, ErrorContains("autocast to bf16 over a f32 model"));
}

TEST_CASE("dist: ZeRO-3 frees the f32 copies a norm reads of a unit's 16-bit weights when it releases the unit",
          "[dist]") {
  nn::LayerNorm<B> norm({.dim = 8, .dtype = DType::BF16});
  dist::SingleProcess<B> one;
  dist::FullyShardedModel<B> model(one, {norm.parameters()}, {.model_dtype = DType::BF16}, adamw_options());
  amp::CastCache<B>::instance().clear();
  MemoryStats& memory = B::default_instance().memory();
  const std::int64_t parameters_before = memory.live(MemCategory::Parameter);
  Tape<B> tape;
  amp::Autocast bf16(DType::BF16);
  const Var<B> y = model.forward(
      tape, 0, [&](const Var<B>& in) { return norm(in); }, tape.input(Tensor<B>::full(Shape{4, 8}, 0.5, DType::F32)));
  // An f32 input: LayerNorm reads its bf16 weight and bias in f32, two 8-element f32 copies
  // from the cast cache; the release after the unit's forward must take them along.
  CHECK(memory.live(MemCategory::Parameter) == parameters_before);
  CHECK(model.gathered_live() == 0);
  tape.backward(sum(y));
  CHECK(memory.live(MemCategory::Parameter) == parameters_before);
}
