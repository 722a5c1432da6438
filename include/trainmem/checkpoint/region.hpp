// trainmem/checkpoint/region.hpp — activation checkpointing: checkpoint(tape, fn, inputs...).
//
// NOTE [Checkpoint regions]
// A region is a SaveHook (decision 3 of DESIGN.md). While fn runs forward:
//  - the region keeps its inputs, saved through the enclosing context (the tape, or an
//    outer region: regions nest, and the innermost owns what is saved inside it);
//  - each op's outputs go past the policy, which may keep (or offload) them;
//  - each tensor an op saves for backward becomes a placeholder naming a slot, unless
//    it is already alive anyway (a parameter or its cached 16-bit cast, a region input,
//    an output the policy kept), in which case the saved tensor refers to it directly.
// The first unpack of a placeholder during backward recomputes: fn runs again on the
// saved inputs under the replay state captured at entry (RNG, autocast, cast cache),
// into a scratch node list; ops whose outputs were kept hand them back instead of
// computing (so selective recompute skips the matmuls), and the k-th save of the
// recompute fills the slot of the k-th save of the forward. Recompute stops as soon as
// the last slot is filled (as PyTorch's non-reentrant checkpoint does): the ops after
// it are never rerun, and an output kept by the policy that neither backward nor that
// shortened recompute can use is released when the region's forward ends. Each slot
// is freed once unpacked. Recompute must reproduce the forward: the op, shape and
// dtype of every save are compared (CheckpointError otherwise), values on request.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainmem/checkpoint/policy.hpp"
#include "trainmem/checkpoint/replay_state.hpp"
#include "trainmem/ops/op_recorder.hpp"

namespace trainmem {

/// How much of a recompute is compared with its forward.
enum class DeterminismCheck : std::uint8_t {
  Metadata,  // count, op, shape and dtype of every saved tensor (always on)
  Checksum,  // ... and a 64-bit FNV-1a hash of every recomputed tensor's bytes
  Bitwise,   // ... and the bytes themselves (keeps a host copy: a debugging aid)
};

struct CheckpointOptions {
  Policy policy = policy::recompute_all();
  DeterminismCheck determinism = DeterminismCheck::Metadata;
  /// Bytes a region may keep through PREFER_SAVE decisions; MUST decisions ignore it.
  std::size_t memory_budget = std::numeric_limits<std::size_t>::max();
  /// Stop a recompute once every dropped tensor is back (faster). Off: rerun fn to the
  /// end and check that it saves exactly what the forward saved.
  bool early_stop = true;
};

/// Counters of the calling thread's checkpoint activity (for tests and benchmarks).
struct CheckpointStats {
  std::int64_t regions = 0;     // regions entered with grad on
  std::int64_t recomputes = 0;  // forward reruns during backward
  std::int64_t ops_reused = 0;  // ops skipped in recompute because their outputs were kept
  std::int64_t outputs_offloaded = 0;
};
inline CheckpointStats& checkpoint_stats() {
  thread_local CheckpointStats stats;
  return stats;
}

namespace detail {

inline constexpr OpInfo kCheckpointInputOp{"checkpoint (region input)", OpKind::Shape, AutocastCategory::Unchanged};
inline constexpr OpInfo kCheckpointNameOp{"checkpoint_name", OpKind::Tag, AutocastCategory::Unchanged};

template <class B>
concept CanOffload = requires(B& backend, const Tensor<B>& t) {
  backend.offload(t);
};

/// 64-bit FNV-1a over bytes.
inline std::uint64_t fnv1a(const std::vector<unsigned char>& bytes) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}
template <class B>
std::vector<unsigned char> host_bytes(const Tensor<B>& t) {
  std::vector<unsigned char> bytes(t.bytes());
  t.backend().download(bytes.data(), t.data(), t.bytes());
  return bytes;
}

template <class B>
class Region final : public SaveHook<B>, public Unpacker<B>, public std::enable_shared_from_this<Region<B>> {
 public:
  using Body = std::function<void(const std::vector<Var<B>>&)>;

  Region(Tape<B>& tape, CheckpointOptions options, Body body)
      : tape_(tape), options_(std::move(options)), body_(std::move(body)), replay_(ReplayState<B>::capture(tape)) {}

