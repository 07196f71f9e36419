// Device-independent host side of linrec::scan and linrec::scan_backward: argument
// checks, output allocation and the tensor -> ScanParams layout. Each backend
// (CPU, CUDA) only supplies a ScanLauncher.
#pragma once
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <optional>

#include "scan_params.h"

namespace linrec {

using at::Tensor;

// Runs the kernel described by `params` for tensors of dtype `dtype` on `device`.
using ScanLauncher = void (*)(const ScanParams& params, at::ScalarType dtype, const at::Device& device);

Tensor scan_impl(const Tensor& x, const Tensor& coeffs, const std::optional<Tensor>& initial,
                 int64_t dim, bool reverse, ScanLauncher launch);

std::tuple<Tensor, Tensor, Tensor> scan_backward_impl(
    const Tensor& grad_y, const Tensor& coeffs, const Tensor& y, const std::optional<Tensor>& initial,
    int64_t dim, bool reverse, ScanLauncher launch);

// The op kernels of one backend, registered by impl_scan_ops<launch>(m) in its TORCH_LIBRARY_IMPL.
template <ScanLauncher kLaunch>
Tensor scan_kernel(const Tensor& x, const Tensor& coeffs, const std::optional<Tensor>& initial, int64_t dim,
                   bool reverse) {
  return scan_impl(x, coeffs, initial, dim, reverse, kLaunch);
}

template <ScanLauncher kLaunch>
std::tuple<Tensor, Tensor, Tensor> scan_backward_kernel(const Tensor& grad_y, const Tensor& coeffs, const Tensor& y,
                                                        const std::optional<Tensor>& initial, int64_t dim,
                                                        bool reverse) {
  return scan_backward_impl(grad_y, coeffs, y, initial, dim, reverse, kLaunch);
}

template <ScanLauncher kLaunch>
void impl_scan_ops(torch::Library& m) {
  m.impl("scan", &scan_kernel<kLaunch>);
  m.impl("scan_backward", &scan_backward_kernel<kLaunch>);
}

}  // namespace linrec
