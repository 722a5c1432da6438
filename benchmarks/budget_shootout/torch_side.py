#!/usr/bin/env python3
"""torch_side.py — PyTorch's side of the fixed-budget shoot-out, and the report.

The same GPT as gpt.hpp, written the way a PyTorch 2.x user writes it (nn.Linear,
nn.LayerNorm, F.scaled_dot_product_attention with is_causal=True, tanh GELU,
torch.autocast(bfloat16) around the forward, torch.optim.AdamW), loaded from the
weights budget_shootout exported, trained on the same byte windows of the same text.
For each budget and each hand schedule (none; every block under
torch.utils.checkpoint(use_reentrant=False); checkpoint_sequential with round(sqrt(N))
segments; build_model also has "offload", every block checkpointed inside
torch.autograd.graph.save_on_cpu, which torch_cuda_side.py runs on the GPU) it finds the largest batch whose steady-state step peak fits, then trains
--timed-steps steps there: time per token (median step after two warm-ups). It also
trains the exported number of steps (20) at each batch trainmem chose, unchecked by any
budget, so the two losses compare at one batch size on the same weights and data.

Peak bytes, as trainmem's MemoryStats counts them: every byte c10's CPU allocator hands
out during one steady-state step (the profiler's memory records, replayed in order), on
top of what is alive before it (parameters, AdamW moments and step counts, the batch);
compare.py's profiled_peak does the counting.

  torch_side.py --export DIR --trainmem trainmem.json --out DIR [--budgets-mib 128,256,512]
                [--threads 2] [--schedules none,per_block,sqrt] [--attention sdpa|explicit]
"""
import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import batch_search  # noqa: E402  (the search, shared with torch_cuda_side.py)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pytorch"))
from compare import profiled_peak  # noqa: E402  (the same counting as the side-by-side benchmark)
from compare import provenance  # noqa: E402  (common/provenance.py, which compare imports)

SCHEDULES = ["none", "per_block", "sqrt"]


