// tests/backend/cuda/test_cuda_step.cu — what a training step on the GPU must not do: wait, poison, wedge, round twice.
//
// Each case names the defect it guards against (issue 12). The host-wait cases use two
// independent witnesses: the backend's own count (host_syncs()) and a gate kernel that
// holds the stream until the host opens it, so any wait the host makes while the step is
// queued, counted or not (a pageable copy, an implicit synchronisation), stalls on the
// gate until its safety timeout and is seen. Values are checked against closed forms:
// integer GEMM inputs whose FP32 sums are exact, so "rounded once" is a bit-exact claim.
#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "cuda_test_support.cuh"

namespace {

namespace tmem = trainmem;
using namespace trainmem::cuda_testing;
using tmem::DType;
using tmem::Shape;
using TensorG = tmem::Tensor<Gpu>;

__device__ unsigned long long global_nanoseconds() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Spins until the host writes 1 to *open (mapped pinned memory) or `limit_ns` pass;
/// writes 1 to *timed_out in the second case.
__global__ void gate_kernel(const volatile int* open, int* timed_out, unsigned long long limit_ns) {
  const unsigned long long start = global_nanoseconds();
  while (*open == 0) {
    if (global_nanoseconds() - start > limit_ns) {
      *timed_out = 1;
      return;
    }
  }
}

/// \brief A gate on a stream: work queued after close() waits until open() (or 20 s).
class Gate {
 public:
  Gate() {
    TRAINMEM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&flags_), 2 * sizeof(int), cudaHostAllocMapped));
    flags_[0] = flags_[1] = 0;
    TRAINMEM_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flags_), flags_, 0));
  }
  ~Gate() { cudaFreeHost(flags_); }
  void close(cudaStream_t stream) {
    flags_[0] = flags_[1] = 0;
    gate_kernel<<<1, 1, 0, stream>>>(device_flags_, device_flags_ + 1, 20'000'000'000ull);
    TRAINMEM_CUDA_CHECK(cudaGetLastError());
  }
  void open() { reinterpret_cast<volatile int*>(flags_)[0] = 1; }
  /// Whether the gate gave up waiting: the host waited for the stream while it was closed.
  bool timed_out() const { return reinterpret_cast<volatile int*>(flags_)[1] != 0; }

 private:
  int* flags_ = nullptr;
  int* device_flags_ = nullptr;
};

std::vector<std::uint16_t> bits_of(const TensorG& t) {
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(t.numel()));
  t.backend().download(bits.data(), t.data(), t.bytes());
  return bits;
}

}  // namespace

// Defect 1: the host launcher called the device-only narrow and compiled to exit(1).
TEST_CASE("cuda step: causal_mask runs in every dtype (its launcher once compiled to exit)", "[cuda][defect1]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  const std::int64_t batch = 2, t = 7;
  std::vector<double> values(static_cast<std::size_t>(batch * t * t));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i % 13) - 6.0;
  for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    INFO("dtype " << dtype_name(dtype));
    tmem::Tape<Gpu> tape;
    auto x = tape.input(TensorG::from_host(Shape{batch, t, t}, values, dtype), false);
    const auto y = tmem::causal_mask(x).value().to_host<double>();
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = 0; i < t; ++i)
        for (std::int64_t j = 0; j < t; ++j) {
          const std::size_t at = static_cast<std::size_t>((b * t + i) * t + j);
          if (j > i) CHECK(std::isinf(y[at]));
          else CHECK(y[at] == values[at]);
        }
  }
}

// Defect 2: a NotReady event query was left as the last error and failed the next launch.
TEST_CASE("cuda step: offload and ready() while copies are in flight do not fail the next launch",
          "[cuda][defect2][offload]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu gpu;
  Gate gate;
  std::vector<double> values(1 << 20);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i % 1000);
  auto first = TensorG::from_host(Shape{1 << 20}, values, DType::F32, tmem::MemCategory::SavedActivation, gpu);
  gate.close(gpu.stream());  // the copies below wait behind the gate, so their events stay not ready
  auto copy1 = gpu.offload(first);
  CHECK_FALSE(copy1.ready());
  auto copy2 = gpu.offload(first);  // reclaim() polls copy1's pending entry: not ready
  CHECK_FALSE(copy2.ready());
  auto doubled = TensorG::empty(Shape{1 << 20}, DType::F32, tmem::MemCategory::Temporary, gpu);
  CHECK_NOTHROW(gpu.map(tmem::math::Scale{2.0}, first, doubled));  // a checked launch
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  gate.open();
  gpu.synchronize();
  CHECK_FALSE(gate.timed_out());
  CHECK(copy1.ready());
  auto back = gpu.fetch(copy2).to_host<double>();
  CHECK(back == values);
  const auto twice = doubled.to_host<double>();
  CHECK(twice[999] == 2.0 * 999.0);
}

