// CUDA registration of linrec::scan and linrec::scan_backward: resolves the config name, plans the
// launch from the device's properties, allocates the look-back workspace from PyTorch's caching
// allocator and calls the kernels on the current stream.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>
#include <string>

#include "../../common/errors.h"
#include "../ops.h"
#include "launch.h"

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
      TORCH_CHECK_VALUE(false, "linrec.scan: the CUDA kernels take float32, float16 or bfloat16, got ", dt(dtype));
  }
}

DeviceInfo device_info(c10::DeviceIndex index) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(index);  // cached by torch per device
  return DeviceInfo{prop->multiProcessorCount, prop->major, prop->sharedMemPerBlockOptin};
}

std::string all_config_names(int elem_size) {
  std::string out;
  for (ScanKind kind : kAllKinds)
    for (int i = 0; i < num_configs(kind); ++i) out += (out.empty() ? "" : ", ") + std::string(config_name(kind, elem_size, i));
  return out;
}

// The request a config name makes (index -1 for None); ValueError for a name not in the tables.
ConfigRequest parse_config(const OptConfig& config, int elem_size) {
  ConfigRequest req;
  if (!config.has_value()) return req;
  const std::string name = strip_prefer(*config, &req.prefer);
  if (name == kNativeDefault) return ConfigRequest{};
  for (ScanKind kind : kAllKinds)
    for (int i = 0; i < num_configs(kind); ++i)
      if (name == config_name(kind, elem_size, i)) {
        req.kind = kind;
        req.index = i;
        return req;
      }
  TORCH_CHECK_VALUE(req.prefer, "linrec.scan: unknown CUDA config '", name, "' for ", num(elem_size),
                    "-byte elements; valid: ", kNativeDefault, " (the default), ", all_config_names(elem_size));
  return ConfigRequest{};
}

void launch_cuda(const ScanParams& p, at::ScalarType dtype, const at::Device& device, const OptConfig& config) {
  const c10::cuda::CUDAGuard guard(device);
  const int elem_size = static_cast<int>(c10::elementSize(dtype));
  const DeviceInfo dev = device_info(device.index());
  const ConfigRequest req = parse_config(config, elem_size);
  bool inapplicable = false;
  const ScanPlan plan = plan_scan(p, elem_size, dev, req, &inapplicable);
  TORCH_CHECK_VALUE(!inapplicable, "linrec.scan: config '", config_name(req.kind, elem_size, req.index),
                    "' does not apply to this ", p.backward ? "backward" : "forward", " problem (",
                    num(p.num_seq), " sequences of length ", num(p.len), ", ",
                    is_channel_layout(p) ? "scanned dim not innermost" : "scanned dim innermost",
                    ") on this device; valid here: ", applicable_config_names(p, elem_size, dev));
  TORCH_CHECK_VALUE(plan.grid <= std::numeric_limits<int32_t>::max(), "linrec.scan: ", num(p.num_seq),
                    " sequences of length ", num(p.len), " need ", num(plan.grid), " blocks, more than a CUDA grid holds");
  at::Tensor workspace;
  if (plan.workspace_bytes > 0)
    workspace = at::empty({static_cast<int64_t>(plan.workspace_bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
  void* ws = plan.workspace_bytes > 0 ? workspace.data_ptr() : nullptr;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cudaError_t err = p.backward ? launch_dtype<true>(dtype, p, plan, ws, stream)
                                     : launch_dtype<false>(dtype, p, plan, ws, stream);
  TORCH_CHECK(err == cudaSuccess, "linrec.scan: CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, CUDA, m) { impl_scan_ops<launch_cuda>(m); }

}  // namespace linrec
