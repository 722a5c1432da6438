// trainmem/state/state_dict.hpp — named host copies of everything a run must restore.
//
// A StateDict maps hierarchical names ("blocks.3.attn.q.weight", "optimizer.steps")
// to entries: an element type, a shape and the raw little-endian bytes, copied to the
// host. Tensors keep their dtype bit for bit; counters are i64, seeds and offsets u64,
// settings f64. Objects make one with `state()` and restore from one with
// `load_state()`, which first checks the whole dict against what the object holds
// (`check_layout` names every missing or extra entry and every shape or type that
// differs; `check_values` refuses values no run writes, such as a NaN master or a negative
// second moment), and only then copies, so a failed load leaves the destination untouched.
// `insert(prefix, dict)` and `sub(prefix)` nest dicts: an object's entries appear
// under its name in a training state, and the entry "" of a dict is the prefix itself.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "trainmem/core/dtype.hpp"
#include "trainmem/core/shape.hpp"
#include "trainmem/core/tensor.hpp"
#include "trainmem/error.hpp"

namespace trainmem {

static_assert(std::endian::native == std::endian::little, "trainmem state files hold little-endian bytes");

/// \brief Element type of a state entry: the tensor dtypes plus 64-bit integers. These are
/// the codes files hold: F32..I32 share DType's codes; the FP8 dtypes, added after the
/// integers, take 7 and 8 (DType's 5 and 6 were already I64 and U64 here).
enum class StateType : std::uint8_t {
  F32 = 0,
  F64 = 1,
  F16 = 2,
  BF16 = 3,
  I32 = 4,
  I64 = 5,
  U64 = 6,
  F8E4M3 = 7,
  F8E5M2 = 8
};

constexpr StateType state_type_of(DType dtype) {
  if (dtype == DType::F8E4M3) return StateType::F8E4M3;
  if (dtype == DType::F8E5M2) return StateType::F8E5M2;
  return static_cast<StateType>(static_cast<std::uint8_t>(dtype));
}
constexpr bool is_tensor_type(StateType type) { return type != StateType::I64 && type != StateType::U64; }
constexpr bool is_valid_state_type(std::uint8_t code) { return code <= 8; }
/// The tensor dtype of a tensor type (is_tensor_type).
constexpr DType dtype_of(StateType type) {
  if (type == StateType::F8E4M3) return DType::F8E4M3;
  if (type == StateType::F8E5M2) return DType::F8E5M2;
  return static_cast<DType>(static_cast<std::uint8_t>(type));
}

constexpr std::size_t size_of(StateType type) {
  return type == StateType::I64 || type == StateType::U64 ? 8 : size_of(dtype_of(type));
}
constexpr std::string_view name_of(StateType type) {
  if (type == StateType::I64) return "i64";
  if (type == StateType::U64) return "u64";
  return name_of(dtype_of(type));
}
inline std::ostream& operator<<(std::ostream& out, StateType type) { return out << name_of(type); }
/// numel * size_of(type): the bytes an entry of `shape` holds, or -1 when that exceeds
/// int64 (a shape like [2^61] of 8-byte values has more elements than bytes can count).
inline std::int64_t byte_count(StateType type, const Shape& shape) {
  const auto size = static_cast<std::int64_t>(size_of(type));
  return shape.numel() > INT64_MAX / size ? -1 : shape.numel() * size;
}

/// \brief One named value: element type, shape and bytes (numel * size_of(type) of them).
struct StateEntry {
  StateType type = StateType::F32;
  Shape shape;
  std::vector<std::byte> bytes;

  bool operator==(const StateEntry&) const = default;

  /// A host copy of `tensor`'s bytes.
  template <class B>
  static StateEntry of(const Tensor<B>& tensor) {
    detail::check(tensor.defined(), "StateEntry::of: the tensor is undefined");
    StateEntry e{state_type_of(tensor.dtype()), tensor.shape(), std::vector<std::byte>(tensor.bytes())};
    if (!e.bytes.empty()) tensor.backend().download(e.bytes.data(), tensor.data(), tensor.bytes());
    return e;
  }
  /// Copies the bytes into `tensor` (the caller checked type and shape) and bumps its
  /// version, so cast caches and saved tensors see the write.
  template <class B>
  void copy_to(const Tensor<B>& tensor) const {
    if (!bytes.empty()) tensor.backend().upload(tensor.data(), bytes.data(), bytes.size());
    tensor.bump_version();
  }
  /// A new tensor holding these bytes (a tensor type only).
  template <class B>
  Tensor<B> to_tensor(MemCategory category, B& backend) const {
    Tensor<B> t = Tensor<B>::empty(shape, dtype_of(type), category, backend);
    copy_to(t);
    return t;
  }
};

/// \brief What an object expects an entry to be.
struct ExpectedEntry {
  StateType type;
  Shape shape;
};

/// \brief Named state entries, sorted by name.
class StateDict {
 public:
  using Map = std::map<std::string, StateEntry>;