// Defect 3: a throw inside offload() left a HostCopy with no event queued in the engine.
TEST_CASE("cuda step: a failed offload leaves the backend usable", "[cuda][defect3][offload]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu gpu;
  auto t = TensorG::from_host(Shape{1000}, std::vector<double>(1000, 3.0), DType::F32,
                              tmem::MemCategory::SavedActivation, gpu);
  // A free of a host address fails inside a noexcept path; the allocator keeps the error
  // and raises it at its next allocation, here the pinned buffer of the offload.
  int not_device_memory = 0;
  gpu.deallocate(&not_device_memory, 0, tmem::MemCategory::Temporary);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  REQUIRE_THROWS_AS(gpu.offload(t), tmem::Error);
  CHECK(gpu.offloads_pending() == 0);
  CHECK(gpu.memory().live(tmem::MemCategory::HostOffload) == 0);
  CHECK_NOTHROW(gpu.synchronize());
  auto copy = gpu.offload(t);
  CHECK(gpu.fetch(copy).to_host<double>() == std::vector<double>(1000, 3.0));
  CHECK_NOTHROW(gpu.synchronize());
}

// Defect 4: a label or id outside its range is raised at the next host wait, not by a wait of its own.
TEST_CASE("cuda step: bad labels and ids are raised at the next host wait", "[cuda][defect4]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  gpu.synchronize();
  tmem::Tape<Gpu> tape(gpu);
  auto logits = tape.input(TensorG::from_host(Shape{3, 5}, std::vector<double>(15, 0.5), DType::F32), true);
  auto bad = TensorG::from_host(Shape{3}, std::vector<double>{1, 7, 2}, DType::I32);
  const auto syncs = gpu.host_syncs();
  auto loss = tmem::cross_entropy(logits, bad);
  CHECK(gpu.host_syncs() == syncs);  // the op queues; it does not wait
  REQUIRE_THROWS_WITH(loss.value().to_host<double>(), Catch::Contains("label 7 at row 1 is outside [0, 5)"));
  auto good = TensorG::from_host(Shape{3}, std::vector<double>{1, 4, 0}, DType::I32);
  CHECK(tmem::cross_entropy(logits, good).value().to_host<double>()[0] == Approx(std::log(5.0)));

  tmem::nn::Init init(5);
  tmem::nn::Embedding<Gpu> table(50, 8, init);
  auto ids = tape.input(TensorG::from_host(Shape{4}, std::vector<double>{3, 0, 55, 49}, DType::I32));
  const auto before_lookup = gpu.host_syncs();
  auto rows = table(ids);
  CHECK(gpu.host_syncs() == before_lookup);  // the ids are not downloaded to be checked
  REQUIRE_THROWS_WITH(gpu.synchronize(), Catch::Contains("id 55 at position 2 is outside [0, 50)"));
  CHECK_NOTHROW(gpu.synchronize());  // raised once, then cleared
}

// Issue 55, case 12: an update that pushed an f16 master past 65504 wrote inf into the model
// copy and reported success. The pass counts such elements on the device; the error comes
// at the next host wait, as the label check's does, and the step is taken in full.
TEST_CASE("cuda step: a model copy an update made inf is raised at the next host wait", "[cuda][amp][overflow]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  gpu.synchronize();
  auto w = tmem::Var<Gpu>::parameter(TensorG::from_host(Shape{4}, std::vector<double>{65000, 1, -65000, 2}, DType::F32,
                                                        tmem::MemCategory::Parameter, gpu),
                                     "big");
  tmem::amp::MasterWeights<Gpu> masters({w}, {.model_dtype = DType::F16});
  tmem::optim::SGD<Gpu> sgd({w}, tmem::optim::SgdOptions{1.0});
  masters.attach(sgd);
  auto grad = [&](std::vector<double> g) {
    w.set_grad(TensorG::from_host(Shape{4}, g, DType::F32, tmem::MemCategory::Gradient, gpu));
  };
  grad({-1000, 0.25, 1000, 0});  // masters 66000, 0.75, -66000, 2
  CHECK_NOTHROW(sgd.step());     // queued: counted on the device, not waited for
  REQUIRE_THROWS_WITH(gpu.synchronize(),
                      Catch::Contains("'big': 2 element(s)") && Catch::Contains("f16 copy overflowed to inf"));
  CHECK_NOTHROW(gpu.synchronize());  // raised once, then cleared
  CHECK(masters.master(0).to_host<double>() == std::vector<double>{66000, 0.75, -66000, 2});
  grad({2000, 0, -2000, 0});  // back to 64000 and -64000: finite in f16
  sgd.step();
  CHECK(w.value().to_host<double>() == std::vector<double>{64000, 0.75, -64000, 2});
}

