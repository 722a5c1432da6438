// tests/checkpoint/test_plan_file.cpp — a checkpoint plan saved as JSON loads back equal
// (every field bitwise), runs the schedule it was saved with, and is refused with an
// Error naming the field where the file is damaged or for another model. Two hidden
// cases, run as two CTest processes (tests/CMakeLists.txt), save a plan in one process
// and load it in the other: the same schedule and bitwise the same gradients, with no
// profiling in the second.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/chain_models.hpp"
#include "trainmem/checkpoint/planner.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;

namespace {

/// The model both processes build (same seed: same weights).
struct SavedPlanModel {
  examples::TransformerStack<B> stack{4, 32, 4, 64, 64, 8, 32};
  PlannerOptions options() const {
    PlannerOptions o;
    o.profile_reps = 1;
    o.model = "transformer 4x32, 8x32 tokens";
    return o;
  }
};

/// The gradients of one step under `run` (lr 0: the weights stay), as raw bytes.
std::vector<std::uint8_t> step_gradient_bytes(const examples::TransformerStack<B>& stack, const ChainRunner<B>& run) {
  stack.step(run, 0.0);
  std::vector<std::uint8_t> out;
  for (const auto& p : stack.params) {
    const std::vector<float> g = p.grad().template to_host<float>();
    const auto* b = reinterpret_cast<const std::uint8_t*>(g.data());
    out.insert(out.end(), b, b + g.size() * sizeof(float));
  }
  return out;
}

/// "begin end mode" per segment: the schedule, written without the JSON code under test.
std::string schedule_text(const std::vector<Segment>& segments) {
  std::ostringstream out;
  for (const Segment& s : segments) out << s.begin << ' ' << s.end << ' ' << static_cast<int>(s.mode) << '\n';
  return out.str();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string plan_path() {
  const char* path = std::getenv("TRAINMEM_PLAN_FILE");
  REQUIRE(path != nullptr);  // set by the CTest registration
  return path;
}

/// `text` with the first `from` replaced by `to` (which must be there).
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

/// `text` with the value after the first `"key": ` (up to the next ',' or '}') replaced by `value`.
std::string with_value(std::string text, const std::string& key, const std::string& value) {
  const auto at = text.find("\"" + key + "\": ");
  REQUIRE(at != std::string::npos);
  const auto begin = at + key.size() + 4, end = text.find_first_of(",}", begin);
  return text.replace(begin, end - begin, value);
}

/// `text` without the line holding `"key": `.
std::string without_line(std::string text, const std::string& key) {
  const auto at = text.find("\"" + key + "\": ");
  REQUIRE(at != std::string::npos);
  const auto begin = text.rfind('\n', at) + 1, end = text.find('\n', at) + 1;
  return text.erase(begin, end - begin);
}

}  // namespace

TEST_CASE("a saved plan loads back equal, field for field and bitwise, and runs its schedule",
          "[checkpoint][planner][plan_file]") {
  SavedPlanModel m;
  Planner<B> planner(
      m.stack.stages, [&m](const ChainRunner<B>& run) { m.stack.step(run); }, m.options());
  const CheckpointPlan<B> plan = planner.plan(Budget::saved_activations(planner.profile().plain_peak[1] / 3));
  INFO(plan.str());
  REQUIRE(plan.segments().size() > 1);  // a schedule with regions in it
  const std::string text = plan.to_json();
  const CheckpointPlan<B> loaded = CheckpointPlan<B>::from_json(m.stack.stages, text, m.options());
  CHECK(loaded.record() == plan.record());
  CHECK(loaded.to_json() == text);
  CHECK(loaded.str() == plan.str());
  // The doubles' bits too (== would also pass for 0.0 against -0.0).
  CHECK(std::memcmp(&loaded.prediction().ms, &plan.prediction().ms, sizeof(double)) == 0);
  for (std::size_t i = 0; i < plan.record().segment_ms.size(); ++i)
    CHECK(std::memcmp(&loaded.record().segment_ms[i], &plan.record().segment_ms[i], sizeof(double)) == 0);
  // Through a file, and the schedule runs: bitwise the gradients of the plan it came from.
  const std::string path = "test_plan_file_round_trip.json";
  plan.save(path);
  const CheckpointPlan<B> from_file = CheckpointPlan<B>::load(m.stack.stages, path, m.options());
  CHECK(from_file.record() == plan.record());
  CHECK(step_gradient_bytes(m.stack, from_file.runner()) == step_gradient_bytes(m.stack, plan.runner()));
  std::remove(path.c_str());
}

TEST_CASE("a damaged plan file, or one for another model, is an Error naming the field",
          "[checkpoint][planner][plan_file]") {
  SavedPlanModel m;
  Planner<B> planner(
      m.stack.stages, [&m](const ChainRunner<B>& run) { m.stack.step(run); }, m.options());
  const CheckpointPlan<B> plan = planner.plan(Budget::saved_activations(planner.profile().plain_peak[1] / 3));
  const std::string text = plan.to_json();
  const auto refused = [&](const std::string& bad, const std::string& why, PlannerOptions options) {
    INFO(bad);
    CHECK_THROWS_AS(CheckpointPlan<B>::from_json(m.stack.stages, bad, options), Error);
    CHECK_THROWS_WITH(CheckpointPlan<B>::from_json(m.stack.stages, bad, options), Catch::Contains(why));
  };
  const PlannerOptions same = m.options();
  SECTION("truncated") {
    for (std::size_t cut : {std::size_t{0}, std::size_t{1}, text.size() / 3, text.size() / 2, text.size() - 3})
      refused(text.substr(0, cut), "truncated", same);
  }
  SECTION("an unknown field") {
    refused(replaced(text, "{\n", "{\n  \"budgets\": 1,\n"), "unknown field 'budgets'", same);
  }
  SECTION("an unknown field in a segment") {
    refused(replaced(text, "\"begin\":", "\"start\": 0, \"begin\":"), "unknown field 'segments[0].start'", same);
  }
  SECTION("a missing field") {
    refused(without_line(text, "model_state_bytes"), "field 'model_state_bytes' is missing", same);
  }
  SECTION("a field of the wrong type") {
    refused(with_value(text, "stages", "\"6\""), "field 'stages' is a string, expected a number", same);
    refused(with_value(text, "model_state_bytes", "1.5e3"), "field 'model_state_bytes' is 1.5e3, expected an integer",
            same);
    refused(with_value(text, "bytes", "[1]"), "field 'budget.bytes' is an array, expected a number", same);
  }
  SECTION("an unknown mode") {
    refused(replaced(text, "\"mode\": \"", "\"mode\": \"fast "), "field 'segments[0].mode' is 'fast ", same);
  }
  SECTION("segments that do not tile the chain") {
    refused(replaced(text, "{\"begin\": 0, \"end\": ", "{\"begin\": 1, \"end\": "), "field 'segments[0]' covers stages",
            same);
  }
  SECTION("another version or format") {
    refused(replaced(text, "\"version\": 1", "\"version\": 2"), "field 'version' is 2", same);
    refused(replaced(text, "trainmem checkpoint plan", "trainmem plan"), "field 'format'", same);
  }
  SECTION("another model") {
    PlannerOptions other = same;
    other.model = "transformer 4x64";
    refused(text, "field 'model' is 'transformer 4x32, 8x32 tokens' but PlannerOptions::model is 'transformer 4x64'",
            other);
    PlannerOptions accumulating = same;
    accumulating.micro_batches = 2;
    refused(text, "field 'micro_batches' is 1 but PlannerOptions::micro_batches is 2", accumulating);
    examples::TransformerStack<B> deeper(5, 32, 4, 64, 64, 8, 32);
    CHECK_THROWS_WITH(CheckpointPlan<B>::from_json(deeper.stages, text, same),
                      Catch::Contains("field 'stages' is 6 but the chain has 7 stages"));
  }
  SECTION("a file that is not there") {
    CHECK_THROWS_WITH(CheckpointPlan<B>::load(m.stack.stages, "no_such_plan.json", same),
                      Catch::Contains("no_such_plan.json: cannot open the file"));
  }
}

// Run by tests/CMakeLists.txt as two processes, the second after the first: a plan made and
// saved here ...
TEST_CASE("saved plan across processes: plan and save", "[.]") {
  SavedPlanModel m;
  Planner<B> planner(
      m.stack.stages, [&m](const ChainRunner<B>& run) { m.stack.step(run); }, m.options());
  const CheckpointPlan<B> plan = planner.plan(Budget::saved_activations(planner.profile().plain_peak[1] / 3));
  REQUIRE(plan.segments().size() > 1);
  const std::string path = plan_path();
  plan.save(path);
  std::ofstream(path + ".schedule") << schedule_text(plan.segments());
  const std::vector<std::uint8_t> grads = step_gradient_bytes(m.stack, plan.runner());
  std::ofstream(path + ".gradients", std::ios::binary)
      .write(reinterpret_cast<const char*>(grads.data()), static_cast<std::streamsize>(grads.size()));
}

// ... and loaded here, in another process that profiles nothing: the same schedule, and the
// step under it gives bitwise the gradients the first process's step gave.
TEST_CASE("saved plan across processes: load and run", "[.]") {
  SavedPlanModel m;
  const std::string path = plan_path();
  const std::int64_t regions = checkpoint_stats().regions;
  const CheckpointPlan<B> plan = CheckpointPlan<B>::load(m.stack.stages, path, m.options());
  CHECK(checkpoint_stats().regions == regions);  // loading ran no step
  CHECK(schedule_text(plan.segments()) == read_file(path + ".schedule"));
  const std::vector<std::uint8_t> grads = step_gradient_bytes(m.stack, plan.runner());
  const std::string saved = read_file(path + ".gradients");
  REQUIRE(saved.size() == grads.size());
  CHECK(std::memcmp(saved.data(), grads.data(), grads.size()) == 0);
}
