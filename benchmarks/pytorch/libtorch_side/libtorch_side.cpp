// libtorch_side — the comparison's models written the way a user of PyTorch's C++ API
// (libtorch) would write them: torch:: functions on tensors, torch::optim::SGD, and
// at::autocast's thread-local switches for BF16.
//
// It reads the files trainmem_side --export writes (manifest.json, weights.bin,
// inputs.bin, labels.bin), builds the same model as compare.py's PyTorch side, trains
// `--steps` SGD steps under one configuration and writes <dir>/libtorch_<config>.json
// (loss of every step, step times, peak memory) and libtorch_grads_<config>.bin (every
// parameter gradient after the first step, manifest order), the same fields as
// compare.py's torch_<config>.json, so the report compares them alike:
//   f32   plain F32
//   bf16  CPU autocast to BF16 around the forward; layer_norm, softmax and
//         cross_entropy with autocast off and their inputs cast to F32, as on the
//         PyTorch side (the CUDA autocast lists, which trainmem follows)
// The checkpointing configurations have no libtorch counterpart: torch.utils.checkpoint
// is Python code on top of saved-tensor hooks, with no C++ API.
//
//   libtorch_side --dir DIR/<model> --config f32|bf16 [--threads 2] [--steps 8] [--warmup 2]
//                 [--lr 0.05] [--momentum 0.9]
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <ATen/autocast_mode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

using json = nlohmann::json;
namespace F = torch::nn::functional;

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("libtorch_side: cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

torch::Tensor tensor_from_file(const std::string& path, const std::vector<std::int64_t>& shape, torch::Dtype dtype) {
  std::vector<char> bytes = read_file(path);
  const auto count = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
  const auto element = static_cast<std::int64_t>(torch::elementSize(dtype));
  if (static_cast<std::int64_t>(bytes.size()) != count * element)
    throw std::runtime_error("libtorch_side: " + path + " holds " + std::to_string(bytes.size()) +
                             " bytes, the manifest says " + std::to_string(count * element));
  return torch::from_blob(bytes.data(), shape, dtype).clone();
}

std::int64_t proc_status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  return -1;
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// What `with torch.autocast("cpu", dtype=..., enabled=...)` does on entry and exit: the
/// thread's CPU autocast switch and dtype, and the nesting count whose return to zero
/// drops the cache of casted weights.
class CpuAutocast {
 public:
  explicit CpuAutocast(bool enabled, at::ScalarType dtype = at::kBFloat16)
      : was_enabled_(at::autocast::is_autocast_enabled(at::kCPU)),
        was_dtype_(at::autocast::get_autocast_dtype(at::kCPU)) {
    at::autocast::set_autocast_enabled(at::kCPU, enabled);
    at::autocast::set_autocast_dtype(at::kCPU, dtype);
    at::autocast::increment_nesting();
  }
  ~CpuAutocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCPU, was_dtype_);
  }
  CpuAutocast(const CpuAutocast&) = delete;
  CpuAutocast& operator=(const CpuAutocast&) = delete;

 private:
  bool was_enabled_;
  at::ScalarType was_dtype_;
};

using Block = std::function<torch::Tensor(const torch::Tensor&)>;

/// The model of manifest.json on libtorch: parameters by name, the blocks, the head.
struct Model {
  std::map<std::string, torch::Tensor> params;
  std::vector<std::string> names;  // manifest order
  std::vector<Block> blocks;
  std::function<torch::Tensor(const torch::Tensor&)> logits;
  bool autocast = false;

  torch::Tensor linear(const torch::Tensor& x, const std::string& name) const {
    return torch::linear(x, params.at(name + ".weight"), params.at(name + ".bias"));
  }
  /// An op on the FP32 list: autocast off and the input cast up, when autocast is on.
  torch::Tensor fp32(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& x) const {
    if (!autocast) return fn(x);
    const CpuAutocast off(false);
    return fn(x.to(torch::kFloat));
  }
  torch::Tensor layer_norm(const torch::Tensor& x, const std::string& name) const {
    const torch::Tensor& gamma = params.at(name + ".weight");
    const torch::Tensor& beta = params.at(name + ".bias");
    return fp32([&](const torch::Tensor& t) { return torch::layer_norm(t, {t.size(-1)}, gamma, beta, 1e-5); }, x);
  }
};