// Defect 4: the unscale kernel rewrote every gradient even when dividing by 1.
TEST_CASE("cuda step: unscale by 1 leaves gradient bits untouched, NaN payloads included", "[cuda][defect4][amp]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  // f16 bits: 1.5, -0, a quiet NaN with a payload, a signalling NaN, +inf.
  const std::vector<std::uint16_t> bits{0x3e00, 0x8000, 0x7e5a, 0x7c01, 0x7c00};
  auto grad = TensorG::empty(Shape{5}, DType::F16, tmem::MemCategory::Gradient, gpu);
  gpu.upload(grad.data(), bits.data(), bits.size() * sizeof(std::uint16_t));
  auto one = TensorG::from_host(Shape{}, std::vector<double>{1.0}, DType::F32);
  auto found_inf = TensorG::zeros(Shape{}, DType::F32);
  const std::vector<TensorG> grads{grad};
  gpu.unscale_grads(grads, one, found_inf);
  CHECK(bits_of(grad) == bits);
  CHECK(found_inf.to_host<double>()[0] == 1.0);
}

// Defect 4: linear added the bias after the GEMM had rounded to 16 bits (two roundings).
TEST_CASE("cuda step: linear adds the bias before the one rounding to 16 bits", "[cuda][defect4][gemm]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  // Integer inputs: every FP32 partial sum is exact, so the only rounding is the final one,
  // and the result must be the FP64 value rounded once, bit for bit.
  const std::int64_t rows = 32, in = 64, out = 24;
  std::vector<double> x(static_cast<std::size_t>(rows * in)), w(static_cast<std::size_t>(out * in)), b(out);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(static_cast<int>(i * 7 % 9) - 4);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<double>(static_cast<int>(i * 5 % 9) - 4);
  for (std::int64_t j = 0; j < out; ++j) b[j] = 0.3125 + 0.0078125 * static_cast<double>(j);  // bf16 values
  for (DType dtype : {DType::BF16, DType::F16}) {
    INFO("dtype " << dtype_name(dtype));
    tmem::Tape<Gpu> tape;
    auto xv = tape.input(TensorG::from_host(Shape{rows, in}, x, dtype), false);
    auto wv = tape.input(TensorG::from_host(Shape{out, in}, w, dtype), false);
    auto bv = tape.input(TensorG::from_host(Shape{out}, b, dtype), false);
    const auto y = tmem::linear(xv, wv, bv).value().to_host<double>();
    std::size_t mismatches = 0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < out; ++j) {
        double exact = b[j];
        for (std::int64_t k = 0; k < in; ++k) exact += x[r * in + k] * w[j * in + k];
        mismatches += y[r * out + j] != rounded_to({exact}, dtype)[0];
      }
    CHECK(mismatches == 0);
  }
}

// Defect 6: a bias that is a view may start off cuBLASLt's 16-byte alignment.
TEST_CASE("cuda step: gemm_bias with a bias view off a 16-byte boundary, and with k = 0", "[cuda][defect6][gemm]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  const std::int64_t m = 8, n = 13, k = 16;
  std::vector<double> a(m * k, 1.0), bmat(k * n, 2.0), biases(2 * n);
  for (std::int64_t i = 0; i < 2 * n; ++i) biases[i] = static_cast<double>(i);
  auto ta = TensorG::from_host(Shape{m, k}, a, DType::BF16);
  auto tb = TensorG::from_host(Shape{k, n}, bmat, DType::BF16);
  auto both = TensorG::from_host(Shape{2, n}, biases, DType::BF16);
  auto bias = both.slice(1, 2).reshape(Shape{n});  // starts 26 bytes in
  REQUIRE(reinterpret_cast<std::uintptr_t>(bias.data()) % 16 != 0);
  tmem::GemmArgs args;
  args.m = m;
  args.n = n;
  args.k = k;
  auto c = TensorG::empty(Shape{m, n}, DType::BF16);
  gpu.gemm_bias(args, ta, tb, bias, c, false);
  const auto y = c.to_host<double>();
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t j = 0; j < n; ++j) CHECK(y[r * n + j] == 2.0 * k + static_cast<double>(n + j));
  // k = 0: no products, C = bias.
  args.k = 0;
  auto c0 = TensorG::empty(Shape{m, n}, DType::BF16);
  gpu.gemm_bias(args, ta, tb, bias, c0, false);
  const auto y0 = c0.to_host<double>();
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t j = 0; j < n; ++j) CHECK(y0[r * n + j] == static_cast<double>(n + j));
}

