// tests/backend/cuda/test_cuda_planner.cu — the checkpoint planner on the GPU, where offloading
// a stage to pinned host memory is a fourth choice next to keeping and recomputing.
//
// Checked: the profile measures Offload here (and only here: the CPU test checks it is
// absent there); an Offload stage keeps less on the device than a plain one and its
// gradients are the plain step's bit for bit (the activations come back unchanged);
// every planned step's measured device peaks are within 2% of the predicted ones, and
// within the budget; the pinned copies are all returned after each step.
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/chain_models.hpp"
#include "cuda_test_support.cuh"
#include "trainmem/checkpoint/planner.hpp"

namespace {

namespace tmem = trainmem;
using namespace trainmem::cuda_testing;

/// Gradients of every parameter after one step under `run`, as raw floats.
std::vector<std::vector<float>> planner_gradients(const examples::ResidualMlpChain<Gpu>& chain,
                                                  const tmem::ChainRunner<Gpu>& run) {
  chain.step(run);
  std::vector<std::vector<float>> g;
  for (const auto& p : chain.params) g.push_back(p.grad().template to_host<float>());
  return g;
}

}  // namespace

TEST_CASE("cuda planner: Offload is measured and exact, planned steps fit and match their predicted peaks (2%)",
          "[cuda][planner][offload]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  using tmem::StageMode;
  Gpu& gpu = Gpu::default_instance();
  examples::ResidualMlpChain<Gpu> chain(8, 256, 1024, 512);
  const tmem::ChainStep<Gpu> step = [&chain](const tmem::ChainRunner<Gpu>& run) { chain.step(run); };
  const tmem::Planner<Gpu> planner(chain.stages, step, {1, {}});
  const tmem::ChainProfile& p = planner.profile();
  const auto n = static_cast<std::int64_t>(chain.stages.size());
  const auto offload = static_cast<std::size_t>(StageMode::Offload), keep = static_cast<std::size_t>(StageMode::Keep);
  REQUIRE(p.measured[offload]);
  for (std::int64_t k = 1; k < n; ++k) {
    const tmem::StageCosts& s = p.stages[static_cast<std::size_t>(k)];
    INFO("stage " << k);
    CHECK(s.kept[offload][1] < s.kept[keep][1]);  // saved activations: the copies are on the host
    CHECK(s.kept[offload][0] < s.kept[keep][0]);  // device bytes too: the sources went back to the pool
    CHECK(s.fwd_ms[offload] > 0.0);
    CHECK(s.bwd_ms[offload] > 0.0);
  }

  std::vector<tmem::Segment> offloaded = {{0, 1, StageMode::Keep}};
  for (std::int64_t k = 1; k < n; ++k) offloaded.push_back({k, k + 1, StageMode::Offload});
  const auto reference = planner_gradients(chain, tmem::ChainRunner<Gpu>(chain.stages, {{0, n, StageMode::Keep}}));
  CHECK(planner_gradients(chain, tmem::ChainRunner<Gpu>(chain.stages, offloaded)) == reference);
  gpu.synchronize();
  CHECK(gpu.memory().live(tmem::MemCategory::HostOffload) == 0);

  // A step with no marks never waits for the side stream: the offloaded sources must still
  // go back to the pool where each region ends, or the whole-step peak would hold them all.
  const tmem::PlanPrediction predicted = tmem::predict(p, offloaded);
  const tmem::StepMeasurement measured = planner.measure(offloaded);
  for (int c = 0; c < tmem::kMemChannels; ++c) {
    INFO("channel " << c);
    CHECK(std::abs(static_cast<double>(predicted.peak[c] - measured.peak[c])) <=
          0.02 * static_cast<double>(measured.peak[c]));
  }

  const std::int64_t plain = p.plain_peak[0];
  for (std::int64_t budget : {plain * 3 / 4, (plain + planner.smallest_budget(tmem::MemChannel::Total)) / 2,
                              planner.smallest_budget(tmem::MemChannel::Total)}) {
    const tmem::CheckpointPlan<Gpu> plan = planner.plan(tmem::Budget::whole_step(budget));
    INFO(plan.str());
    const tmem::StepMeasurement m = planner.measure(plan);
    INFO(plan.compare(m));
    CHECK(m.peak[0] <= budget + budget / 50);
    CHECK(std::abs(static_cast<double>(plan.prediction().peak[0] - m.peak[0])) <=
          0.02 * static_cast<double>(m.peak[0]));
    CHECK(planner_gradients(chain, plan.runner()) == reference);
  }
}

TEST_CASE("cuda planner: a budget no schedule fits raises the planner's error, not an out-of-memory error",
          "[cuda][planner][offload]") {
  TRAINMEM_REQUIRE_CUDA_DEVICE();
  examples::ResidualMlpChain<Gpu> chain(6, 128, 512, 256);
  const tmem::ChainStep<Gpu> step = [&chain](const tmem::ChainRunner<Gpu>& run) { chain.step(run); };
  const tmem::Planner<Gpu> planner(chain.stages, step, {1, {}});
  const std::int64_t least = planner.smallest_budget(tmem::MemChannel::Total);
  REQUIRE(least > planner.profile().model_state);
  // Below the smallest budget (even with every stage offloaded), and far below: the model state alone.
  for (const std::int64_t budget : {least - 1, planner.profile().model_state / 2, std::int64_t{4096}}) {
    INFO("budget " << budget);
    try {
      (void)planner.plan(tmem::Budget::whole_step(budget));
      FAIL("a plan fits " << budget << " bytes, below the smallest budget " << least);
    } catch (const tmem::Error& e) {
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains("checkpoint planner: no schedule of the 6 stages fits") &&
                           Catch::Contains("the smallest that fits is " + std::to_string(least) + " bytes"));
      CHECK_THAT(what, !Catch::Contains("out of device memory"));
    }
  }
  // The smallest budget itself has a plan, and its step fits it on the device (2%).
  const tmem::CheckpointPlan<Gpu> plan = planner.plan(tmem::Budget::whole_step(least));
  const tmem::StepMeasurement m = planner.measure(plan);
  INFO(plan.compare(m));
  CHECK(m.peak[0] <= least + least / 50);
}