def build_model(torch, manifest, attention):
    import torch.nn as nn
    import torch.nn.functional as F
    s = manifest["sizes"]
    d, heads, seq = s["dim"], s["heads"], s["seq"]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))

        def forward(self, x):
            b, t, _ = x.shape

            def split(z):
                return z.view(b, t, heads, d // heads).transpose(1, 2)

            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            if attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // heads))
                mask = torch.ones(t, t, dtype=torch.bool).triu(1)
                y = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
            return self.out(y.transpose(1, 2).reshape(b, t, d))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(d, s["hidden"]), nn.Linear(s["hidden"], d)

        def forward(self, x):
            return self.down(F.gelu(self.up(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(d), Attention(), nn.LayerNorm(d), Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(s["vocab"], d)
            self.position = nn.Parameter(torch.zeros(seq * d))
            self.blocks = nn.ModuleList(Block() for _ in range(s["blocks"]))
            self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, s["vocab"])

        def forward(self, ids, schedule):
            from torch.utils.checkpoint import checkpoint, checkpoint_sequential
            b, t = ids.shape
            x = self.tokens(ids) + self.position.view(t, d)
            if schedule == "per_block":
                for block in self.blocks:
                    x = checkpoint(block, x, use_reentrant=False)
            elif schedule == "offload":
                # Per-block checkpoints whose saved inputs go to pinned host memory. Reentrant:
                # its inputs are saved tensors that save_on_cpu's hooks move (the non-reentrant
                # checkpoint keeps them by reference, on the device).
                with torch.autograd.graph.save_on_cpu(pin_memory=True):
                    for block in self.blocks:
                        x = checkpoint(block, x, use_reentrant=True)
            elif schedule == "sqrt":
                x = checkpoint_sequential(self.blocks, round(math.sqrt(len(self.blocks))), x, use_reentrant=False)
            else:
                for block in self.blocks:
                    x = block(x)
            return self.head(self.ln_f(x)).view(b * t, -1)

    model = Gpt()
    weights = np.fromfile(Path(manifest["dir"]) / manifest["weights"], dtype="<f4")
    named = dict(model.named_parameters())
    if set(named) != {p["name"] for p in manifest["params"]}:
        raise SystemExit(f"torch_side: parameter names differ: torch {sorted(named)} vs "
                         f"trainmem {sorted(p['name'] for p in manifest['params'])}")
    with torch.no_grad():
        for p in manifest["params"]:
            n = int(np.prod(p["shape"]))
            value = torch.from_numpy(weights[p["offset"]:p["offset"] + n].copy())
            named[p["name"]].copy_(value.view(named[p["name"]].shape))
    return model


class Trainer:
    def __init__(self, torch, manifest, text, attention, schedule):
        self.torch, self.manifest, self.text, self.schedule = torch, manifest, text, schedule
        self.model = build_model(torch, manifest, attention)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=manifest["lr"])  # defaults as trainmem's
        self.seq = manifest["sizes"]["seq"]

    def batch(self, step, batch):
        n, seq = len(self.text), self.seq
        starts = ((step * batch + np.arange(batch)) * 7919) % (n - seq - 1)
        windows = np.stack([self.text[o:o + seq + 1] for o in starts]).astype(np.int64)
        return self.torch.from_numpy(windows[:, :-1].copy()), self.torch.from_numpy(windows[:, 1:].reshape(-1).copy())

    def loss(self, ids, labels):
        import torch.nn.functional as F
        with self.torch.autocast("cpu", dtype=self.torch.bfloat16):
            logits = self.model(ids, self.schedule)
        return F.cross_entropy(logits.float(), labels)

    def step(self, step, batch):
        ids, labels = self.batch(step, batch)
        loss = self.loss(ids, labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def peak(self, batch):
        """Peak bytes of one steady-state step at `batch` sequences."""
        ids, labels = self.batch(0, batch)
        params = dict(self.model.named_parameters())
        return profiled_peak(self.torch, lambda: self.loss(ids, labels), self.optimizer, params,
                             [ids, labels])["peak_total_bytes"]


def largest_batch(trainer, budget, log):
    """Largest batch whose measured peak fits: a guess from two small batches, bracket, bisect."""
    trainer.step(0, 2)  # the moments exist from here on: steady state
    return batch_search.largest_batch(trainer.peak, budget, (4, 8), log, f"{trainer.schedule}: ")


def train(torch, manifest, text, attention, schedule, batch, steps):
    trainer = Trainer(torch, manifest, text, attention, schedule)
    losses, ms = [], []
    for k in range(steps):
        t0 = time.perf_counter()
        losses.append(trainer.step(k, batch))
        ms.append((time.perf_counter() - t0) * 1e3)
    median_ms = statistics.median(ms[2:])
    tokens = batch * manifest["sizes"]["seq"]
    return {"batch": batch, "tokens_per_step": tokens, "losses": losses, "step_ms": ms, "median_step_ms": median_ms,
            "us_per_token": 1e3 * median_ms / tokens}


def cpu_model():
    """The model name, with family and model numbers (virtual machines often name no model)."""
    fields = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
        if not line.strip():
            break
    name = fields.get("model name", platform.processor())
    return f"{name} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"


def cpu_flags():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return [f for f in ("avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile") if f in flags]
    return []


def report(result, out_dir):
    lines = [f"# Fixed-budget shoot-out: trainmem vs PyTorch {result['torch_version']} eager",
             "",
             f"{result['date']}, {result['cpu']} ({', '.join(result['isa'])}), {result['threads']} threads. "
             f"GPT: {result['sizes']['blocks']} blocks, dim {result['sizes']['dim']}, {result['sizes']['heads']} heads, "
             f"MLP {result['sizes']['hidden']}, sequence {result['sizes']['seq']}, vocabulary {result['sizes']['vocab']}; "
             f"BF16 autocast, AdamW; losses compared after {result['steps']} steps. Peak: every byte the allocator hands out during a "
             "steady-state step, on top of what is alive before it (trainmem: MemoryStats; PyTorch: c10's CPU "
             f"allocator records). PyTorch attention: {result['attention']}.",
             "",
             "| budget | side | schedule | sequences | tokens/step | µs/token | peak MiB | loss step 1 | "
             "loss, last step |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        if not row.get("batch"):
            lines.append(f"| {row['budget_mib']:.0f} MiB | {row['side']} | {row['schedule']} | does not fit | | | | | |")
            continue
        lines.append(f"| {row['budget_mib']:.0f} MiB | {row['side']} | {row['schedule']} | {row['batch']} | "
                     f"{row['tokens_per_step']} | {row['us_per_token']:.1f} | {row['peak_bytes'] / 2**20:.1f} | "
                     f"{row['losses'][0]:.4f} | {row['losses'][-1]:.4f} (step {len(row['losses'])}) |")
    lines += ["", "| budget | trainmem tokens / best PyTorch | µs/token ratio | best PyTorch schedule | "
              f"loss step {result['steps']}: trainmem vs PyTorch at trainmem's batch |",
              "|---:|---:|---:|---|---|"]
    for s in result["summary"]:
        lines.append(f"| {s['budget_mib']:.0f} MiB | {s['token_ratio']:.2f}x | {s['time_ratio']:.2f} | "
                     f"{s['best_torch_schedule']} | {s['trainmem_loss']:.4f} vs {s['torch_loss']:.4f} "
                     f"({s['loss_rel_diff'] * 100:.2f}%) |")
    for path in (out_dir / "budget_shootout.md", out_dir / "budget_shootout.json"):
        provenance.check_writable(path, result["provenance"])
    lines.insert(2, provenance.text(result["provenance"], "- ").rstrip("\n").replace("\n", "  \n"))
    lines.insert(3, "")
    (out_dir / "budget_shootout.md").write_text("\n".join(lines) + "\n")
    (out_dir / "budget_shootout.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", required=True, help="folder budget_shootout --export wrote")
    ap.add_argument("--trainmem", required=True, help="budget_shootout's JSON (its rows)")
    ap.add_argument("--out", required=True, help="where budget_shootout.md and .json go")
    ap.add_argument("--budgets-mib", default="128,256,512")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--attention", choices=["sdpa", "explicit"], default="sdpa")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timed-steps", type=int, default=6,
                    help="steps per schedule at its largest batch (time: median after 2); the loss comparison "
                         "at trainmem's batch runs the exported step count")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    manifest = json.loads((Path(args.export) / "manifest.json").read_text())
    manifest["dir"] = args.export
    text = np.frombuffer(Path(manifest["text"]).read_bytes(), dtype=np.uint8)
    steps = manifest["steps"]  # the loss comparison's length
    trainmem = json.loads(Path(args.trainmem).read_text())
    budgets = [float(b) for b in args.budgets_mib.split(",")]

    def log(msg):
        print(msg, flush=True)

    rows = []
    for mib in budgets:
        budget = int(mib * 2**20)
        for schedule in args.schedules.split(","):
            trainer = Trainer(torch, manifest, text, args.attention, schedule)
            batch, peak = largest_batch(trainer, budget, log)
            del trainer
            row = {"side": "pytorch", "schedule": schedule, "budget_mib": mib, "batch": batch}
            if batch:
                row.update(train(torch, manifest, text, args.attention, schedule, batch, args.timed_steps),
                           peak_bytes=peak)
                log(f"budget {mib:.0f} MiB, {schedule}: {batch} sequences, {row['us_per_token']:.1f} us/token, "
                    f"peak {peak / 2**20:.1f} MiB")
            rows.append(row)
    summary = []
    for t in trainmem["rows"]:
        if t.get("schedule") != "planner" or t["budget_mib"] not in budgets:
            continue
        rows.append({"side": "trainmem", "peak_bytes": t.get("steady_peak_bytes", 0), **t})
        fitting = [r for r in rows if r["side"] == "pytorch" and r["budget_mib"] == t["budget_mib"] and r["batch"]]
        if not t.get("batch") or not fitting:
            continue
        best = max(fitting, key=lambda r: (r["tokens_per_step"], -r["us_per_token"]))
        same = train(torch, manifest, text, args.attention, "none", t["batch"], steps)
        summary.append({"budget_mib": t["budget_mib"], "token_ratio": t["tokens_per_step"] / best["tokens_per_step"],
                        "time_ratio": t["us_per_token"] / best["us_per_token"], "best_torch_schedule": best["schedule"],
                        "trainmem_loss": t["losses"][-1], "torch_loss": same["losses"][-1],
                        "loss_rel_diff": abs(t["losses"][-1] - same["losses"][-1]) / abs(same["losses"][-1]),
                        "torch_at_trainmem_batch": same})
    result = {"benchmark": "budget_shootout", "provenance": provenance.provenance(args.threads),
              "date": datetime.date.today().isoformat(), "cpu": cpu_model(),
              "isa": cpu_flags(), "threads": args.threads, "torch_version": torch.__version__,
              "attention": args.attention, "sizes": manifest["sizes"], "steps": steps, "rows": rows,
              "summary": summary}
    report(result, Path(args.out))


if __name__ == "__main__":
    main()