// Defect 4: the step synchronised (cross_entropy, the embedding id check, upload, the seed).
TEST_CASE("cuda step: a steady-state mixed-precision training step makes no host wait", "[cuda][defect4][step][gate]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  const std::int64_t vocab = 97, dim = 64, batch = 2, t = 16;
  tmem::nn::Init init(12);
  tmem::nn::Embedding<Gpu> embed(vocab, dim, init, 0.02);
  tmem::nn::TransformerBlock<Gpu> block(dim, 4, 4 * dim, init, 0.1f);
  tmem::nn::Linear<Gpu> head(dim, vocab, init);
  std::vector<tmem::Var<Gpu>> params = embed.parameters();
  for (auto& p : block.parameters()) params.push_back(p);
  for (auto& p : head.parameters()) params.push_back(p);
  tmem::optim::AdamW<Gpu> optimizer(params, tmem::optim::AdamWOptions{1e-3});
  tmem::amp::GradScaler<Gpu> scaler(DType::F16, tmem::amp::GradScalerOptions{});
  std::vector<double> id_values(batch * t), label_values(batch * t);
  for (std::int64_t i = 0; i < batch * t; ++i) {
    id_values[i] = static_cast<double>(i * 31 % vocab);
    label_values[i] = static_cast<double>((i * 31 + 1) % vocab);
  }
  const auto ids = TensorG::from_host(Shape{batch * t}, id_values, DType::I32);
  const auto labels = TensorG::from_host(Shape{batch * t}, label_values, DType::I32);
  std::optional<tmem::Var<Gpu>> last_loss;
  auto step = [&] {
    tmem::Tape<Gpu> tape(gpu);
    optimizer.zero_grad();
    tmem::amp::Autocast autocast(DType::F16);
    auto h = tmem::reshape(embed(tape.input(ids)), Shape{batch, t, dim});
    h = tmem::checkpoint(
        tape, [&](auto x) { return block(x); }, h);
    auto logits = tmem::reshape(head(h), Shape{batch * t, vocab});
    auto loss = tmem::cross_entropy(logits, labels);
    tape.backward(scaler.scale(loss));
    scaler.step_async(optimizer);
    scaler.update();
    last_loss = loss;
  };
  for (int warmup = 0; warmup < 3; ++warmup) step();
  gpu.synchronize();
  Gate gate;
  gate.close(gpu.stream());
  const auto syncs = gpu.host_syncs();
  step();
  CHECK(gpu.host_syncs() == syncs);
  gate.open();
  gpu.synchronize();
  CHECK_FALSE(gate.timed_out());
  CHECK(std::isfinite(last_loss->value().to_host<double>()[0]));
}

// Defect 6: the device was set only in the constructor.
TEST_CASE("cuda step: a backend on device 1 launches there while device 0 is current", "[cuda][defect6]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  if (tmem::cuda::device_count() < 2) {
    WARN("one CUDA device: the two-device case needs two, not run");
    return;
  }
  Gpu second(1);
  TRAINMEM_CUDA_CHECK(cudaSetDevice(0));
  auto x =
      TensorG::from_host(Shape{1000}, std::vector<double>(1000, 1.5), DType::F32, tmem::MemCategory::Temporary, second);
  auto y = TensorG::empty(Shape{1000}, DType::F32, tmem::MemCategory::Temporary, second);
  TRAINMEM_CUDA_CHECK(cudaSetDevice(0));
  second.map(tmem::math::Scale{2.0}, x, y);
  CHECK(y.to_host<double>() == std::vector<double>(1000, 3.0));
  cudaPointerAttributes attributes{};
  TRAINMEM_CUDA_CHECK(cudaPointerGetAttributes(&attributes, y.data()));
  CHECK(attributes.device == 1);
}

