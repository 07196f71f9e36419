#include <Python.h>

#include "ops.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>

#include <vector>

#include "../common/errors.h"
#include "../common/host_pool.h"
#include "../common/layout.h"
#include "tuned.h"

namespace linrec {

std::string strip_prefer(c10::string_view config, bool* prefer, bool* tuned) {
  const std::string s(config.data(), config.size());
  const std::string p(kPreferPrefix), t(kTunedPrefix);
  const bool is_tuned = s.compare(0, t.size(), t) == 0;
  if (tuned) *tuned = is_tuned;
  *prefer = is_tuned || s.compare(0, p.size(), p) == 0;
  return is_tuned ? s.substr(t.size()) : *prefer ? s.substr(p.size()) : s;
}

bool is_triton_config(const OptConfig& config) {
  if (!config.has_value()) return false;
  bool prefer;
  const std::string name = strip_prefer(*config, &prefer);
  return name == kTritonDefault || name.rfind(kTritonConfigPrefix, 0) == 0;
}

namespace {

// The Triton ops are registered by a Python module that `import torch_linrec` does not load (it
// imports triton, ~1 s): a call that needs one imports it, under the GIL and outside any lock of
// ours (not inside a function-local static's initialization, which another thread holding the GIL
// could wait on). Once registered this is one schema lookup. Returns the import error's text, empty
// on success or without an interpreter (AOTInductor's C++ runtime).
std::string import_triton_ops(const char* name) {
  if (c10::Dispatcher::singleton().findSchema({name, ""}).has_value() || !Py_IsInitialized()) return "";
  const PyGILState_STATE gil = PyGILState_Ensure();
  std::string error;
  PyObject* module = PyImport_ImportModule("torch_linrec.linrec.triton");
  if (module == nullptr) {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    PyObject* text = value ? PyObject_Str(value) : nullptr;
    PyObject* bytes = text ? PyUnicode_AsUTF8String(text) : nullptr;
    error = bytes ? PyBytes_AsString(bytes) : "import torch_linrec.linrec.triton failed";
    Py_XDECREF(bytes);
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(trace);
    PyErr_Clear();
  }
  Py_XDECREF(module);
  PyGILState_Release(gil);
  return error;
}

template <typename Sig>
c10::TypedOperatorHandle<Sig> find_triton_op(const char* name, const std::string& import_error) {
  auto handle = c10::Dispatcher::singleton().findSchema({name, ""});
  TORCH_CHECK_VALUE(handle.has_value(), "linrec.scan: the config names a Triton config, but ", name,
                    " is not registered: install triton (import torch_linrec.linrec.triton: ",
                    import_error.empty() ? "no Python interpreter" : import_error, ")");
  return handle->typed<Sig>();
}

// The handle of an op torch_linrec.linrec.triton registers (the import outside the static's
// initialization, see import_triton_ops; a failed lookup raises and is tried again on the next call).
template <typename Sig, const char* kName>
const c10::TypedOperatorHandle<Sig>& python_op() {
  const std::string error = import_triton_ops(kName);
  static const auto op = find_triton_op<Sig>(kName, error);
  return op;
}

constexpr char kScanTriton[] = "linrec::scan_triton";
constexpr char kScanBackwardTriton[] = "linrec::scan_backward_triton";
constexpr char kScanTritonEager[] = "linrec::_scan_triton_eager";
constexpr char kScanBackwardTritonEager[] = "linrec::_scan_backward_triton_eager";

}  // namespace

const c10::TypedOperatorHandle<ScanSig>& scan_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("linrec::scan", "").typed<ScanSig>();
  return op;
}

const c10::TypedOperatorHandle<ScanSig>& scan_triton_op() {
  return python_op<ScanSig, kScanTriton>();
}

const c10::TypedOperatorHandle<ScanBackwardSig>& scan_backward_triton_op() {
  return python_op<ScanBackwardSig, kScanBackwardTriton>();
}

const c10::TypedOperatorHandle<ScanSig>& scan_triton_eager_op() {
  return python_op<ScanSig, kScanTritonEager>();
}

const c10::TypedOperatorHandle<ScanBackwardSig>& scan_backward_triton_eager_op() {
  return python_op<ScanBackwardSig, kScanBackwardTritonEager>();
}

namespace {

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    default: return "float64";
  }
}

