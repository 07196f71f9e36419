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

}  // namespace linrec
