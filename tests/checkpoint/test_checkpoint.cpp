// Checkpoint regions: recompute reproduces the forward bit for bit, saves what the
// closed form says, and fails loudly when it cannot reproduce it.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "checkpoint_schedule.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;

namespace {

std::vector<float> wave(std::size_t n, double phase) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + phase));
  return v;
}

/// A residual MLP chain: x + L2(gelu(L1(ln(x)))) per block, dropout optional.
struct Chain {
  Chain(int blocks, std::int64_t dim, std::int64_t hidden, float dropout_p, B& backend = B::default_instance())
      : p(dropout_p) {
    nn::Init init(11);
    for (int i = 0; i < blocks; ++i) {
      up.emplace_back(dim, hidden, init);
      down.emplace_back(hidden, dim, init);
      norm.emplace_back(dim);
    }
    (void)backend;
    for (int i = 0; i < blocks; ++i)
      layers.push_back([this, i](const Var<B>& x) { return add(x, dropout(down[i](gelu(up[i](norm[i](x)))), p)); });
  }
  std::vector<Var<B>> parameters() const {
    std::vector<Var<B>> ps;
    for (std::size_t i = 0; i < up.size(); ++i) {
      for (auto& v : up[i].parameters()) ps.push_back(v);
      for (auto& v : down[i].parameters()) ps.push_back(v);
      for (auto& v : norm[i].parameters()) ps.push_back(v);
    }
    return ps;
  }
  float p;
  std::vector<nn::Linear<B>> up, down;
  std::vector<nn::LayerNorm<B>> norm;
  std::vector<Layer<B>> layers;
};

using testing::each_block;
using testing::run_plain;
using testing::Schedule;

/// Gradients of every parameter and of the input, as raw floats, after one backward.
std::vector<std::vector<float>> gradients(Chain& chain, const Schedule& schedule, std::int64_t batch,
                                          std::int64_t dim) {
  for (auto& p : chain.parameters()) p.zero_grad();
  Tape<B> tape;
  tape.manual_seed(1234);
  auto x = tape.input(T::from_host({batch, dim}, wave(static_cast<std::size_t>(batch * dim), 0.1)), true, "x");
  auto loss = mean(schedule(tape, chain.layers, x));
  tape.backward(loss);
  std::vector<std::vector<float>> grads{x.grad().to_host(), loss.value().to_host()};
  for (auto& p : chain.parameters()) grads.push_back(p.grad().to_host());
  return grads;
}

}  // namespace

TEST_CASE("every schedule gives gradients bitwise identical to the plain run (MLP chain, dropout on)", "[checkpoint]") {
  Chain chain(9, 8, 16, 0.25f);
  const auto reference = gradients(chain, run_plain, 4, 8);
  CheckpointOptions selective;
  selective.policy = policy::save_matmuls();
  CheckpointOptions predicate;
  predicate.policy =
      policy::save_if([](OpKind kind, std::size_t bytes, double) { return kind == OpKind::Norm && bytes > 100; });
  const std::vector<std::pair<const char*, Schedule>> schedules = {
      {"every block", each_block()},
      {"sqrt(N) segments", [](Tape<B>& t, const auto& l, const Var<B>& x) { return checkpoint_sequential(t, l, x); }},
      {"every 2", [](Tape<B>& t, const auto& l, const Var<B>& x) { return checkpoint_sequential(t, l, 5, x); }},
      {"one segment",
       [](Tape<B>& t, const auto& l, const Var<B>& x) {
         return checkpoint(
             t, [&](const Var<B>& h) { return run_plain(t, l, h); }, x);
       }},
      {"selective", each_block(selective)},
      {"predicate", each_block(predicate)},
      {"checksum-checked", each_block(CheckpointOptions{policy::recompute_all(), DeterminismCheck::Checksum})},
      {"bitwise-checked", each_block(CheckpointOptions{policy::recompute_all(), DeterminismCheck::Bitwise})},
      {"nested",
       [](Tape<B>& t, const auto& l, const Var<B>& x) {
         return checkpoint(
             t,
             [&](const Var<B>& h) {
               Var<B> y = h;
               for (const auto& layer : l) y = checkpoint(t, layer, y);
               return y;
             },
             x);
       }},
  };
  for (const auto& [name, schedule] : schedules) {
    INFO("schedule: " << name);
    const auto before = checkpoint_stats().recomputes;
    CHECK(gradients(chain, schedule, 4, 8) == reference);
    CHECK(checkpoint_stats().recomputes > before);
  }
}

