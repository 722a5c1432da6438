// trainmem/dist/same_parameters.hpp — every rank must train the same parameter list.
//
// Data parallelism pairs element k of one rank's gradients with element k of every
// other's. Ranks that built different models (another width, a dtype, one parameter
// more) would still exchange buffers of some size, and train on garbage or wait forever
// for a message that never comes. So set-up compares each rank's list (count, then
// each parameter's dtype and shape) with rank 0's, and every rank throws the same
// Error, naming each rank that differs and how, before any gradient moves.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "trainmem/autograd/var.hpp"
#include "trainmem/dist/communicator.hpp"

namespace trainmem::dist {

namespace detail {
/// [count, then per parameter: dtype, rank, dims...]
template <class B>
std::vector<std::int64_t> parameter_signature(const std::vector<Var<B>>& params) {
  std::vector<std::int64_t> s{static_cast<std::int64_t>(params.size())};
  for (const Var<B>& p : params) {
    s.push_back(static_cast<std::int64_t>(p.dtype()));
    s.push_back(static_cast<std::int64_t>(p.shape().rank()));
    for (std::int64_t d : p.shape().dims()) s.push_back(d);
  }
  return s;
}

/// What differs between this rank's list and rank 0's signature; empty when nothing does.
template <class B>
std::string describe_difference(const std::vector<Var<B>>& params, const std::vector<std::int64_t>& root) {
  std::ostringstream out;
  if (root.empty() || root[0] != static_cast<std::int64_t>(params.size())) {
    out << params.size() << " parameters, rank 0 has " << (root.empty() ? 0 : root[0]);
    return out.str();
  }
  std::size_t at = 1;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto dtype = static_cast<DType>(root.at(at));
    const auto rank = static_cast<std::size_t>(root.at(at + 1));
    std::vector<std::int64_t> dims(root.begin() + static_cast<std::ptrdiff_t>(at + 2),
                                   root.begin() + static_cast<std::ptrdiff_t>(at + 2 + rank));
    at += 2 + rank;
    const Shape shape(dims);
    if (dtype != params[i].dtype() || shape != params[i].shape()) {
      out << "parameter " << i << " '" << params[i].name() << "' is " << params[i].shape() << " " << params[i].dtype()
          << ", rank 0's is " << shape << " " << dtype;
      return out.str();
    }
  }
  return {};
}
}  // namespace detail

/// Throws trainmem::Error on every rank unless all ranks hold parameter lists of the
/// same count, dtypes and shapes. A collective: every rank calls it. `who` names the caller.
template <class B>
void check_same_parameters(Communicator<B>& comm, const std::vector<Var<B>>& params, const char* who) {
  for (const Var<B>& p : params) trainmem::detail::check(p.defined(), who, ": a parameter is undefined");
  std::vector<std::int64_t> root = detail::parameter_signature(params);
  std::int64_t length = static_cast<std::int64_t>(root.size());
  comm.broadcast_host(std::as_writable_bytes(std::span(&length, 1)), 0);
  root.resize(static_cast<std::size_t>(length));
  comm.broadcast_host(std::as_writable_bytes(std::span(root)), 0);

  constexpr std::size_t kMessageBytes = 256;
  std::string mine = detail::describe_difference(params, root).substr(0, kMessageBytes - 1);
  std::vector<std::byte> message(kMessageBytes), all(kMessageBytes * static_cast<std::size_t>(comm.size()));
  std::memcpy(message.data(), mine.data(), mine.size());
  comm.all_gather_host(message, all);

  std::string report;
  for (int q = 0; q < comm.size(); ++q) {
    const char* text = reinterpret_cast<const char*>(all.data() + static_cast<std::size_t>(q) * kMessageBytes);
    const std::string difference(text, strnlen(text, kMessageBytes));
    if (!difference.empty()) report += "; rank " + std::to_string(q) + " has " + difference;
  }
  trainmem::detail::check(report.empty(), who, ": the ranks' parameter lists differ", report);
}

}  // namespace trainmem::dist