  /// Keeps the region's inputs through the enclosing context.
  void save_inputs(const std::vector<Var<B>>& inputs) {
    SaveHook<B>* parent = tape_.hook();
    for (const Var<B>& in : inputs) {
      const Tensor<B>& value = in.value();
      if (parent != nullptr) {
        const std::int64_t index = parent->begin_op(kCheckpointInputOp);
        inputs_.push_back(parent->pack(value, SaveInfo{&kCheckpointInputOp, index, value.bytes(), 0.0}));
      } else {
        inputs_.push_back(SavedTensor<B>::keep(value, kCheckpointInputOp.name));
      }
      input_requires_grad_.push_back(in.requires_grad());
      alive_.insert(value.storage().get());
    }
  }

  // --- SaveHook -------------------------------------------------------------------
  std::int64_t begin_op(const OpIdentity&) override { return next_op_++; }

  const std::vector<Tensor<B>>* reuse_outputs(std::int64_t op_index) override {
    if (!replaying_) return nullptr;
    if (auto it = kept_.find(op_index); it != kept_.end()) {
      ++checkpoint_stats().ops_reused;
      return &it->second;
    }
    if (auto it = offloaded_.find(op_index); it != offloaded_.end()) {
      ++checkpoint_stats().ops_reused;
      return &it->second.fetched;
    }
    return nullptr;
  }

  void on_outputs(std::int64_t op_index, const OpIdentity& op, double flops,
                  const std::vector<Tensor<B>>& outputs) override {
    if (replaying_) return;
    compute_event_[op_index] = events_++;
    output_counts_[op_index] = outputs.size();
    std::size_t bytes = 0;
    for (const auto& t : outputs) bytes += t.bytes();
    decide(op_index, OpSummary{op, bytes, flops, {}}, outputs);
  }

  SavedTensor<B> pack(const Tensor<B>& tensor, const SaveInfo& info) override {
    if (replaying_) {
      fill(tensor, info);
      return {};
    }
    const bool alive = tensor.category() == MemCategory::Parameter || tensor.category() == MemCategory::MasterWeight ||
                       alive_.count(tensor.storage().get()) != 0;
    const std::int64_t event = events_++;
    packed_.insert(tensor.storage().get());
    PackRecord record{-1, tensor.shape(), tensor.dtype(), info.op->name, 0, {}};
    if (alive) {
      packs_.push_back(std::move(record));
      return SavedTensor<B>::keep(tensor, info.op->name);
    }
    last_placeholder_event_ = event;
    last_placeholder_pack_ = packs_.size();
    record.slot = static_cast<std::int64_t>(slots_.size());
    slots_.emplace_back();
    if (options_.determinism == DeterminismCheck::Checksum) record.checksum = fnv1a(host_bytes(tensor));
    if (options_.determinism == DeterminismCheck::Bitwise) record.bytes = host_bytes(tensor);
    const std::int64_t slot = record.slot;
    packs_.push_back(std::move(record));
    return SavedTensor<B>::placeholder(tensor, info.op->name, this->shared_from_this(), slot);
  }

  // --- Unpacker -------------------------------------------------------------------
  Tensor<B> unpack(std::int64_t slot, const SavedTensor<B>&) override {
    auto& held = slots_.at(static_cast<std::size_t>(slot));
    if (!held) recompute();
    Tensor<B> t = held->tensor();
    held.reset();  // freed after use (a second backward recomputes again)
    return t;
  }

  /// The region's forward has returned: release kept outputs that no saved tensor refers
  /// to and that the recompute (which stops at the last placeholder) will never reach.
  void finish_forward() {
    for (auto it = kept_.begin(); it != kept_.end();) {
      bool referenced = false;
      for (const auto& t : it->second) referenced = referenced || packed_.count(t.storage().get()) != 0;
      const auto computed = compute_event_.find(it->first);
      const bool reachable = computed != compute_event_.end() && computed->second < last_placeholder_event_;
      if (!referenced && !reachable) {
        for (const auto& t : it->second) kept_bytes_ -= t.bytes();
        kept_refs_.erase(it->first);
        it = kept_.erase(it);
      } else {
        ++it;
      }
    }
  }

  /// checkpoint_name: lets the policy keep `x` under `name` (and skip its producer in recompute).
  void name_tensor(const Var<B>& x, std::string_view name) {
    if (replaying_) return;
    const VarImpl<B>& v = x.impl();
    const std::int64_t producer = v.hook == this ? v.op_index : -1;
    std::vector<Tensor<B>> outputs{v.value};
    const bool single_output = producer >= 0 && output_counts_.count(producer) && output_counts_[producer] == 1;
    decide(single_output ? producer : -1, OpSummary{kCheckpointNameOp, v.value.bytes(), 0.0, name}, outputs);
  }