TEST_CASE("transformer blocks with dropout: checkpointed gradients are bitwise identical", "[checkpoint]") {
  nn::Init init(5);
  std::vector<nn::TransformerBlock<B>> blocks;
  for (int i = 0; i < 3; ++i) blocks.emplace_back(8, 2, 16, init, 0.2f);
  std::vector<Layer<B>> layers;
  for (auto& b : blocks) layers.push_back([&b](const Var<B>& x) { return b(x); });
  auto grads = [&](const Schedule& schedule) {
    for (auto& b : blocks)
      for (auto& p : b.parameters()) p.zero_grad();
    Tape<B> tape;
    tape.manual_seed(99);
    auto x = tape.input(T::from_host({2, 5, 8}, wave(80, 0.3)), true);
    tape.backward(mean(schedule(tape, layers, x)));
    std::vector<std::vector<float>> g{x.grad().to_host()};
    for (auto& b : blocks)
      for (auto& p : b.parameters()) g.push_back(p.grad().to_host());
    return g;
  };
  const auto reference = grads(run_plain);
  CheckpointOptions selective;
  selective.policy = policy::save_matmuls();
  CHECK(grads(each_block()) == reference);
  CHECK(grads(each_block(selective)) == reference);
  CHECK(grads([](Tape<B>& t, const auto& l, const Var<B>& x) { return checkpoint_sequential(t, l, 2, x); }) ==
        reference);
}

TEST_CASE("a region under bf16 autocast recomputes in bf16 even when backward runs outside the guard",
          "[checkpoint][amp]") {
  Chain chain(4, 8, 16, 0.1f);
  auto run = [&](bool use_checkpoint) {
    for (auto& p : chain.parameters()) p.zero_grad();
    Tape<B> tape;
    tape.manual_seed(7);
    auto x = tape.input(T::from_host({4, 8}, wave(32, 0.2)), true);
    Var<B> loss;
    {
      amp::Autocast guard(DType::BF16);
      Var<B> h = x;
      for (const auto& layer : chain.layers) h = use_checkpoint ? checkpoint(tape, layer, h) : layer(h);
      loss = mean(h);
    }
    tape.backward(loss);  // outside the guard: recompute must restore bf16 itself
    std::vector<std::vector<float>> g{x.grad().to_host()};
    for (auto& p : chain.parameters()) g.push_back(p.grad().to_host());
    return g;
  };
  CHECK(run(true) == run(false));
}

