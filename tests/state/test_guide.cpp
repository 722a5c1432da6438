// tests/state/test_guide.cpp — the save/load snippet in docs/training-state.md is compiled code:
// it must appear verbatim in tests/state/resume_training.hpp, which the resume test builds and runs.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "guide_snippet.hpp"

using trainmem::testing::guide_snippet;
using trainmem::testing::read_text;

TEST_CASE("the guide's save/load snippet is the compiled one", "[state][docs]") {
  const std::filesystem::path here = std::filesystem::path(__FILE__).parent_path();
  const std::string guide = read_text(here / "../../docs/training-state.md");
  const std::string source = read_text(here / "resume_training.hpp");
  REQUIRE(!guide.empty());
  REQUIRE(!source.empty());
  const std::string snippet = guide_snippet(guide, "<!-- training-state-example -->");
  CHECK(snippet.size() > 200);
  CHECK(source.find(snippet) != std::string::npos);
}