  bool empty() const { return entries_.empty(); }
  std::size_t size() const { return entries_.size(); }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const Map& entries() const { return entries_; }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }
  bool operator==(const StateDict&) const = default;

  /// The entry called `name`; throws naming `who` when it is absent.
  const StateEntry& at(const std::string& name, std::string_view who = "StateDict") const {
    auto it = entries_.find(name);
    detail::check(it != entries_.end(), who, ": entry '", name, "' is missing");
    return it->second;
  }
  /// Adds (or replaces) one entry.
  void set(const std::string& name, StateEntry entry) {
    const std::int64_t expected = byte_count(entry.type, entry.shape);
    detail::check(expected >= 0, "StateDict::set: '", name, "' is ", entry.type, " ", entry.shape,
                  ", more bytes than int64 counts");
    detail::check(entry.bytes.size() == static_cast<std::size_t>(expected), "StateDict::set: '", name, "' is ",
                  entry.type, " ", entry.shape, " (", expected, " bytes), got ", entry.bytes.size(), " bytes");
    entries_[name] = std::move(entry);
  }
  template <class B>
  void set(const std::string& name, const Tensor<B>& tensor) {
    set(name, StateEntry::of(tensor));
  }
  void set_f64(const std::string& name, double value) { set(name, scalar(StateType::F64, &value)); }
  void set_i64(const std::string& name, std::int64_t value) { set(name, scalar(StateType::I64, &value)); }
  void set_u64(const std::string& name, std::uint64_t value) { set(name, scalar(StateType::U64, &value)); }

  double get_f64(const std::string& name, std::string_view who = "StateDict") const {
    return get_scalar<double>(name, StateType::F64, who);
  }
  std::int64_t get_i64(const std::string& name, std::string_view who = "StateDict") const {
    return get_scalar<std::int64_t>(name, StateType::I64, who);
  }
  std::uint64_t get_u64(const std::string& name, std::string_view who = "StateDict") const {
    return get_scalar<std::uint64_t>(name, StateType::U64, who);
  }

  /// Adds every entry of `other` under `prefix` ("a" + "b" -> "a.b"; "a" + "" -> "a").
  void insert(const std::string& prefix, const StateDict& other) {
    for (const auto& [name, entry] : other.entries_) {
      const std::string full = join(prefix, name);
      detail::check(!contains(full), "StateDict::insert: entry '", full, "' is already present");
      entries_[full] = entry;
    }
  }
  /// The entries under `prefix`, with the prefix (and its dot) removed; "" is the whole dict.
  StateDict sub(const std::string& prefix) const {
    if (prefix.empty()) return *this;
    StateDict out;
    for (auto it = entries_.lower_bound(prefix); it != entries_.end(); ++it) {
      const std::string& name = it->first;
      if (name.compare(0, prefix.size(), prefix) != 0) break;
      if (name.size() == prefix.size()) out.entries_[""] = it->second;
      else if (name[prefix.size()] == '.') out.entries_[name.substr(prefix.size() + 1)] = it->second;
    }
    return out;
  }
  /// Whether `name` is `prefix` or lies under it.
  static bool is_under(const std::string& name, const std::string& prefix) {
    return prefix.empty() || name == prefix ||
           (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 && name[prefix.size()] == '.');
  }
  static std::string join(const std::string& prefix, const std::string& name) {
    if (prefix.empty()) return name;
    return name.empty() ? prefix : prefix + "." + name;
  }