TEST_CASE("saved-activation bytes match the closed form for plain, every-block and sqrt(N) schedules",
          "[checkpoint][memory]") {
  // Per block, in f32 with no dropout, backward keeps: layer_norm's x [b,d], mean [b], rstd [b];
  // L1's input [b,d]; gelu's input [b,h]; L2's input [b,h]. A = 4 b (2d + 2h + 2).
  constexpr std::int64_t b = 4, d = 8, h = 16;
  constexpr std::int64_t block_bytes = 4 * b * (2 * d + 2 * h + 2);
  constexpr std::int64_t boundary_bytes = 4 * b * d;  // a segment's kept input
  auto peak_saved = [&](int n, const Schedule& schedule) {
    B backend;
    Chain chain(n, d, h, 0.0f);
    Tape<B> tape(backend);
    auto x = tape.input(T::from_host({b, d}, wave(b * d, 0.5), DType::F32, MemCategory::Temporary, backend));
    // Parameters live on the default backend; only activations are counted on `backend`.
    auto y = schedule(tape, chain.layers, x);
    auto loss = sum(y);
    const auto forward_peak = backend.memory().peak(MemCategory::SavedActivation);
    tape.backward(loss);
    return std::pair{forward_peak, backend.memory().peak(MemCategory::SavedActivation)};
  };
  SECTION("plain: N A") {
    const auto [fwd, all] = peak_saved(9, run_plain);
    CHECK(fwd == 9 * block_bytes);
    CHECK(all == 9 * block_bytes);
  }
  SECTION("every block: N boundaries in forward, plus one block's recompute in backward") {
    const auto [fwd, all] = peak_saved(9, each_block());
    CHECK(fwd == 9 * boundary_bytes);
    CHECK(all == 8 * boundary_bytes + block_bytes);
  }
  SECTION("sqrt(N) = 3 segments of 3: (k-1) boundaries + the last segment") {
    const auto [fwd, all] =
        peak_saved(9, [](Tape<B>& t, const auto& l, const Var<B>& x) { return checkpoint_sequential(t, l, x); });
    CHECK(fwd == 2 * boundary_bytes + 3 * block_bytes);
    CHECK(all == 2 * boundary_bytes + 3 * block_bytes);
  }
  SECTION("selective keeps L1's output; L2's output is released when the region ends") {
    CheckpointOptions selective;
    selective.policy = policy::save_matmuls();
    const auto [fwd, all] = peak_saved(9, each_block(selective));
    // Kept per block: its input and L1's output [b,h] (gelu's input). L2's output [b,d] is
    // kept while its region runs, then released: recompute stops at L2's saved input, and
    // nothing saves L2's output. So one [b,d] is transiently on top.
    CHECK(fwd == 9 * (boundary_bytes + 4 * b * h) + 4 * b * d);
    // Backward recomputes one block's layer_norm output, statistics and gelu output.
    CHECK(all == 9 * (boundary_bytes + 4 * b * h) + 4 * b * (d + 2 + h));
  }
}

TEST_CASE("OFFLOAD on the CPU keeps the tensors as SAVE does, a budget turns PREFER_SAVE into recompute",
          "[checkpoint][policy]") {
  Chain chain(3, 8, 16, 0.0f);
  const auto reference = gradients(chain, run_plain, 4, 8);
  CheckpointOptions offload;
  offload.policy = policy::offload_matmuls();
  CHECK(gradients(chain, each_block(offload), 4, 8) == reference);

  CheckpointOptions everything;
  everything.policy = policy::save_if([](OpKind, std::size_t, double) { return true; });
  CheckpointOptions budgeted = everything;
  budgeted.memory_budget = 0;
  auto kept = [&](const CheckpointOptions& o) {
    B backend;
    Tape<B> tape(backend);
    auto x = tape.input(T::from_host({4, 8}, wave(32, 0.5), DType::F32, MemCategory::Temporary, backend));
    auto y = each_block(o)(tape, chain.layers, x);
    return backend.memory().live(MemCategory::SavedActivation);
  };
  CHECK(kept(budgeted) == 3 * 4 * 4 * 8);  // only the three block inputs
  CHECK(kept(everything) > kept(budgeted));
}

TEST_CASE("checkpoint_name with save_names keeps the named tensor and skips its producer in recompute",
          "[checkpoint][policy]") {
  nn::Init init(3);
  nn::Linear<B> up(8, 16, init), down(16, 8, init);
  auto block = [&](const Var<B>& x) { return down(relu(checkpoint_name(up(x), "up_out"))); };
  auto grads = [&](bool use_checkpoint) {
    for (auto& p : up.parameters()) p.zero_grad();
    for (auto& p : down.parameters()) p.zero_grad();
    Tape<B> tape;
    auto x = tape.input(T::from_host({4, 8}, wave(32, 0.9)), true);
    CheckpointOptions named;
    named.policy = policy::save_names({"up_out"});
    auto y = use_checkpoint ? checkpoint(tape, named, block, x) : block(x);
    tape.backward(sum(y));
    return std::vector<std::vector<float>>{x.grad().to_host(), up.weight().grad().to_host(),
                                           down.weight().grad().to_host()};
  };
  const auto reference = grads(false);
  const auto reused_before = checkpoint_stats().ops_reused;
  CHECK(grads(true) == reference);
  CHECK(checkpoint_stats().ops_reused == reused_before + 1);  // `up` was not recomputed
}

