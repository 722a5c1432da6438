// trainmem/error.hpp — the one exception type users catch.
//
// Public entry points validate, then call the implementation. A failed check throws
// trainmem::Error whose message names the op, the shapes involved and what was
// expected. Library code never prints and never exits. `require` is that check for
// code built on the library (examples, benchmarks, a user's loop), so their errors
// read and are caught like the library's own.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace trainmem {

/// \brief Thrown for every misuse and every failure the library detects.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// \brief Thrown when a checkpoint region's recompute does not reproduce its forward.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// \brief Thrown when an optimizer step wrote a 16-bit model copy that overflowed to inf
/// from a finite master (core/copy_overflow.hpp). The step itself was taken in full.
class CopyOverflowError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

/// Throws ErrorType with the concatenated message when `ok` is false. The message
/// parts are only formatted on failure.
template <class ErrorType = Error, class... Parts>
void check(bool ok, Parts&&... parts) {
  if (!ok) throw ErrorType(concat(std::forward<Parts>(parts)...));
}

}  // namespace detail

/// Throws trainmem::Error with the concatenated `parts` as its message when `ok` is
/// false; the parts are only formatted on failure.
template <class... Parts>
void require(bool ok, Parts&&... parts) {
  detail::check<Error>(ok, std::forward<Parts>(parts)...);
}

}  // namespace trainmem
