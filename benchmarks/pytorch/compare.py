#!/usr/bin/python3
"""compare.py — PyTorch's half of the side-by-side comparison, and the report.

trainmem_side (trainmem_side.cpp) writes each model's initial weights and batch
(manifest.json, weights.bin, inputs.bin, labels.bin). This script builds the same
model in PyTorch from those files (the same weights; trainmem's Linear weight is
[out, in] like torch's), trains the same SGD steps under each configuration, and
compares: the loss of every step and every parameter gradient after the first step.
Each side runs each configuration in a fresh process, so the process peak RSS belongs
to that configuration, with the same thread count (torch.set_num_threads(N) here,
OMP_NUM_THREADS=N for both processes).

  compare.py all --trainmem BIN [--libtorch BIN] --work DIR --results DIR [--threads 2] [--steps 8] ...
      export, run every side for every model and configuration, write the report
  compare.py torch-run --dir DIR/<model> --config CFG [--threads 2] [--device cpu]
      PyTorch's side of one configuration (what `all` starts in a fresh process)
  compare.py report --work DIR --results DIR
      the markdown table and JSON from runs already made

Configurations (both sides):
  f32        plain F32
  ckpt_full  every block checkpointed: torch.utils.checkpoint(use_reentrant=False)
  ckpt_sqrt  round(sqrt(N)) segments cut the way torch.utils.checkpoint_sequential
             cuts them, each but the last checkpointed non-reentrantly (1.13's
             checkpoint_sequential is reentrant only, which drops the gradients of the
             first segment when the input does not require grad)
  bf16       torch.autocast(dtype=torch.bfloat16) around the forward; trainmem's
             amp::Autocast(BF16). trainmem follows PyTorch's CUDA autocast lists, so
             on the PyTorch side layer_norm, softmax and cross_entropy run in f32
             (autocast disabled, inputs cast up): PyTorch 1.13's CPU lists would run
             layer_norm and softmax in bf16 when their input is bf16.

A third side, libtorch_side (libtorch_side/libtorch_side.cpp: the same model on PyTorch's C++
API, linked against the wheel's libtorch), runs f32 and bf16 when --libtorch is given; the
checkpointing configurations have no libtorch counterpart (torch.utils.checkpoint is Python
only) and the report says so in their rows.

Errors, per tensor b (PyTorch) and a (trainmem, or libtorch):
  max_rel    max|a - b| / max|b|   (the criterion for F32: <= 1e-5)
  norm_rel   ||a - b||_2 / ||b||_2 (the criterion for BF16: <= 1e-2, METHOD.md)
  elem_rel   max over elements with |b| > 1e-3 max|b| of |a - b| / |b| (reported)
  loss       |a - b| / |b| for the loss of each step; the worst step is reported.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import provenance  # noqa: E402  (common/provenance.py: the record every results file carries)

import numpy as np

CONFIGS = ["f32", "ckpt_full", "ckpt_sqrt", "bf16"]
LIBTORCH_CONFIGS = ["f32", "bf16"]
LIBTORCH_NOT_EXPRESSIBLE = "not expressible (libtorch has no C++ checkpoint API)"
MODELS = ["mlp", "transformer"]
F32_TOL = 1e-5
BF16_NORM_TOL = 1e-2


# --- process memory --------------------------------------------------------------------
def proc_status_bytes(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def reset_peak_rss():
    """Resets the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def loaded_libraries(patterns):
    """Real paths of mapped shared libraries whose name matches one of `patterns`."""
    found = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and any(re.search(p, os.path.basename(parts[5])) for p in patterns):
                    found.add(os.path.realpath(parts[5]))
    except OSError:
        pass
    return sorted(found)