 private:
  struct PackRecord {
    std::int64_t slot;  // -1: kept directly, not recomputed
    Shape shape;
    DType dtype;
    std::string_view op;
    std::uint64_t checksum;
    std::vector<unsigned char> bytes;
  };
  template <class Copy>
  struct Offloaded {
    std::vector<Copy> copies;
    std::vector<Tensor<B>> fetched;
  };
  template <class Backend, bool = CanOffload<Backend>>
  struct HostCopyOf {
    using type = int;  // nothing to offload to
  };
  template <class Backend>
  struct HostCopyOf<Backend, true> {
    using type = decltype(std::declval<Backend&>().offload(std::declval<const Tensor<Backend>&>()));
  };
  using HostCopy = typename HostCopyOf<B>::type;

  /// Applies the policy to outputs (op_index -1: keep without recompute skipping).
  void decide(std::int64_t op_index, const OpSummary& summary, const std::vector<Tensor<B>>& outputs) {
    PolicyDecision d = options_.policy(summary);
    if (d.decision != Decision::Recompute && d.strength == Strength::Prefer &&
        kept_bytes_ + summary.bytes > options_.memory_budget)
      d = kPreferRecompute;
    if (d.decision == Decision::Recompute) return;
    if constexpr (CanOffload<B>) {
      if (d.decision == Decision::Offload && op_index >= 0) {
        auto& entry = offloaded_[op_index];
        for (const auto& t : outputs) entry.copies.push_back(t.backend().offload(t));
        checkpoint_stats().outputs_offloaded += static_cast<std::int64_t>(outputs.size());
        return;
      }
    }
    // Save (and Offload where the backend has nowhere to offload to: the CPU).
    auto& refs = kept_refs_[op_index];  // op_index -1 collects named tensors without an op to skip
    for (const auto& t : outputs) {
      refs.push_back(std::make_shared<const SavedRef<B>>(t));
      alive_.insert(t.storage().get());
      kept_bytes_ += t.bytes();
    }
    if (op_index >= 0) kept_[op_index] = outputs;
  }

  /// Replay: the k-th save of the recompute fills the k-th save's slot of the forward.
  void fill(const Tensor<B>& tensor, const SaveInfo& info) {
    const std::size_t k = pack_cursor_++;
    detail::check<CheckpointError>(k < packs_.size(), "checkpoint: recompute is not deterministic: op '", info.op->name,
                                   "' saved tensor #", k, " but the forward saved only ", packs_.size());
    const PackRecord& r = packs_[k];
    detail::check<CheckpointError>(r.op == info.op->name && r.shape == tensor.shape() && r.dtype == tensor.dtype(),
                                   "checkpoint: recompute is not deterministic: saved tensor #", k, " was ", r.dtype,
                                   " ", r.shape, " from op '", r.op, "' in forward, but ", tensor.dtype(), " ",
                                   tensor.shape(), " from op '", info.op->name, "' in recompute");
    if (r.slot < 0) return;
    if (options_.determinism == DeterminismCheck::Checksum)
      detail::check<CheckpointError>(fnv1a(host_bytes(tensor)) == r.checksum,
                                     "checkpoint: recompute is not deterministic: values of saved tensor #", k,
                                     " (op '", r.op, "', ", r.shape, ") differ from the forward (checksum)");
    if (options_.determinism == DeterminismCheck::Bitwise)
      detail::check<CheckpointError>(host_bytes(tensor) == r.bytes,
                                     "checkpoint: recompute is not deterministic: values of saved tensor #", k,
                                     " (op '", r.op, "', ", r.shape, ") differ bitwise from the forward");
    slots_[static_cast<std::size_t>(r.slot)] = std::make_shared<const SavedRef<B>>(tensor);
    if (options_.early_stop && k == last_placeholder_pack_) throw StopRecompute{};  // every slot is filled
  }

  /// Thrown through fn to end a recompute early; never escapes the region.
  struct StopRecompute {};

