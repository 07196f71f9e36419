// Entry point of the CUDA scan kernels for host code (torch-free, no CUDA C++ needed).
#pragma once
#include <cuda_runtime_api.h>

#include "plan.h"

namespace linrec {

enum class ScanDType : int { kFloat32, kFloat16, kBFloat16 };

// The look-back workspace of one launch: plan.workspace_bytes at `base` (null when 0), zero at
// launch: `zero` has the launcher zero it first; else it was left zero. The kernels zero
// `clean_bytes` (a multiple of 16) at `clean` as they start, so that launches of one stream can
// alternate between two halves of a kept buffer with no zeroing in between: each cleans the half
// its predecessor used.
struct LookbackWorkspace {
  void* base = nullptr;
  bool zero = true;
  void* clean = nullptr;
  size_t clean_bytes = 0;
};

// Launches the kernel `plan` selects on `stream`.
// Defined once per dtype and direction in scan_<dtype>_<dir>.cu.
template <ScanDType kDType, bool kBackward>
cudaError_t launch_scan(const ScanParams& p, const ScanPlan& plan, const LookbackWorkspace& ws, cudaStream_t stream);

}  // namespace linrec
