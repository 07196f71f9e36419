// CUDA registration of linrec::scan and linrec::scan_backward: plans the launch, allocates
// the look-back workspace from PyTorch's caching allocator and calls the kernels on the
// current stream.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

#include "../scan_ops.h"
#include "scan_launch.h"

namespace linrec {
namespace {

template <bool kBackward>
cudaError_t launch_dtype(at::ScalarType dtype, const ScanParams& p, const ScanPlan& plan, void* ws,
                         cudaStream_t stream) {
  switch (dtype) {
    case at::kFloat:
      return launch_scan<ScanDType::kFloat32, kBackward>(p, plan, ws, stream);
    case at::kHalf:
      return launch_scan<ScanDType::kFloat16, kBackward>(p, plan, ws, stream);
    case at::kBFloat16:
      return launch_scan<ScanDType::kBFloat16, kBackward>(p, plan, ws, stream);
    default:
      TORCH_CHECK(false, "linrec.scan: the CUDA kernels take float32, float16 or bfloat16, got ",
                  c10::toString(dtype));
  }
}

void launch_cuda(const ScanParams& p, at::ScalarType dtype, const at::Device& device) {
  const c10::cuda::CUDAGuard guard(device);
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  const ScanPlan plan =
      plan_scan(p, static_cast<int>(c10::elementSize(dtype)), prop->multiProcessorCount, prop->major);
  TORCH_CHECK(plan.grid <= std::numeric_limits<int32_t>::max(), "linrec.scan: ", std::to_string(p.num_seq),
              " sequences of length ", std::to_string(p.len), " need ", std::to_string(plan.grid),
              " blocks, more than a CUDA grid holds");
  at::Tensor workspace;
  if (plan.workspace_bytes > 0)
    workspace = at::empty({static_cast<int64_t>(plan.workspace_bytes)},
                          at::TensorOptions().dtype(at::kByte).device(device));
  void* ws = plan.workspace_bytes > 0 ? workspace.data_ptr() : nullptr;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cudaError_t err = p.backward ? launch_dtype<true>(dtype, p, plan, ws, stream)
                                     : launch_dtype<false>(dtype, p, plan, ws, stream);
  TORCH_CHECK(err == cudaSuccess, "linrec.scan: CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, CUDA, m) { impl_scan_ops<launch_cuda>(m); }

}  // namespace linrec
