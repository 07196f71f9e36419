// One dtype per file, so the kernels compile in parallel.
#include "launch.cuh"

namespace linrec {
template <>
cudaError_t launch_selective<SelectiveDType::kBFloat16>(const SelectiveParams& p, const SelectiveLaunch& launch,
                                                   bool backward, cudaStream_t stream) {
  return selective::dispatch<__nv_bfloat16>(p, launch, backward, stream);
}
}  // namespace linrec
