// examples/common/cli_checks.hpp — command-line checks whose messages say what a value must be.
//
// CLI11's PositiveNumber refuses --batch 0 with "Value 0 not in range 0.000000 to
// 1.797693e+308", which reads as if 0 were allowed. These name the bound instead.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>

namespace examples {

/// A number > 0, or >= 0 when `zero_allowed`; otherwise a message saying so.
inline CLI::Validator number_check(bool zero_allowed) {
  const std::string bound = zero_allowed ? ">= 0" : "> 0";
  return CLI::Validator(
      [zero_allowed, bound](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        const bool number = end != text.c_str() && *end == '\0';
        if (number && (zero_allowed ? value >= 0.0 : value > 0.0)) return {};
        return "must be a number " + bound + ", got '" + text + "'";
      },
      "NUMBER " + bound);
}

inline const CLI::Validator kPositive = number_check(false);
inline const CLI::Validator kNonNegative = number_check(true);

}  // namespace examples
