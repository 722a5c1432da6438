// tests/support/error_matchers.hpp — match a thrown trainmem::Error by its message.
//
//   CHECK_THROWS_MATCHES(matmul(a, b), trainmem::Error, testing::ErrorContains("[2, 3]"));
//
// checks both that the expression throws trainmem::Error (not some other exception)
// and that the message names what it should (the op, the shapes, the expectation).
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <string_view>

#include "trainmem/error.hpp"

namespace trainmem::testing {

class ErrorContains : public Catch::MatcherBase<trainmem::Error> {
 public:
  explicit ErrorContains(std::string part) : part_(std::move(part)) {}
  bool match(const trainmem::Error& error) const override {
    return std::string_view(error.what()).find(part_) != std::string_view::npos;
  }
  std::string describe() const override { return "has a message containing \"" + part_ + "\""; }

 private:
  std::string part_;
};

}  // namespace trainmem::testing