// Config "auto": the tuned cache's choice for the call's bucket (tuned.h) as a preference, so that
// a bucket's choice that does not apply to this call's exact layout runs the default ("prefer:"
// for a Triton choice, "tuned:" for a native one: see kTunedPrefix); nullopt
// (the default) without an entry or where it does not apply at this length and direction. `ref` is x (forward)
// or y (backward).
std::optional<std::string> resolve_auto(bool backward, const Tensor& ref, const Tensor& coeffs, int64_t d,
                                        bool reverse, bool initial) {
  if (!ref.is_cuda() && !ref.is_cpu()) return std::nullopt;
  const int64_t length = ref.size(d);
  const int64_t rows = length > 0 ? ref.numel() / length : 0;
  const std::string layout =
      scan_layout_class(ref.sizes().vec(), ref.strides().vec(), d, coeffs.sizes() != ref.sizes());
  auto name = tuned_config(ref.is_cuda() ? ref.get_device() : kCpuTable,
                           bucket_key("scan", backward ? "bwd" : "fwd", dtype_name(ref.scalar_type()), layout, length, rows),
                           length, reverse, initial);
  if (!name) return std::nullopt;
  return std::string(is_triton_config(*name) ? kPreferPrefix : kTunedPrefix) + *name;
}

bool is_auto(const OptConfig& config) { return config.has_value() && *config == kAutoConfig; }

bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

}  // namespace

int64_t check_scan_inputs(const char* op, const Tensor& x, const Tensor& coeffs, const std::optional<Tensor>& initial,
                          int64_t dim, const char* x_name, const char* coeffs_name) {
  const char* xn = x_name;
  const char* cn = coeffs_name;
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": ", xn, " must have at least one dimension, got a 0-d tensor");
  TORCH_CHECK_VALUE(is_supported_dtype(x.scalar_type()), op, ": ", xn,
                    " must be float32, float16, bfloat16 or float64, got ", dt(x.scalar_type()));
  TORCH_CHECK_VALUE(coeffs.scalar_type() == x.scalar_type(), op, ": ", cn, " must have the dtype of ", xn, " (",
                    dt(x.scalar_type()), "), got ", dt(coeffs.scalar_type()));
  TORCH_CHECK_VALUE(coeffs.device() == x.device(), op, ": ", cn, " must be on the device of ", xn, " (",
                    dev(x.device()), "), got ", dev(coeffs.device()));
  TORCH_CHECK_VALUE(x.scalar_type() != at::kDouble || x.device().is_cpu(), op,
                    ": float64 is supported on the CPU only, got ", xn, " on ", dev(x.device()));
  TORCH_CHECK_VALUE(-x.dim() <= dim && dim < x.dim(), op, ": dim must be in [", num(-x.dim()), ", ",
                    num(x.dim() - 1), "] for ", xn, " of shape ", shape(x.sizes()), ", got ", num(dim));
  const int64_t d = at::maybe_wrap_dim(dim, x.dim());
  TORCH_CHECK_VALUE(at::is_expandable_to(coeffs.sizes(), x.sizes()), op, ": ", cn, " of shape ",
                    shape(coeffs.sizes()), " must be broadcastable to ", xn, " of shape ", shape(x.sizes()));
  if (initial.has_value()) {
    const Tensor& h0 = *initial;
    auto expect = x.sizes().vec();
    expect.erase(expect.begin() + d);
    TORCH_CHECK_VALUE(h0.scalar_type() == x.scalar_type(), op, ": initial must have the dtype of ", xn, " (",
                      dt(x.scalar_type()), "), got ", dt(h0.scalar_type()));
    TORCH_CHECK_VALUE(h0.device() == x.device(), op, ": initial must be on the device of ", xn, " (",
                      dev(x.device()), "), got ", dev(h0.device()));
    TORCH_CHECK_VALUE(at::is_expandable_to(h0.sizes(), expect), op, ": initial must have shape ", shape(expect),
                      " (", xn, " without dim ", num(d), ") or broadcast to it, got ", shape(h0.sizes()));
  }
  return d;
}

namespace {

void check_config(const char* op, const OptConfig& config) {
  TORCH_CHECK_VALUE(!is_triton_config(config), op, ": config '", std::string(config->data(), config->size()),
                    "' names a Triton config; pass it to the Triton op (torch.ops.linrec.scan_triton) or to "
                    "torch_linrec.scan");
}

std::vector<int64_t> batch_shape(const Tensor& x, int64_t dim) {
  auto s = x.sizes().vec();
  s.erase(s.begin() + dim);
  return s;
}

std::optional<Tensor> expand_initial(const std::optional<Tensor>& initial, const Tensor& x, int64_t dim) {
  if (!initial.has_value()) return std::nullopt;
  return initial->expand(batch_shape(x, dim));
}

SlotTensors<kNumSlots> slot_tensors() {
  SlotTensors<kNumSlots> s;
  for (int slot = 0; slot < kNumSlots; ++slot) s.batch[slot] = is_batch_slot(slot);
  return s;
}

}  // namespace