// Untested before: index arithmetic past 2^31 elements, and grids that loop over several waves.
TEST_CASE("cuda step: causal_mask and map past 2^31 elements, sums over many waves", "[cuda][large]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  const std::int64_t batch = 513, t = 2048, n = batch * t * t;  // 2^31 + 2^22 elements, 4.3 GB in bf16
  REQUIRE(n > (std::int64_t{1} << 31));
  {
    auto x = TensorG::empty(Shape{batch, t, t}, DType::BF16);
    gpu.fill(x, 1.0);
    tmem::Tape<Gpu> tape;
    const auto y = tmem::causal_mask(tape.input(x)).value();
    auto at = [&](std::int64_t b, std::int64_t i, std::int64_t j) {
      std::uint16_t bits = 0;
      gpu.download(&bits, static_cast<const std::uint16_t*>(y.data()) + (b * t + i) * t + j, sizeof bits);
      return bits;
    };
    const std::uint16_t one = 0x3f80, minus_inf = 0xff80;
    CHECK(at(batch - 1, t - 1, t - 1) == one);
    CHECK(at(batch - 1, t - 1, 0) == one);
    CHECK(at(batch - 1, t - 2, t - 1) == minus_inf);
    CHECK(at(batch - 1, 0, 1) == minus_inf);
    CHECK(at(0, 0, 0) == one);
  }
  // A map and a sum over 5 M elements: several grid-stride waves (blocks are capped at 32 per SM).
  const std::int64_t m = 5'000'011;
  auto ones = TensorG::empty(Shape{m}, DType::F32);
  gpu.fill(ones, 1.0);
  auto twos = TensorG::empty(Shape{m}, DType::F32);
  gpu.map(tmem::math::Scale{2.0}, ones, twos);
  auto total = TensorG::empty(Shape{}, DType::F64);
  gpu.sum_all(twos, total);
  CHECK(total.to_host<double>()[0] == 2.0 * static_cast<double>(m));
}

// Untested before: NaN inputs must give NaN in exactly the rows the CPU backend gives it.
TEST_CASE("cuda step: NaN inputs to softmax, layer norm and cross-entropy poison the rows the CPU's do",
          "[cuda][nan]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> x{0.5, nan, -1.0, 2.0, 0.25, -0.5, 1.0, 0.0, 3.0, -2.0, 1.5, 0.75};  // [3, 4]; NaN in row 0
  auto run = [&]<class B>(B& backend) {
    tmem::Tape<B> tape(backend);
    auto v = tape.input(tmem::Tensor<B>::from_host(Shape{3, 4}, x, DType::F32, tmem::MemCategory::Temporary, backend));
    auto gamma = tape.input(tmem::Tensor<B>::from_host(Shape{4}, std::vector<double>(4, 1.0), DType::F32,
                                                       tmem::MemCategory::Temporary, backend));
    auto beta = tape.input(tmem::Tensor<B>::zeros(Shape{4}, DType::F32, tmem::MemCategory::Temporary, backend));
    auto labels = tmem::Tensor<B>::from_host(Shape{3}, std::vector<double>{0, 2, 3}, DType::I32,
                                             tmem::MemCategory::Temporary, backend);
    std::vector<std::vector<double>> out;
    out.push_back(tmem::softmax(v).value().template to_host<double>());
    out.push_back(tmem::layer_norm(v, gamma, beta, 1e-5).value().template to_host<double>());
    out.push_back(tmem::cross_entropy(v, labels).value().template to_host<double>());
    return out;
  };
  const auto want = run(Cpu::default_instance());
  const auto got = run(Gpu::default_instance());
  for (std::size_t k = 0; k < want.size(); ++k) {
    INFO("result " << k << " (softmax, layer_norm, cross_entropy)");
    REQUIRE(got[k].size() == want[k].size());
    for (std::size_t i = 0; i < want[k].size(); ++i) {
      CHECK(std::isnan(got[k][i]) == std::isnan(want[k][i]));
      if (!std::isnan(want[k][i])) CHECK(got[k][i] == Approx(want[k][i]).epsilon(1e-5).margin(1e-6));
    }
  }
}

