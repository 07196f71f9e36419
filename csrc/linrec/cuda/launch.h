// Entry point of the CUDA scan kernels for host code (torch-free, no CUDA C++ needed).
#pragma once
#include <cuda_runtime_api.h>

#include "plan.h"

namespace linrec {

enum class ScanDType : int { kFloat32, kFloat16, kBFloat16 };

// Launches the kernel `plan` selects on `stream`. `workspace` holds plan.workspace_bytes
// (may be null when 0); the launcher zeroes its first plan.zeroed_bytes itself.
// Defined once per dtype and direction in scan_<dtype>_<dir>.cu.
template <ScanDType kDType, bool kBackward>
cudaError_t launch_scan(const ScanParams& p, const ScanPlan& plan, void* workspace, cudaStream_t stream);

}  // namespace linrec
