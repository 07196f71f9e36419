#!/usr/bin/env bash
# The whole GPU part in one command on a bare CUDA machine with no internet:
# build (timed), the benchmark main job, and the CUDA-marked tests.
#   OUT=/path/to/results bash scripts/gpu_all.sh [pytest -k expr]
# Writes build.log, tests.log, bench.log, the benchmark CSV and PNG under $OUT.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
if [ -d .whl ]; then  # wheels carried for packages the GPU image lacks
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"

start=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1
rc=$?
echo "build: rc=$rc in $(( $(date +%s) - start )) s (MAX_JOBS=$MAX_JOBS)" | tee -a "$OUT/device.txt"
grep -iE "spill|error" "$OUT/build.log" | grep -v " 0 bytes spill" | head -20
[ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit $rc; }

python3 -m torch_linrec --out "$OUT" --no-progress 2>&1 | tee "$OUT/bench.log" | tail -40
timeout "${TEST_TIMEOUT:-900}" python3 -m pytest tests -q -m "cuda" ${1:+-k "$1"} -p no:cacheprovider \
  --durations=15 >"$OUT/tests.log" 2>&1
echo "cuda tests: rc=$?"; tail -25 "$OUT/tests.log"