Tensor scan_impl(const Tensor& x, const Tensor& coeffs, const std::optional<Tensor>& initial, int64_t dim,
                 bool reverse, const OptConfig& config, ScanLauncher launch) {
  const int64_t d = check_scan_inputs("linrec.scan", x, coeffs, initial, dim);
  if (is_auto(config)) {
    const auto resolved = resolve_auto(false, x, coeffs, d, reverse, initial.has_value());
    const OptConfig cfg = resolved ? OptConfig(*resolved) : std::nullopt;
    if (is_triton_config(cfg)) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return scan_triton_eager_op().call(x, coeffs, initial, d, reverse, cfg, std::nullopt);
    }
    return scan_impl(x, coeffs, initial, dim, reverse, cfg, launch);
  }
  check_config("linrec.scan", config);
  Tensor y = empty_like_pooled(x);  // CPU: recycled blocks (common/host_pool.h)
  if (y.numel() == 0) return y;
  const Tensor c = coeffs.expand(x.sizes());
  const auto h0 = expand_initial(initial, x, d);
  auto s = slot_tensors();
  s.t[kIn] = &x;
  s.t[kCoeff] = &c;
  s.t[kOut] = &y;
  if (h0) s.t[kInit] = &*h0;
  ScanParams p{};
  fill_layout(p, s, y, d, reverse, "linrec.scan");
  p.backward = false;
  p.deterministic = at::globalContext().deterministicAlgorithms();
  launch(p, x.scalar_type(), x.device(), config);
  return y;
}

std::tuple<Tensor, Tensor, Tensor> scan_backward_impl(const Tensor& grad_y, const Tensor& coeffs, const Tensor& y,
                                                      const std::optional<Tensor>& initial, int64_t dim, bool reverse,
                                                      const OptConfig& config, ScanLauncher launch) {
  const int64_t d = check_scan_inputs("linrec.scan_backward", y, coeffs, initial, dim);
  TORCH_CHECK_VALUE(grad_y.sizes() == y.sizes(), "linrec.scan_backward: grad_y must have the shape of y (",
                    shape(y.sizes()), "), got ", shape(grad_y.sizes()));
  TORCH_CHECK_VALUE(grad_y.scalar_type() == y.scalar_type() && grad_y.device() == y.device(),
                    "linrec.scan_backward: grad_y must have the dtype and device of y (", dt(y.scalar_type()), ", ",
                    dev(y.device()), "), got ", dt(grad_y.scalar_type()), ", ", dev(grad_y.device()));
  if (is_auto(config)) {
    const auto resolved = resolve_auto(true, y, coeffs, d, reverse, initial.has_value());
    const OptConfig cfg = resolved ? OptConfig(*resolved) : std::nullopt;
    if (is_triton_config(cfg)) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return scan_backward_triton_eager_op().call(grad_y, coeffs, y, initial, d, reverse, cfg);
    }
    return scan_backward_impl(grad_y, coeffs, y, initial, dim, reverse, cfg, launch);
  }
  check_config("linrec.scan_backward", config);
  // Broadcast coeffs: on CUDA the kernels add their gradient into a float32 buffer of the coeffs'
  // shape (no full-size temporary); elsewhere, and under torch.use_deterministic_algorithms(True)
  // (atomic adds sum in a timing-dependent order), it is computed full size and reduced.
  const bool broadcast_c = coeffs.sizes() != y.sizes();
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  const bool accumulate = broadcast_c && y.is_cuda() && !deterministic;
  // CPU: the outputs' blocks are recycled (common/host_pool.cpp: glibc would page-fault them in again).
  Tensor grad_x = empty_like_pooled(y);
  Tensor grad_c = accumulate ? at::zeros(coeffs.sizes(), y.options().dtype(at::kFloat)) : empty_like_pooled(y);
  const Tensor grad_c_view = accumulate ? grad_c.expand(y.sizes()) : grad_c;
  Tensor grad_h0 = at::empty(batch_shape(y, d), y.options());
  if (y.size(d) == 0) {
    grad_h0.zero_();
  } else if (y.numel() > 0) {
    const Tensor c = coeffs.expand(y.sizes());
    const auto h0 = expand_initial(initial, y, d);
    auto s = slot_tensors();
    s.t[kIn] = &grad_y;
    s.t[kCoeff] = &c;
    s.t[kOut] = &y;
    if (h0) s.t[kInit] = &*h0;
    s.t[kGradIn] = &grad_x;
    s.t[kGradCoeff] = &grad_c_view;
    s.t[kGradInit] = &grad_h0;
    // The vector-Jacobian product is a scan in the opposite direction.
    ScanParams p{};
    fill_layout(p, s, y, d, !reverse, "linrec.scan_backward");
    p.backward = true;
    p.accumulate_grad_coeff = accumulate;
    p.deterministic = deterministic;
    launch(p, y.scalar_type(), y.device(), config);
  }
  if (accumulate) grad_c = grad_c.to(y.scalar_type());
  else if (broadcast_c) grad_c = grad_c.sum_to_size(coeffs.sizes());
  return {grad_x, grad_c, grad_h0};
}

}  // namespace linrec
