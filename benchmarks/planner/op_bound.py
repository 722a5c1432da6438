#!/usr/bin/env python3
"""op_bound.py — a lower bound on any checkpoint schedule of the planner benchmark's
transformer, op by op: how close to the plain step a budget allows even a schedule that
chooses what to keep tensor by tensor, inside blocks, and pays no transient.

Reads the JSON of `planner --models transformer --op-times` (the profile of the stage per
block, and one block's forward timed op by op). For one block, every set of tensors to
keep is priced: its bytes, plus the forward time of every op that must run again to
bring back the tensors backward needs (ops whose inputs are dropped run again too;
feed_forward, needed for z only, runs its first linear). Dropping a block's input costs
the forward of the stage before it. The embedding and the head take their profiled
modes. Two moments bound what may be kept: the start of backward, when every kept byte
and the loss's are live; and the start of the last block's MLP backward, when the loss
and the head have let go of theirs but feed_forward's backward reads z and its input b
at once, beside everything the earlier stages keep. The least added time over all
choices that fit the budget at both is a lower bound on every schedule: a real one also
holds more of a recompute's transient and cannot cut where it likes.

    benchmarks/planner/op_bound.py results/planner.json
"""
import itertools
import json
import sys

BLOCK_OPS = ["layer_norm", "linear", "split_heads", "linear", "split_heads", "linear", "split_heads",
             "scaled_dot_product_attention", "merge_heads", "linear", "add", "layer_norm", "feed_forward", "add"]


def block_graph(ops, dim_bytes):
    """Tensors of nn::TransformerBlock (no dropout): name -> (bytes, producing op, its inputs)."""
    ms = {i: o["ms"] for i, o in enumerate(ops)}
    first_linear = next(o["ms"] for o in ops if o["op"] == "feed_forward.first_linear")
    stats = ops[0]["output_bytes"] - dim_bytes           # LayerNorm's mean and rstd
    lse = ops[7]["output_bytes"] - dim_bytes             # attention's log-sum-exp
    z = ops[12]["output_bytes"] - dim_bytes              # feed_forward's z (its output y is not saved)
    # op name -> (ms, inputs); tensor -> (bytes, op)
    op = {"ln1": (ms[0], ["x"]), "q_proj": (ms[1], ["a"]), "q_split": (ms[2], ["q0"]), "k_proj": (ms[3], ["a"]),
          "k_split": (ms[4], ["k0"]), "v_proj": (ms[5], ["a"]), "v_split": (ms[6], ["v0"]),
          "attention": (ms[7], ["q", "k", "v"]), "merge": (ms[8], ["o"]), "out_proj": (ms[9], ["m"]),
          "residual": (ms[10], ["x", "p"]), "ln2": (ms[11], ["h"]), "ffn_first_linear": (first_linear, ["b"])}
    tensor = {"a": (dim_bytes, "ln1"), "a_stats": (stats, "ln1"), "q0": (dim_bytes, "q_proj"),
              "k0": (dim_bytes, "k_proj"), "v0": (dim_bytes, "v_proj"), "q": (dim_bytes, "q_split"),
              "k": (dim_bytes, "k_split"), "v": (dim_bytes, "v_split"), "o": (dim_bytes, "attention"),
              "lse": (lse, "attention"), "m": (dim_bytes, "merge"), "p": (dim_bytes, "out_proj"),
              "h": (dim_bytes, "residual"), "b": (dim_bytes, "ln2"), "b_stats": (stats, "ln2"),
              "z": (z, "ffn_first_linear")}
    saved = ["a", "a_stats", "q", "k", "v", "lse", "m", "h", "b", "b_stats", "z"]  # what backward reads, x aside
    return op, tensor, saved


def block_frontier(op, tensor, saved, x_bytes):
    """(kept bytes, added ms, kept set) for every keep set not beaten on both."""
    best = {}
    names = sorted(tensor)
    for r in range(len(names) + 1):
        for keep in itertools.combinations(names, r):
            keep = set(keep)
            run = set()

            def need(t):
                if t == "x" or t in keep:
                    return
                o = tensor[t][1]
                if o not in run:
                    run.add(o)
                    for i in op[o][1]:
                        need(i)

            for t in saved:
                need(t)
            kept = x_bytes + sum(tensor[t][0] for t in keep)
            ms = sum(op[o][0] for o in run)
            if kept not in best or ms < best[kept][0]:
                best[kept] = (ms, sorted(keep))
    frontier = []
    for kept in sorted(best):
        ms, keep = best[kept]
        if not frontier or ms < frontier[-1][1] - 1e-12:
            frontier.append((kept, ms, keep))
    return frontier


