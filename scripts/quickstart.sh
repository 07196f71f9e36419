#!/usr/bin/env bash
# Quickstart on a fresh machine with only Python: installs what is missing, then runs.
#   bash scripts/quickstart.sh bench [ARGS]   # the main job: python -m torch_linrec ARGS
#   bash scripts/quickstart.sh test  [ARGS]   # the test suite: python -m pytest tests -q ARGS
# Every pip call is `$PYTHON -m pip` (PYTHON, default python3), so the packages land in the Python
# that runs them. torch is installed only when absent: the CPU wheel where no NVIDIA GPU is visible,
# PyPI's default (CUDA) wheel where one is; an installed torch (a CUDA image's) is kept. The package
# builds against that torch (--no-build-isolation), so the build needs setuptools >= 77 and ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
what=${1:-}
case "$what" in
  bench|test) shift ;;
  *) echo "usage: bash scripts/quickstart.sh bench|test [ARGS]" >&2; exit 2 ;;
esac
"$PY" -m pip --version >/dev/null 2>&1 || "$PY" -m ensurepip --upgrade
gpu=0
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && gpu=1
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if [ "$gpu" = 1 ]; then
    "$PY" -m pip install "torch>=2.11"
  else
    "$PY" -m pip install "torch>=2.11" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
"$PY" -m pip install -q "setuptools>=77" wheel ninja
extras=$([ "$what" = test ] && echo "[test]" || true)
"$PY" -m pip install -q --no-build-isolation -e ".$extras"
"$PY" -c "import torch, torch_linrec._library as lib; print('torch', torch.__version__, '|', lib.build_info())"
if [ "$what" = bench ]; then
  exec "$PY" -m torch_linrec "$@"
fi
if [ "$gpu" = 1 ]; then
  exec "$PY" -m pytest tests -q "$@"                     # Triton compiled on the GPU
fi
TRITON_INTERPRET=1 exec "$PY" -m pytest tests -q "$@"   # CPU: the Triton kernels interpreted