# --- PyTorch's side ----------------------------------------------------------------------
def torch_run(args):
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model_dir = Path(args.dir)
    manifest = json.loads((model_dir / "manifest.json").read_text())
    sizes = manifest["sizes"]
    weights = np.fromfile(model_dir / manifest["weights"], dtype="<f4")
    params = {}
    for p in manifest["params"]:
        n = int(np.prod(p["shape"]))
        t = torch.from_numpy(weights[p["offset"]:p["offset"] + n].reshape(p["shape"]).copy())
        params[p["name"]] = t.to(device).requires_grad_(True)
    names = [p["name"] for p in manifest["params"]]
    inputs = torch.from_numpy(np.fromfile(model_dir / manifest["inputs"]["file"], dtype="<f4")
                              .reshape(manifest["inputs"]["shape"])).to(device)
    labels = torch.from_numpy(np.fromfile(model_dir / manifest["labels"]["file"], dtype="<i4")
                              .astype(np.int64)).to(device)
    del weights

    config = args.config
    autocast_dtype = torch.bfloat16 if config == "bf16" else None

    def fp32(fn, *tensors):
        """An op on trainmem's (CUDA autocast list) FP32 list: f32 even under autocast."""
        if autocast_dtype is None:
            return fn(*tensors)
        with torch.autocast(device.type, enabled=False):
            return fn(*[t.float() for t in tensors])

    def linear(x, name):
        return F.linear(x, params[name + ".weight"], params[name + ".bias"])

    def layer_norm(x, name):
        gamma, beta = params[name + ".weight"], params[name + ".bias"]
        return fp32(lambda t: F.layer_norm(t, (t.shape[-1],), gamma, beta, 1e-5), x)

    d = sizes["dim"]
    if manifest["model"] == "mlp":
        def make_block(i):
            def block(x):
                h = F.gelu(linear(layer_norm(x, f"block{i}.ln"), f"block{i}.up"), approximate="tanh")
                return x + linear(h, f"block{i}.down")
            return block

        def logits_of(h):
            return linear(h, "head")
    else:
        batch, seq, heads = sizes["batch"], sizes["seq"], sizes["heads"]
        dh = d // heads
        causal = torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1)

        def split_heads(t):  # [batch, T, D] -> [batch * H, T, Dh]
            return t.reshape(batch, seq, heads, dh).transpose(1, 2).reshape(batch * heads, seq, dh)

        def make_block(i):
            pre = f"block{i}"

            def attention(x):
                q = split_heads(linear(x, pre + ".attn.q"))
                k = split_heads(linear(x, pre + ".attn.k"))
                v = split_heads(linear(x, pre + ".attn.v"))
                scores = (torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(dh))).masked_fill(causal, float("-inf"))
                probs = fp32(lambda s: torch.softmax(s, dim=-1), scores)
                o = torch.bmm(probs, v).reshape(batch, heads, seq, dh).transpose(1, 2).reshape(batch, seq, d)
                return linear(o, pre + ".attn.out")

            def block(x):
                h = x + attention(layer_norm(x, pre + ".ln1"))
                m = F.gelu(linear(layer_norm(h, pre + ".ln2"), pre + ".mlp.up"), approximate="tanh")
                return h + linear(m, pre + ".mlp.down")
            return block

        def logits_of(h):
            return linear(h.reshape(batch * seq, d), "head")

    blocks = [make_block(i) for i in range(sizes["layers"])]
    segments = max(1, round(math.sqrt(len(blocks))))

    def run_blocks(x):
        h = x
        if config == "ckpt_full":
            for f in blocks:
                h = checkpoint(f, h, use_reentrant=False)
            return h
        if config == "ckpt_sqrt":  # torch.utils.checkpoint_sequential's cut, non-reentrant
            segment_size = len(blocks) // segments
            end = -1
            for start in range(0, segment_size * (segments - 1), segment_size):
                end = start + segment_size - 1
                h = checkpoint(lambda t, s=start, e=end: run_range(t, s, e), h, use_reentrant=False)
            return run_range(h, end + 1, len(blocks) - 1)
        for f in blocks:
            h = f(h)
        return h

    def run_range(t, start, end):
        for j in range(start, end + 1):
            t = blocks[j](t)
        return t

    def loss_of(x):
        return fp32(lambda z: F.cross_entropy(z, labels), logits_of(run_blocks(x)))

    optimizer = torch.optim.SGD([params[n] for n in names], lr=args.lr, momentum=args.momentum)
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def one_step():
        ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else _null()
        with ctx:
            loss = loss_of(inputs)
        return loss

    rss_baseline = proc_status_bytes("VmRSS")
    hwm_reset = reset_peak_rss()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    # Process CPU time (all threads) too: steadier than wall time on a machine shared with other work.
    losses, step_ms, cpu_ms, fwd_ms, bwd_ms, opt_ms = [], [], [], [], [], []
    for step in range(args.steps):
        sync()
        c0 = time.process_time()
        t0 = time.perf_counter()
        loss = one_step()
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        c2 = time.process_time()
        losses.append(loss.item())
        if step == 0:
            with open(model_dir / f"torch_grads_{config}.bin", "wb") as f:
                for n in names:
                    f.write(params[n].grad.detach().float().cpu().numpy().astype("<f4").tobytes())
        c3 = time.process_time()
        t3 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
        sync()
        t4 = time.perf_counter()
        c4 = time.process_time()
        if step >= args.warmup:
            cpu_ms.append((c2 - c0 + c4 - c3) * 1e3)
            fwd_ms.append((t1 - t0) * 1e3)
            bwd_ms.append((t2 - t1) * 1e3)
            opt_ms.append((t4 - t3) * 1e3)
            step_ms.append((t2 - t0 + t4 - t3) * 1e3)
    hwm = proc_status_bytes("VmHWM")
    rss = {"baseline_bytes": rss_baseline, "peak_bytes": hwm, "peak_reset_at_start": hwm_reset and hwm > 0}

    # PyTorch's own accounting of tensor bytes: on CUDA its allocator's peak; on the CPU
    # (no allocator statistics) the profiler's per-op net allocations over one more step,
    # summed in op order on top of the bytes alive before it (parameters, momentum
    # buffers, the batch). Transient peaks inside one op are not visible to it.
    memory = {}
    if cuda:
        memory = {"accounting": "torch.cuda.max_memory_allocated over the steps",
                  "peak_total_bytes": torch.cuda.max_memory_allocated()}
    else:
        memory = profiled_peak(torch, one_step, optimizer, params, [inputs, labels])

    result = {
        "side": "pytorch", "model": manifest["model"], "config": config, "sizes": sizes,
        "device": args.device, "threads": torch.get_num_threads(), "steps": args.steps, "warmup": args.warmup,
        "sqrt_segments": segments, "losses": losses, "step_ms": step_ms,
        "median_step_ms": statistics.median(step_ms) if step_ms else 0.0,
        "min_step_ms": min(step_ms) if step_ms else 0.0,
        "step_cpu_ms": cpu_ms, "median_step_cpu_ms": statistics.median(cpu_ms) if cpu_ms else 0.0,
        "median_forward_ms": statistics.median(fwd_ms) if fwd_ms else 0.0,
        "median_backward_ms": statistics.median(bwd_ms) if bwd_ms else 0.0,
        "median_optimizer_ms": statistics.median(opt_ms) if opt_ms else 0.0,
        "grads_file": f"torch_grads_{config}.bin", "params": names, "memory": memory, "rss": rss,
        "build": torch_build_info(torch),
    }
    (model_dir / f"torch_{config}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"pytorch {manifest['model']} {config}: loss {losses[0]:.6f} -> {losses[-1]:.6f}, median step "
          f"{result['median_step_ms']:.2f} ms (fwd {result['median_forward_ms']:.2f} bwd "
          f"{result['median_backward_ms']:.2f} opt {result['median_optimizer_ms']:.2f}), peak "
          f"{memory.get('peak_total_bytes', 0) / 2**20:.1f} MiB ({memory.get('accounting', '')}), peak RSS "
          f"{hwm / 2**20:.1f} MiB, {torch.get_num_threads()} threads", flush=True)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def running_peak(changes):
    """(peak, op at the peak, final) of the running sum of (bytes, op) changes, taken in order."""
    running = peak = 0
    peak_op = ""
    for nbytes, op in changes:
        running += nbytes
        if running > peak:
            peak, peak_op = running, op
    return peak, peak_op, running