TEST_CASE("retain_graph lets a checkpointed graph run backward twice, without it the second throws",
          "[checkpoint][errors]") {
  Chain chain(2, 8, 16, 0.0f);
  auto once = gradients(chain, each_block(), 4, 8);
  for (auto& p : chain.parameters()) p.zero_grad();
  Tape<B> tape;
  tape.manual_seed(1234);
  auto x = tape.input(T::from_host({4, 8}, wave(32, 0.1)), true, "x");
  auto loss = mean(each_block()(tape, chain.layers, x));
  tape.backward(loss, {}, true);
  tape.backward(loss, {}, false);
  auto twice = x.grad().to_host();
  for (std::size_t i = 0; i < twice.size(); ++i) CHECK(twice[i] == Approx(2.0f * once[0][i]));
  REQUIRE_THROWS_WITH(tape.backward(loss),
                      Catch::Contains("freed by an earlier backward") && Catch::Contains("retain_graph"));
}

TEST_CASE("a region input modified in place before backward is detected", "[checkpoint][errors]") {
  Chain chain(2, 8, 16, 0.0f);
  Tape<B> tape;
  auto x = tape.input(T::from_host({4, 8}, wave(32, 0.1)), true, "x");
  auto loss = mean(each_block()(tape, chain.layers, x));
  x.value().copy_from(T::from_host({4, 8}, wave(32, 0.7)));
  REQUIRE_THROWS_AS(tape.backward(loss), Error);
  try {
    Tape<B> again;
    auto x2 = again.input(T::from_host({4, 8}, wave(32, 0.1)), true, "x");
    auto loss2 = mean(each_block()(again, chain.layers, x2));
    x2.value().copy_from(T::from_host({4, 8}, wave(32, 0.7)));
    again.backward(loss2);
    FAIL("no error");
  } catch (const Error& e) {
    WARN("message: " << e.what());
    CHECK_THAT(e.what(), Catch::Contains("checkpoint (region input)") && Catch::Contains("modified in place"));
  }
}

TEST_CASE("a recompute that differs from its forward throws CheckpointError naming the op", "[checkpoint][errors]") {
  nn::Init init(2);
  nn::Linear<B> layer(8, 8, init);
  SECTION("a different shape") {
    int calls = 0;
    auto fickle = [&](const Var<B>& x) {
      ++calls;
      return relu(calls == 1 ? layer(x) : layer(reshape(x, Shape{2, 2, 8})));
    };
    Tape<B> tape;
    auto x = tape.input(T::from_host({4, 8}, wave(32, 0.1)), true);
    auto loss = sum(checkpoint(tape, fickle, x));
    try {
      tape.backward(loss);
      FAIL("no error");
    } catch (const CheckpointError& e) {
      WARN("message: " << e.what());
      CHECK_THAT(e.what(), Catch::Contains("not deterministic") && Catch::Contains("linear") &&
                               Catch::Contains("[4, 8]") && Catch::Contains("[2, 2, 8]"));
    }
  }
  SECTION("a different op") {
    int calls = 0;
    auto fickle = [&](const Var<B>& x) { return ++calls == 1 ? relu(layer(x)) : sigmoid(layer(x)); };
    Tape<B> tape;
    auto x = tape.input(T::from_host({4, 8}, wave(32, 0.1)), true);
    auto loss = sum(checkpoint(tape, fickle, x));
    REQUIRE_THROWS_AS(tape.backward(loss), CheckpointError);
  }
  SECTION("different values: caught by the fingerprint (default), checksum and bitwise checks, not by metadata") {
    for (auto mode : {DeterminismCheck::Fingerprint, DeterminismCheck::Checksum, DeterminismCheck::Bitwise}) {
      int calls = 0;
      auto fickle = [&](const Var<B>& x) { return relu(layer(scale(x, ++calls == 1 ? 1.0 : 1.5))); };
      Tape<B> tape;
      auto x = tape.input(T::from_host({4, 8}, wave(32, 0.1)), true);
      auto loss = sum(checkpoint(tape, CheckpointOptions{policy::recompute_all(), mode}, fickle, x));
      try {
        tape.backward(loss);
        FAIL("no error");
      } catch (const CheckpointError& e) {
        WARN("message: " << e.what());
        CHECK_THAT(e.what(), Catch::Contains("values of saved tensor"));
      }
    }
    int calls = 0;
    auto fickle = [&](const Var<B>& x) { return relu(layer(scale(x, ++calls == 1 ? 1.0 : 1.5))); };
    Tape<B> tape;
    auto x = tape.input(T::from_host({4, 8}, wave(32, 0.1)), true);
    CheckpointOptions metadata_only;
    metadata_only.determinism = DeterminismCheck::Metadata;
    auto loss = sum(checkpoint(tape, metadata_only, fickle, x));
    CHECK_NOTHROW(tape.backward(loss));  // metadata alone cannot see a value change
  }
}

