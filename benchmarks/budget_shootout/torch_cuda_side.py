#!/usr/bin/env python3
"""torch_cuda_side.py — PyTorch's side of the fixed-budget shoot-out on the GPU, and the merged results.

The GPT of torch_side.py's build_model (the same weights, exported by
trainmem_cuda_budget_shootout --export) on the CUDA device: torch.autocast("cuda",
bfloat16) around the forward, cross-entropy in f32, torch.optim.AdamW(fused=True) with
f32 parameters (its masters) and the exported learning rate. For each budget and each
hand schedule — none; every block under torch.utils.checkpoint; checkpoint_sequential
with round(sqrt(N)) segments; every block checkpointed inside
torch.autograd.graph.save_on_cpu (offload) — it finds the largest batch whose
steady-state step fits, then times --timed-steps steps there from the initial weights
(median after two warm-ups; each step ends with loss.item(), as on trainmem's side).
At the first budget it also trains the exported number of steps at trainmem's batch
(per-block checkpointing: the plain step would not fit), so the losses compare on the
same weights, data and batch.

Peak bytes: torch.cuda.max_memory_allocated() over one steady-state step (the moments
exist), reset just before it with the batch already on the device: every block the
caching allocator hands out — parameters, gradients, AdamW moments, activations, the
autocast weight cache, cuBLAS/cuDNN workspaces, the batch — each rounded up to the
allocator's 512-byte granularity; pinned host copies are not device bytes. trainmem
counts the same on its side (MemoryStats::peak_device(), requested bytes). A step that
runs out of device memory does not fit.

The search (batch_search.py, shared with the CPU side): the measured peaks of two small
batches (--bracket) give a first guess, steps of 1, 2, 4, ... bracket it, bisection ends it.

  torch_cuda_side.py --export DIR --trainmem trainmem.json --out DIR [--budgets-gib 40,24,64]
                     [--schedules none,per_block,sqrt,offload] [--timed-steps 5] [--bracket 1,2]
                     [--time-limit-s 0]
Writes DIR/budget_shootout_<gpu>_<date>.json (rows: side, schedule, budget_mib, batch,
tokens_per_step, us_per_token, peak_bytes, losses) and .md.
"""
import argparse
import datetime
import gc
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here))
import batch_search  # noqa: E402
from torch_side import build_model  # noqa: E402  (also puts benchmarks/pytorch on the path)

sys.path.insert(0, str(here.parent / "common"))
import provenance  # noqa: E402  (common/provenance.py: the record every results file carries)

SCHEDULES = ["none", "per_block", "sqrt", "offload"]


