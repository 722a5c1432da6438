# shellcheck shell=bash
# benchmarks/pytorch/torch_env.sh — the PyTorch that the comparisons measure against, and
# the libtorch programs built on it; sourced (after scripts/setup) by benchmarks/pytorch/run
# and benchmarks/op_overhead/run.
#
#   torch_python          sets TORCH_PYTHON: $PYTHON if set; else the virtual environment
#                         $TRAINMEM_BUILD_DIR/torch-venv with PyTorch 2.x from PyPI (made
#                         with `python3 -m venv` and `pip install torch numpy` when missing:
#                         the PyTorch a user installs today); where that cannot be made,
#                         a python3 that imports torch, else Debian's python3-torch.
#   torch_build_libtorch  sets LIBTORCH_BIN to the folder holding libtorch_side and
#                         op_overhead_libtorch, built against that PyTorch's own libtorch
#                         (its share/cmake/Torch); empty where it has none or the build
#                         fails (then the reports leave the libtorch rows out).

TORCH_ENV_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

torch_as_root() { if ((EUID == 0)); then "$@"; else sudo "$@"; fi; }
torch_apt_install() {
  echo "torch_env: installing $*"
  torch_as_root apt-get update -q
  torch_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

# Makes (or finds) the virtual environment; returns non-zero where it cannot be made.
torch_venv() {
  local venv=$1
  if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c 'import torch, numpy' 2>/dev/null; then
    return 0
  fi
  if ! python3 -c 'import ensurepip' 2>/dev/null; then  # Debian splits venv's pip out
    torch_apt_install python3-venv || return 1
  fi
  echo "torch_env: making $venv with PyTorch from PyPI (pip install torch numpy; several GB with the CUDA wheels)"
  rm -rf "$venv"
  python3 -m venv "$venv" || return 1
  "$venv/bin/python" -m pip install --progress-bar off torch numpy || return 1
  "$venv/bin/python" -c 'import torch, numpy'
}

torch_python() {
  TORCH_PYTHON="${PYTHON:-}"
  if [[ -z "$TORCH_PYTHON" ]]; then
    local venv="$TRAINMEM_BUILD_DIR/torch-venv"
    if torch_venv "$venv"; then
      TORCH_PYTHON="$venv/bin/python"
    else
      echo "torch_env: could not make $venv; falling back to a system PyTorch" >&2
      rm -rf "$venv"
      local candidate
      for candidate in /usr/bin/python3 python3; do
        if command -v "$candidate" >/dev/null && "$candidate" -c 'import torch, numpy' 2>/dev/null; then
          TORCH_PYTHON="$(command -v "$candidate")"
          break
        fi
      done
    fi
  fi
  if [[ -z "$TORCH_PYTHON" ]]; then
    torch_apt_install python3-torch python3-numpy
    TORCH_PYTHON=/usr/bin/python3
  fi
  # Debian's torch calls whatever libblas.so.3 the alternatives system points at; the
  # reference BLAS there would make PyTorch's F32 matmuls 10x slower than it is for anyone
  # with OpenBLAS or MKL, so an optimised one is installed (it becomes the default BLAS).
  if "$TORCH_PYTHON" -c 'import torch, sys; sys.exit("BLAS_INFO=generic" not in torch.__config__.show())'; then
    local blas
    blas="$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)"
    if [[ "$blas" != *openblas* && "$blas" != *blis* && "$blas" != *mkl* ]]; then
      torch_apt_install libopenblas0-openmp
    fi
  fi
  "$TORCH_PYTHON" -c 'import torch; print("torch_env: PyTorch", torch.__version__, "from", torch.__file__,
                      "CUDA", torch.version.cuda if torch.cuda.is_available() else "none")'
  export TORCH_PYTHON
}

torch_build_libtorch() {
  LIBTORCH_BIN=""
  local prefix build="$TRAINMEM_BUILD_DIR/libtorch_side"
  prefix="$("$TORCH_PYTHON" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)"
  if [[ -z "$prefix" || ! -f "$prefix/Torch/TorchConfig.cmake" ]]; then
    echo "torch_env: $TORCH_PYTHON's PyTorch ships no libtorch CMake package; no libtorch side" >&2
    return 0
  fi
  # A tree configured against another PyTorch keeps that one's paths in its cache.
  if [[ -f "$build/CMakeCache.txt" ]] && ! grep -qxF "Torch_DIR:PATH=$prefix/Torch" "$build/CMakeCache.txt"; then
    rm -rf "$build"
  fi
  if cmake -S "$TORCH_ENV_DIR/libtorch_side" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DTorch_DIR="$prefix/Torch" >"$build.configure.log" 2>&1 &&
    cmake --build "$build" -j "$TRAINMEM_JOBS"; then
    LIBTORCH_BIN="$build"
  else
    echo "torch_env: the libtorch programs did not build (configure log: $build.configure.log); no libtorch side" >&2
  fi
  export LIBTORCH_BIN
}