  void recompute() {
    ++checkpoint_stats().recomputes;
    std::vector<Var<B>> inputs;
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      auto impl = std::make_shared<VarImpl<B>>();
      impl->value = inputs_[i].unpack();
      tape_.adopt(*impl);
      impl->requires_grad = input_requires_grad_[i];
      if (impl->requires_grad) impl->grad_slot = std::make_shared<GradSlot<B>>();
      inputs.emplace_back(std::move(impl));
    }
    if constexpr (CanOffload<B>) {
      for (auto& [index, entry] : offloaded_) {
        entry.fetched.clear();
        for (auto& copy : entry.copies) entry.fetched.push_back(tape_.backend().fetch(copy));
      }
    }
    std::vector<std::unique_ptr<Node<B>>> scratch;
    {
      typename Tape<B>::RecordInto record_into(tape_, scratch);
      typename ReplayState<B>::Scope scope(tape_, replay_);
      ReplayGuard replay(*this);
      tape_.push_hook(this);
      struct PopHook {
        Tape<B>& tape;
        ~PopHook() { tape.pop_hook(); }
      } pop{tape_};
      try {
        body_(inputs);
        detail::check<CheckpointError>(pack_cursor_ == packs_.size(),
                                       "checkpoint: recompute is not deterministic: "
                                       "the forward saved ",
                                       packs_.size(), " tensors, the recompute ", pack_cursor_);
      } catch (const StopRecompute&) {
      }
    }
    if constexpr (CanOffload<B>) {
      for (auto& [index, entry] : offloaded_) entry.fetched.clear();
    }
  }

  /// Puts the region in replay mode with fresh op and save cursors.
  struct ReplayGuard {
    Region& region;
    explicit ReplayGuard(Region& r) : region(r) {
      region.replaying_ = true;
      region.next_op_ = 0;
      region.pack_cursor_ = 0;
    }
    ~ReplayGuard() { region.replaying_ = false; }
  };

  Tape<B>& tape_;
  CheckpointOptions options_;
  Body body_;
  ReplayState<B> replay_;
  std::vector<SavedTensor<B>> inputs_;
  std::vector<bool> input_requires_grad_;
  std::set<const void*> alive_;  // storages that are alive anyway: saved directly
  std::unordered_map<std::int64_t, std::vector<Tensor<B>>> kept_;
  std::unordered_map<std::int64_t, std::size_t> output_counts_;
  std::unordered_map<std::int64_t, Offloaded<HostCopy>> offloaded_;
  std::unordered_map<std::int64_t, std::vector<std::shared_ptr<const SavedRef<B>>>> kept_refs_;
  std::set<const void*> packed_;  // storages some op saved (directly or as a placeholder)
  std::unordered_map<std::int64_t, std::int64_t> compute_event_;
  std::int64_t events_ = 0;  // packs and computes of the forward, in order
  std::int64_t last_placeholder_event_ = -1;
  std::size_t last_placeholder_pack_ = std::numeric_limits<std::size_t>::max();
  std::size_t kept_bytes_ = 0;
  std::vector<PackRecord> packs_;
  std::vector<std::shared_ptr<const SavedRef<B>>> slots_;
  std::int64_t next_op_ = 0;
  std::size_t pack_cursor_ = 0;
  bool replaying_ = false;
};

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
  auto region = std::make_shared<detail::Region<B>>(tape, options, std::move(body));
  region->save_inputs(std::vector<Var<B>>{inputs...});
  ++checkpoint_stats().regions;
  tape.push_hook(region.get());
  struct PopHook {
    Tape<B>& tape;
    ~PopHook() { tape.pop_hook(); }
  } pop{tape};
  auto result = (*shared_fn)(inputs...);
  region->finish_forward();
  return result;
}

/// checkpoint with the default options: full recompute, metadata determinism check.
template <class B, class Fn, class... Inputs>
auto checkpoint(Tape<B>& tape, Fn&& fn, const Var<B>& first, const Inputs&... rest) {
  return checkpoint(tape, CheckpointOptions{}, std::forward<Fn>(fn), first, rest...);
}

/// Names x for checkpoint policies (policy::save_names); returns x. Outside a region it does nothing.
template <class B>
const Var<B>& checkpoint_name(const Var<B>& x, std::string_view name) {
  Tape<B>* tape = x.tape();
  if (tape == nullptr || !grad_enabled()) return x;
  if (auto* region = dynamic_cast<detail::Region<B>*>(tape->hook())) region->name_tensor(x, name);
  return x;
}

}  // namespace trainmem
