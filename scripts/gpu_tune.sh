#!/usr/bin/env bash
# Tuning run on the GPU machine in one call: build, then whichever of these the environment asks for:
#   PERF_CASES="few-long ..."   quick_perf (native vs torch.add) on those cases ("all": the suite)
#   SWEEP="0 1 ..."             TORCH_LINREC_CUDA_STREAM_CONFIG values on $SWEEP_CASES (default few-long)
#   STORE_SWEEP="direct bulk"   TORCH_LINREC_CUDA_STREAM_STORE values on $SWEEP_CASES
#   CHANNEL_SWEEP, TILE_SWEEP   the channel (mamba-BLD cases) and tile (many-short cases) configs
#   DIAG_MEM=1                  the op-by-op peak-memory trace (scripts/diag_peak_memory.py)
#   BENCH_CASES="small-call"    the main job on those cases
#   TEST_K="stream or compile"  the CUDA-marked tests matching that pytest -k expression ("all": every one)
# e.g. OUT=dir PERF_CASES=all SWEEP="1 4" TEST_K=all bash scripts/gpu_tune.sh
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name --format=csv,noheader
start=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - start )) s"; grep -i "spill" "$OUT/build.log" | grep -v " 0 bytes spill" | head
[ "${DIAG_MEM:-0}" = 1 ] && python3 scripts/diag_peak_memory.py 2>&1 | tail -30 > "$OUT/diag_mem.log"
if [ -n "${PERF_CASES:-}" ]; then
  [ "$PERF_CASES" = all ] && PERF_CASES=""
  python3 scripts/quick_perf.py $PERF_CASES 2>&1 | tee "$OUT/perf.log"
fi
sweep() {  # sweep ENV_VAR "values" cases...
  local var=$1 values=$2; shift 2
  for cfg in $values; do
    echo "$var=$cfg" | tee -a "$OUT/perf.log"
    env "$var=$cfg" python3 scripts/quick_perf.py "$@" 2>&1 | tee -a "$OUT/perf.log"
  done
}
sweep TORCH_LINREC_CUDA_STREAM_CONFIG "${SWEEP:-}" ${SWEEP_CASES:-few-long very-few-long}
sweep TORCH_LINREC_CUDA_STREAM_STORE "${STORE_SWEEP:-}" ${SWEEP_CASES:-few-long very-few-long}
sweep TORCH_LINREC_CUDA_CHANNEL_CONFIG "${CHANNEL_SWEEP:-}" mamba-BLD bf16-mamba-BLD
sweep TORCH_LINREC_CUDA_TILE_CONFIG "${TILE_SWEEP:-}" many-short bf16-many-short
if [ -n "${BENCH_CASES:-}" ]; then
  python3 -m torch_linrec --out "$OUT" --no-progress --no-plot --cases $BENCH_CASES 2>&1 | tee "$OUT/bench.log" | tail -30
fi
if [ -n "${TEST_K:-}" ]; then
  [ "$TEST_K" = all ] && TEST_K=""
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest tests -q -m cuda -p no:cacheprovider ${TEST_K:+-k "$TEST_K"} \
    >"$OUT/tests.log" 2>&1
  echo "cuda tests rc=$?"; grep -E "^FAILED|passed|failed" "$OUT/tests.log" | tail -15
fi
exit 0
