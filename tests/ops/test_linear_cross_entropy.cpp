// tests/ops/test_linear_cross_entropy.cpp — the output layer and the loss as one op in row
// chunks (NOTE [Linear cross-entropy in row chunks]).
//
// - F64: the loss against plain loops, the gradients of x, w and b against central finite
//   differences, one chunk and several (a last partial one among them);
// - against cross_entropy(linear(...)): bit for bit in one chunk, in F32 and under bf16
//   autocast; within the rounding of the sums over chunks in several;
// - its bytes: it keeps no logits (the unfused pair keeps rows x classes of them), and
//   its backward holds one chunk's logits, not all of them;
// - bad input is an Error naming what is wrong, a bad label the chunk and row it is in.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "gradcheck.hpp"
#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;
using V = Var<B>;
using Vars = std::vector<V>;

namespace {

std::vector<double> class_labels(std::int64_t rows, std::int64_t classes) {
  std::vector<double> labels(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) labels[r] = static_cast<double>((r * 7 + 3) % classes);
  return labels;
}

/// The mean cross-entropy of x w^T + b in plain F64 loops.
double reference_loss(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                      const std::vector<double>& labels, std::int64_t rows, std::int64_t in, std::int64_t classes) {
  double loss = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<double> logits(static_cast<std::size_t>(classes));
    for (std::int64_t c = 0; c < classes; ++c) {
      double s = b[c];
      for (std::int64_t k = 0; k < in; ++k) s += x[r * in + k] * w[c * in + k];
      logits[c] = s;
    }
    const double max = *std::max_element(logits.begin(), logits.end());
    double total = 0.0;
    for (double l : logits) total += std::exp(l - max);
    loss += max + std::log(total) - logits[static_cast<std::size_t>(labels[r])];
  }
  return loss / static_cast<double>(rows);
}

struct Run {
  std::vector<double> values;  // loss, then dx, dw, db
  std::int64_t saved_bytes = 0;
  std::int64_t backward_peak = 0;  // above the live bytes at backward's start
};

/// One step of the fused op (chunk_rows >= 0) or of cross_entropy(linear(...)) (chunk_rows < 0).
Run run(const T& x0, const V& w, const V& b, const T& labels, std::int64_t chunk_rows, bool bf16) {
  auto& memory = B::default_instance().memory();
  std::optional<amp::Autocast> autocast;
  if (bf16) autocast.emplace(DType::BF16);
  Tape<B> tape;
  const V x = tape.input(x0, true);
  const std::int64_t saved_before = memory.live(MemCategory::SavedActivation);
  const V loss = chunk_rows >= 0 ? linear_cross_entropy(x, w, b, labels, {.chunk_rows = chunk_rows})
                                 : cross_entropy(linear(x, w, b), labels);
  Run out;
  out.saved_bytes = memory.live(MemCategory::SavedActivation) - saved_before;
  const std::int64_t live = memory.live_total();
  memory.reset_peak();
  tape.backward(loss);
  out.backward_peak = memory.peak_total() - live;
  out.values = loss.value().to_host<double>();
  for (const V& v : {x, w, b}) {
    const auto g = v.grad().to_host<double>();
    out.values.insert(out.values.end(), g.begin(), g.end());
  }
  w.zero_grad();
  b.zero_grad();
  return out;
}

}  // namespace

TEST_CASE("linear_cross_entropy: F64 loss against loops, gradients against finite differences, in chunks",
          "[ops][grad][loss]") {
  const std::int64_t rows = 10, in = 4, classes = 6;
  const std::int64_t chunk_rows = GENERATE(0, 3, 10);  // one chunk; 3 + 3 + 3 + 1; one chunk again
  INFO("chunk_rows " << chunk_rows);
  const T x = testing::random_tensor(Shape{2, rows / 2, in}, 31, -2, 2);
  const T w = testing::random_tensor(Shape{classes, in}, 32, -2, 2);
  const T b = testing::random_tensor(Shape{classes}, 33);
  const auto labels = class_labels(rows, classes);
  const T label_tensor = testing::int_tensor(Shape{rows}, labels);
  const auto op = [&](Tape<B>&, const Vars& v) {
    return linear_cross_entropy(v[0], v[1], v[2], label_tensor, {.chunk_rows = chunk_rows});
  };
  {
    Tape<B> tape;
    const V loss = op(tape, {tape.input(x, true), tape.input(w, true), tape.input(b, true)});
    CHECK(loss.shape() == Shape{});
    CHECK(loss.dtype() == DType::F64);
    const double want =
        reference_loss(x.to_host<double>(), w.to_host<double>(), b.to_host<double>(), labels, rows, in, classes);
    CHECK(std::abs(loss.value().to_host<double>()[0] - want) <= 1e-12 * (1.0 + std::abs(want)));
  }
  const auto result = testing::check_gradients(op, {x, w, b});
  INFO(result.report());
  CHECK(result.ok);
  CHECK(result.checked == static_cast<std::size_t>(rows * in + classes * in + classes));
}

