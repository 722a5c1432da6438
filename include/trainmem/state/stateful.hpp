// trainmem/state/stateful.hpp — one spelling for the state of everything a run holds.
//
// `state_of(x)` returns x's StateDict, `check_state(x, dict)` throws unless dict fits x
// (changing nothing) and `load_state(x, dict)` checks, then copies. They cover tensors
// and Vars (the entry "" holds the value), Generators and a Tape's random stream
// ("seed", "offset"), every class with `state()` / `check_state()` / `load_state()`
// members (nn::Module and its subclasses, optimizers, amp::MasterWeights), and a
// StateDict of the caller's own (the data order: epoch, position, sampler seed), which is
// saved and loaded as it is.
//
// A type whose `state()` means something else (amp::GradScaler's is its GradScalerState)
// joins through three free functions in its own namespace, found by argument-dependent
// lookup: `trainmem_state_of(const T&)`, `trainmem_check_state(const T&, const StateDict&)`
// and `trainmem_load_state(T&, const StateDict&)`. So this header knows no layer above it.
#pragma once

#include <concepts>

#include "trainmem/autograd/tape.hpp"
#include "trainmem/autograd/var.hpp"
#include "trainmem/core/rng.hpp"
#include "trainmem/core/tensor.hpp"
#include "trainmem/state/state_dict.hpp"

namespace trainmem {

/// \brief A class that makes and restores its own StateDict.
template <class T>
concept HasStateDict = requires(const T& c, T& m, const StateDict& s) {
  { c.state() } -> std::same_as<StateDict>;
  c.check_state(s);
  m.load_state(s);
};

template <HasStateDict T>
StateDict state_of(const T& object) {
  return object.state();
}
template <HasStateDict T>
void check_state(const T& object, const StateDict& state) {
  object.check_state(state);
}
template <HasStateDict T>
void load_state(T& object, const StateDict& state) {
  object.load_state(state);
}

// --- a type that describes its state with free functions in its own namespace -----------
template <class T>
concept HasStateFunctions = requires(const T& c, T& m, const StateDict& s) {
  { trainmem_state_of(c) } -> std::same_as<StateDict>;
  trainmem_check_state(c, s);
  trainmem_load_state(m, s);
};

template <HasStateFunctions T>
StateDict state_of(const T& object) {
  return trainmem_state_of(object);
}
template <HasStateFunctions T>
void check_state(const T& object, const StateDict& state) {
  trainmem_check_state(object, state);
}
template <HasStateFunctions T>
void load_state(T& object, const StateDict& state) {
  trainmem_load_state(object, state);
}

// --- a StateDict of the caller's own (data order, epoch, anything else to resume) --------
inline StateDict state_of(const StateDict& state) { return state; }
inline void check_state(const StateDict&, const StateDict&) {}
/// Replaces the dict with the loaded one.
inline void load_state(StateDict& state, const StateDict& loaded) { state = loaded; }

// --- tensors and Vars: the single entry "" ---------------------------------------------
template <class B>
StateDict state_of(const Tensor<B>& tensor) {
  StateDict out;
  out.set("", tensor);
  return out;
}
template <class B>
void check_state(const Tensor<B>& tensor, const StateDict& state) {
  detail::check(tensor.defined(), "load_state: the destination tensor is undefined");
  check_layout(state, {{"", {state_type_of(tensor.dtype()), tensor.shape()}}}, "Tensor load_state");
}
/// Copies into the tensor's storage (a Tensor is a handle: every copy of it sees the values).
template <class B>
void load_state(const Tensor<B>& tensor, const StateDict& state) {
  check_state(tensor, state);
  state.at("").copy_to(tensor);
}
template <class B>
StateDict state_of(const Var<B>& var) {
  return state_of(var.value());
}
template <class B>
void check_state(const Var<B>& var, const StateDict& state) {
  check_state(var.value(), state);
}
template <class B>
void load_state(const Var<B>& var, const StateDict& state) {
  load_state(var.value(), state);
}

// --- random streams -----------------------------------------------------------------------
inline StateDict state_of(const Generator& generator) {
  StateDict out;
  out.set_u64("seed", generator.state().seed);
  out.set_u64("offset", generator.state().offset);
  return out;
}
inline void check_state(const Generator&, const StateDict& state) {
  check_layout(state, {{"seed", {StateType::U64, Shape{}}}, {"offset", {StateType::U64, Shape{}}}},
               "Generator load_state");
  detail::check(state.get_u64("offset") % 4 == 0, "Generator load_state: offset ", state.get_u64("offset"),
                " is not a multiple of 4 (streams start at whole Philox blocks)");
}
inline void load_state(Generator& generator, const StateDict& state) {
  check_state(generator, state);
  generator.set_state({state.get_u64("seed"), state.get_u64("offset")});
}
/// The tape's random stream (dropout's masks); the recorded graph is not state.
template <class B>
StateDict state_of(const Tape<B>& tape) {
  return state_of(tape.rng());
}
template <class B>
void check_state(const Tape<B>& tape, const StateDict& state) {
  check_state(tape.rng(), state);
}
template <class B>
void load_state(Tape<B>& tape, const StateDict& state) {
  load_state(tape.rng(), state);
}

}  // namespace trainmem