void build_mlp(Model& m, const json& sizes) {
  for (std::int64_t i = 0; i < sizes.at("layers").get<std::int64_t>(); ++i) {
    const std::string pre = "block" + std::to_string(i);
    m.blocks.push_back([&m, pre](const torch::Tensor& x) {
      const torch::Tensor h = torch::gelu(m.linear(m.layer_norm(x, pre + ".ln"), pre + ".up"), "tanh");
      return x + m.linear(h, pre + ".down");
    });
  }
  m.logits = [&m](const torch::Tensor& h) { return m.linear(h, "head"); };
}

void build_transformer(Model& m, const json& sizes) {
  const auto batch = sizes.at("batch").get<std::int64_t>(), seq = sizes.at("seq").get<std::int64_t>();
  const auto heads = sizes.at("heads").get<std::int64_t>(), d = sizes.at("dim").get<std::int64_t>();
  const std::int64_t dh = d / heads;
  const torch::Tensor causal = torch::ones({seq, seq}, torch::kBool).triu(1);
  auto split_heads = [=](const torch::Tensor& t) {  // [batch, T, D] -> [batch * H, T, Dh]
    return t.reshape({batch, seq, heads, dh}).transpose(1, 2).reshape({batch * heads, seq, dh});
  };
  for (std::int64_t i = 0; i < sizes.at("layers").get<std::int64_t>(); ++i) {
    const std::string pre = "block" + std::to_string(i);
    auto attention = [&m, pre, split_heads, causal, batch, seq, heads, dh, d](const torch::Tensor& x) {
      const torch::Tensor q = split_heads(m.linear(x, pre + ".attn.q"));
      const torch::Tensor k = split_heads(m.linear(x, pre + ".attn.k"));
      const torch::Tensor v = split_heads(m.linear(x, pre + ".attn.v"));
      const torch::Tensor scores = (torch::bmm(q, k.transpose(1, 2)) * (1.0 / std::sqrt(static_cast<double>(dh))))
                                       .masked_fill(causal, -std::numeric_limits<double>::infinity());
      const torch::Tensor probs = m.fp32([](const torch::Tensor& s) { return torch::softmax(s, -1); }, scores);
      const torch::Tensor o =
          torch::bmm(probs, v).reshape({batch, heads, seq, dh}).transpose(1, 2).reshape({batch, seq, d});
      return m.linear(o, pre + ".attn.out");
    };
    m.blocks.push_back([&m, pre, attention](const torch::Tensor& x) {
      const torch::Tensor h = x + attention(m.layer_norm(x, pre + ".ln1"));
      const torch::Tensor u = torch::gelu(m.linear(m.layer_norm(h, pre + ".ln2"), pre + ".mlp.up"), "tanh");
      return h + m.linear(u, pre + ".mlp.down");
    });
  }
  m.logits = [&m, batch, seq, d](const torch::Tensor& h) { return m.linear(h.reshape({batch * seq, d}), "head"); };
}

std::int64_t tensor_bytes(const torch::Tensor& t) { return t.numel() * static_cast<std::int64_t>(t.element_size()); }

/// Peak tensor bytes of one step by c10's CPU allocator accounting, the way compare.py's
/// profiled_peak takes it: the legacy profiler's allocation records (every allocation and
/// free of tensor storage, in order) replayed on top of the bytes alive before the step.
json profiled_peak(const std::function<void()>& step, std::int64_t live) {
  using namespace torch::autograd::profiler;
  enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU, false, true));
  step();
  const thread_event_lists records = disableProfilerLegacy();
  struct Change {
    double us;
    std::int64_t bytes;
    std::string op;
  };
  std::vector<Change> changes;
  const LegacyEvent* origin = nullptr;
  for (const auto& thread : records)
    if (!thread.empty() && origin == nullptr) origin = &thread.front();
  for (const auto& thread : records) {
    std::vector<std::string> stack;
    for (const LegacyEvent& r : thread) {
      switch (r.kind()) {
        case EventKind::PushRange: stack.emplace_back(r.name()); break;
        case EventKind::PopRange:
          if (!stack.empty()) stack.pop_back();
          break;
        case EventKind::MemoryAlloc:
          changes.push_back({origin->cpuElapsedUs(r), r.cpuMemoryUsage(), stack.empty() ? "-" : stack.back()});
          break;
        default: break;
      }
    }
  }
  std::stable_sort(changes.begin(), changes.end(), [](const Change& a, const Change& b) { return a.us < b.us; });
  std::int64_t running = 0, peak = 0;
  std::string peak_op;
  for (const Change& c : changes) {
    running += c.bytes;
    if (running > peak) {
      peak = running;
      peak_op = c.op;
    }
  }
  return {{"accounting",
           "c10 CPU allocator: every allocation and free of one steady-state step, from the legacy profiler's "
           "records (profile_memory), on top of parameters, momentum buffers and the batch; oneDNN's private "
           "buffers are not seen"},
          {"live_at_start_bytes", live},
          {"peak_total_bytes", live + peak},
          {"net_after_step_bytes", running},
          {"peak_op", peak_op}};
}

