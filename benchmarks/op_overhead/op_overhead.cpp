// benchmarks/op_overhead — host time per op, forward + backward, on tiny tensors.
//
// Each figure is one op applied `--chain` times in a row to a [4, 4] tensor (a
// parameter or a constant as its second operand), then sum, backward and Tape::clear:
// one training step's worth of bookkeeping with kernels that take nanoseconds. Time per
// op = step time / chain length, median over `--reps` steps after a warm-up (which also
// fills the allocator's per-size cache, as a training loop's first step does). What is
// measured is the library's per-op cost: the op entry (validation, autocast lookup), the
// node and its saved tensors, the allocations and the backward walk.
//
// The same measurement on libtorch C++ (benchmarks/pytorch/libtorch_side/
// op_overhead_libtorch.cpp) and PyTorch eager (op_overhead_torch.py here); ./run in this
// folder runs all three and writes them into one table (results/op_overhead.md).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common/provenance.hpp"
#include "common/stats.hpp"
#include "common/timing.hpp"
#include "trainmem/trainmem.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using Var = tmem::Var<B>;
using Tensor = tmem::Tensor<B>;

namespace {

Tensor tiny(tmem::Shape shape, double value) {
  const auto count = static_cast<std::size_t>(shape.numel());
  return Tensor::from_host(std::move(shape), std::vector<float>(count, static_cast<float>(value)), tmem::DType::F32,
                           tmem::MemCategory::Parameter);
}

struct OpCase {
  std::string name;
  // y -> op(y), with the tape's leaves w (a [4, 4] weight), v and v2 ([4] vectors) available.
  std::function<Var(const Var& y, const Var& w, const Var& v, const Var& v2)> apply;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trainmem host time per op (forward + backward) on tiny tensors"};
  std::string json_path, only;
  int chain = 64, reps = 31, warmup = 3;
  app.add_option("--json", json_path, "write the results (provenance and rows) to this file");
  app.add_option("--chain", chain, "ops per measured step")->check(CLI::Range(1, 100000));
  app.add_option("--reps", reps, "measured steps (median reported)")->check(CLI::Range(3, 100000));
  app.add_option("--op", only, "measure only this op (for profiling)");
  app.add_option("--warmup", warmup, "unmeasured steps first")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  const benchmarks::Provenance provenance = benchmarks::provenance(argc, argv, tmem::num_threads());
  if (!json_path.empty()) benchmarks::check_writable(json_path, provenance);

  const std::vector<OpCase> cases = {
      {"add", [](const Var& y, const Var& w, const Var&, const Var&) { return tmem::add(y, w); }},
      {"mul", [](const Var& y, const Var& w, const Var&, const Var&) { return tmem::mul(y, w); }},
      {"relu", [](const Var& y, const Var&, const Var&, const Var&) { return tmem::relu(y); }},
      {"gelu", [](const Var& y, const Var&, const Var&, const Var&) { return tmem::gelu(y); }},
      {"matmul", [](const Var& y, const Var& w, const Var&, const Var&) { return tmem::matmul(y, w); }},
      {"linear", [](const Var& y, const Var& w, const Var& v, const Var&) { return tmem::linear(y, w, v); }},
      {"softmax", [](const Var& y, const Var&, const Var&, const Var&) { return tmem::softmax(y); }},
      {"layer_norm", [](const Var& y, const Var&, const Var& v, const Var& v2) { return tmem::layer_norm(y, v, v2); }},
  };

  std::printf("%s", provenance.text().c_str());
  std::printf(
      "trainmem host time per op, forward + backward, [4, 4] F32 tensors, chains of %d ops, "
      "median of %d steps\n\n%-12s %14s %14s\n",
      chain, reps, "op", "us per op", "best us");
  nlohmann::json out = {{"benchmark", "op_overhead"},
                        {"provenance", nlohmann::json::parse(provenance.json())},
                        {"rows", nlohmann::json::array()}};
  for (const auto& op : cases) {
    if (!only.empty() && op.name != only) continue;
    std::vector<double> per_op_us;
    for (int r = 0; r < warmup + reps; ++r) {
      tmem::Tape<B> tape;
      const Var x = tape.input(tiny(tmem::Shape{4, 4}, 0.5), true, "x");
      const Var w = tape.input(tiny(tmem::Shape{4, 4}, 0.25), true, "w");
      const Var v = tape.input(tiny(tmem::Shape{4}, 1.0), true, "v");
      const Var v2 = tape.input(tiny(tmem::Shape{4}, 0.0), true, "v2");
      const benchmarks::Stopwatch watch;
      Var y = x;
      for (int i = 0; i < chain; ++i) y = op.apply(y, w, v, v2);
      tape.backward(tmem::sum(y));
      tape.clear();
      const double us = watch.us();
      if (r >= warmup) per_op_us.push_back(us / chain);
    }
    const double med = benchmarks::median(per_op_us), best = *std::min_element(per_op_us.begin(), per_op_us.end());
    std::printf("%-12s %14.3f %14.3f\n", op.name.c_str(), med, best);
    out["rows"].push_back({{"op", op.name},
                           {"us_per_op_median", med},
                           {"us_per_op_best", best},
                           {"chain", chain},
                           {"reps", reps},
                           {"side", "trainmem"}});
  }
  std::printf(
      "\n(per op: forward, its node and saved tensors, and its share of backward; the sum at the end\n"
      "and the tape's clear are included, 1/%d of a step each)\n",
      chain);
  if (!json_path.empty()) {
    std::ofstream file(json_path);
    if (!file) {
      std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
      return 1;
    }
    file << out.dump(2) << '\n';
  }
  return 0;
}
