#!/usr/bin/env python3
# benchmarks/fp8_convergence/run.py — does FP8 (delayed scaling, emulated on the CPU) train
# as well as BF16? The two examples, each trained twice from one seed with the same
# steps: --precision bf16, and --precision bf16 --fp8 (linear's GEMMs in FP8, the rest
# BF16). It keeps every line the programs print and ends with a summary: the char
# transformer's last training and held-out loss, Fashion-MNIST's last epoch mean loss and
# test accuracy, each FP8 figure beside the BF16 one and their difference (relative for
# losses, in percentage points for accuracy). The bar: within 2% of the loss, 1 pp
# of accuracy. Writes results/fp8_convergence_<kind>_<date>.txt (the file names the
# machine; no run replaces another machine's file). The programs run with OMP_NUM_THREADS=1.
#
#   python3 benchmarks/fp8_convergence/run.py --kind amd_zen2 [--build build] [--char-steps 300]
#                                             [--mnist-epochs 2]
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "common"))
import provenance  # noqa: E402


def run(command):
    print("==", " ".join(command), flush=True)
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout


def last(pattern, text, what):
    found = re.findall(pattern, text, re.M)
    if not found:
        sys.exit(f"no {what} in the output")
    return found[-1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", required=True, help="machine kind for the file name, e.g. amd_zen2")
    parser.add_argument("--build", default="build")
    parser.add_argument("--char-steps", type=int, default=300)
    parser.add_argument("--mnist-epochs", type=int, default=2)
    args = parser.parse_args()

    record = provenance.provenance(threads=1)  # OMP_NUM_THREADS=1: on a shared 2-core machine spinning threads dominate
    path = ROOT / "results" / f"fp8_convergence_{args.kind}_{record['date'][:10]}.txt"
    provenance.check_writable(path, record)
    bin_dir = Path(args.build) / "bin"
    char = [str(bin_dir / "char_transformer"), "--steps", str(args.char_steps), "--log-every", "50",
            "--sample-chars", "0", "--precision", "bf16"]
    mnist = [str(bin_dir / "fashion_mnist"), "--model", "mlp", "--epochs", str(args.mnist_epochs),
             "--precision", "bf16", "--out", "/tmp/fp8_convergence"]
    runs = {}
    body = []
    for name, command in (("char bf16", char), ("char fp8", char + ["--fp8"]), ("mnist bf16", mnist),
                          ("mnist fp8", mnist + ["--fp8"])):
        text = run(command)
        runs[name] = text
        body.append(f"== {' '.join(command)}\n{text.rstrip()}\n")

    rows = []
    for label, pattern, fields in (
            ("char_transformer", r"^step +\d+ +train loss (\S+) +held-out loss (\S+)",
             ("train loss (last 50 steps)", "held-out loss")),
            ("fashion_mnist mlp", r"^epoch \d+/\d+ +mean loss (\S+), test accuracy (\S+)%",
             ("mean loss (last epoch)", "test accuracy %"))):
        key = "char" if label.startswith("char") else "mnist"
        bf16 = last(pattern, runs[f"{key} bf16"], label)
        fp8 = last(pattern, runs[f"{key} fp8"], label)
        for field, a, b in zip(fields, bf16, fp8):
            a, b = float(a), float(b)
            diff = f"{b - a:+.2f} pp" if field.endswith("%") else f"{100.0 * (b - a) / a:+.2f}%"
            rows.append(f"{label:18s}  {field:28s}  {a:9.4f}  {b:9.4f}  {diff}")

    summary = ["summary (fp8 - bf16: relative for losses, percentage points for accuracy):",
               f"{'example':18s}  {'figure':28s}  {'bf16':>9s}  {'fp8':>9s}  difference", *rows]
    path.write_text(provenance.text(record) + "\n".join(body) + "\n" + "\n".join(summary) + "\n")
    print("\n".join(summary))
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
