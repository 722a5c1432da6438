// tests/state/test_guide.cpp — the save/load snippet in docs/training-state.md is compiled code:
// it must appear verbatim in tests/state/resume_training.hpp, which the resume test builds and runs.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

TEST_CASE("the guide's save/load snippet is the compiled one", "[state][docs]") {
  const std::filesystem::path here = std::filesystem::path(__FILE__).parent_path();
  const std::string guide = read_text(here / "../../docs/training-state.md");
  const std::string source = read_text(here / "resume_training.hpp");
  REQUIRE(!guide.empty());
  REQUIRE(!source.empty());
  const auto marker = guide.find("<!-- training-state-example -->");
  REQUIRE(marker != std::string::npos);
  const auto open = guide.find("```cpp\n", marker);
  REQUIRE(open != std::string::npos);
  const auto close = guide.find("\n```", open + 7);
  REQUIRE(close != std::string::npos);
  const std::string snippet = guide.substr(open + 7, close - open - 7);
  CHECK(snippet.size() > 200);
  CHECK(source.find(snippet) != std::string::npos);
}
