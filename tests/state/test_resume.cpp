// tests/state/test_resume.cpp — a run saved at step k and resumed in another process ends
// bitwise equal to the run that was never interrupted.
//
// The test binary runs itself twice (the two helper cases below, hidden from the normal
// run): the first process trains steps [0, k) and saves; the second loads and trains
// [k, n). The reference is the same program trained [0, n) in this process. The run
// (resume_training.hpp) has f16 autocast, skipped overflow steps on both sides of k,
// dropout, f32 masters and AdamW, so leaving out any piece of state shows. A control
// resumes without the tape's random stream and must differ.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "resume_training.hpp"

namespace {

constexpr std::int64_t kSaveAt = 7, kSteps = 20;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

void write_bytes(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
std::vector<std::byte> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) out[i] = static_cast<std::byte>(raw[i]);
  return out;
}

/// Runs this test binary on one test case, with TRAINMEM_RESUME_DIR set; returns its exit code.
int run_self(const std::string& test_name, const std::filesystem::path& dir) {
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command = "TRAINMEM_RESUME_DIR='" + dir.string() + "' '" + exe + "' '" + test_name + "' > '" +
                              (dir / (test_name.substr(15) + ".log")).string() + "' 2>&1";
  return std::system(command.c_str());
}

}  // namespace

TEST_CASE("resume helper: first part", "[.resume_helper]") {
  const std::string dir = env("TRAINMEM_RESUME_DIR");
  REQUIRE(!dir.empty());
  resume::Run run;
  run.train_until(kSaveAt);
  run.save(dir + "/state.tmstate");
}

TEST_CASE("resume helper: second part", "[.resume_helper]") {
  const std::string dir = env("TRAINMEM_RESUME_DIR");
  REQUIRE(!dir.empty());
  resume::Run run;
  run.load(dir + "/state.tmstate");
  REQUIRE(run.step == kSaveAt);
  run.train_until(kSteps);
  write_bytes(dir + "/weights.bin", run.weight_bytes());
}

TEST_CASE("a run resumed in a second process is bitwise equal to the uninterrupted run", "[state][resume]") {
  // The uninterrupted run, noting which steps the scaler skipped.
  resume::Run whole;
  std::vector<int> skipped_before(kSteps + 1, 0);
  for (std::int64_t k = 0; k < kSteps; ++k) {
    whole.train_until(k + 1);
    skipped_before[k + 1] = whole.skipped;
  }
  const int skipped_first = skipped_before[kSaveAt], skipped_second = whole.skipped - skipped_first;
  INFO("skipped steps: " << skipped_first << " before the save, " << skipped_second << " after");
  REQUIRE(skipped_first >= 1);           // the scaler's state at the save matters
  REQUIRE(skipped_second >= 1);          // ... and skipping continues after the resume
  REQUIRE(kSteps - whole.skipped >= 6);  // and many steps train

  const auto dir = std::filesystem::temp_directory_path() / ("trainmem_resume_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  REQUIRE(run_self("resume helper: first part", dir) == 0);
  REQUIRE(std::filesystem::exists(dir / "state.tmstate"));
  REQUIRE(run_self("resume helper: second part", dir) == 0);
  const std::vector<std::byte> resumed = read_bytes((dir / "weights.bin").string());
  const std::vector<std::byte> reference = whole.weight_bytes();
  CHECK(resumed.size() == reference.size());
  CHECK(resumed == reference);

  // Control: the same resume in this process without the tape's random stream (dropout
  // masks then repeat those of steps 0..) must end elsewhere.
  resume::Run partial;
  const trainmem::StateDict all = trainmem::load(dir / "state.tmstate");
  partial.net.load_state(all.sub("model"));
  partial.masters.load_state(all.sub("masters"));
  partial.optimizer.load_state(all.sub("optimizer"));
  trainmem::load_state(partial.scaler, all.sub("scaler"));
  partial.step = all.get_i64("data.step");
  partial.train_until(kSteps);
  CHECK(partial.weight_bytes() != reference);

  std::filesystem::remove_all(dir);
}
