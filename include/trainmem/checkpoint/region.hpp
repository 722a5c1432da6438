// trainmem/checkpoint/region.hpp — activation checkpointing: checkpoint(tape, fn, inputs...).
//
// NOTE [Checkpoint regions]
// A region trades compute for memory through the saved-tensor seam alone: while fn runs
// forward, the region's save hook turns what its ops save for backward into placeholders
// (keeping only its inputs and what its policy says to keep), and the first unpack of a
// placeholder in backward runs fn again to bring the dropped tensors back. The pieces,
// one header each, in checkpoint/detail/:
//  - frame.hpp          the region itself: owns the forward's record and runs recompute;
//  - forward_hook.hpp   the hook fn's forward runs under (NOTE [Region forward]);
//  - keep_decision.hpp  policy + memory budget + offload, applied to each op's outputs;
//  - replay_hook.hpp    the hook pushed only during recompute (NOTE [Region recompute]);
//  - determinism.hpp    the replay state and saves a recompute must reproduce: op, shape
//                       and dtype of every save are always compared, and by default
//                       (DeterminismCheck::Fingerprint, options.hpp) a fingerprint of
//                       every byte of each recomputed tensor too (CheckpointError otherwise).
// checkpoint_name reaches the region through the SaveHook interface: any other hook
// ignores names.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainmem/checkpoint/detail/frame.hpp"
#include "trainmem/checkpoint/options.hpp"
#include "trainmem/checkpoint/policy.hpp"

namespace trainmem {

namespace detail {

template <class Fn, class B, std::size_t... I>
void call_with(Fn& fn, const std::vector<Var<B>>& inputs, std::index_sequence<I...>) {
  (void)fn(inputs[I]...);
}

}  // namespace detail

/// Runs fn(inputs...) as a checkpoint region under `options`: fn's activations are
/// dropped (or kept as the policy says) and recomputed in backward. fn must return
/// Var<B> or std::vector<Var<B>>, be a pure function of its inputs, the parameters
/// and what it captures, and stay callable until backward has run.
template <class B, class Fn, class... Inputs>
auto checkpoint(Tape<B>& tape, const CheckpointOptions& options, Fn&& fn, const Inputs&... inputs) {
  static_assert((std::is_same_v<Inputs, Var<B>> && ...), "checkpoint: inputs must be Var<B>");
  if (!grad_enabled()) return fn(inputs...);
  for (const Var<B>* in : {&inputs...})
    detail::check(in->tape() == nullptr || in->tape() == &tape, "checkpoint: input ",
                  in->name().empty() ? "" : "'" + in->name() + "' ", "belongs to another tape");
  auto shared_fn = std::make_shared<std::decay_t<Fn>>(std::forward<Fn>(fn));
  auto body = [shared_fn](const std::vector<Var<B>>& in) {
    detail::call_with(*shared_fn, in, std::index_sequence_for<Inputs...>{});
  };
  auto region = detail::RegionFrame<B>::open(tape, options, std::move(body), std::vector<Var<B>>{inputs...});
  ++checkpoint_stats().regions;
  typename Tape<B>::HookScope forward(tape, region->forward_hook());
  auto result = (*shared_fn)(inputs...);
  region->finish_forward();
  return result;
}

/// checkpoint with the default options: full recompute, every recompute's values checked by fingerprint.
template <class B, class Fn, class... Inputs>
auto checkpoint(Tape<B>& tape, Fn&& fn, const Var<B>& first, const Inputs&... rest) {
  return checkpoint(tape, CheckpointOptions{}, std::forward<Fn>(fn), first, rest...);
}

/// Names x for checkpoint policies (policy::save_names); returns x. Outside a region it does nothing.
template <class B>
const Var<B>& checkpoint_name(const Var<B>& x, std::string_view name) {
  Tape<B>* tape = x.tape();
  if (tape == nullptr || !grad_enabled()) return x;
  if (SaveHook<B>* hook = tape->hook()) hook->name_tensor(x.impl(), name);
  return x;
}

}  // namespace trainmem
