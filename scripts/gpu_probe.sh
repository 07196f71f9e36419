#!/usr/bin/env bash
# Short probe run on the GPU machine: build, quick_perf on the named cases ($PERF_CASES), the
# stream-config sweep ($SWEEP) on few-long, the channel-config sweep ($CHANNEL_SWEEP), the main job on $BENCH_CASES, CUDA tests matching $TEST_K.
#   OUT=dir PERF_CASES="few-long" SWEEP="1 4" BENCH_CASES=small-call TEST_K=compile bash scripts/gpu_probe.sh
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
[ -n "${PERF_CASES:-}" ] && python3 scripts/quick_perf.py $PERF_CASES 2>&1 | tee "$OUT/perf.log"
for cfg in ${SWEEP:-}; do
  echo "TORCH_LINREC_CUDA_STREAM_CONFIG=$cfg" | tee -a "$OUT/perf.log"
  TORCH_LINREC_CUDA_STREAM_CONFIG=$cfg python3 scripts/quick_perf.py ${SWEEP_CASES:-few-long} 2>&1 | tee -a "$OUT/perf.log"
done
for cfg in ${CHANNEL_SWEEP:-}; do
  echo "TORCH_LINREC_CUDA_CHANNEL_CONFIG=$cfg" | tee -a "$OUT/perf.log"
  TORCH_LINREC_CUDA_CHANNEL_CONFIG=$cfg python3 scripts/quick_perf.py mamba-BLD bf16-mamba-BLD 2>&1 | tee -a "$OUT/perf.log"
done
[ -n "${BENCH_CASES:-}" ] && python3 -m torch_linrec --out "$OUT" --no-progress --no-plot --cases $BENCH_CASES 2>&1 \
  | tee "$OUT/bench.log" | tail -30
if [ -n "${TEST_K:-}" ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest tests -q -m cuda -p no:cacheprovider -k "$TEST_K" >"$OUT/tests.log" 2>&1
  echo "cuda tests rc=$?"; grep -E "^FAILED|passed|failed" "$OUT/tests.log" | tail -15
fi
exit 0
