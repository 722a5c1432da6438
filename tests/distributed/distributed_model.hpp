// tests/distributed/distributed_model.hpp — a tiny classifier trained by one process or by N ranks.
//
// The data-parallel tests compare N ranks, each on its slice of a global batch, with
// one process on the whole batch (the independent reference: no communicator at all).
// 7-5-3 with the second layer unbiased: Ψ = 55 parameters, divisible by neither 2 nor 3.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainmem/distributed/data_parallel.hpp"
#include "trainmem/distributed/zero.hpp"
#include "trainmem/trainmem.hpp"

namespace dist_test {

using namespace trainmem;
using B = cpu::Backend;

inline constexpr std::int64_t kFeatures = 7, kHidden = 5, kClasses = 3, kGlobalBatch = 12;

struct TinyNet {
  explicit TinyNet(DType dtype = DType::F32)
      : init(7), fc1(kFeatures, kHidden, init, true, dtype, "fc1"), fc2(kHidden, kClasses, init, false, dtype, "fc2") {}
  std::vector<Var<B>> parameters() const {
    std::vector<Var<B>> ps = fc1.parameters();
    for (const auto& p : fc2.parameters()) ps.push_back(p);
    return ps;
  }
  nn::Init init;
  nn::Linear<B> fc1, fc2;
};

/// Rows [begin, end) of the global batch: features and labels from closed-form formulas.
inline std::pair<Tensor<B>, Tensor<B>> batch(std::int64_t begin, std::int64_t end, int step) {
  std::vector<double> x, y;
  for (std::int64_t r = begin; r < end; ++r) {
    for (std::int64_t c = 0; c < kFeatures; ++c)
      x.push_back(0.5 * std::sin(0.7 * static_cast<double>(r * kFeatures + c) + 0.3 * step));
    y.push_back(static_cast<double>((r + step) % kClasses));
  }
  return {Tensor<B>::from_host(Shape{end - begin, kFeatures}, x),
          Tensor<B>::from_host(Shape{end - begin}, y, DType::I32)};
}

/// Backward of the mean cross-entropy over rows [begin, end), scaled by the scaler if
/// given; `poison` puts an inf into the first feature (a bad sample: every gradient non-finite).
inline void backward(const TinyNet& net, std::int64_t begin, std::int64_t end, int step, DType autocast,
                     amp::GradScaler<B>* scaler = nullptr, bool poison = false) {
  Tape<B> tape;
  auto [x, labels] = batch(begin, end, step);
  if (poison) {
    std::vector<double> values = x.to_host<double>();
    values[0] = INFINITY;
    x = Tensor<B>::from_host(x.shape(), values);
  }
  Var<B> loss;
  {
    std::unique_ptr<amp::Autocast> guard;
    if (autocast != DType::F32) guard = std::make_unique<amp::Autocast>(autocast);
    loss = cross_entropy(net.fc2(tanh(net.fc1(tape.input(x)))), labels);
  }
  tape.backward(scaler ? scaler->scale(loss) : loss);
}

/// As backward() in f32, but the input is changed in place after the forward: fc1's
/// backward finds its saved input changed and throws, after fc2's gradient was made (a
/// backward that fails part way, marking the gradients it reached Var::grad_incomplete).
inline void failed_backward(const TinyNet& net, std::int64_t begin, std::int64_t end, int step) {
  Tape<B> tape;
  auto [x, labels] = batch(begin, end, step);
  const Var<B> loss = cross_entropy(net.fc2(tanh(net.fc1(tape.input(x)))), labels);
  x.copy_from(batch(begin, end, step + 1).first);
  bool failed = false;
  try {
    tape.backward(loss);
  } catch (const Error&) {
    failed = true;
  }
  trainmem::detail::check(failed, "failed_backward: the backward with a changed saved input did not fail");
}

/// Every weight of the net, in parameter order, widened to f64.
inline std::vector<double> weights(const TinyNet& net) {
  std::vector<double> out;
  for (const auto& p : net.parameters())
    for (double v : p.value().to_host<double>()) out.push_back(v);
  return out;
}

inline optim::AdamWOptions adamw_options() { return {.lr = 1e-2, .weight_decay = 1e-2}; }

/// One process, whole global batch, plain AdamW in f32: the reference.
inline std::vector<double> train_reference(int steps) {
  TinyNet net;
  optim::AdamW<B> opt(net.parameters(), adamw_options());
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    backward(net, 0, kGlobalBatch, s, DType::F32);
    opt.step();
  }
  return weights(net);
}

/// This rank's slice of the global batch, in `micro` micro-batches per step; stage 0 is
/// DataParallel + AdamW, 1 and 2 ZeroOptimizer. f32 throughout. `overlap`: buckets are
/// sent during backward, or only after it. Step `fail_at` is first tried with the last
/// rank's last backward failing part way: every rank must refuse that step, weights
/// unchanged, then zero_grad and run it again.
inline std::vector<double> train_ranks(dist::Communicator<B>& comm, int stage, int steps, std::int64_t bucket_bytes,
                                       int micro = 1, bool overlap = true, int fail_at = -1) {
  TinyNet net;
  const std::int64_t rows = kGlobalBatch / comm.size(), first = comm.rank() * rows;
  const dist::DataParallelOptions dp{
      .bucket_bytes = bucket_bytes, .accumulation_steps = micro, .overlap_with_backward = overlap};
  const auto local = [&](int s, bool fail, auto&& done) {
    for (int m = 0; m < micro; ++m) {
      const std::int64_t b = first + m * rows / micro, e = first + (m + 1) * rows / micro;
      if (fail && m == micro - 1 && comm.rank() == comm.size() - 1) failed_backward(net, b, e, s);
      else backward(net, b, e, s, DType::F32);
      done();
    }
  };
  const auto refused = [&](auto&& step) {
    const std::vector<double> before = weights(net);
    std::string message = "no error";
    try {
      step();
    } catch (const Error& e) {
      message = e.what();
    }
    trainmem::detail::check(message.find("failed part way") != std::string::npos && weights(net) == before, "rank ",
                            comm.rank(), ": the step after a failed backward was not refused (", message, ")");
  };
  // The same steps for both: `optimizer` steps and zeroes, `micro_batch_done` reduces.
  const auto train = [&](auto& optimizer, const auto& micro_batch_done) {
    for (int s = 0; s < steps; ++s) {
      if (s == fail_at) {
        optimizer.zero_grad();
        local(s, true, micro_batch_done);
        refused([&] { optimizer.step(); });
      }
      optimizer.zero_grad();
      local(s, false, micro_batch_done);
      optimizer.step();
    }
  };
  if (stage == 0) {
    dist::DataParallel<B> sync(comm, net.parameters(), dp);
    optim::AdamW<B> opt(net.parameters(), adamw_options());
    train(opt, [&] { sync.micro_batch_done(); });
  } else {
    dist::ZeroOptimizer<B> zero(comm, net.parameters(),
                                {.stage = stage, .model_dtype = DType::F32, .data_parallel = dp}, adamw_options());
    train(zero, [&] { zero.micro_batch_done(); });
  }
  return weights(net);
}

}  // namespace dist_test
