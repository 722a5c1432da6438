// tests/core/test_error.cpp — trainmem::require, the check code built on the library uses.
#include <catch2/catch.hpp>

#include <string>

#include "trainmem/error.hpp"

TEST_CASE("require: throws trainmem::Error with the parts as its message, only when the check fails", "[core][error]") {
  CHECK_NOTHROW(trainmem::require(true, "never formatted"));
  try {
    trainmem::require(2 + 2 == 5, "IDX file ", std::string("a.gz"), ": extent ", 7, " of ", 2.5, " is too large");
    FAIL("require(false, ...) returned");
  } catch (const trainmem::Error& e) {
    CHECK(std::string(e.what()) == "IDX file a.gz: extent 7 of 2.5 is too large");
  }
  CHECK_THROWS_AS(trainmem::require(false, "x"), trainmem::Error);
}