TEST_CASE("linear_cross_entropy: cross_entropy(linear(...))'s values without its logits' bytes", "[ops][loss][saved]") {
  const std::int64_t rows = 96, in = 24, classes = 40;
  const bool bf16 = GENERATE(false, true);
  INFO("bf16 autocast: " << bf16);
  const T x0 = testing::random_tensor(Shape{rows, in}, 41, -2, 2, DType::F32);
  const V w = V::parameter(testing::random_tensor(Shape{classes, in}, 42, -1, 1, DType::F32));
  const V b = V::parameter(testing::random_tensor(Shape{classes}, 43, -1, 1, DType::F32));
  const T labels = testing::int_tensor(Shape{rows}, class_labels(rows, classes));
  const Run unfused = run(x0, w, b, labels, -1, bf16);

  // One chunk: the same arithmetic, so the same bits.
  const Run whole = run(x0, w, b, labels, 0, bf16);
  CHECK(whole.values == unfused.values);
  // The unfused pair keeps the logits (in the compute dtype: cross_entropy keeps a bf16
  // input as it is); the fused op keeps none. Both keep x, the labels and a log-sum-exp a row.
  INFO("saved bytes: fused " << whole.saved_bytes << ", unfused " << unfused.saved_bytes);
  const std::int64_t element = bf16 ? 2 : 4;
  CHECK(whole.saved_bytes == rows * in * element + rows * 4 + rows * 4);
  CHECK(unfused.saved_bytes - whole.saved_bytes == rows * classes * element);

  // Chunks of 16 rows: only the sums over chunks (the loss, dw and db) round differently.
  const Run chunked = run(x0, w, b, labels, 16, bf16);
  CHECK(chunked.saved_bytes == whole.saved_bytes);
  REQUIRE(chunked.values.size() == unfused.values.size());
  double scale = 0.0;
  for (double v : unfused.values) scale = std::max(scale, std::abs(v));
  for (std::size_t i = 0; i < unfused.values.size(); ++i) {
    INFO("value " << i << " (0: loss, then dx, dw, db)");
    REQUIRE(std::abs(chunked.values[i] - unfused.values[i]) <= 1e-6 * scale);
  }
}

TEST_CASE("linear_cross_entropy: backward holds one chunk's logits, not all of them", "[ops][loss][saved]") {
  const std::int64_t rows = 512, in = 8, classes = 1000, chunk_rows = 32;
  const T x0 = testing::random_tensor(Shape{rows, in}, 51, -1, 1, DType::F32);
  const V w = V::parameter(testing::random_tensor(Shape{classes, in}, 52, -1, 1, DType::F32));
  const V b = V::parameter(testing::random_tensor(Shape{classes}, 53, -1, 1, DType::F32));
  const T labels = testing::int_tensor(Shape{rows}, class_labels(rows, classes));
  const Run unfused = run(x0, w, b, labels, -1, false);
  const Run chunked = run(x0, w, b, labels, chunk_rows, false);
  const std::int64_t logits_bytes = rows * classes * 4;
  INFO("backward peak above the live bytes: chunked " << chunked.backward_peak << ", unfused "
                                                      << unfused.backward_peak);
  CHECK(unfused.backward_peak >= logits_bytes);  // the logits' whole gradient
  // A chunk's logits and their gradient, and the f32 sums of dw and db.
  CHECK(chunked.backward_peak <= 2 * chunk_rows * classes * 4 + rows * in * 4 + 2 * (classes * in + classes) * 4);
  CHECK(chunked.backward_peak < logits_bytes / 4);
}

TEST_CASE("linear_cross_entropy: bad input is an Error naming what is wrong", "[ops][loss][errors]") {
  Tape<B> tape;
  const V x = tape.input(testing::random_tensor(Shape{6, 4}, 61, -1, 1, DType::F32), true);
  const V w = V::parameter(testing::random_tensor(Shape{5, 4}, 62, -1, 1, DType::F32));
  const V b = V::parameter(testing::random_tensor(Shape{5}, 63, -1, 1, DType::F32));
  const T labels = testing::int_tensor(Shape{6}, {0, 1, 2, 3, 4, 0});
  CHECK_THROWS_WITH(linear_cross_entropy(x, V::parameter(testing::random_tensor(Shape{5, 3}, 64)), b, labels),
                    Catch::Contains("does not match weight"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, V::parameter(testing::random_tensor(Shape{4}, 65)), labels),
                    Catch::Contains("bias [4] should be [5]"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, b, testing::int_tensor(Shape{5}, {0, 1, 2, 3, 4})),
                    Catch::Contains("labels must be i32 [6]"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, b, labels, {.chunk_rows = -1}), Catch::Contains("chunk_rows"));
  // A label out of range: the chunk it is in and its row there.
  const T bad = testing::int_tensor(Shape{6}, {0, 1, 2, 3, 7, 0});
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, b, bad, {.chunk_rows = 4}), Catch::Contains("chunk of rows [4, 6)") &&
                                                                               Catch::Contains("label 7 at row 0") &&
                                                                               Catch::Contains("outside [0, 5)"));
  // Nothing was recorded by the failed calls: the tape still differentiates a good one.
  const V loss = linear_cross_entropy(x, w, b, labels);
  tape.backward(loss);
  CHECK(x.grad().defined());
}

TEST_CASE("linear_cross_entropy: chunks of 512 rows unless asked, at most the batch", "[ops][loss]") {
  CHECK(detail::linear_cross_entropy_chunk(100000, {}) == 512);
  CHECK(detail::linear_cross_entropy_chunk(100, {}) == 100);
  CHECK(detail::linear_cross_entropy_chunk(100000, {.chunk_rows = 3}) == 3);
  CHECK(detail::linear_cross_entropy_chunk(2, {.chunk_rows = 3}) == 2);
}