def profiled_peak(torch, one_step, optimizer, params, batch):
    """Peak tensor bytes of one steady-state step by PyTorch's CPU allocator accounting.

    The profiler with profile_memory=True records every allocation and free of c10's CPU
    allocator (all tensor storage; not oneDNN's private buffers). Replayed in order on top of
    the bytes alive before the step (parameters, momentum buffers, the batch), they give the
    peak at allocation granularity, as trainmem's MemoryStats does."""

    def tensor_bytes(t):
        return t.numel() * t.element_size()

    live = sum(tensor_bytes(p) for p in params.values()) + sum(tensor_bytes(t) for t in batch)
    for state in optimizer.state.values():
        live += sum(tensor_bytes(v) for v in state.values() if torch.is_tensor(v))

    def step():
        loss = one_step()
        loss.backward()
        del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:  # the raw records: each allocation in order, with the op it happened in
        from torch.autograd import ProfilerConfig, ProfilerState, _disable_profiler_legacy, _enable_profiler_legacy
        config = ProfilerConfig(ProfilerState.CPU, False, True, False, False, False,
                                torch._C._profiler._ExperimentalConfig())
    except (ImportError, AttributeError, TypeError):
        return profiled_peak_from_events(torch, step, live)
    _enable_profiler_legacy(config)
    try:
        step()
    finally:
        records = _disable_profiler_legacy()
    changes = []  # (time, bytes, op)
    for thread in records:
        origin, stack = records[0][0], []
        for r in thread:
            kind = r.kind()
            if kind == "push":
                stack.append(r.name())
            elif kind == "pop" and stack:
                stack.pop()
            elif kind == "memory_alloc":
                # a.cpu_elapsed_us(b) is b's time minus a's: the time since the first record.
                changes.append((origin.cpu_elapsed_us(r), r.cpu_memory_usage(), stack[-1] if stack else "-"))
    if len(records) > 1:
        changes.sort(key=lambda c: c[0])
    peak, peak_op, running = running_peak((nbytes, op) for _, nbytes, op in changes)
    return {"accounting": "c10 CPU allocator: every allocation and free of one steady-state step, from "
                          "the profiler (profile_memory=True) records, on top of parameters, momentum buffers and "
                          "the batch; oneDNN's private buffers are not seen",
            "live_at_start_bytes": live, "peak_total_bytes": live + peak, "net_after_step_bytes": running,
            "peak_op": peak_op}


