// tests/distributed/nccl/test_distributed_nccl.cu — the NCCL communicator on the GPUs of one process's ranks.
//
// Runs with one rank (a SingleProcess host communicator hands out the NCCL id): every
// collective of one rank must return its input, and DataParallel over it must leave a
// gradient g as g (the mean of one), and ZeRO-3 (dist::FullyShardedModel) over it must take
// the step plain AdamW takes. Exits 77 (skipped) where no GPU exists.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "trainmem/cuda.hpp"
#include "trainmem/distributed/data_parallel.hpp"
#include "trainmem/distributed/fully_sharded.hpp"
#include "trainmem/distributed/nccl.cuh"

namespace tmem = trainmem;
using G = tmem::cuda::Backend;

namespace {
int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "test_distributed_nccl: FAILED: %s\n", what);
    ++failures;
  }
}
}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("test_distributed_nccl: no GPU; skipped");
    return 77;
  }
  try {
    G& gpu = G::default_instance();
    tmem::dist::SingleProcess<tmem::cpu::Backend> host;
    tmem::dist::nccl::Communicator comm(host, gpu);
    const std::vector<double> values = {1.5, -2.0, 3.25, 0.0, 7.0};
    const auto t =
        tmem::Tensor<G>::from_host(tmem::Shape{5}, values, tmem::DType::F32, tmem::MemCategory::Temporary, gpu);
    comm.all_reduce_sum(t);
    expect(t.to_host<double>() == values, "all_reduce_sum over one rank returns the input");
    const std::vector<std::int64_t> counts = {5};
    const auto out = tmem::Tensor<G>::empty(tmem::Shape{5}, tmem::DType::F32, tmem::MemCategory::Temporary, gpu);
    comm.reduce_scatter_sum(t, out, counts);
    expect(out.to_host<double>() == values, "reduce_scatter_sum over one rank copies");
    comm.all_gather(out, counts);
    comm.broadcast(out, 0);
    comm.barrier();
    expect(out.to_host<double>() == values, "all_gather and broadcast over one rank leave the values");

    auto w = tmem::Var<G>::parameter(
        tmem::Tensor<G>::from_host(tmem::Shape{5}, values, tmem::DType::BF16, tmem::MemCategory::Parameter, gpu), "w");
    w.set_grad(tmem::Tensor<G>::from_host(tmem::Shape{5}, values, tmem::DType::BF16, tmem::MemCategory::Gradient, gpu));
    tmem::dist::DataParallel<G> sync(comm, {w}, {.bucket_bytes = 8});
    sync.average_gradients();
    expect(w.grad().to_host<double>() == values, "DataParallel over one GPU keeps a bf16 gradient");

    // ZeRO-3 over one GPU: one unit, two AdamW steps, bitwise those of plain AdamW on a twin layer.
    tmem::nn::Init init_sharded(3), init_plain(3);
    tmem::nn::Linear<G> sharded_fc(4, 3, init_sharded, true, tmem::DType::F32, "fc");
    tmem::nn::Linear<G> plain_fc(4, 3, init_plain, true, tmem::DType::F32, "fc");
    tmem::dist::FullyShardedModel<G> model(comm, {sharded_fc.parameters()}, {.model_dtype = tmem::DType::F32},
                                           tmem::optim::AdamWOptions{.lr = 1e-2});
    tmem::optim::AdamW<G> adamw(plain_fc.parameters(), {.lr = 1e-2});
    const std::vector<double> x = {0.5, -1.0, 0.25, 2.0, -0.75, 1.5, 0.0, -0.5};
    const auto input =
        tmem::Tensor<G>::from_host(tmem::Shape{2, 4}, x, tmem::DType::F32, tmem::MemCategory::Temporary, gpu);
    const auto labels = tmem::Tensor<G>::from_host(tmem::Shape{2}, std::vector<std::int32_t>{0, 2}, tmem::DType::I32,
                                                   tmem::MemCategory::Temporary, gpu);
    for (int step = 0; step < 2; ++step) {
      model.zero_grad();
      tmem::Tape<G> tape;
      const tmem::Var<G> logits = model.forward(
          tape, 0, [&](const tmem::Var<G>& in) { return sharded_fc(in); }, tape.input(input));
      tape.backward(tmem::cross_entropy(logits, labels));
      model.micro_batch_done();
      model.step();
      adamw.zero_grad();
      tmem::Tape<G> plain_tape;
      plain_tape.backward(tmem::cross_entropy(plain_fc(plain_tape.input(input)), labels));
      adamw.step();
    }
    std::vector<double> plain;
    for (const auto& p : plain_fc.parameters())
      for (double v : p.value().to_host<double>()) plain.push_back(v);
    expect(model.full_weights() == plain, "ZeRO-3 over one GPU steps as plain AdamW");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_distributed_nccl: %s\n", e.what());
    return 1;
  }
  if (failures == 0) std::puts("test_distributed_nccl: all passed");
  return failures == 0 ? 0 : 1;
}
