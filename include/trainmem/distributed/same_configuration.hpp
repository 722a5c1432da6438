// trainmem/distributed/same_configuration.hpp — every rank must train the same parameter list
// with the same settings.
//
// Data parallelism pairs element k of one rank's gradients with element k of every
// other's, and bucket b's collectives with bucket b's. Ranks that built different models
// (another width, a dtype, one parameter more, the same shapes listed in another order)
// or chose different settings (bucket size, accumulation steps, ZeRO stage) would still
// exchange buffers of some size, and train on garbage or wait forever for a message that
// never comes. So set-up compares each rank's configuration with rank 0's: a list of
// named fields, the parameter count, each parameter's name, shape and dtype in order,
// then the settings whose difference changes the collectives or the result. Every rank
// throws the same Error, naming each rank that differs, its first differing field and
// both values, before any gradient moves. Three small host collectives, once; they run
// on any Communicator (over NCCL they go through its host communicator).
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
#include "trainmem/distributed/communicator.hpp"

namespace trainmem::dist {

/// \brief One field of the configuration every rank must share: a name and a value as text.
struct Setting {
  std::string name, value;
  bool operator==(const Setting&) const = default;
};

/// The Setting `name` with `value` written as text.
template <class T>
Setting setting(std::string name, const T& value) {
  std::ostringstream out;
  out << value;
  return {std::move(name), out.str()};
}

namespace detail {
/// The parameter count, then "parameter i" = "'name' shape dtype" for each, in order
/// (with "(f32 gradient)" for a 16-bit one whose gradient is summed in f32).
template <class B>
std::vector<Setting> parameter_settings(const std::vector<Var<B>>& params) {
  std::vector<Setting> out{setting("parameter count", params.size())};
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::ostringstream value;
    value << "'" << params[i].name() << "' " << params[i].shape() << " " << params[i].dtype();
    if (params[i].grad_in_f32() && params[i].dtype() != DType::F32) value << " (f32 gradient)";
    out.push_back({"parameter " + std::to_string(i), value.str()});
  }
  return out;
}

/// name \0 value \0, for each setting.
inline std::vector<char> encode(const std::vector<Setting>& settings) {
  std::vector<char> out;
  for (const Setting& s : settings)
    for (const std::string* text : {&s.name, &s.value}) {
      out.insert(out.end(), text->begin(), text->end());
      out.push_back('\0');
    }
  return out;
}
inline std::vector<Setting> decode(const std::vector<char>& bytes) {
  std::vector<std::string> texts;
  std::string text;
  for (char c : bytes) {
    if (c != '\0') {
      text += c;
      continue;
    }
    texts.push_back(std::move(text));
    text.clear();
  }
  std::vector<Setting> out;
  for (std::size_t i = 0; i + 1 < texts.size(); i += 2) out.push_back({texts[i], texts[i + 1]});
  return out;
}

/// The first difference between this rank's settings and rank 0's; empty when there is none.
inline std::string describe_difference(const std::vector<Setting>& mine, const std::vector<Setting>& root) {
  for (std::size_t i = 0; i < std::max(mine.size(), root.size()); ++i) {
    if (i < mine.size() && i < root.size() && mine[i] == root[i]) continue;
    if (i >= root.size()) return mine[i].name + " " + mine[i].value + ", rank 0 has none";
    if (i >= mine.size()) return "no " + root[i].name + ", rank 0 has " + root[i].value;
    if (mine[i].name != root[i].name)
      return mine[i].name + " " + mine[i].value + " where rank 0 has " + root[i].name + " " + root[i].value;
    return mine[i].name + " " + mine[i].value + ", rank 0 has " + root[i].value;
  }
  return {};
}
}  // namespace detail

/// Throws trainmem::Error on every rank unless all ranks hold the same parameter list
/// (count, then each parameter's name, shape and dtype, in order) and the same `settings`.
/// A collective: every rank calls it. `who` names the caller.
template <class B>
void check_same_configuration(Communicator<B>& comm, const std::vector<Var<B>>& params,
                              const std::vector<Setting>& settings, const char* who) {
  for (const Var<B>& p : params) trainmem::detail::check(p.defined(), who, ": a parameter is undefined");
  std::vector<Setting> mine = detail::parameter_settings(params);
  mine.insert(mine.end(), settings.begin(), settings.end());
  std::vector<char> root = detail::encode(mine);
  std::int64_t length = static_cast<std::int64_t>(root.size());
  comm.broadcast_host(std::as_writable_bytes(std::span(&length, 1)), 0);
  root.resize(static_cast<std::size_t>(length));
  comm.broadcast_host(std::as_writable_bytes(std::span(root)), 0);

  constexpr std::size_t kMessageBytes = 256;
  const std::string difference = detail::describe_difference(mine, detail::decode(root)).substr(0, kMessageBytes - 1);
  std::vector<std::byte> message(kMessageBytes), all(kMessageBytes * static_cast<std::size_t>(comm.size()));
  std::memcpy(message.data(), difference.data(), difference.size());
  comm.all_gather_host(message, all);

  std::string report;
  for (int q = 0; q < comm.size(); ++q) {
    const char* text = reinterpret_cast<const char*>(all.data() + static_cast<std::size_t>(q) * kMessageBytes);
    const std::string theirs(text, strnlen(text, kMessageBytes));
    if (!theirs.empty()) report += "; rank " + std::to_string(q) + " has " + theirs;
  }
  trainmem::detail::check(report.empty(), who, ": the ranks' configurations differ", report);
}

}  // namespace trainmem::dist