def profiled_peak_from_events(torch, step, live):
    """Fallback where the raw profiler records are not reachable: per-op net allocations,
    allocations placed at an op's start and frees at its end (an upper bound at op granularity)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    points = []
    for e in prof.events():
        u = e.self_cpu_memory_usage
        if u:
            points.append((e.time_range.start if u > 0 else e.time_range.end, 0 if u > 0 else 1, u, e.name))
    points.sort()
    peak, peak_op, running = running_peak((u, name) for _, _, u, name in points)
    return {"accounting": "torch.profiler(profile_memory=True): per-op net CPU allocations, allocations at op "
                          "start and frees at op end, over one steady-state step, on top of parameters, momentum "
                          "buffers and the batch; oneDNN's private buffers are not seen",
            "live_at_start_bytes": live, "peak_total_bytes": live + peak, "net_after_step_bytes": running,
            "peak_op": peak_op}


def torch_build_info(torch):
    info = {"torch": torch.__version__, "numpy": np.__version__}
    config = torch.__config__.show()
    m = re.search(r"BLAS_INFO=([^,\s]+)", config)
    info["blas_info"] = m.group(1) if m else "?"
    info["mkldnn"] = bool(torch.backends.mkldnn.is_available())
    m = re.search(r"MKL-DNN v([\d.]+)", config)
    info["onednn"] = m.group(1) if m else None
    info["mkl"] = bool(torch.backends.mkl.is_available())
    info["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
    info["cpu_capability"] = (torch.backends.cpu.get_cpu_capability()
                              if hasattr(torch.backends, "cpu") and hasattr(torch.backends.cpu, "get_cpu_capability")
                              else os.environ.get("ATEN_CPU_CAPABILITY", "default (highest the CPU has)"))
    info["loaded_blas"] = loaded_libraries([r"blas", r"mkl_", r"libdnnl", r"libgomp", r"libiomp"])
    try:  # the distribution package, where torch came from one
        if not torch.__file__.startswith("/usr/lib/python3/dist-packages/"):
            raise OSError("torch is not Debian's")
        info["package"] = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Version}", "python3-torch"],
                                         capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        if sys.prefix != sys.base_prefix:  # a virtual environment: pip's wheel
            from importlib import metadata
            info["package"] = f"pip wheel torch {metadata.version('torch')} in the virtual environment {sys.prefix}"
    info["config_show"] = config
    return info


# --- comparison -------------------------------------------------------------------------------
ZERO_GRAD_FRACTION = 1e-6


def tensor_errors(a, b, scale, zero):
    """Errors of a against b. A tensor whose reference gradient is below ZERO_GRAD_FRACTION of the
    model's largest gradient entry `scale` is analytically zero (the attention k bias: softmax is
    shift invariant) and holds only rounding noise on both sides; it is measured against `scale`."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    diff = np.abs(a64 - b64)
    bmax = float(np.max(np.abs(b64))) if b.size else 0.0
    if zero:
        rel = float(diff.max()) / scale
        return {"max_rel": rel, "norm_rel": rel, "elem_rel": rel, "zero_gradient": True}
    mask = np.abs(b64) > 1e-3 * bmax
    return {"max_rel": float(diff.max()) / bmax,
            "norm_rel": float(np.linalg.norm(diff)) / float(np.linalg.norm(b64)),
            "elem_rel": float(np.max(diff[mask] / np.abs(b64[mask]))),
            "zero_gradient": False}


def compare_grads(model_dir, manifest, file_a, file_b, file_f32=None):
    """Worst errors over the tensors. Which tensors are analytically zero is read from the F32
    reference (file_f32, else file_b): a tensor whose largest entry is under ZERO_GRAD_FRACTION of the
    model's largest gradient entry."""
    a_all = np.fromfile(model_dir / file_a, dtype="<f4")
    b_all = np.fromfile(model_dir / file_b, dtype="<f4")
    ref_all = np.fromfile(model_dir / file_f32, dtype="<f4") if file_f32 else b_all
    scale = float(np.max(np.abs(b_all)))
    ref_scale = float(np.max(np.abs(ref_all)))
    worst = {"max_rel": (0.0, ""), "norm_rel": (0.0, ""), "elem_rel": (0.0, "")}
    zero = []
    for p in manifest["params"]:
        n = int(np.prod(p["shape"]))
        sl = slice(p["offset"], p["offset"] + n)
        is_zero = float(np.max(np.abs(ref_all[sl]))) < ZERO_GRAD_FRACTION * ref_scale
        e = tensor_errors(a_all[sl], b_all[sl], scale, is_zero)
        if e["zero_gradient"]:
            zero.append(p["name"])
        for k in worst:
            if not math.isfinite(e[k]) or e[k] > worst[k][0]:
                worst[k] = (e[k], p["name"])
    out = {k: {"value": v[0], "param": v[1]} for k, v in worst.items()}
    out["zero_gradient_tensors"] = zero
    return out


