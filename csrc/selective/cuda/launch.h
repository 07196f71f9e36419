// Entry point of the CUDA selective-scan kernels for host code (torch-free).
#pragma once
#include <cuda_runtime_api.h>

#include "params.h"

namespace linrec {

// Launches the forward kernel (backward = false: out, last state and checkpoints as `p` asks) or
// the backward kernel on `stream`. Defined once per dtype in selective_scan_<dtype>.cu.
// Returns cudaErrorInvalidConfiguration for a launch shape without a compiled kernel.
template <SelectiveDType kDType>
cudaError_t launch_selective(const SelectiveParams& p, const SelectiveLaunch& launch, bool backward,
                             cudaStream_t stream);

// A (batch, groups, nstate, len) tensor of float32, float16 or bfloat16 with int64 strides: B, C
// or their gradients in the inputs' layout.
struct StateRows {
  void* p = nullptr;
  SelectiveDType dtype = SelectiveDType::kFloat32;
  int64_t groups = 1, sb = 0, sg = 0, sn = 0, sl = 0;
};

constexpr int kMaxFills = 3;

// B and C into the kernels' step-major rows (batch, groups, len, nstate_pad) float32 contiguous
// (states past nstate zero), in one launch that also zeroes the backward's accumulators: dB_zero
// and dC_zero (null, or shaped like B_rows and C_rows) and `fill` ranges of fill_numel floats.
struct StepMajorArgs {
  StateRows B, C;
  float* B_rows = nullptr;
  float* C_rows = nullptr;
  float* dB_zero = nullptr;
  float* dC_zero = nullptr;
  float* fill[kMaxFills] = {};
  int64_t fill_numel[kMaxFills] = {};
  int64_t batch = 0, len = 0, nstate = 0, nstate_pad = 0;
  int64_t rows = 0;  // set by the launcher
};
cudaError_t launch_step_major(StepMajorArgs args, cudaStream_t stream);

// The backward's dB and dC accumulators (step-major rows as above) into dB and dC (their states
// < nstate, converted to each one's dtype), in one launch.
struct StatesLastArgs {
  const float* dB_rows = nullptr;
  const float* dC_rows = nullptr;
  StateRows dB, dC;
  int64_t batch = 0, len = 0, nstate = 0, nstate_pad = 0;
  int64_t rows = 0;  // set by the launcher
};
cudaError_t launch_states_last(StatesLastArgs args, cudaStream_t stream);

}  // namespace linrec