def pareto(choices, budget, quantum=4096):
    """{kept quanta: least total ms} picking one (bytes, ms) per stage, total bytes <= budget."""
    best = {0: 0.0}
    for options in choices:
        nxt = {}
        for used, ms in best.items():
            for b, m in options:
                u = used + b // quantum  # bytes rounded down: the bound stays a bound
                if u * quantum > budget:
                    continue
                if u not in nxt or ms + m < nxt[u]:
                    nxt[u] = ms + m
        pruned, least = {}, float("inf")
        for u in sorted(nxt):
            if nxt[u] < least - 1e-12:
                pruned[u], least = nxt[u], nxt[u]
        best = pruned
    return best


def main(path):
    run = json.load(open(path))
    if run.get("precision", "f32") != "f32":
        # Under autocast the block's tensors differ in size (the residual stream F32, the
        # products 16-bit) and casts join its ops: this graph does not describe that block.
        sys.exit(f"op_bound.py: {path} ran with --precision {run['precision']}; the op-level bound models "
                 "the F32 block only (the stage-level 'profile bound' lines of the run still hold)")
    prof = run["profiles"]["transformer"]
    ops = run["block_op_ms"]["transformer"]
    assert [o["op"] for o in ops[:len(BLOCK_OPS)]] == BLOCK_OPS, "not the block this bound knows"
    stages = prof["stages"]
    dim_bytes = ops[1]["output_bytes"]
    op, tensor, saved = block_graph(ops, dim_bytes)
    frontier = block_frontier(op, tensor, saved, dim_bytes)
    assert frontier[-1][0] == stages[1]["kept_saved_bytes"][0], "the block's plain kept bytes disagree"
    plain_ms, plain_saved = prof["plain_ms"], prof["plain_peak_saved_bytes"]
    block_fwd = sum(o["ms"] for o in ops[:len(BLOCK_OPS)])
    print(f"one block, op by op: forward {block_fwd:.3f} ms (the profile's plain stage: "
          f"{stages[1]['fwd_ms'][0]:.3f} ms); plain step {plain_ms:.2f} ms")
    print("keep sets no other beats on both bytes and time (x, the block's input, always kept):")
    for kept, ms, keep in frontier:
        print(f"  {kept:9d} B  +{ms:.3f} ms  {' '.join(keep) or '(x only)'}")
    # Stage choices: (kept bytes, added ms). Blocks: the frontier, or with their input dropped too.
    def profiled(s):
        return [(s["kept_saved_bytes"][m], max(0.0, s["bwd_ms"][m] - s["bwd_ms"][0])) for m in range(len(s["kept_saved_bytes"]))]
    choices = [profiled(stages[0])]
    for i in range(1, len(stages) - 1):
        options = [(k, ms) for k, ms, _ in frontier]
        options += [(k - dim_bytes, ms + stages[i - 1]["fwd_ms"][0]) for k, ms, _ in frontier]
        choices.append(options)
    choices.append(profiled(stages[-1]))
    loss = plain_saved - sum(s["kept_saved_bytes"][0] for s in stages)
    mlp_reads = tensor["b"][0] + tensor["b_stats"][0] + tensor["z"][0]  # feed_forward's backward
    q = 4096
    rows = []
    for frac in (0.5, 0.25, 0.1):
        budget = int(frac * plain_saved)
        at_start = min(pareto(choices, budget - loss, q).values(), default=float("inf"))
        # Embedding and blocks but the last, then the last block and the head on top.
        before_last = pareto(choices[:-2], budget - mlp_reads, q)
        both = float("inf")
        for used, ms in before_last.items():
            for k_last, ms_last in choices[-2]:
                for k_head, ms_head in choices[-1]:
                    if used * q + (k_last + k_head) // q * q + loss <= budget:
                        both = min(both, ms + ms_last + ms_head)
        rows.append({"budget_fraction": frac, "added_ms_start_of_backward": at_start, "added_ms": both,
                     "time_ratio_lower_bound": 1 + both / plain_ms})
        print(f"budget {frac:.2f} of plain saved ({budget} B): any schedule adds >= {at_start:.2f} ms by the start "
              f"of backward ({1 + at_start / plain_ms:.3f}x the plain step), >= {both:.2f} ms with the last "
              f"block's MLP backward too ({1 + both / plain_ms:.3f}x)")
    return rows


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/planner.json")
