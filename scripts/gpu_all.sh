#!/usr/bin/env bash
# The GPU part on a bare CUDA machine with no internet, in steps that fit the device tool's calls:
#   OUT=/path STEPS="build test tune bench" bash scripts/gpu_all.sh [pytest -k expr]
# build: the extension (timed); test: the CUDA-marked tests, tests/test_triton.py's included (TEST_TIMEOUT,
# default 480 s; the whole set runs longer on an H200: split it with the -k argument);
# tune: `python -m torch_linrec tune` (TUNE_ARGS, e.g. --quick), its file installed as the shipped
# cache of this checkout; bench: the main job (scan suite, then the selective section) with the
# shipped cache only (an empty user cache dir).
# Wheels the image lacks (expecttest, platformdirs) are installed from .whl/ when present.
set -uo pipefail
OUT=${OUT:-out}
STEPS=${STEPS:-build test bench}
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
export TORCH_LINREC_CACHE_DIR=${TORCH_LINREC_CACHE_DIR:-/tmp/torch_linrec_empty_cache}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/device.txt"
has() { [[ " $STEPS " == *" $1 "* ]]; }

if has build; then
  start=$(date +%s)
  python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1
  rc=$?
  echo "build: rc=$rc in $(( $(date +%s) - start )) s (MAX_JOBS=$MAX_JOBS)" | tee -a "$OUT/device.txt"
  grep -iE "spill|error" "$OUT/build.log" | grep -v " 0 bytes spill" | head -20
  [ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit $rc; }
fi
if has test; then
  timeout "${TEST_TIMEOUT:-480}" python3 -m pytest tests -q -m cuda ${1:+-k "$1"} -p no:cacheprovider \
    --durations=10 -x >"$OUT/tests.log" 2>&1
  echo "cuda tests: rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head; tail -15 "$OUT/tests.log"
fi
if has tune; then
  start=$(date +%s)
  file=$(python3 -c "from torch_linrec.configs import cache_file_name, device_identity; print(cache_file_name(device_identity(0)))")
  python3 -m torch_linrec tune --no-progress ${TUNE_ARGS:-} --out "$OUT/$file" 2>&1 | tee "$OUT/tune.log" | tail -60
  echo "tune: $(( $(date +%s) - start )) s" | tee -a "$OUT/device.txt"
  cp "$OUT/$file" torch_linrec/configs/
fi
if has bench; then
  python3 -m torch_linrec --out "$OUT" --no-progress ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -90
fi
exit 0