 private:
  static StateEntry scalar(StateType type, const void* value) {
    StateEntry e{type, Shape{}, std::vector<std::byte>(8)};
    std::memcpy(e.bytes.data(), value, 8);
    return e;
  }
  template <class T>
  T get_scalar(const std::string& name, StateType type, std::string_view who) const {
    const StateEntry& e = at(name, who);
    detail::check(e.type == type && e.shape.numel() == 1 && e.shape.rank() == 0, who, ": entry '", name, "' is ",
                  e.type, " ", e.shape, ", expected a ", type, " scalar");
    T value;
    std::memcpy(&value, e.bytes.data(), sizeof value);
    return value;
  }

  Map entries_;
};

namespace detail {

inline std::string state_entry_label(const std::string& name) { return name.empty() ? "(the value itself)" : name; }

/// What scan_values found: how many values failed, and the first of them.
struct ValueScan {
  std::int64_t failing = 0;
  std::int64_t first = -1;
  double first_value = 0;
};
/// Runs `ok` over every value of a floating-point entry, widened to f64 (other types: nothing fails).
template <class Ok>
ValueScan scan_values(const StateEntry& entry, Ok ok) {
  ValueScan scan;
  if (!is_tensor_type(entry.type) || !is_floating(dtype_of(entry.type))) return scan;
  visit_dtype(dtype_of(entry.type), [&]<class T>() {
    for (std::int64_t i = 0; i < entry.shape.numel(); ++i) {
      T stored;
      std::memcpy(&stored, entry.bytes.data() + static_cast<std::size_t>(i) * sizeof(T), sizeof(T));
      const auto value = static_cast<double>(widen(stored));
      if (ok(value)) continue;
      if (scan.failing++ == 0) {
        scan.first = i;
        scan.first_value = value;
      }
    }
  });
  return scan;
}
}  // namespace detail

/// \brief Throws from `who` unless every value of the floating-point entry `name` passes
/// `ok` (called with the value widened to f64); the message names the entry, how many
/// values fail, the first of them (element and value) and `expected`. Objects call it
/// after check_layout, before anything is copied: a value no run writes (a NaN master, a
/// negative second moment) is refused like a wrong shape. An absent entry passes.
template <class Ok>
void check_values(const StateDict& state, const std::string& name, Ok ok, std::string_view expected,
                  std::string_view who) {
  if (!state.contains(name)) return;
  const detail::ValueScan scan = detail::scan_values(state.at(name), ok);
  if (scan.failing == 0) return;
  throw Error(detail::concat(who, ": '", detail::state_entry_label(name), "' holds ", scan.failing,
                             scan.failing == 1 ? " value that is not " : " values that are not ", expected,
                             ": element ", scan.first, " is ", scan.first_value, "; nothing was loaded"));
}

/// \brief Checks that `state` holds exactly the `expected` entries (names, types, shapes);
/// throws one Error from `who` that lists every difference (the first 12, then a count).
inline void check_layout(const StateDict& state, const std::map<std::string, ExpectedEntry>& expected,
                         std::string_view who) {
  std::vector<std::string> problems;
  for (const auto& [name, want] : expected) {
    auto it = state.entries().find(name);
    if (it == state.entries().end()) {
      problems.push_back(detail::concat("'", detail::state_entry_label(name), "' is missing from the state"));
      continue;
    }
    const StateEntry& got = it->second;
    if (got.shape != want.shape)
      problems.push_back(detail::concat("'", detail::state_entry_label(name), "' has shape ", got.shape,
                                        " in the state, the destination is ", want.shape));
    if (got.type != want.type)
      problems.push_back(detail::concat("'", detail::state_entry_label(name), "' is ", got.type,
                                        " in the state, the destination is ", want.type));
  }
  for (const auto& [name, entry] : state.entries())
    if (!expected.count(name))
      problems.push_back(detail::concat("'", detail::state_entry_label(name), "' (", entry.type, " ", entry.shape,
                                        ") in the state has no counterpart in the destination"));
  if (problems.empty()) return;
  std::string message = detail::concat(who, ": the state does not match (", problems.size(),
                                       problems.size() == 1 ? " difference" : " differences", "; nothing was loaded):");
  for (std::size_t i = 0; i < problems.size() && i < 12; ++i) message += "\n  " + problems[i];
  if (problems.size() > 12) message += detail::concat("\n  ... and ", problems.size() - 12, " more");
  throw Error(message);
}

}  // namespace trainmem