TEST_CASE("the default check catches a region that captures the current block by reference", "[checkpoint][errors]") {
  // NOTE [Capture by value]: every region's fn reads `current` when it recomputes, and by
  // then it points at the last block. Same shapes everywhere, so only values can tell.
  nn::Init init(3);
  std::vector<nn::Linear<B>> blocks;
  for (int i = 0; i < 3; ++i) blocks.emplace_back(8, 8, init);
  const auto run = [&](bool by_value) {
    Tape<B> tape;
    auto h = tape.input(T::from_host({4, 8}, wave(32, 0.1)), true);
    nn::Linear<B>* current = nullptr;
    for (auto& block : blocks) {
      current = &block;
      if (by_value)
        h = checkpoint(
            tape, [layer = current](const Var<B>& x) { return relu((*layer)(x)); }, h);
      else
        h = checkpoint(
            tape, [&](const Var<B>& x) { return relu((*current)(x)); }, h);
    }
    tape.backward(sum(h));
  };
  try {
    run(false);
    FAIL("no error");
  } catch (const CheckpointError& e) {
    WARN("message: " << e.what());
    CHECK_THAT(e.what(), Catch::Contains("values of saved tensor") && Catch::Contains("fingerprint") &&
                             Catch::Contains("captures by reference"));
  }
  CHECK_NOTHROW(run(true));
}

TEST_CASE("a fingerprint is order-free integer arithmetic over the bytes: a closed form", "[checkpoint][errors]") {
  // 12 bytes: word 0 is bytes 0..7, word 1 is bytes 8..11 zero-padded, each mixed with its index.
  B& be = B::default_instance();
  const std::vector<double> values = {1.0, -2.0, 0.5};  // f32: 3f80 0000, c000 0000, 3f00 0000
  const T t = T::from_host({3}, values, DType::F32);
  const std::uint64_t word0 = 0xC00000003F800000ull, word1 = 0x3F000000ull;
  const std::uint64_t expected = detail::fingerprint_term(word0, 0) + detail::fingerprint_term(word1, 1);
  CHECK(be.fingerprint(t) == expected);
  // splitmix64's finaliser of 0 ^ 0 is 0, and of golden ^ golden too: the mix itself is pinned.
  CHECK(detail::fingerprint_term(0, 0) == 0);
  CHECK(detail::fingerprint_term(0x9E3779B97F4A7C15ull, 1) == 0);
  CHECK(detail::fingerprint_term(1, 0) == 0x5692161D100B05E5ull);
  // Swapping two words changes it.
  const T swapped = T::from_host({3}, std::vector<double>{-2.0, 1.0, 0.5}, DType::F32);
  CHECK(be.fingerprint(swapped) != be.fingerprint(t));
  // A large tensor contributes every word, the loop split over threads: here 2^18 + 1
  // whole words and 4 bytes of a last one.
  const std::vector<float> wide = wave((1 << 19) + 3, 0.01);
  const T big = T::from_host({(1 << 19) + 3}, wide, DType::F32);
  std::uint64_t all = 0;
  for (std::uint64_t j = 0; 2 * j < wide.size(); ++j) {
    std::uint64_t word = 0;
    std::memcpy(&word, wide.data() + 2 * j, 2 * j + 1 < wide.size() ? 8 : 4);
    all += detail::fingerprint_term(word, j);
  }
  CHECK(be.fingerprint(big) == all);
}

