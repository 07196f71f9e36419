// One dtype and direction per file, so the kernels compile in parallel.
#include "launch.cuh"

namespace linrec {
template cudaError_t launch_scan<ScanDType::kBFloat16, false>(const ScanParams&, const ScanPlan&, const LookbackWorkspace&, cudaStream_t);
}  // namespace linrec