def loss_error(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and len(a) == len(b) else float("nan")


# --- the whole run ----------------------------------------------------------------------------
def run_all(args):
    if args.device != "cpu":
        sys.exit("compare.py all: trainmem_side runs on the CPU only so far; `torch-run --device cuda` runs "
                 "PyTorch's side alone")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY=args.wait_policy.upper())
    # Where the machine has more cores than threads (the GPU machine), both sides get the same cores.
    pin = []
    if (os.cpu_count() or 1) > args.threads and shutil.which("taskset"):
        pin = ["taskset", "-c", f"0-{args.threads - 1}"]
    (work / "run_settings.json").write_text(json.dumps(
        {"OMP_WAIT_POLICY": env["OMP_WAIT_POLICY"], "taskset": " ".join(pin) or None}) + "\n")
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--lr", repr(args.lr),
              "--momentum", repr(args.momentum)]
    timing_keys = ["median_step_ms", "min_step_ms", "median_step_cpu_ms", "median_forward_ms", "median_backward_ms",
                   "median_optimizer_ms"]
    history = {}  # (model, config, side) -> per-round timings
    for model in args.models:
        for stale in (work / model).glob("libtorch_*"):  # a report without --libtorch has no libtorch rows
            stale.unlink()
        subprocess.run(pin + [args.trainmem, "--model", model, "--out", str(work), "--export"], check=True, env=env)
        for r in range(args.rounds):
            for i, config in enumerate(args.configs):
                trainmem_cmd = pin + [args.trainmem, "--model", model, "--config", config, "--out", str(work)] + common
                torch_cmd = pin + [sys.executable, __file__, "torch-run", "--dir", str(work / model), "--config",
                                   config, "--threads", str(args.threads), "--device", args.device] + common
                sides = [("trainmem", trainmem_cmd), ("torch", torch_cmd)]
                if args.libtorch and config in LIBTORCH_CONFIGS:
                    sides.append(("libtorch", pin + [args.libtorch, "--dir", str(work / model), "--config", config,
                                                     "--threads", str(args.threads)] + common))
                # Rotate which side runs first, so that drifting machine load hits all alike.
                turn = (i + r) % len(sides)
                for side, cmd in sides[turn:] + sides[:turn]:
                    subprocess.run(cmd, check=True, env=env)
                    result = json.loads((work / model / f"{side}_{config}.json").read_text())
                    history.setdefault((model, config, side), []).append({k: result[k] for k in timing_keys})
    # Each figure is the median over rounds of each round's figure (one fresh process per round).
    for (model, config, side), rounds in history.items():
        path = work / model / f"{side}_{config}.json"
        result = json.loads(path.read_text())
        result["rounds"] = rounds
        for k in timing_keys:
            result[k] = statistics.median(x[k] for x in rounds)
        path.write_text(json.dumps(result, indent=2) + "\n")
    report(args)


def machine_info():
    fields = {}
    try:
        for line in open("/proc/cpuinfo"):
            if ":" in line:
                k, v = (x.strip() for x in line.split(":", 1))
                fields.setdefault(k, v)
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0, 0, 0)
    return {"nproc": os.cpu_count(), "cpu": fields.get("model name", "?"),
            "cpu_id": f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} model "
                      f"{fields.get('model', '?')}",
            "cpu_flags": " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags),
            "kernel": platform.release(), "loadavg_at_report": [round(x, 2) for x in load]}