TEST_CASE("without early stop, a recompute that saves more or fewer tensors is caught", "[checkpoint][errors]") {
  nn::Init init(2);
  nn::Linear<B> layer(8, 8, init);
  CheckpointOptions full;
  full.early_stop = false;
  int calls = 0;
  auto longer = [&](const Var<B>& x) {
    auto y = relu(layer(x));
    return ++calls == 1 ? y : sigmoid(y);  // the recompute adds a save at the end
  };
  Tape<B> tape;
  auto x = tape.input(T::from_host({4, 8}, wave(32, 0.1)), true);
  auto loss = sum(checkpoint(tape, full, longer, x));
  try {
    tape.backward(loss);
    FAIL("no error");
  } catch (const CheckpointError& e) {
    WARN("message: " << e.what());
    CHECK_THAT(e.what(), Catch::Contains("sigmoid") && Catch::Contains("forward saved only"));
  }
}

TEST_CASE("a recompute that needs only feed_forward's z ends before GELU and the second linear", "[checkpoint]") {
  // The region's one placeholder is z [rows, hidden] (x and the weights are alive anyway).
  // A full recompute allocates z, h = gelu(z) and y [rows, dim]; one that stops at z's
  // save allocates z alone. Backward's own allocations are the same in both runs.
  const std::int64_t rows = 6, dim = 8, hidden = 20;
  nn::Init init(5);
  nn::Mlp<B> mlp(dim, hidden, init);
  auto run = [&](bool early_stop) {
    CheckpointOptions options;
    options.early_stop = early_stop;
    B backend;
    Tape<B> tape(backend);
    auto x =
        tape.input(T::from_host({rows, dim}, wave(rows * dim, 0.3), DType::F32, MemCategory::Temporary, backend), true);
    auto loss = sum(checkpoint(
        tape, options, [&](const Var<B>& in) { return mlp(in); }, x));
    backend.memory().record_timeline(true);
    tape.backward(loss);
    std::int64_t allocated = 0;
    for (const auto& e : backend.memory().timeline())
      if (e.event == MemoryStats::Event::Allocate) allocated += e.bytes;
    std::vector<std::vector<float>> grads{x.grad().to_host()};
    for (auto& p : mlp.parameters()) {
      grads.push_back(p.grad().to_host());
      p.zero_grad();  // the gradient lives on this run's backend
    }
    return std::pair{allocated, grads};
  };
  const auto [full_bytes, full_grads] = run(false);
  const auto [early_bytes, early_grads] = run(true);
  CHECK(full_bytes - early_bytes == 4 * (rows * hidden + rows * dim));
  CHECK(early_grads == full_grads);
}