// Untested before: the syncing GradScaler::step, hysteresis and the scale floor through the scaler.
TEST_CASE("cuda step: GradScaler::step returns whether it stepped, hysteresis and min_scale hold", "[cuda][amp]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  tmem::nn::Init init(3);
  tmem::nn::Linear<Gpu> fc(16, 8, init);
  tmem::optim::SGD<Gpu> optimizer(fc.parameters(), tmem::optim::SgdOptions{0.01});
  tmem::amp::GradScalerOptions options;
  options.init_scale = 4.0;
  options.hysteresis = 2;
  options.min_scale = 2.0;
  tmem::amp::GradScaler<Gpu> scaler(DType::F16, options);
  std::vector<double> x_values(4 * 16);
  for (std::size_t i = 0; i < x_values.size(); ++i) x_values[i] = static_cast<double>(i % 7) * 0.125 - 0.375;
  auto train_step = [&](bool poison) {
    optimizer.zero_grad();
    tmem::Tape<Gpu> tape;
    auto x = tape.input(TensorG::from_host(Shape{4, 16}, x_values, DType::F32));
    {
      tmem::amp::Autocast guard(DType::F16);
      tape.backward(scaler.scale(tmem::mean(fc(x))));
    }
    if (poison) {
      const auto& grad = fc.weight().grad();
      auto values = grad.to_host<double>();
      values[5] = NAN;
      grad.copy_from(TensorG::from_host(grad.shape(), values, grad.dtype()));
    }
    const bool stepped = scaler.step(optimizer);
    scaler.update();
    return stepped;
  };
  const auto before = fc.weight().value().to_host<double>();
  CHECK_FALSE(train_step(true));
  CHECK(fc.weight().value().to_host<double>() == before);
  CHECK(scaler.get_scale() == 4.0);  // hysteresis 2: the first overflow only counts down
  CHECK_FALSE(train_step(true));
  CHECK(scaler.get_scale() == 2.0);  // the second backs off
  CHECK_FALSE(train_step(true));
  CHECK_FALSE(train_step(true));
  CHECK(scaler.get_scale() == 2.0);  // never below min_scale
  CHECK(train_step(false));
  CHECK(fc.weight().value().to_host<double>() != before);
}

namespace {

/// A Linear on each backend with the same initial values (nn::Init draws on the host).
struct TwinLinear {
  tmem::nn::Init cpu_init{21}, gpu_init{21};
  tmem::nn::Linear<Cpu> cpu{16, 8, cpu_init};
  tmem::nn::Linear<Gpu> gpu{16, 8, gpu_init};
};

std::vector<double> twin_inputs() {
  std::vector<double> x(4 * 16);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i % 11) * 0.25 - 1.25;
  return x;
}

/// One scaled FP16 backward of mean(fc(x)) on backend B.
template <class B>
void scaled_backward(tmem::nn::Linear<B>& fc, tmem::amp::GradScaler<B>& scaler, const std::vector<double>& x_values) {
  tmem::Tape<B> tape;
  auto x = tape.input(tmem::Tensor<B>::from_host(Shape{4, 16}, x_values, DType::F32));
  tmem::amp::Autocast guard(DType::F16);
  tape.backward(scaler.scale(tmem::mean(fc(x))));
}

}  // namespace

TEST_CASE("cuda step: unscale_ then clip_grad_norm gives the CPU's norm and clipped gradients", "[cuda][amp]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  TwinLinear twin;
  tmem::optim::SGD<Cpu> cpu_opt(twin.cpu.parameters(), tmem::optim::SgdOptions{0.1});
  tmem::optim::SGD<Gpu> gpu_opt(twin.gpu.parameters(), tmem::optim::SgdOptions{0.1});
  tmem::amp::GradScalerOptions options;
  options.init_scale = 1024.0;
  tmem::amp::GradScaler<Cpu> cpu_scaler(DType::F16, options);
  tmem::amp::GradScaler<Gpu> gpu_scaler(DType::F16, options);
  const auto x = twin_inputs();
  scaled_backward(twin.cpu, cpu_scaler, x);
  scaled_backward(twin.gpu, gpu_scaler, x);
  cpu_scaler.unscale_(cpu_opt);
  gpu_scaler.unscale_(gpu_opt);
  const double cpu_norm = tmem::optim::clip_grad_norm(cpu_opt, 1e-3);
  const double gpu_norm = tmem::optim::clip_grad_norm(gpu_opt, 1e-3);
  CHECK(gpu_norm == Approx(cpu_norm).epsilon(1e-6));
  CHECK(cpu_norm > 1e-3);  // the clip did something
  for (std::size_t i = 0; i < twin.cpu.parameters().size(); ++i) {
    const auto want = twin.cpu.parameters()[i].grad().to_host<double>();
    const auto got = twin.gpu.parameters()[i].grad().to_host<double>();
    REQUIRE(got.size() == want.size());
    for (std::size_t k = 0; k < want.size(); ++k) CHECK(got[k] == Approx(want[k]).epsilon(1e-5).margin(1e-9));
  }
  CHECK(gpu_scaler.step(gpu_opt));  // unscaled once: the step does not divide again
  gpu_scaler.update();
}