std::string arg_value(int& i, int argc, char** argv) {
  if (i + 1 >= argc) throw std::runtime_error(std::string("libtorch_side: ") + argv[i] + " needs a value");
  return argv[++i];
}

}  // namespace

int main(int argc, char** argv) try {
  std::string dir, config = "f32";
  int threads = 2, steps = 8, warmup = 2;
  double lr = 0.05, momentum = 0.9;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir") dir = arg_value(i, argc, argv);
    else if (a == "--config") config = arg_value(i, argc, argv);
    else if (a == "--threads") threads = std::stoi(arg_value(i, argc, argv));
    else if (a == "--steps") steps = std::stoi(arg_value(i, argc, argv));
    else if (a == "--warmup") warmup = std::stoi(arg_value(i, argc, argv));
    else if (a == "--lr") lr = std::stod(arg_value(i, argc, argv));
    else if (a == "--momentum") momentum = std::stod(arg_value(i, argc, argv));
    else throw std::runtime_error("libtorch_side: unknown argument " + a);
  }
  if (dir.empty()) throw std::runtime_error("libtorch_side: --dir is required");
  if (config == "ckpt_full" || config == "ckpt_sqrt")
    throw std::runtime_error("libtorch_side: " + config +
                             " is not expressible: libtorch has no C++ checkpoint API (torch.utils.checkpoint "
                             "is Python)");
  if (config != "f32" && config != "bf16") throw std::runtime_error("libtorch_side: unknown --config " + config);
  if (steps < 1 || warmup < 0) throw std::runtime_error("libtorch_side: --steps must be >= 1, --warmup >= 0");

  torch::set_num_threads(threads);
  const json manifest = json::parse(read_file(dir + "/manifest.json"));
  const json& sizes = manifest.at("sizes");
  std::int64_t weight_count = 0;
  for (const auto& p : manifest.at("params")) {
    const auto shape = p.at("shape").get<std::vector<std::int64_t>>();
    weight_count =
        std::max(weight_count, p.at("offset").get<std::int64_t>() +
                                   std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>()));
  }
  const torch::Tensor weights =
      tensor_from_file(dir + "/" + manifest.at("weights").get<std::string>(), {weight_count}, torch::kFloat);
  Model model;
  model.autocast = config == "bf16";
  for (const auto& p : manifest.at("params")) {
    const auto shape = p.at("shape").get<std::vector<std::int64_t>>();
    const auto offset = p.at("offset").get<std::int64_t>();
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    const std::string name = p.at("name").get<std::string>();
    model.params[name] = weights.narrow(0, offset, n).reshape(shape).clone().requires_grad_(true);
    model.names.push_back(name);
  }
  const torch::Tensor inputs =
      tensor_from_file(dir + "/" + manifest.at("inputs").at("file").get<std::string>(),
                       manifest.at("inputs").at("shape").get<std::vector<std::int64_t>>(), torch::kFloat);
  const torch::Tensor labels =
      tensor_from_file(dir + "/" + manifest.at("labels").at("file").get<std::string>(),
                       manifest.at("labels").at("shape").get<std::vector<std::int64_t>>(), torch::kInt)
          .to(torch::kLong);
  const std::string model_name = manifest.at("model").get<std::string>();
  if (model_name == "mlp") build_mlp(model, sizes);
  else build_transformer(model, sizes);

  std::vector<torch::Tensor> param_list;
  for (const auto& n : model.names) param_list.push_back(model.params.at(n));
  torch::optim::SGD optimizer(param_list, torch::optim::SGDOptions(lr).momentum(momentum));

  auto forward_loss = [&] {
    std::optional<CpuAutocast> autocast;
    if (model.autocast) autocast.emplace(true, at::kBFloat16);
    torch::Tensor h = inputs;
    for (const auto& block : model.blocks) h = block(h);
    return model.fp32([&](const torch::Tensor& z) { return F::cross_entropy(z, labels); }, model.logits(h));
  };

  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  };
  auto cpu_ms = [] { return 1e3 * static_cast<double>(std::clock()) / CLOCKS_PER_SEC; };
  const std::int64_t rss_baseline = proc_status_bytes("VmRSS");
  const bool hwm_reset = reset_peak_rss();
  std::vector<double> losses, step_ms, step_cpu_ms, forward_ms, backward_ms, optimizer_ms;
  for (int step = 0; step < steps; ++step) {
    const double c0 = cpu_ms();
    const auto t0 = clock::now();
    torch::Tensor loss = forward_loss();
    const double t1 = ms_since(t0);
    loss.backward();
    const double t2 = ms_since(t0);
    const double c2 = cpu_ms();
    losses.push_back(loss.item<double>());
    if (step == 0) {  // every gradient after the first step, before the update consumes it
      std::ofstream out(dir + "/libtorch_grads_" + config + ".bin", std::ios::binary);
      for (const auto& n : model.names) {
        const torch::Tensor g = model.params.at(n).grad().detach().to(torch::kFloat).contiguous();
        out.write(static_cast<const char*>(g.data_ptr()), static_cast<std::streamsize>(tensor_bytes(g)));
      }
    }
    const double c3 = cpu_ms();
    const double t3 = ms_since(t0);
    optimizer.step();
    optimizer.zero_grad();
    loss = torch::Tensor();
    const double t4 = ms_since(t0);
    const double c4 = cpu_ms();
    if (step >= warmup) {
      step_cpu_ms.push_back(c2 - c0 + c4 - c3);
      forward_ms.push_back(t1);
      backward_ms.push_back(t2 - t1);
      optimizer_ms.push_back(t4 - t3);
      step_ms.push_back(t2 + (t4 - t3));
    }
  }
  const std::int64_t hwm = proc_status_bytes("VmHWM");

  std::int64_t live = tensor_bytes(inputs) + tensor_bytes(labels);
  for (const auto& p : param_list) live += tensor_bytes(p);
  for (const auto& p : param_list) {
    auto found = optimizer.state().find(p.unsafeGetTensorImpl());
    if (found != optimizer.state().end())
      live += tensor_bytes(static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer());
  }
  const json memory = profiled_peak(
      [&] {
        torch::Tensor loss = forward_loss();
        loss.backward();
        loss = torch::Tensor();
        optimizer.step();
        optimizer.zero_grad();
      },
      live);

  const json result = {
      {"side", "libtorch"},
      {"model", model_name},
      {"config", config},
      {"sizes", sizes},
      {"threads", torch::get_num_threads()},
      {"steps", steps},
      {"warmup", warmup},
      {"lr", lr},
      {"momentum", momentum},
      {"losses", losses},
      {"step_ms", step_ms},
      {"median_step_ms", median(step_ms)},
      {"min_step_ms", step_ms.empty() ? 0.0 : *std::min_element(step_ms.begin(), step_ms.end())},
      {"step_cpu_ms", step_cpu_ms},
      {"median_step_cpu_ms", median(step_cpu_ms)},
      {"median_forward_ms", median(forward_ms)},
      {"median_backward_ms", median(backward_ms)},
      {"median_optimizer_ms", median(optimizer_ms)},
      {"grads_file", "libtorch_grads_" + config + ".bin"},
      {"params", model.names},
      {"memory", memory},
      {"rss", {{"baseline_bytes", rss_baseline}, {"peak_bytes", hwm}, {"peak_reset_at_start", hwm_reset && hwm > 0}}},
      {"build",
       {{"libtorch", TORCH_VERSION},
        {"compiler", __VERSION__},
        {"glibcxx_use_cxx11_abi", _GLIBCXX_USE_CXX11_ABI},
        {"parallel_info", at::get_parallel_info()}}},
  };
  std::ofstream(dir + "/libtorch_" + config + ".json") << result.dump(2) << "\n";
  std::printf(
      "libtorch %s %s: loss %.6f -> %.6f, median step %.2f ms (fwd %.2f bwd %.2f opt %.2f), peak %.1f MiB "
      "(profiler), peak RSS %.1f MiB, %d threads\n",
      model_name.c_str(), config.c_str(), losses.front(), losses.back(), median(step_ms), median(forward_ms),
      median(backward_ms), median(optimizer_ms),
      static_cast<double>(memory.at("peak_total_bytes").get<std::int64_t>()) / (1 << 20),
      static_cast<double>(hwm) / (1 << 20), torch::get_num_threads());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