TEST_CASE("a selective region over x + mlp(ln(x)) keeps z, not the feed_forward output beside it",
          "[checkpoint][policy]") {
  // save_matmuls keeps feed_forward's outputs {y, z}. Backward saved z (so it stays); the
  // recompute stops at ln's output, feed_forward's input, so nothing would reuse y.
  const std::int64_t rows = 6, dim = 8, hidden = 20;
  nn::Init init(9);
  nn::LayerNorm<B> ln(dim);
  nn::Mlp<B> mlp(dim, hidden, init);
  auto block = [&](const Var<B>& x) { return add(x, mlp(ln(x))); };
  auto run = [&](bool selective) {
    CheckpointOptions options;
    options.policy = policy::save_matmuls();
    B backend;
    Tape<B> tape(backend);
    auto x =
        tape.input(T::from_host({rows, dim}, wave(rows * dim, 0.7), DType::F32, MemCategory::Temporary, backend), true);
    auto loss = sum(selective ? checkpoint(tape, options, block, x) : block(x));
    const std::int64_t kept = backend.memory().live(MemCategory::SavedActivation);
    tape.backward(loss);
    std::vector<std::vector<float>> grads{x.grad().to_host()};
    for (auto* m : std::initializer_list<const nn::Module<B>*>{&ln, &mlp})
      for (auto& p : m->parameters()) {
        grads.push_back(p.grad().to_host());
        p.zero_grad();  // the gradient lives on this run's backend
      }
    return std::pair{kept, grads};
  };
  const auto [plain_kept, plain_grads] = run(false);
  const auto [kept, grads] = run(true);
  CHECK(kept == 4 * (rows * dim + rows * hidden));  // the region's input and z
  CHECK(grads == plain_grads);
  CHECK(plain_kept > kept);
}

TEST_CASE("a region may return several outputs", "[checkpoint]") {
  nn::Init init(4);
  nn::Linear<B> a(8, 8, init), b(8, 8, init);
  auto grads = [&](bool use_checkpoint) {
    for (auto* l : {&a, &b})
      for (auto& p : l->parameters()) p.zero_grad();
    Tape<B> tape;
    auto x = tape.input(T::from_host({4, 8}, wave(32, 0.4)), true);
    auto body = [&](const Var<B>& v) { return std::vector<Var<B>>{tanh(a(v)), sigmoid(b(v))}; };
    auto outs = use_checkpoint ? checkpoint(tape, body, x) : body(x);
    tape.backward(sum(mul(outs[0], outs[1])));
    return std::vector<std::vector<float>>{x.grad().to_host(), a.weight().grad().to_host(),
                                           b.weight().grad().to_host()};
  };
  CHECK(grads(true) == grads(false));
}

TEST_CASE("checkpoint under no_grad just runs the function", "[checkpoint]") {
  nn::Init init(2);
  nn::Linear<B> layer(8, 8, init);
  Tape<B> tape;
  auto x = tape.input(T::from_host({4, 8}, wave(32, 0.1)));
  NoGradGuard no_grad;
  const auto regions = checkpoint_stats().regions;
  auto y = checkpoint(
      tape, [&](const Var<B>& v) { return layer(v); }, x);
  CHECK(checkpoint_stats().regions == regions);
  CHECK(tape.size() == 0);
  CHECK(y.value().to_host() == layer(x).value().to_host());
}

TEST_CASE("a region whose fn throws leaves no save hook on the tape", "[checkpoint][errors]") {
  nn::Init init(5);
  nn::Linear<B> layer(8, 8, init);
  Tape<B> tape;
  auto x = tape.input(T::from_host({4, 8}, wave(32, 0.2)), true);
  auto failing = [&](const Var<B>& v) -> Var<B> {
    (void)layer(v);
    throw Error("fn failed");
  };
  REQUIRE_THROWS_WITH(checkpoint(tape, failing, x), "fn failed");
  CHECK(tape.hook() == nullptr);
  auto y = layer(x);  // records on the tape, saves directly
  tape.backward(sum(y));
  CHECK(x.grad().defined());
}

TEST_CASE("an empty policy function is refused when the region opens, before fn runs", "[checkpoint][errors]") {
  nn::Init init(5);
  nn::Linear<B> layer(8, 8, init);
  Tape<B> tape;
  auto x = tape.input(T::from_host({4, 8}, wave(32, 0.2)), true);
  int calls = 0;
  auto fn = [&](const Var<B>& v) {
    ++calls;
    return layer(v);
  };
  const auto regions = checkpoint_stats().regions;
  CHECK_THROWS_WITH(checkpoint(tape, CheckpointOptions{.policy = Policy{}}, fn, x),
                    Catch::Contains("the region's policy is an empty function"));
  CHECK(calls == 0);
  CHECK(checkpoint_stats().regions == regions);
  CHECK(tape.hook() == nullptr);
  CHECK_THROWS_WITH(policy::save_if(nullptr), Catch::Contains("policy::save_if: the predicate is an empty function"));
  CHECK_THROWS_WITH(policy::prefer(policy::save_matmuls(), Policy{}),
                    Catch::Contains("policy::prefer: the second policy is an empty function"));
}

