#!/usr/bin/env bash
# Tuning run on the GPU machine: build, the op-by-op peak memory trace, the stream-kernel config
# sweep on the look-back cases, then the CUDA-marked tests.  OUT=dir bash scripts/gpu_tune.sh
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
echo "build $(( $(date +%s) - start )) s"
python3 scripts/diag_peak_memory.py 2>&1 | tail -30 > "$OUT/diag_mem.log"
python3 scripts/quick_perf.py ${PERF_CASES:-} 2>&1 | tee "$OUT/perf.log"
for cfg in ${SWEEP:-}; do
  echo "TORCH_LINREC_CUDA_STREAM_CONFIG=$cfg" | tee -a "$OUT/perf.log"
  TORCH_LINREC_CUDA_STREAM_CONFIG=$cfg python3 scripts/quick_perf.py few-long very-few-long 2>&1 | tee -a "$OUT/perf.log"
done
for cfg in ${CHANNEL_SWEEP:-}; do
  echo "TORCH_LINREC_CUDA_CHANNEL_CONFIG=$cfg" | tee -a "$OUT/perf.log"
  TORCH_LINREC_CUDA_CHANNEL_CONFIG=$cfg python3 scripts/quick_perf.py mamba-BLD bf16-mamba-BLD 2>&1 | tee -a "$OUT/perf.log"
done
for cfg in ${TILE_SWEEP:-}; do
  echo "TORCH_LINREC_CUDA_TILE_CONFIG=$cfg" | tee -a "$OUT/perf.log"
  TORCH_LINREC_CUDA_TILE_CONFIG=$cfg python3 scripts/quick_perf.py many-short bf16-many-short 2>&1 | tee -a "$OUT/perf.log"
done
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest tests -q -m cuda -p no:cacheprovider ${TEST_K:+-k "$TEST_K"} \
  >"$OUT/tests.log" 2>&1
echo "cuda tests rc=$?"; grep -E "^FAILED|passed|failed" "$OUT/tests.log" | tail -15
