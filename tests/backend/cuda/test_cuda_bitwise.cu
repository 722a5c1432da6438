// tests/backend/cuda/test_cuda_bitwise.cu — results that must equal the CPU backend's bit for bit.
//
// Where no sum is reordered the GPU must give the CPU's bits: dropout (the same Philox
// draws and the same multiply and rounding, so a checkpoint recompute on either
// backend reproduces the forward's mask), embedding backward (a stable sort keeps each
// id's rows in position order, as the CPU loop adds them), and casts between dtypes.
#include <vector>

#include "cuda_test_support.cuh"

namespace {

namespace tmem = trainmem;
using namespace trainmem::cuda_testing;
using tmem::DType;
using tmem::Shape;

template <class B>
tmem::Tensor<B> make(B& backend, Shape shape, const std::vector<double>& values, DType dtype) {
  return tmem::Tensor<B>::from_host(std::move(shape), values, dtype, tmem::MemCategory::Temporary, backend);
}

}  // namespace

TEST_CASE("cuda bitwise: dropout masks and scaling equal the CPU's", "[cuda][rng]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  auto& cpu = Cpu::default_instance();
  auto& gpu = Gpu::default_instance();
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F64})
    for (std::uint64_t offset : {0ull, 4ull, 6ull, 1ull << 40})  // 6: a stream not on a Philox block
      for (std::int64_t n : {1, 1003, 100000}) {
        INFO(dtype_name(dtype) << " offset " << offset << " n " << n);
        const tmem::RngState rng{random.seed() ^ static_cast<std::uint64_t>(n), offset};
        const auto x = random.uniform(n);
        auto x_cpu = make(cpu, Shape{n}, x, dtype);
        auto x_gpu = make(gpu, Shape{n}, x, dtype);
        auto y_cpu = tmem::Tensor<Cpu>::empty(Shape{n}, dtype, tmem::MemCategory::Temporary, cpu);
        auto y_gpu = tmem::Tensor<Gpu>::empty(Shape{n}, dtype, tmem::MemCategory::Temporary, gpu);
        cpu.dropout(x_cpu, y_cpu, 0.3f, rng);
        gpu.dropout(x_gpu, y_gpu, 0.3f, rng);
        REQUIRE(bits_of(y_gpu) == bits_of(y_cpu));
      }
}

TEST_CASE("cuda bitwise: the dropout op draws the same stream on both backends", "[cuda][rng]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  const auto x = random.uniform(4 * 257);
  const auto seed_grad = random.uniform(4 * 257);
  auto run = [&]<class B>(B& backend) {
    tmem::Tape<B> tape(backend);
    tape.manual_seed(random.seed());
    auto v = tape.input(make(backend, Shape{4, 257}, x, DType::F32), true);
    auto y = tmem::dropout(tmem::dropout(v, 0.25f), 0.5f);  // two streams, the second at a later offset
    tape.backward(y, make(backend, Shape{4, 257}, seed_grad, DType::F32));
    return std::vector<std::vector<std::uint64_t>>{bits_of(y.value()), bits_of(v.grad())};
  };
  CHECK(run(Gpu::default_instance()) == run(Cpu::default_instance()));
}

TEST_CASE("cuda bitwise: embedding backward sums repeated ids in the CPU's order", "[cuda][embedding]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  auto& cpu = Cpu::default_instance();
  auto& gpu = Gpu::default_instance();
  const std::int64_t vocab = 1000, dim = 200, count = 5000;
  const auto ids = random.integers(count, 0, 60);  // 60 of 1000 rows, ~80 repeats each
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F64})
    for (DType weight_dtype : {dtype, DType::F32}) {
      INFO("dout " << dtype_name(dtype) << ", dweight " << dtype_name(weight_dtype));
      const auto dout = random.uniform(count * dim);
      auto run = [&]<class B>(B& backend) {
        auto t_ids = make(backend, Shape{count}, ids, DType::I32);
        auto t_dout = make(backend, Shape{count, dim}, dout, dtype);
        auto dweight = tmem::Tensor<B>::zeros(Shape{vocab, dim}, weight_dtype, tmem::MemCategory::Temporary, backend);
        backend.embedding_backward(t_dout, t_ids, dweight);
        auto out = tmem::Tensor<B>::empty(Shape{count, dim}, dtype, tmem::MemCategory::Temporary, backend);
        backend.embedding(t_dout.reshape(Shape{count, dim}).slice(0, vocab), t_ids, out);  // forward: a gather
        return std::vector<std::vector<std::uint64_t>>{bits_of(dweight), bits_of(out)};
      };
      CHECK(run(gpu) == run(cpu));
    }
}

TEST_CASE("cuda bitwise: casts between every pair of dtypes", "[cuda][cast]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  Inputs random;
  INFO("seed " << random.seed());
  auto& cpu = Cpu::default_instance();
  auto& gpu = Gpu::default_instance();
  // Wide range, ties and specials: overflow to inf in f16, subnormals, NaN and signed zero.
  auto values = random.uniform(4099, -70000.0, 70000.0);
  const auto small = random.uniform(2000, -1e-6, 1e-6);
  values.insert(values.end(), small.begin(), small.end());
  values.insert(values.end(), {0.0, -0.0, 65504.0, 65520.0, 1e-8, -3e38, INFINITY, -INFINITY, 1.0 + 1.0 / 512});
  const auto n = static_cast<std::int64_t>(values.size());
  const DType all[] = {DType::F32, DType::F64, DType::F16, DType::BF16};
  for (DType from : all)
    for (DType to : all) {
      INFO(dtype_name(from) << " -> " << dtype_name(to));
      auto in_cpu = make(cpu, Shape{n}, values, from);
      auto in_gpu = make(gpu, Shape{n}, values, from);
      auto out_cpu = tmem::Tensor<Cpu>::empty(Shape{n}, to, tmem::MemCategory::Temporary, cpu);
      auto out_gpu = tmem::Tensor<Gpu>::empty(Shape{n}, to, tmem::MemCategory::Temporary, gpu);
      cpu.map(tmem::math::Identity{}, in_cpu, out_cpu);
      gpu.map(tmem::math::Identity{}, in_gpu, out_gpu);
      CHECK(bits_of(out_gpu) == bits_of(out_cpu));
    }
}