class Trainer:
    """One model on the GPU for every schedule and batch; reset() puts the initial weights back."""

    def __init__(self, torch, manifest, text):
        self.torch, self.manifest, self.text = torch, manifest, text
        self.seq = manifest["sizes"]["seq"]
        with torch.device("cuda"):  # parameters made on the device (their random init is overwritten)
            self.model = build_model(torch, manifest, "sdpa")
        self.weights = np.fromfile(Path(manifest["dir"]) / manifest["weights"], dtype="<f4")
        self.schedule = "none"
        self.optimizer = None
        self.reset()

    def reset(self):
        torch = self.torch
        self.optimizer = None
        named = dict(self.model.named_parameters())
        with torch.no_grad():
            for p in self.manifest["params"]:
                n = int(np.prod(p["shape"]))
                value = torch.from_numpy(self.weights[p["offset"]:p["offset"] + n])
                named[p["name"]].copy_(value.view(named[p["name"]].shape))
                named[p["name"]].grad = None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.manifest["lr"], fused=True)
        self.free()

    def free(self):
        gc.collect()
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def batch(self, step, batch):
        n, seq = len(self.text), self.seq
        starts = ((step * batch + np.arange(batch)) * 7919) % (n - seq - 1)
        windows = np.stack([self.text[o:o + seq + 1] for o in starts]).astype(np.int64)
        return (self.torch.from_numpy(windows[:, :-1].copy()).cuda(),
                self.torch.from_numpy(windows[:, 1:].reshape(-1).copy()).cuda())

    def step(self, step, batch, ids_labels=None):
        import torch.nn.functional as F
        torch = self.torch
        ids, labels = ids_labels or self.batch(step, batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model(ids, self.schedule)
        loss = F.cross_entropy(logits.float(), labels)
        del logits
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def peak(self, batch):
        """Peak device bytes of one steady-state step at `batch` sequences; None if the device ran out."""
        torch = self.torch
        try:
            ids_labels = self.batch(0, batch)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.step(0, batch, ids_labels)
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        except torch.cuda.OutOfMemoryError:
            self.optimizer.zero_grad(set_to_none=True)
            return None
        finally:
            ids_labels = None
            self.free()


def timed(trainer, schedule, batch, steps):
    trainer.reset()
    trainer.schedule = schedule
    torch = trainer.torch
    losses, ms = [], []
    torch.cuda.reset_peak_memory_stats()
    peak = 0
    for k in range(steps):
        torch.cuda.synchronize()
        if k == 1:
            torch.cuda.reset_peak_memory_stats()  # after the first step made the moments
        t0 = time.perf_counter()
        losses.append(trainer.step(k, batch))
        ms.append((time.perf_counter() - t0) * 1e3)
        if k >= 1:
            peak = torch.cuda.max_memory_allocated()
    median_ms = statistics.median(ms[min(2, steps - 1):])
    tokens = batch * trainer.seq
    return {"batch": batch, "tokens_per_step": tokens, "losses": losses, "step_ms": ms, "median_step_ms": median_ms,
            "us_per_token": 1e3 * median_ms / tokens, "steady_peak_bytes": peak}


def slug(name):
    """The GPU's model for a file name: "NVIDIA H100 80GB HBM3" -> "h100" (else the whole name)."""
    model = re.search(r"\b([A-Z]\d{2,4})\b", name)
    return model.group(1).lower() if model else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def summarize(rows, budgets):
    summary = []
    for mib in budgets:
        t = next((r for r in rows if r["side"] == "trainmem" and r.get("budget_mib") == mib and r.get("batch")), None)
        fitting = [r for r in rows if r["side"] == "pytorch" and r["budget_mib"] == mib and r.get("batch")
                   and "us_per_token" in r]
        if not t or not fitting:
            continue
        best = max(fitting, key=lambda r: (r["tokens_per_step"], -r["us_per_token"]))
        summary.append({"budget_mib": mib, "token_ratio": t["tokens_per_step"] / best["tokens_per_step"],
                        "time_ratio": t["us_per_token"] / best["us_per_token"],
                        "best_torch_schedule": best["schedule"], "trainmem_batch": t["batch"],
                        "torch_batch": best["batch"]})
    return summary


def report(result, out_dir):
    gib = 2**30
    lines = [f"# Fixed-budget shoot-out on {result['gpu']}: trainmem vs PyTorch {result['torch_version']} eager", "",
             f"{result['date']}. GPT: {result['sizes']['blocks']} blocks, dim {result['sizes']['dim']}, "
             f"{result['sizes']['heads']} heads, MLP {result['sizes']['hidden']}, sequence {result['sizes']['seq']}, "
             f"vocabulary {result['sizes']['vocab']} ({result['parameters'] / 1e9:.2f} B parameters); BF16 autocast, "
             "f32 masters, AdamW. Peak: every device byte the allocator hands out during a steady-state step "
             "(trainmem: MemoryStats::peak_device; PyTorch: torch.cuda.max_memory_allocated).", "",
             "| budget | side | schedule | sequences | tokens/step | µs/token | peak GiB | loss step 1 | last loss |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        if not r.get("batch") or "losses" not in r:
            lines.append(f"| {r['budget_mib'] / 1024:.0f} GiB | {r['side']} | {r['schedule']} | "
                         f"{r.get('note', 'does not fit')} | | | | | |")
            continue
        lines.append(f"| {r['budget_mib'] / 1024:.0f} GiB | {r['side']} | {r['schedule']} | {r['batch']} | "
                     f"{r['tokens_per_step']} | {r['us_per_token']:.2f} | {r['peak_bytes'] / gib:.2f} | "
                     f"{r['losses'][0]:.4f} | {r['losses'][-1]:.4f} (step {len(r['losses'])}) |")
    lines += ["", "| budget | tokens/step vs best PyTorch | µs/token ratio | best PyTorch schedule |", "|---:|---:|---:|---|"]
    for s in result["summary"]:
        lines.append(f"| {s['budget_mib'] / 1024:.0f} GiB | {s['token_ratio']:.2f}x | {s['time_ratio']:.2f} | "
                     f"{s['best_torch_schedule']} |")
    c = result.get("loss_comparison")
    if c:
        lines += ["", f"Losses at trainmem's batch ({c['batch']} sequences, {c['budget_mib'] / 1024:.0f} GiB): "
                  f"trainmem {c['trainmem_loss']:.4f}, PyTorch ({c['schedule']}) {c['torch_loss']:.4f} after "
                  f"{c['steps']} steps ({c['rel_diff'] * 100:.2f}%)."]
    stem = f"budget_shootout_{slug(result['gpu_name'])}_{result['date']}"
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(lines), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", required=True, help="folder trainmem_cuda_budget_shootout --export wrote")
    ap.add_argument("--trainmem", required=True, help="trainmem's JSON (its rows; may be missing: PyTorch alone)")
    ap.add_argument("--out", required=True, help="where budget_shootout_<gpu>_<date>.json and .md go")
    ap.add_argument("--budgets-gib", default="40,24,64", help="the first is the one the losses are compared at")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--timed-steps", type=int, default=5, help="steps at each largest batch (median after 2)")
    ap.add_argument("--bracket", default="1,2", help="two small batches whose peaks bracket the search")
    ap.add_argument("--time-limit-s", type=float, default=0, help="start no search after this many seconds (0: none)")
    args = ap.parse_args()
    start = time.perf_counter()

    import torch
    if not torch.cuda.is_available():
        print("torch_cuda_side: no CUDA device", file=sys.stderr)
        return 77
    torch.backends.cuda.matmul.allow_tf32 = False  # trainmem's f32 GEMMs use no TF32 either
    manifest = json.loads((Path(args.export) / "manifest.json").read_text())
    manifest["dir"] = args.export
    text = np.frombuffer(Path(manifest["text"]).read_bytes(), dtype=np.uint8)
    budgets = [float(b) * 1024 for b in args.budgets_gib.split(",")]
    bracket = tuple(int(b) for b in args.bracket.split(","))
    try:
        trainmem = json.loads(Path(args.trainmem).read_text())
    except (OSError, ValueError) as e:
        print(f"torch_cuda_side: no trainmem results ({e}); PyTorch alone", flush=True)
        trainmem = {"rows": []}
    props = torch.cuda.get_device_properties(0)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "budget_shootout", "provenance": provenance.provenance(1, f"{props.name}, CUDA {torch.version.cuda}"),
              "date": datetime.date.today().isoformat(), "gpu": f"{props.name}, {props.total_memory / 2**30:.0f} GiB",
              "gpu_name": props.name, "torch_version": torch.__version__, "sizes": manifest["sizes"],
              "parameters": manifest.get("parameter_count", int(manifest["params"][-1]["offset"])),
              "steps": manifest["steps"], "rows": [], "summary": []}
    trainmem_rows = [dict(r, side="trainmem", peak_bytes=r.get("steady_peak_bytes", 0))
                     for r in trainmem.get("rows", []) if r.get("schedule") == "planner"]

    def log(msg):
        print(msg, flush=True)

    def save():
        result["rows"] = torch_rows + [r for r in trainmem_rows if r["budget_mib"] in budgets]
        result["summary"] = summarize(result["rows"], budgets)
        result["elapsed_s"] = time.perf_counter() - start
        report(result, out_dir)

    trainer = Trainer(torch, manifest, text)
    log(f"torch_cuda_side: model on {props.name} in {time.perf_counter() - start:.0f} s")
    trainer.schedule = "none"
    trainer.step(0, bracket[0])  # the moments exist from here on: every probe is a steady-state step
    torch_rows, measured = [], {}
    for i, mib in enumerate(budgets):
        budget = int(mib * 2**20)
        for schedule in args.schedules.split(","):
            row = {"side": "pytorch", "schedule": schedule, "budget_mib": mib}
            if args.time_limit_s and time.perf_counter() - start > args.time_limit_s:
                log(f"budget {mib / 1024:.0f} GiB, {schedule}: not started, past the {args.time_limit_s:.0f} s limit")
                torch_rows.append(dict(row, note="not run (time limit)"))
                continue
            trainer.schedule = schedule
            peaks = measured.setdefault(schedule, {})  # a batch's peak holds for every budget

            def peak(n):
                if n not in peaks:
                    peaks[n] = trainer.peak(n)
                return peaks[n]

            batch, peak_bytes = batch_search.largest_batch(peak, budget, bracket, log, f"{schedule}: ")
            row.update(batch=batch, peak_bytes=peak_bytes)
            if batch:
                try:
                    row.update(timed(trainer, schedule, batch, args.timed_steps), peak_bytes=peak_bytes)
                except torch.cuda.OutOfMemoryError:  # fitted in its probe, not over several steps
                    trainer.free()
                    torch_rows.append(dict(row, batch=0, note=f"{batch} fitted once, then ran out of memory"))
                    save()
                    continue
                log(f"budget {mib / 1024:.0f} GiB, {schedule}: {batch} sequences, {row['us_per_token']:.2f} us/token, "
                    f"peak {peak_bytes / 2**30:.2f} GiB")
            torch_rows.append(row)
            save()
        t = next((r for r in trainmem_rows if r["budget_mib"] == mib and r.get("batch")), None)
        if i == 0 and t:  # the losses, at trainmem's batch, from the same weights on the same windows
            for schedule in ("per_block", "offload"):
                try:
                    same = timed(trainer, schedule, t["batch"], len(t["losses"]))
                except torch.cuda.OutOfMemoryError:
                    trainer.free()
                    continue
                result["loss_comparison"] = {
                    "budget_mib": mib, "batch": t["batch"], "schedule": schedule, "steps": len(t["losses"]),
                    "trainmem_loss": t["losses"][-1], "torch_loss": same["losses"][-1],
                    "rel_diff": abs(t["losses"][-1] - same["losses"][-1]) / abs(same["losses"][-1]),
                    "trainmem_losses": t["losses"], "torch_losses": same["losses"]}
                break
            save()
    save()
    log(f"torch_cuda_side: done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