TEST_CASE("checkpoint_name on an earlier region's output keeps it without skipping the naming region's ops",
          "[checkpoint][policy]") {
  nn::Init init(6);
  nn::Linear<B> first(8, 8, init), up(8, 16, init), down(16, 8, init);
  auto produce = [&](const Var<B>& x) { return tanh(first(x)); };
  auto consume = [&](const Var<B>& h) { return down(relu(up(checkpoint_name(h, "h")))); };
  CheckpointOptions named;
  named.policy = policy::save_names({"h"});
  auto grads = [&](bool use_checkpoint) {
    for (auto* l : {&first, &up, &down})
      for (auto& p : l->parameters()) p.zero_grad();
    Tape<B> tape;
    auto x = tape.input(T::from_host({4, 8}, wave(32, 0.6)), true);
    auto h = use_checkpoint ? checkpoint(tape, named, produce, x) : produce(x);
    auto y = use_checkpoint ? checkpoint(tape, named, consume, h) : consume(h);
    tape.backward(sum(y));
    return std::vector<std::vector<float>>{x.grad().to_host(), first.weight().grad().to_host(),
                                           up.weight().grad().to_host(), down.weight().grad().to_host()};
  };
  const auto reference = grads(false);
  const auto reused_before = checkpoint_stats().ops_reused;
  CHECK(grads(true) == reference);
  CHECK(checkpoint_stats().ops_reused == reused_before);  // `h` was made outside the naming region: no op skipped
}

TEST_CASE("checkpoint_sequential owns its segments' layers: a temporary list is safe through backward",
          "[checkpoint][sequential]") {
  const Var<B> w = Var<B>::parameter(T::from_host(Shape{3, 3}, wave(9, 0.1)), "w");
  const Var<B> layer_w = w;
  const Layer<B> layer = [layer_w](const Var<B>& h) { return relu(matmul(h, layer_w)); };
  const auto input = T::from_host(Shape{2, 3}, wave(6, 0.4));
  const auto grad_of_w = [&](bool checkpointed) {
    w.zero_grad();
    Tape<B> tape;
    const Var<B> x = tape.input(input);
    // The list is a temporary: it is gone when backward replays the first segment.
    const Var<B> y = checkpointed
                         ? checkpoint_sequential<B>(tape, std::vector<Layer<B>>{layer, layer, layer, layer}, 2, x)
                         : layer(layer(layer(layer(x))));
    tape.backward(sum(y));
    return w.grad().to_host<float>();
  };
  CHECK(grad_of_w(true) == grad_of_w(false));
}

TEST_CASE("a bf16 parameter passed to a region as an input recomputes as it ran: the plain step's gradients",
          "[checkpoint][amp]") {
  const Var<B> p = Var<B>::parameter(T::from_host(Shape{2, 3}, wave(6, 0.2), DType::BF16), "p");
  const auto input = T::from_host(Shape{2, 3}, wave(6, 0.9));
  const auto fn = [](const Var<B>& a, const Var<B>& w) {
    const Var<B> m = mul(a, w);
    return mul(m, m);
  };
  const auto grads = [&](bool checkpointed) {
    p.zero_grad();
    Tape<B> tape;
    const Var<B> x = tape.input(input, true);
    const Var<B> y = checkpointed ? checkpoint(tape, fn, x, p) : fn(x, p);
    tape.backward(sum(y));
    return std::pair{x.grad().to_host<float>(), p.grad().to_host<float>()};
  };
  CHECK(grads(true) == grads(false));
}
