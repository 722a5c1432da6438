#!/usr/bin/env python3
"""pytorch_side.py — PyTorch's half of the GPU side-by-side (cuda_vs_pytorch.cu is trainmem's).

Builds the budget shoot-out's GPT (budget_shootout/torch_side.py's build_model: nn.Linear,
nn.LayerNorm, F.scaled_dot_product_attention(is_causal=True), tanh GELU) from the weights
trainmem exported, moves it to the GPU and trains the same steps on the same byte windows:
torch.autocast("cuda", bfloat16) around the forward, cross-entropy in f32,
torch.optim.AdamW(fused=True) with the exported learning rate (its other defaults are
trainmem's). Every batch is on the device before the first step, and each step is timed
with CUDA events, as on trainmem's side. The peak is torch.cuda.max_memory_allocated over
the timed steps (the caching allocator's blocks handed out, workspaces included).

  pytorch_side.py --dir DIR --mode eager|compile --json PATH

--mode compile wraps the model in torch.compile (default mode); its first steps compile,
and the caller bounds the process's time.
"""
import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import provenance  # noqa: E402  (common/provenance.py: the record every results file carries)

import numpy as np


def load_build_model():
    path = Path(__file__).resolve().parent.parent / "budget_shootout" / "torch_side.py"
    sys.path.insert(0, str(path.parent.parent / "pytorch"))  # torch_side imports compare.py from there
    spec = importlib.util.spec_from_file_location("budget_shootout_torch_side", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, help="the folder trainmem exported (manifest.json, weights.bin)")
    parser.add_argument("--mode", choices=["eager", "compile"], default="eager")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    manifest = json.loads((Path(args.dir) / "manifest.json").read_text())
    manifest["dir"] = args.dir
    torch.backends.cuda.matmul.allow_tf32 = False  # trainmem's f32 GEMMs use no TF32 either
    model = load_build_model()(torch, manifest, "sdpa").cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=manifest["lr"], fused=True)
    forward = torch.compile(model) if args.mode == "compile" else model

    text = np.frombuffer(Path(manifest["text"]).read_bytes(), dtype=np.uint8)
    seq, batch = manifest["sizes"]["seq"], manifest["batch"]
    warmup, steps = manifest["warmup"], manifest["steps"]
    batches = []
    for step in range(warmup + steps):
        starts = ((step * batch + np.arange(batch)) * 7919) % (len(text) - seq - 1)
        windows = np.stack([text[o:o + seq + 1] for o in starts]).astype(np.int64)
        batches.append((torch.from_numpy(windows[:, :-1].copy()).cuda(),
                        torch.from_numpy(windows[:, 1:].reshape(-1).copy()).cuda()))

    marks = [torch.cuda.Event(enable_timing=True) for _ in range(warmup + steps + 1)]
    losses = []
    started = time.time()
    for step, (ids, labels) in enumerate(batches):
        if step == warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            warm_s = time.time() - started
        marks[step].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = forward(ids, "none")
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks[step + 1].record()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    step_ms = [marks[i].elapsed_time(marks[i + 1]) for i in range(warmup, warmup + steps)]
    median = statistics.median(step_ms)
    result = {
        "benchmark": "cuda_vs_pytorch",
        "side": f"pytorch_{args.mode}",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "batch": batch,
        "tokens_per_step": batch * seq,
        "model_flops_per_step": manifest["model_flops_per_step"],
        "step_ms": step_ms,
        "median_ms": median,
        "tflops": manifest["model_flops_per_step"] / (median * 1e-3) / 1e12,
        "peak_bytes": torch.cuda.max_memory_allocated(),
        "losses": [float(l) for l in losses],
        "warmup_s": warm_s,
    }
    result["provenance"] = provenance.provenance(
        torch.get_num_threads(), f"{torch.cuda.get_device_name()}, CUDA runtime {torch.version.cuda} (PyTorch's)")
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"cuda_vs_pytorch (PyTorch {torch.__version__}, {args.mode}) on {result['device']}: median step "
          f"{median:.2f} ms, {result['tflops']:.1f} TFLOP/s, peak {result['peak_bytes'] / 2**30:.2f} GiB, "
          f"loss {result['losses'][0]:.4f} -> {result['losses'][-1]:.4f} (warm-up {warm_s:.1f} s)")


if __name__ == "__main__":
    main()