TEST_CASE("cuda step: the scale grows to max_scale and stays there", "[cuda][amp]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  TwinLinear twin;
  tmem::optim::SGD<Gpu> optimizer(twin.gpu.parameters(), tmem::optim::SgdOptions{0.0});
  tmem::amp::GradScalerOptions options;
  options.init_scale = 2.0;
  options.growth_interval = 1;
  options.max_scale = 8.0;
  tmem::amp::GradScaler<Gpu> scaler(DType::F16, options);
  const auto x = twin_inputs();
  const double expected[] = {4.0, 8.0, 8.0, 8.0};
  for (const double scale : expected) {
    optimizer.zero_grad();
    scaled_backward(twin.gpu, scaler, x);
    CHECK(scaler.step(optimizer));
    scaler.update();
    CHECK(scaler.get_scale() == scale);
  }
}

TEST_CASE("cuda step: stochastic rounding with a skipped step leaves masters and copies unchanged", "[cuda][amp]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  TwinLinear twin;
  auto params = twin.gpu.parameters();
  tmem::optim::SGD<Gpu> optimizer(params, tmem::optim::SgdOptions{0.05});
  tmem::amp::MasterWeights<Gpu> masters(
      params, tmem::amp::MasterWeightsOptions{DType::BF16, tmem::RoundingMode::Stochastic, 5});
  masters.attach(optimizer);
  tmem::amp::GradScaler<Gpu> scaler(DType::F16, tmem::amp::GradScalerOptions{});
  const auto x = twin_inputs();
  auto step = [&](bool poison) {
    optimizer.zero_grad();
    scaled_backward(twin.gpu, scaler, x);
    if (poison) {
      const auto& grad = params[0].grad();
      auto values = grad.to_host<double>();
      values[3] = INFINITY;
      grad.copy_from(TensorG::from_host(grad.shape(), values, grad.dtype()));
    }
    const bool stepped = scaler.step(optimizer);
    scaler.update();
    return stepped;
  };
  CHECK(step(false));
  const auto master_before = masters.master(0).to_host<double>();
  const auto copy_before = params[0].value().to_host<double>();
  CHECK_FALSE(step(true));
  CHECK(masters.master(0).to_host<double>() == master_before);
  CHECK(params[0].value().to_host<double>() == copy_before);
  CHECK(step(false));
  // After a real step each copy is one of the two bf16 neighbours of its f32 master.
  const auto master = masters.master(0).to_host<float>();
  const auto copy = params[0].value().to_host<float>();
  int outside = 0;
  for (std::size_t i = 0; i < master.size(); ++i) {
    const auto toward_zero = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(master[i]) >> 16);
    const float low = tmem::BFloat16::to_float(toward_zero);
    const float high = tmem::BFloat16::to_float(static_cast<std::uint16_t>(toward_zero + 1));  // one step away from 0
    if (copy[i] != low && copy[i] != high) ++outside;
  }
  CHECK(outside == 0);
}

TEST_CASE("cuda step: dropout inside a checkpoint recompute gives the plain step's gradients bitwise", "[cuda][rng]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  TwinLinear twin;
  const auto x_values = twin_inputs();
  auto gradients = [&](bool checkpointed) {
    for (auto& p : twin.gpu.parameters()) p.zero_grad();
    tmem::Tape<Gpu> tape;
    tape.rng().manual_seed(99);
    auto x = tape.input(TensorG::from_host(Shape{4, 16}, x_values, DType::F32));
    auto block = [&](const tmem::Var<Gpu>& v) { return tmem::dropout(tmem::gelu(twin.gpu(v)), 0.5f); };
    auto h = checkpointed ? tmem::checkpoint(tape, block, x) : block(x);
    tape.backward(tmem::sum(h));
    std::vector<std::vector<float>> grads;
    for (auto& p : twin.gpu.parameters()) grads.push_back(p.grad().to_host<float>());
    return grads;
  };
  const auto plain = gradients(false);
  const auto recomputed = gradients(true);
  REQUIRE(plain.size() == recomputed.size());
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(plain[i] == recomputed[i]);
}

