#!/usr/bin/env python3
"""report.py — the GPU side-by-side's table and targets, from the JSON files of one run.

Reads cuda_vs_pytorch_trainmem.json, cuda_vs_pytorch_eager.json and (where it compiled in
time) cuda_vs_pytorch_compile.json, and cuda_gemm.json for the bf16 GEMM rate measured in
the same run (4096^3, trainmem's GEMM: the ceiling MFU is measured against). Prints the
table and one line per target of issue 49, writes cuda_vs_pytorch.json beside them.

  report.py OUT_DIR
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import provenance  # noqa: E402  (common/provenance.py: the record every results file carries)

LOSS_TOLERANCE = 2e-2  # relative, per step: bf16 rounding of the same 23 steps from the same weights


def load(out, name):
    try:
        return json.loads((out / name).read_text())
    except Exception as e:  # a side that did not run or finish
        print(f"  {name}: missing ({e})")
        return None


def main():
    out = Path(sys.argv[1])
    trainmem = load(out, "cuda_vs_pytorch_trainmem.json")
    eager = load(out, "cuda_vs_pytorch_eager.json")
    compiled = load(out, "cuda_vs_pytorch_compile.json")
    gemm = load(out, "cuda_gemm.json")
    ceiling = None
    if gemm:
        square = [r for r in gemm["rows"] if r["dtype"] == "bf16" and r["m"] == r["n"] == r["k"] == 4096]
        ceiling = square[0]["trainmem_tflops"] if square else None
    sides = [s for s in (trainmem, eager, compiled) if s]
    if not sides:
        return
    print(f"  GPT step on {sides[0]['device']}: {sides[0]['tokens_per_step']} tokens, "
          f"{sides[0]['model_flops_per_step'] / 1e12:.2f} TFLOP of model work per step; bf16 GEMM ceiling "
          f"{ceiling:.0f} TFLOP/s" if ceiling else "")
    print(f"  {'side':<18}{'step ms':>9}{'TFLOP/s':>9}{'MFU':>7}{'peak GiB':>10}{'first loss':>11}{'last loss':>10}")
    for s in sides:
        mfu = f"{s['tflops'] / ceiling:.0%}" if ceiling else "-"
        print(f"  {s['side']:<18}{s['median_ms']:>9.2f}{s['tflops']:>9.1f}{mfu:>7}{s['peak_bytes'] / 2**30:>10.2f}"
              f"{s['losses'][0]:>11.4f}{s['losses'][-1]:>10.4f}")
    if trainmem and "attention_paths" in trainmem:
        p = trainmem["attention_paths"]
        print(f"  trainmem attention: cuDNN {p['cudnn_forward']} forward / {p['cudnn_backward']} backward, own kernels "
              f"{p['kernel_forward']} / {p['kernel_backward']}; {p['cudnn_status']}")
    checks = []
    if trainmem and eager:
        time_ratio = trainmem["median_ms"] / eager["median_ms"]
        peak_ratio = trainmem["peak_bytes"] / eager["peak_bytes"]
        worst = max(abs(a - b) / abs(b) for a, b in zip(trainmem["losses"], eager["losses"]))
        checks += [("bf16 GPT step <= 1.0x PyTorch eager", time_ratio <= 1.0, f"{time_ratio:.3f}x"),
                   ("peak bytes <= 1.0x PyTorch eager", peak_ratio <= 1.0, f"{peak_ratio:.3f}x"),
                   (f"losses within {LOSS_TOLERANCE:g} of PyTorch's at every step", worst <= LOSS_TOLERANCE,
                    f"worst {worst:.2e}")]
        if compiled:
            checks.append(("(reported) step vs torch.compile", True,
                           f"{trainmem['median_ms'] / compiled['median_ms']:.3f}x"))
    if trainmem and ceiling:
        mfu = trainmem["tflops"] / ceiling
        checks.append(("MFU >= 35% of the bf16 GEMM rate", mfu >= 0.35, f"{mfu:.1%}"))
    for name, met, value in checks:
        print(f"  target {name}: {value} {'met' if met else 'NOT met'}")
    gpu = next((s["provenance"]["gpu"] for s in sides if "provenance" in s), "")  # trainmem's names the driver
    record = provenance.provenance(1, gpu)
    provenance.check_writable(out / "cuda_vs_pytorch.json", record)
    summary = {"provenance": record, "sides": sides, "gemm_bf16_4096_tflops": ceiling,
               "targets": [{"target": n, "met": m, "value": v} for n, m, v in checks]}
    (out / "cuda_vs_pytorch.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