def report(args):
    work, results = Path(args.work), Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    rows, runs = [], {}
    for model in args.models:
        model_dir = work / model
        manifest = json.loads((model_dir / "manifest.json").read_text())
        for config in args.configs:
            try:
                tm = json.loads((model_dir / f"trainmem_{config}.json").read_text())
                pt = json.loads((model_dir / f"torch_{config}.json").read_text())
            except FileNotFoundError as e:
                print(f"report: skipping {model} {config}: {e}", file=sys.stderr)
                continue
            runs[(model, config)] = (tm, pt)
            ref = "torch_grads_f32.bin" if (model_dir / "torch_grads_f32.bin").exists() else None
            grads = compare_grads(model_dir, manifest, tm["grads_file"], pt["grads_file"], ref)
            row = {"model": model, "config": config, "sizes": manifest["sizes"],
                   "loss_rel": loss_error(tm["losses"], pt["losses"]), "grads": grads,
                   "losses": {"trainmem": tm["losses"], "pytorch": pt["losses"]},
                   "step_ms": {"trainmem": tm["median_step_ms"], "pytorch": pt["median_step_ms"]},
                   "min_step_ms": {"trainmem": tm["min_step_ms"], "pytorch": pt["min_step_ms"]},
                   "step_cpu_ms": {"trainmem": tm["median_step_cpu_ms"], "pytorch": pt["median_step_cpu_ms"]},
                   "phase_ms": {side: {k: r[f"median_{k}_ms"] for k in ("forward", "backward", "optimizer")}
                                for side, r in (("trainmem", tm), ("pytorch", pt))},
                   "peak_bytes": {"trainmem": tm["memory"]["peak_total_bytes"],
                                  "pytorch": pt["memory"].get("peak_total_bytes")},
                   "peak_rss_bytes": {"trainmem": tm["rss"]["peak_bytes"], "pytorch": pt["rss"]["peak_bytes"]},
                   "rss_growth_bytes": {"trainmem": tm["rss"]["peak_bytes"] - tm["rss"]["baseline_bytes"],
                                        "pytorch": pt["rss"]["peak_bytes"] - pt["rss"]["baseline_bytes"]},
                   "trainmem_peak_by_category": tm["memory"]["peak_by_category_bytes"]}
            if config == "bf16":  # each side's bf16 against PyTorch's F32 gradients, for scale
                if ref:
                    row["bf16_vs_f32_reference"] = {
                        "trainmem": compare_grads(model_dir, manifest, tm["grads_file"], ref, ref)["norm_rel"],
                        "pytorch": compare_grads(model_dir, manifest, pt["grads_file"], ref, ref)["norm_rel"]}
                tol = BF16_NORM_TOL
                row["criterion"] = f"grad norm_rel <= {tol:g} (METHOD.md, bf16 operands); loss rel <= {tol:g}"
                row["pass"] = grads["norm_rel"]["value"] <= tol and row["loss_rel"] <= tol
            else:
                row["criterion"] = f"grad max_rel <= {F32_TOL:g}; loss rel <= {F32_TOL:g}"
                row["pass"] = grads["max_rel"]["value"] <= F32_TOL and row["loss_rel"] <= F32_TOL
            lt_file = model_dir / f"libtorch_{config}.json"
            if config not in LIBTORCH_CONFIGS:
                row["libtorch"] = {"expressible": False, "note": LIBTORCH_NOT_EXPRESSIBLE}
            elif lt_file.exists():
                lt = json.loads(lt_file.read_text())
                lt_grads = compare_grads(model_dir, manifest, lt["grads_file"], pt["grads_file"], ref)
                lt_loss = loss_error(lt["losses"], pt["losses"])
                lt_pass = (lt_grads["norm_rel"]["value"] <= BF16_NORM_TOL and lt_loss <= BF16_NORM_TOL
                           if config == "bf16" else lt_grads["max_rel"]["value"] <= F32_TOL and lt_loss <= F32_TOL)
                row["libtorch"] = {
                    "expressible": True, "loss_rel": lt_loss, "grads": lt_grads, "pass": lt_pass,
                    "losses": lt["losses"], "step_ms": lt["median_step_ms"], "min_step_ms": lt["min_step_ms"],
                    "step_cpu_ms": lt["median_step_cpu_ms"],
                    "phase_ms": {k: lt[f"median_{k}_ms"] for k in ("forward", "backward", "optimizer")},
                    "peak_bytes": lt["memory"].get("peak_total_bytes"), "peak_rss_bytes": lt["rss"]["peak_bytes"],
                    "rss_growth_bytes": lt["rss"]["peak_bytes"] - lt["rss"]["baseline_bytes"],
                    "build": lt["build"], "memory_accounting": lt["memory"].get("accounting")}
            rows.append(row)
    if not runs:
        sys.exit("report: no runs found under " + str(work))
    tm0, pt0 = next(iter(runs.values()))
    settings_file = work / "run_settings.json"
    settings = json.loads(settings_file.read_text()) if settings_file.exists() else {}
    record = provenance.provenance(tm0["threads"])
    for path in (results / "pytorch_compare.json", results / "pytorch_compare.md"):
        provenance.check_writable(path, record)
    meta = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "provenance": record, "trainmem_side_provenance": tm0.get("provenance"),
            "machine": machine_info(), "threads": {"trainmem": tm0["threads"], "pytorch": pt0["threads"]},
            "steps": tm0["steps"], "warmup": tm0["warmup"], "rounds": len(tm0.get("rounds", [None])),
            "lr": tm0["lr"], "momentum": tm0["momentum"],
            "device": pt0.get("device", "cpu"), "run_settings": settings,
            "trainmem_build": tm0["build"],
            "pytorch_build": {k: v for k, v in pt0["build"].items() if k != "config_show"},
            "memory_accounting": {"trainmem": tm0["memory"]["accounting"], "pytorch": pt0["memory"].get("accounting")}}
    libtorch_builds = [r["libtorch"]["build"] for r in rows if r.get("libtorch", {}).get("expressible")]
    if libtorch_builds:
        meta["libtorch_build"] = libtorch_builds[0]
    (results / "pytorch_compare.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    notes = Path(__file__).with_name("NOTES.md")  # the profile behind the ratios, written by hand
    (results / "pytorch_compare.md").write_text(
        markdown(meta, rows) + ("\n" + notes.read_text() if notes.exists() else ""))
    print((results / "pytorch_compare.md").read_text())


def markdown(meta, rows):
    mib = lambda b: f"{b / 2**20:.1f}" if b is not None else "—"
    ratio = lambda a, b: f"{a / b:.2f}" if a is not None and b else "—"
    pb = meta["pytorch_build"]
    blas = ", ".join(os.path.basename(os.path.dirname(p)) + "/" + os.path.basename(p) for p in pb["loaded_blas"]
                     if "blas" in os.path.basename(p) or "mkl" in os.path.basename(p)) or pb["blas_info"]
    if pb["blas_info"] == "mkl":  # the wheels link MKL into libtorch_cpu; mapped BLASes are numpy's or CUDA's
        blas = "MKL, linked into libtorch_cpu"
    m = meta["machine"]
    lines = [
        "# trainmem vs PyTorch, side by side",
        "",
        f"- Date: {meta['date']}",
        f"- Commit {meta['provenance']['commit']}; machine {meta['provenance']['machine']}; command "
        f"`{meta['provenance']['command']}`",
        f"- Machine: {m['cpu']} ({m['cpu_id']}; {m['cpu_flags']}), nproc {m['nproc']}, Linux {m['kernel']}; "
        f"load average at report time "
        f"{m['loadavg_at_report']} (the machine is shared: step times are noisy)",
        f"- Threads: trainmem {meta['threads']['trainmem']} (OMP_NUM_THREADS), PyTorch "
        f"{meta['threads']['pytorch']} (torch.set_num_threads); OMP_WAIT_POLICY "
        f"{meta['run_settings'].get('OMP_WAIT_POLICY', 'unset')} for both; pinned: "
        f"{meta['run_settings'].get('taskset') or 'no'}; device {meta['device']}",
        f"- trainmem: {meta['trainmem_build']['gemm']}; g++ "
        f"{meta['trainmem_build']['compiler']} -O2 -march=native; Eigen SIMD {meta['trainmem_build']['simd']}",
        f"- PyTorch {pb['torch']}{' (' + pb['package'] + ')' if pb.get('package') else ''} "
        f"(BLAS_INFO={pb['blas_info']}; BLAS loaded: {blas}; oneDNN {pb['onednn']} "
        f"(bf16 matmuls); MKL {'yes' if pb['mkl'] else 'no'}; CUDA {pb['cuda'] or 'none'}); numpy {pb['numpy']}",
        f"- Steps: {meta['steps']} SGD steps (lr {meta['lr']}, momentum {meta['momentum']}); a step's time is the "
        "median "
        f"over the last {meta['steps'] - meta['warmup']} steps of a fresh process, and each figure the median over "
        f"{meta['rounds']} such processes per side and configuration, the sides alternating",
        f"- Peak memory: trainmem — {meta['memory_accounting']['trainmem']}; PyTorch — "
        f"{meta['memory_accounting']['pytorch']}. Peak RSS is the process high-water mark (VmHWM) over the steps; "
        "RSS growth is that mark minus the RSS before the first step.",
        "- Errors: max_rel = max|a−b|/max|b| per gradient tensor (worst tensor), "
        "norm_rel = ‖a−b‖₂/‖b‖₂; "
        "loss = worst |a−b|/|b| over the steps. F32 passes at max_rel ≤ 1e-5 and loss ≤ 1e-5; BF16 at "
        "norm_rel ≤ 1e-2 (METHOD.md, bf16 operands).",
        "",
    ]
    for model in dict.fromkeys(r["model"] for r in rows):
        s = next(r["sizes"] for r in rows if r["model"] == model)
        if model == "mlp":
            desc = (f"{s['layers']} blocks x + Linear(GELU(Linear(LayerNorm(x)))), D={s['dim']}, hidden "
                    f"{s['hidden']}, batch {s['batch']}, head to {s['classes']} classes")
        else:
            desc = (f"{s['layers']} pre-LN transformer blocks, D={s['dim']}, {s['heads']} heads, hidden "
                    f"{s['hidden']}, batch {s['batch']} x T={s['seq']}, head to {s['classes']} classes per token")
        lines.append(f"- **{model}**: {desc}")
    lines += ["",
              "| model | config | loss rel err | grad max_rel (worst tensor) | grad norm_rel | pass | step ms trainmem "
              "| step ms PyTorch | time ratio | peak MiB trainmem | peak MiB PyTorch | peak ratio | peak RSS MiB "
              "tm / pt | RSS growth MiB tm / pt | RSS growth ratio |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g = r["grads"]
        st, sp = r["step_ms"]["trainmem"], r["step_ms"]["pytorch"]
        mt, mp = r["peak_bytes"]["trainmem"], r["peak_bytes"]["pytorch"]
        rt, rp = r["peak_rss_bytes"]["trainmem"], r["peak_rss_bytes"]["pytorch"]
        gt, gp = r["rss_growth_bytes"]["trainmem"], r["rss_growth_bytes"]["pytorch"]
        lines.append(
            f"| {r['model']} | {r['config']} | {r['loss_rel']:.1e} | {g['max_rel']['value']:.1e} "
            f"({g['max_rel']['param']}) | {g['norm_rel']['value']:.1e} | {'yes' if r['pass'] else '**no**'} "
            f"| {st:.1f} | {sp:.1f} | {ratio(st, sp)} | {mib(mt)} | {mib(mp)} | {ratio(mt, mp)} "
            f"| {mib(rt)} / {mib(rp)} | {mib(gt)} / {mib(gp)} | {ratio(gt, gp)} |")
    lines += ["", "Ratios are trainmem / PyTorch (below 1: trainmem is faster or smaller)."]
    lines += libtorch_markdown(meta, rows, mib, ratio)
    lines += ["",
              "Timing detail — minimum step time and process CPU time per step (all threads; steadier than wall "
              "time when other work shares the cores), and the median phases, trainmem / PyTorch:", "",
              "| model | config | min step ms | min ratio | CPU ms per step | CPU ratio | forward ms | backward ms "
              "| optimizer ms |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ph, mn, cp = r["phase_ms"], r["min_step_ms"], r["step_cpu_ms"]
        lines.append(f"| {r['model']} | {r['config']} | {mn['trainmem']:.1f} / {mn['pytorch']:.1f} | "
                     f"{ratio(mn['trainmem'], mn['pytorch'])} | {cp['trainmem']:.1f} / {cp['pytorch']:.1f} | "
                     f"{ratio(cp['trainmem'], cp['pytorch'])} | " + " | ".join(
                         f"{ph['trainmem'][k]:.1f} / {ph['pytorch'][k]:.1f}"
                         for k in ("forward", "backward", "optimizer"))
                     + " |")
    zero = sorted({n for r in rows for n in r["grads"]["zero_gradient_tensors"]})
    if zero:
        lines += ["", f"Gradients that are analytically zero ({len(zero)} tensors: {', '.join(zero[:4])}"
                      f"{', ...' if len(zero) > 4 else ''}; softmax is shift invariant, so the attention k bias gets "
                      "none) hold rounding noise on both sides and are measured against the model's largest gradient "
                      "entry instead of their own."]
    bf = [r for r in rows if "bf16_vs_f32_reference" in r]
    if bf:
        lines += ["", "BF16 gradients against PyTorch's F32 gradients (norm_rel, worst tensor), for scale:", ""]
        for r in bf:
            ref = r["bf16_vs_f32_reference"]
            lines.append(f"- {r['model']}: trainmem {ref['trainmem']['value']:.1e} ({ref['trainmem']['param']}), "
                         f"PyTorch {ref['pytorch']['value']:.1e} ({ref['pytorch']['param']})")
    return "\n".join(lines) + "\n"


def libtorch_markdown(meta, rows, mib, ratio):
    """The libtorch C++ side's rows: its errors against PyTorch's run, its times and peaks, and
    trainmem's against it."""
    lt_rows = [r for r in rows if "libtorch" in r]
    if not any(r["libtorch"]["expressible"] for r in lt_rows):
        return []
    b = meta["libtorch_build"]
    lines = ["", f"**libtorch C++ side** (libtorch_side: the same models on PyTorch's C++ API — torch::linear, "
                 f"torch::optim::SGD, at::autocast's CPU switches for BF16 — linked against the wheel's own libtorch "
                 f"{b['libtorch']} (libtorch_cpu; _GLIBCXX_USE_CXX11_ABI={b['glibcxx_use_cxx11_abi']}), g++ "
                 f"{b['compiler']} -O3; same weights, batch, threads and rounds). Errors are against the PyTorch "
                 "(Python) side's gradients and losses, by the same criteria; peak MiB is c10's allocator accounting "
                 "from the legacy profiler's records, as for PyTorch.", "",
             "| model | config | loss rel err vs PyTorch | grad max_rel vs PyTorch | grad norm_rel | pass | step ms "
             "libtorch | libtorch / PyTorch | trainmem / libtorch | min step ms libtorch | min: libtorch / PyTorch "
             "| min: trainmem / libtorch | CPU ms per step libtorch | trainmem / libtorch CPU | peak MiB libtorch "
             "| trainmem / libtorch peak | peak RSS MiB libtorch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in lt_rows:
        lt = r["libtorch"]
        if not lt["expressible"]:
            lines.append(f"| {r['model']} | {r['config']} | {lt['note']} |" + " |" * 14)
            continue
        g = lt["grads"]
        worst = (f"{g['max_rel']['value']:.1e} ({g['max_rel']['param']})" if g["max_rel"]["value"] > 0
                 else "0 (every gradient bit for bit)")
        lines.append(
            f"| {r['model']} | {r['config']} | {lt['loss_rel']:.1e} | {worst} "
            f"| {g['norm_rel']['value']:.1e} | {'yes' if lt['pass'] else '**no**'} "
            f"| {lt['step_ms']:.1f} | {ratio(lt['step_ms'], r['step_ms']['pytorch'])} "
            f"| {ratio(r['step_ms']['trainmem'], lt['step_ms'])} | {lt['min_step_ms']:.1f} "
            f"| {ratio(lt['min_step_ms'], r['min_step_ms']['pytorch'])} "
            f"| {ratio(r['min_step_ms']['trainmem'], lt['min_step_ms'])} | {lt['step_cpu_ms']:.1f} "
            f"| {ratio(r['step_cpu_ms']['trainmem'], lt['step_cpu_ms'])} | {mib(lt['peak_bytes'])} "
            f"| {ratio(r['peak_bytes']['trainmem'], lt['peak_bytes'])} | {mib(lt['peak_rss_bytes'])} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--steps", type=int, default=8)
        p.add_argument("--warmup", type=int, default=2)
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--device", default="cpu", help="cpu (the deliverable) or cuda (PyTorch's side only)")
        p.add_argument("--lr", type=float, default=0.05)
        p.add_argument("--momentum", type=float, default=0.9)

    p = sub.add_parser("torch-run", help="PyTorch's side of one configuration")
    p.add_argument("--dir", required=True)
    p.add_argument("--config", required=True, choices=CONFIGS)
    common(p)

    for name in ("all", "report"):
        p = sub.add_parser(name)
        p.add_argument("--work", required=True, help="folder for weights, batches, gradients and per-run JSON")
        p.add_argument("--results", required=True, help="folder for pytorch_compare.md and .json")
        p.add_argument("--models", type=lambda s: s.split(","), default=MODELS)
        p.add_argument("--configs", type=lambda s: s.split(","), default=CONFIGS)
        if name == "all":
            p.add_argument("--trainmem", required=True, help="the trainmem_side program")
            p.add_argument("--libtorch", help="the libtorch_side program (libtorch_side/); without it no libtorch rows")
            p.add_argument("--rounds", type=int, default=3,
                           help="fresh processes per side and configuration; timings are medians over them")
            p.add_argument("--wait-policy", default="passive", choices=["passive", "active"],
                           help="OMP_WAIT_POLICY for both sides (passive: threads waiting at a barrier sleep "
                                "instead of spinning, which on a shared machine keeps a descheduled partner "
                                "thread from costing whole time slices)")
            common(p)

    args = parser.parse_args()
    if args.command == "torch-run":
        torch_run(args)
    elif args.command == "all":
        run_all(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
