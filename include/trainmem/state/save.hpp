// trainmem/state/save.hpp — save and load a whole training state, each object under its name.
//
//   tmem::save("run.tmstate", {{"model", model}, {"masters", masters}, {"optimizer", optimizer},
//                              {"scaler", scaler}, {"rng", tape}, {"data", data_position}});
//   tmem::load("run.tmstate", {{"model", model}, ...});   // the same list
//
// Loading reads and verifies the file (trainmem::load(path)), then checks every object
// against its part of the file and that no part is left over, and only then copies:
// when anything differs, it throws naming the object and the entries, and nothing the
// caller holds has changed.
#pragma once

#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "trainmem/state/file.hpp"
#include "trainmem/state/stateful.hpp"

namespace trainmem {

/// \brief A named reference to something with a state (anything state_of accepts).
class StateRef {
 public:
  template <class T>
  StateRef(std::string name, T& object) : name_(std::move(name)) {
    state_ = [&object] { return state_of(object); };
    check_ = [&object](const StateDict& s) { check_state(object, s); };
    if constexpr (!std::is_const_v<T>) load_ = [&object](const StateDict& s) { load_state(object, s); };
  }

  const std::string& name() const { return name_; }
  StateDict state() const { return state_(); }
  void check(const StateDict& state) const {
    detail::check(static_cast<bool>(load_), "trainmem::load: '", name_, "' was passed as const and cannot be loaded");
    check_(state);
  }
  void load(const StateDict& state) const { load_(state); }

 private:
  std::string name_;
  std::function<StateDict()> state_;
  std::function<void(const StateDict&)> check_, load_;
};

namespace detail {
inline void check_ref_names(std::initializer_list<StateRef> objects, const char* who) {
  for (auto a = objects.begin(); a != objects.end(); ++a)
    for (auto b = objects.begin(); b != a; ++b)
      detail::check(!StateDict::is_under(a->name(), b->name()) && !StateDict::is_under(b->name(), a->name()), who,
                    ": the names '", b->name(), "' and '", a->name(), "' overlap; give each object its own name");
}
}  // namespace detail

/// \brief Writes every object's state under its name to `path`, atomically.
inline void save(const std::filesystem::path& path, std::initializer_list<StateRef> objects) {
  detail::check_ref_names(objects, "trainmem::save");
  StateDict all;
  for (const StateRef& o : objects) all.insert(o.name(), o.state());
  save(path, all);
}

/// \brief Loads `path` into every object: all checks first, then all copies.
inline void load(const std::filesystem::path& path, std::initializer_list<StateRef> objects) {
  detail::check_ref_names(objects, "trainmem::load");
  const StateDict all = load(path);
  std::vector<std::string> extra;
  for (const auto& [name, entry] : all) {
    bool claimed = false;
    for (const StateRef& o : objects) claimed = claimed || StateDict::is_under(name, o.name());
    if (!claimed) extra.push_back(name);
  }
  if (!extra.empty()) {
    std::string list;
    for (std::size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? "', '" : "'") + extra[i];
    throw Error(detail::concat("trainmem::load: '", path.string(), "' holds ", extra.size(),
                               " entries no object was given for: ", list, "'", extra.size() > 8 ? ", ..." : "",
                               "; nothing was loaded"));
  }
  for (const StateRef& o : objects) {
    try {
      o.check(all.sub(o.name()));
    } catch (const Error& e) {
      throw Error(detail::concat("trainmem::load: '", path.string(), "', object '", o.name(), "': ", e.what()));
    }
  }
  for (const StateRef& o : objects) o.load(all.sub(o.name()));
}

}  // namespace trainmem
