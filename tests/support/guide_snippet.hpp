// tests/support/guide_snippet.hpp — a guide's code block, so a test can prove the guide
// shows compiled code: the block after a marker comment must appear verbatim in a source
// file that a test builds and runs.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace trainmem::testing {

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

/// The ```cpp block that follows `marker` (an HTML comment) in `guide`; empty when the
/// marker or a whole block after it is missing.
inline std::string guide_snippet(const std::string& guide, std::string_view marker) {
  const auto at = guide.find(marker);
  if (at == std::string::npos) return {};
  const auto open = guide.find("```cpp\n", at);
  if (open == std::string::npos) return {};
  const auto close = guide.find("\n```", open + 7);
  if (close == std::string::npos) return {};
  return guide.substr(open + 7, close - open - 7);
}

}  // namespace trainmem::testing
