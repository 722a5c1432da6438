// op_overhead_libtorch — benchmarks/op_overhead's measurement on PyTorch's C++ API: host
// time per op, forward + backward, on [4, 4] F32 tensors, where the kernels cost nothing
// and what is left is the dispatcher, the autograd node and the allocator.
//
// The same cases, chain and timing as bin/op_overhead: one op applied `--chain` times to
// a leaf x (a [4, 4] weight w, or [4] vectors v, v2 as the other operands), then sum and
// backward; the graph goes with the last reference to its output. Time per op = step time
// / chain, median over `--reps` steps after `--warmup`.
//
//   op_overhead_libtorch [--json PATH] [--chain 64] [--reps 31] [--warmup 3] [--threads 1]
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Op = std::function<torch::Tensor(const torch::Tensor& y, const torch::Tensor& w, const torch::Tensor& v,
                                       const torch::Tensor& v2)>;

torch::Tensor leaf(std::vector<std::int64_t> shape, double value) {
  return torch::full(shape, value, torch::kFloat).requires_grad_(true);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) try {
  std::string json_path;
  int chain = 64, reps = 31, warmup = 3, threads = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw std::runtime_error("op_overhead_libtorch: " + a + " needs a value");
    const std::string value = argv[++i];
    if (a == "--json") json_path = value;
    else if (a == "--chain") chain = std::stoi(value);
    else if (a == "--reps") reps = std::stoi(value);
    else if (a == "--warmup") warmup = std::stoi(value);
    else if (a == "--threads") threads = std::stoi(value);
    else throw std::runtime_error("op_overhead_libtorch: unknown argument " + a);
  }
  if (chain < 1 || reps < 3 || warmup < 1)
    throw std::runtime_error("op_overhead_libtorch: chain >= 1, reps >= 3, warmup >= 1");
  torch::set_num_threads(threads);

  const std::vector<std::pair<std::string, Op>> cases = {
      {"add", [](auto& y, auto& w, auto&, auto&) { return y + w; }},
      {"mul", [](auto& y, auto& w, auto&, auto&) { return y * w; }},
      {"relu", [](auto& y, auto&, auto&, auto&) { return torch::relu(y); }},
      {"gelu", [](auto& y, auto&, auto&, auto&) { return torch::gelu(y, "tanh"); }},
      {"matmul", [](auto& y, auto& w, auto&, auto&) { return torch::matmul(y, w); }},
      {"linear", [](auto& y, auto& w, auto& v, auto&) { return torch::linear(y, w, v); }},
      {"softmax", [](auto& y, auto&, auto&, auto&) { return torch::softmax(y, -1); }},
      {"layer_norm", [](auto& y, auto&, auto& v, auto& v2) { return torch::layer_norm(y, {4}, v, v2, 1e-5); }},
  };
  std::printf(
      "libtorch %s host time per op, forward + backward, [4, 4] F32 tensors, chains of %d ops, median of %d "
      "steps, %d intra-op threads\n\n%-12s %14s %14s\n",
      TORCH_VERSION, chain, reps, threads, "op", "us per op", "best us");
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [name, apply] : cases) {
    std::vector<double> per_op_us;
    for (int r = 0; r < warmup + reps; ++r) {
      const torch::Tensor x = leaf({4, 4}, 0.5), w = leaf({4, 4}, 0.25), v = leaf({4}, 1.0), v2 = leaf({4}, 0.0);
      const auto t0 = std::chrono::steady_clock::now();
      {
        torch::Tensor y = x;
        for (int i = 0; i < chain; ++i) y = apply(y, w, v, v2);
        y.sum().backward();
      }
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (r >= warmup) per_op_us.push_back(us / chain);
    }
    const double med = median(per_op_us), best = *std::min_element(per_op_us.begin(), per_op_us.end());
    std::printf("%-12s %14.3f %14.3f\n", name.c_str(), med, best);
    out.push_back({{"op", name},
                   {"us_per_op_median", med},
                   {"us_per_op_best", best},
                   {"chain", chain},
                   {"reps", reps},
                   {"side", "libtorch"},
                   {"version", TORCH_VERSION}});
  }
  if (!json_path.empty()) {
    std::ofstream file(json_path);
    if (!file) throw std::runtime_error("op_overhead_libtorch: cannot write " + json_path);
    file << out.dump(2) << '\n';
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
