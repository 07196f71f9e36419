// Device-independent host side of linrec::scan and linrec::scan_backward: argument checks, output
// allocation and the tensor -> ScanParams layout. Each device (CPU, CUDA) supplies a ScanLauncher.
#pragma once
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/string_view.h>

#include <optional>
#include <string>

#include "params.h"

namespace linrec {

using at::Tensor;
using OptConfig = std::optional<c10::string_view>;

// Runs the kernel for `params` with tensors of `dtype` on `device`; `config` names the kernel
// config (None: the device's default). Raises ValueError for a config it does not know or that
// does not apply, listing the valid names.
using ScanLauncher = void (*)(const ScanParams& params, at::ScalarType dtype, const at::Device& device,
                              const OptConfig& config);

// Config names (torch_linrec/linrec/ops.py has the same rules): "native" and "triton" name each
// backend's default config, "triton.<...>" the Triton configs (torch_linrec/linrec/triton), which
// the native ops reject and the autograd of linrec::scan hands to the Triton backward; a name
// behind "prefer:" is a preference: where it does not apply, the default runs. "auto" (tuned.h)
// runs the tuned cache's choice for the call's bucket on its device, which may be a Triton config
// (the native op then runs it through linrec::_scan_triton_eager, below), else the default; a
// native choice goes to the launcher behind "tuned:", a preference that also yields to the
// planner's rules newer than the shipped caches (CUDA: plan.h's small stream blocks).
constexpr const char* kNativeDefault = "native";
constexpr const char* kTritonDefault = "triton";
constexpr const char* kTritonConfigPrefix = "triton.";
constexpr const char* kPreferPrefix = "prefer:";
constexpr const char* kTunedPrefix = "tuned:";

// `config` without a "prefer:" or "tuned:" prefix; whether it had one (either: a preference), and
// (`tuned`, when given) whether it was "tuned:".
std::string strip_prefer(c10::string_view config, bool* prefer, bool* tuned = nullptr);
// Whether `config` (after any "prefer:") names a Triton config.
bool is_triton_config(const OptConfig& config);

using ScanSig = Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t, bool, OptConfig,
                       OptConfig);
using ScanBackwardSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                           const std::optional<Tensor>&, int64_t, bool, OptConfig);
// linrec::scan through the dispatcher.
const c10::TypedOperatorHandle<ScanSig>& scan_op();
// linrec::scan_triton and linrec::scan_backward_triton, defined in Python by torch_linrec.linrec.triton
// (imported on first use); ValueError if they cannot be registered.
const c10::TypedOperatorHandle<ScanSig>& scan_triton_op();
const c10::TypedOperatorHandle<ScanBackwardSig>& scan_backward_triton_op();
// Their eager twins linrec::_scan_triton_eager and linrec::_scan_backward_triton_eager, which the
// native ops' kernels call for a Triton "auto" entry (below autograd, arguments checked; compiled
// graphs hold the native op there): plain Python kernels, without the public ops' custom-op layers.
const c10::TypedOperatorHandle<ScanSig>& scan_triton_eager_op();
const c10::TypedOperatorHandle<ScanBackwardSig>& scan_backward_triton_eager_op();

// Checks of a scan's operands (the same as torch_linrec/linrec/checks.py: check_scan_args), naming
// them x_name and coeffs_name in messages; returns the wrapped scan dim. Raises ValueError.
int64_t check_scan_inputs(const char* op, const Tensor& x, const Tensor& coeffs, const std::optional<Tensor>& initial,
                          int64_t dim, const char* x_name = "x", const char* coeffs_name = "coeffs");

Tensor scan_impl(const Tensor& x, const Tensor& coeffs, const std::optional<Tensor>& initial, int64_t dim,
                 bool reverse, const OptConfig& config, ScanLauncher launch);

std::tuple<Tensor, Tensor, Tensor> scan_backward_impl(const Tensor& grad_y, const Tensor& coeffs, const Tensor& y,
                                                      const std::optional<Tensor>& initial, int64_t dim, bool reverse,
                                                      const OptConfig& config, ScanLauncher launch);

// The op kernels of one device, registered by impl_scan_ops<launch>(m) in its TORCH_LIBRARY_IMPL.
template <ScanLauncher kLaunch>
Tensor scan_kernel(const Tensor& x, const Tensor& coeffs, const std::optional<Tensor>& initial, int64_t dim,
                   bool reverse, OptConfig config, OptConfig /*backward_config: read by autograd*/) {
  return scan_impl(x, coeffs, initial, dim, reverse, config, kLaunch);
}

template <ScanLauncher kLaunch>
std::tuple<Tensor, Tensor, Tensor> scan_backward_kernel(const Tensor& grad_y, const Tensor& coeffs, const Tensor& y,
                                                        const std::optional<Tensor>& initial, int64_t dim,
                                                        bool reverse, OptConfig config) {
  return scan_backward_impl(grad_y, coeffs, y, initial, dim, reverse, config, kLaunch);
}

template <ScanLauncher kLaunch>
void impl_scan_ops(torch::Library& m) {
  m.impl("scan", &scan_kernel<kLaunch>);
  m.impl("scan_backward", &scan_backward_kernel<kLaunch>);
}

}  // namespace linrec
