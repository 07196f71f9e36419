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

}  // namespace linrec
