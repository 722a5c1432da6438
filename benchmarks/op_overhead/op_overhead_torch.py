#!/usr/bin/python3
"""op_overhead_torch.py — PyTorch eager's side of benchmarks/op_overhead, and the table of all three.

  op_overhead_torch.py measure --json PATH [--chain 64] [--reps 31] [--warmup 3] [--threads 1]
      host time per op, forward + backward, on [4, 4] F32 tensors: the cases, chain and timing
      of bin/op_overhead (trainmem) and op_overhead_libtorch (PyTorch's C++ API), in Python
  op_overhead_torch.py report --runs DIR --results DIR
      DIR holds <side>_<round>.json for the sides trainmem, libtorch and pytorch; writes
      results/op_overhead.md and .json: per op the median over rounds of each round's median

Each case applies one op `chain` times to a leaf x (a [4, 4] weight w, or [4] vectors v, v2
as the other operands), then sum and backward; the graph goes with the last reference to
its output. Time per op = step time / chain, median over `reps` steps after `warmup`.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import provenance  # noqa: E402  (common/provenance.py: the record every results file carries)

SIDES = [("trainmem", "trainmem"), ("libtorch", "libtorch C++"), ("pytorch", "PyTorch eager")]


def measure(args):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    cases = [
        ("add", lambda y, w, v, v2: y + w),
        ("mul", lambda y, w, v, v2: y * w),
        ("relu", lambda y, w, v, v2: torch.relu(y)),
        ("gelu", lambda y, w, v, v2: F.gelu(y, approximate="tanh")),
        ("matmul", lambda y, w, v, v2: torch.matmul(y, w)),
        ("linear", lambda y, w, v, v2: F.linear(y, w, v)),
        ("softmax", lambda y, w, v, v2: torch.softmax(y, -1)),
        ("layer_norm", lambda y, w, v, v2: F.layer_norm(y, (4,), v, v2, 1e-5)),
    ]

    def leaf(shape, value):
        return torch.full(shape, value, dtype=torch.float32).requires_grad_(True)

    print(f"PyTorch {torch.__version__} eager host time per op, forward + backward, [4, 4] F32 tensors, chains of "
          f"{args.chain} ops, median of {args.reps} steps, {args.threads} intra-op threads\n\n"
          f"{'op':<12} {'us per op':>14} {'best us':>14}")
    out = []
    for name, apply in cases:
        per_op_us = []
        for r in range(args.warmup + args.reps):
            x, w, v, v2 = leaf((4, 4), 0.5), leaf((4, 4), 0.25), leaf((4,), 1.0), leaf((4,), 0.0)
            t0 = time.perf_counter()
            y = x
            for _ in range(args.chain):
                y = apply(y, w, v, v2)
            y.sum().backward()
            del y
            us = (time.perf_counter() - t0) * 1e6
            if r >= args.warmup:
                per_op_us.append(us / args.chain)
        med, best = statistics.median(per_op_us), min(per_op_us)
        print(f"{name:<12} {med:14.3f} {best:14.3f}")
        out.append({"op": name, "us_per_op_median": med, "us_per_op_best": best, "chain": args.chain,
                    "reps": args.reps, "side": "pytorch", "version": torch.__version__})
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


def cpu_description():
    fields = {}
    try:
        for line in open("/proc/cpuinfo"):
            if ":" in line:
                k, v = (x.strip() for x in line.split(":", 1))
                fields.setdefault(k, v)
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    isa = " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16") if f in flags)
    return (f"{fields.get('model name', '?')} ({fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} "
            f"model {fields.get('model', '?')}; {isa}), nproc {os.cpu_count()}, Linux {platform.release()}")


def report(args):
    runs, results = Path(args.runs), Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    figures, best, versions, rounds = {}, {}, {}, {}
    for side, _ in SIDES:
        for path in sorted(runs.glob(f"{side}_*.json")):
            rounds[side] = rounds.get(side, 0) + 1
            held = json.loads(path.read_text())
            for row in held["rows"] if isinstance(held, dict) else held:  # trainmem's: provenance and rows
                figures.setdefault(side, {}).setdefault(row["op"], []).append(row["us_per_op_median"])
                best.setdefault(side, {}).setdefault(row["op"], []).append(row["us_per_op_best"])
                versions[side] = row.get("version", "")
    if "trainmem" not in figures:
        sys.exit(f"report: no trainmem_*.json under {runs}")
    settings = json.loads((runs / "settings.json").read_text()) if (runs / "settings.json").exists() else {}
    sides = [(s, label) for s, label in SIDES if s in figures]
    ops = list(figures["trainmem"])
    table = {op: {s: statistics.median(figures[s][op]) for s, _ in sides if op in figures[s]} for op in ops}
    best_table = {op: {s: min(best[s][op]) for s, _ in sides if op in best[s]} for op in ops}
    record = provenance.provenance(settings.get("threads", 1))
    for path in (results / "op_overhead.json", results / "op_overhead.md"):
        provenance.check_writable(path, record)
    meta = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "provenance": record,
            "machine": cpu_description(),
            "loadavg_at_report": [round(x, 2) for x in os.getloadavg()], "rounds": rounds, "versions": versions,
            "settings": settings}
    (results / "op_overhead.json").write_text(json.dumps({"meta": meta, "us_per_op": table, "best_us_per_op": best_table}, indent=2) + "\n")
    label = dict(sides)
    lines = ["# Host time per op: trainmem, libtorch C++ and PyTorch eager", "",
             f"- Date: {meta['date']}",
             f"- Commit {record['commit']}; machine {record['machine']}; command `{record['command']}`",
             f"- Machine: {meta['machine']}; load average at report time {meta['loadavg_at_report']} (the machine is "
             "shared with other benchmark runs: compare the ratios, which come from one run)",
             f"- Each side: one op applied {settings.get('chain', '?')} times in a row to [4, 4] F32 tensors, then sum "
             f"and backward (and, for trainmem, Tape::clear); time per op = step time / chain, the median over "
             f"{settings.get('reps', '?')} steps; each figure the median over {max(rounds.values())} fresh processes "
             f"per side, the sides alternating; {settings.get('threads', '?')} thread (OMP_NUM_THREADS, "
             "torch.set_num_threads): what is measured is the host's bookkeeping, not the kernels",
             "- Sides: trainmem (bin/op_overhead)"
             + (f"; libtorch {versions['libtorch']} C++ API (op_overhead_libtorch, linked against the wheel's "
                "libtorch_cpu)" if "libtorch" in figures else "")
             + (f"; PyTorch {versions['pytorch']} eager from Python (op_overhead_torch.py)" if "pytorch" in figures
                else ""),
             ""]
    for title, t in (("Median µs per op (median over the processes of each one's median step):", table),
                     ("Best µs per op (the fastest step of any process: the figure least disturbed by the "
                      "other work on the machine):", best_table)):
        lines += [title, "", "| op | " + " | ".join(f"{label[s]} µs" for s, _ in sides)
                  + "".join(f" | trainmem / {label[s]}" for s, _ in sides if s != "trainmem") + " |",
                  "|---|" + "---|" * (2 * len(sides) - 1)]
        for op in ops:
            row = t[op]
            cells = [f"{row[s]:.2f}" if s in row else "—" for s, _ in sides]
            ratios = [f"{row['trainmem'] / row[s]:.2f}" if s in row else "—" for s, _ in sides if s != "trainmem"]
            lines.append(f"| {op} | " + " | ".join(cells + ratios) + " |")
        lines.append("")
    lines += ["Ratios below 1: trainmem spends less host time per op."]
    (results / "op_overhead.md").write_text("\n".join(lines) + "\n")
    print((results / "op_overhead.md").read_text())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("measure")
    p.add_argument("--json", required=True)
    p.add_argument("--chain", type=int, default=64)
    p.add_argument("--reps", type=int, default=31)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p = sub.add_parser("report")
    p.add_argument("--runs", required=True)
    p.add_argument("--results", required=True)
    args = parser.parse_args()
    measure(args) if args.command == "measure" else report(args)


if __name__ == "__main__":
    main()
