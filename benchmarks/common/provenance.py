# benchmarks/common/provenance.py — where a results file came from, for the Python sides.
#
# The same record as common/provenance.hpp writes for the C++ programs: commit (with
# "-dirty"), date (UTC), command line, machine (CPU model, family/model, ISA flags; the GPU
# and driver when one is used), threads and the 1-minute load average at the start; and the
# same overwrite rule: check_writable(path, record) refuses (exit status 2) when `path`
# exists and does not name this run's machine. Import it with
#   sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common")); import provenance
import datetime
import os
import subprocess
import sys
from pathlib import Path

ISA_FLAGS = ("avx2", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")
SOURCE = Path(__file__).resolve().parents[2]


def cpu_description():
    """"model name (family F model M; the flags among avx2 ... amx_fp16 that it has)", as machine.hpp."""
    fields = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model", "flags") and key not in fields:
                fields[key] = value.strip()
            if "flags" in fields:
                break
    except OSError:
        pass
    flags = fields.get("flags", "").split()
    isa = " ".join(f for f in ISA_FLAGS if f in flags)
    return (f"{fields.get('model name', 'unknown CPU')} (family {fields.get('cpu family', '?')} model "
            f"{fields.get('model', '?')}; {isa or 'no AVX2'}{'' if any(f.startswith('amx_') for f in flags) else ', no AMX'})")


def _git(*args):
    try:
        return subprocess.run(["git", "-C", str(SOURCE), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def provenance(threads, gpu=""):
    """The record for this run; `gpu`: name and driver of the GPU used, "" on the CPU."""
    commit = _git("rev-parse", "--short=12", "HEAD")
    if commit is None:
        commit = "unknown (not run from a git checkout)"
    elif _git("status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    cpu = cpu_description()
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = -1.0
    return {"commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join([sys.executable.split("/")[-1], *sys.argv]),
            "machine": f"{cpu}; GPU {gpu}" if gpu else cpu, "cpu": cpu, "gpu": gpu, "threads": threads,
            "load_1min": load}


def text(record, prefix="# "):
    """The record as text lines, each starting with `prefix`."""
    return "".join(f"{prefix}{line}\n" for line in (
        f"commit: {record['commit']}", f"date: {record['date']}", f"command: {record['command']}",
        f"machine: {record['machine']}",
        f"threads: {record['threads']}, load average (1 min) at start: {record['load_1min']}"))


def check_writable(path, record):
    """Exit (status 2) when `path` exists and does not name this run's machine."""
    path = Path(path)
    if path.exists() and record["machine"] not in path.read_text(errors="replace"):
        sys.exit(f"{path} exists and was not written on this machine ({record['machine']}), or records no "
                 "machine: not overwriting it. Name this run's file with the machine kind and date, e.g. "
                 "<benchmark>_<kind>_<YYYY-MM-DD>.json.")