// core/fingerprint.hpp is one formula for both backends: the device tree over every word
// must give the CPU loop's bits (and a scalar loop's, written out here), for a tensor of
// whole words, one with a partial last word, and one large enough to split over threads
// and blocks; one changed element far from the start changes it on both.
TEST_CASE("cuda fingerprint: every word, the same bits as the CPU backend and a scalar loop", "[cuda][checkpoint]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  Cpu& cpu = Cpu::default_instance();
  for (const std::int64_t n : {std::int64_t{4}, std::int64_t{4099}, std::int64_t{(1 << 20) + 3}}) {
    INFO("floats " << n);
    std::vector<float> values(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    const auto device_bits = [&](const std::vector<float>& v) {
      const auto fingerprint = gpu.fingerprint(TensorG::from_host(Shape{n}, v, DType::F32));
      gpu.synchronize();
      unsigned long long bits = 0;
      TRAINMEM_CUDA_CHECK(cudaMemcpy(&bits, fingerprint.slot(), sizeof(bits), cudaMemcpyDeviceToHost));
      return static_cast<std::uint64_t>(bits);
    };
    std::uint64_t scalar = 0;
    for (std::size_t j = 0; 2 * j < values.size(); ++j) {
      std::uint64_t word = 0;
      std::memcpy(&word, values.data() + 2 * j, 2 * j + 1 < values.size() ? 8 : 4);
      scalar += tmem::detail::fingerprint_term(word, j);
    }
    const std::uint64_t on_device = device_bits(values);
    CHECK(on_device == scalar);
    CHECK(cpu.fingerprint(
              tmem::Tensor<Cpu>::from_host(Shape{n}, values, DType::F32, tmem::MemCategory::Temporary, cpu)) == scalar);
    values[values.size() - 1] += 1.0f;
    CHECK(device_bits(values) != on_device);
  }
}

// The first GPU run: DeterminismCheck::Fingerprint (the default) downloaded each
// fingerprint, one host wait per tensor a region drops and per tensor its recompute
// compares (130 waits where the step above expects 98). The fingerprints now stay on the
// device, a mismatch waits for the next host wait, and until then no update is applied.
TEST_CASE("cuda step: a recompute unlike its forward is raised at the next host wait, and its step is not applied",
          "[cuda][checkpoint][gate]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Gpu& gpu = Gpu::default_instance();
  tmem::nn::Init init(21);
  tmem::nn::Linear<Gpu> layer(16, 16, init);
  tmem::optim::SGD<Gpu> optimizer(layer.parameters(), tmem::optim::SgdOptions{0.1});
  const auto x_values = twin_inputs();
  const auto checkpointed_step = [&](double second_scale) {
    int calls = 0;
    auto block = [&, second_scale](const tmem::Var<Gpu>& x) {
      return tmem::relu(layer(tmem::scale(x, ++calls == 1 ? 1.0 : second_scale)));
    };
    tmem::Tape<Gpu> tape(gpu);
    auto x = tape.input(TensorG::from_host(Shape{4, 16}, x_values, DType::F32), true);
    tape.backward(tmem::sum(tmem::checkpoint(tape, block, x)));
    optimizer.step();
  };
  // First launches load their kernels (CUDA's lazy loading), which may wait for the
  // device: a deterministic step first, so the gated one below launches nothing new.
  checkpointed_step(1.0);
  CHECK_NOTHROW(gpu.synchronize());
  const auto weight_before = layer.parameters()[0].value().to_host<float>();
  const std::size_t held = gpu.fingerprints_held();
  {
    int calls = 0;
    auto fickle = [&](const tmem::Var<Gpu>& x) { return tmem::relu(layer(tmem::scale(x, ++calls == 1 ? 1.0 : 1.5))); };
    tmem::Tape<Gpu> tape(gpu);
    auto x = tape.input(TensorG::from_host(Shape{4, 16}, x_values, DType::F32), true);
    auto loss = tmem::sum(tmem::checkpoint(tape, fickle, x));
    gpu.synchronize();
    CHECK(gpu.fingerprints_held() > held);  // the forward's fingerprints, on the device
    Gate gate;
    gate.close(gpu.stream());
    const auto syncs = gpu.host_syncs();
    tape.backward(loss);  // the recompute is compared on the device ...
    optimizer.step();     // ... and the pending mismatch cancels the update there
    CHECK(gpu.host_syncs() == syncs);
    gate.open();
    try {
      gpu.synchronize();
      FAIL("no error");
    } catch (const tmem::CheckpointError& e) {
      WARN("message: " << e.what());
      CHECK_THAT(e.what(), Catch::Contains("values of saved tensor") && Catch::Contains("fingerprint") &&
                               Catch::Contains("raised at the next host wait"));
    }
    CHECK_FALSE(gate.timed_out());
    CHECK_NOTHROW(gpu.synchronize());  // raised once, then cleared
  }
  CHECK(gpu.fingerprints_held() == held);  // the region's record gave its slots back
  CHECK(layer.parameters()[0].value().to_host<float>() == weight_before);

  // The same region, deterministic again: no error, and the update is applied.
  checkpointed_step(1.0);
  CHECK_NOTHROW(gpu.synchronize());
  CHECK(layer.parameters()[0].value().to_host<float>() != weight_before);
}
