#include "scan_ops.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <string>

namespace linrec {
namespace {

// Error-message pieces formatted without std::ostream's numeric facets: on the H100 image
// (torch 2.11 wheel, extension built by gcc 13) streaming an integer into TORCH_CHECK's
// message crashed the process, while strings streamed fine.
std::string num(int64_t v) { return std::to_string(v); }
std::string shape(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
std::string dev(const at::Device& d) { return d.str(); }
const char* dt(at::ScalarType t) { return c10::toString(t); }

bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// Checks shared by forward and backward; returns the wrapped scan dim.
int64_t check_inputs(const char* op, const Tensor& x, const Tensor& coeffs,
                     const std::optional<Tensor>& initial, int64_t dim) {
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension, got a 0-d tensor");
  TORCH_CHECK(is_supported_dtype(x.scalar_type()), op,
              ": x must be float32, float16, bfloat16 or float64, got ", dt(x.scalar_type()));
  TORCH_CHECK(coeffs.scalar_type() == x.scalar_type(), op, ": coeffs must have the dtype of x (",
              dt(x.scalar_type()), "), got ", dt(coeffs.scalar_type()));
  TORCH_CHECK(coeffs.device() == x.device(), op, ": coeffs must be on the device of x (", dev(x.device()),
              "), got ", dev(coeffs.device()));
  TORCH_CHECK(x.scalar_type() != at::kDouble || x.device().is_cpu(), op,
              ": float64 is supported on the CPU only, got x on ", dev(x.device()));
  TORCH_CHECK(-x.dim() <= dim && dim < x.dim(), op, ": dim must be in [", num(-x.dim()), ", ", num(x.dim() - 1),
              "] for x of shape ", shape(x.sizes()), ", got ", num(dim));
  const int64_t d = at::maybe_wrap_dim(dim, x.dim());
  TORCH_CHECK(at::is_expandable_to(coeffs.sizes(), x.sizes()), op, ": coeffs of shape ", shape(coeffs.sizes()),
              " must be broadcastable to x of shape ", shape(x.sizes()));
  if (initial.has_value()) {
    const Tensor& h0 = *initial;
    auto expect = x.sizes().vec();
    expect.erase(expect.begin() + d);
    TORCH_CHECK(h0.scalar_type() == x.scalar_type(), op, ": initial must have the dtype of x (",
                dt(x.scalar_type()), "), got ", dt(h0.scalar_type()));
    TORCH_CHECK(h0.device() == x.device(), op, ": initial must be on the device of x (", dev(x.device()),
                "), got ", dev(h0.device()));
    TORCH_CHECK(at::is_expandable_to(h0.sizes(), expect), op, ": initial must have shape ",
                shape(expect), " (x without dim ", num(d), ") or broadcast to it, got ", shape(h0.sizes()));
  }
  return d;
}

std::vector<int64_t> batch_shape(const Tensor& x, int64_t dim) {
  auto s = x.sizes().vec();
  s.erase(s.begin() + dim);
  return s;
}

// Tensors per slot: scan-shaped (x's shape) or batch-shaped (x's shape without dim).
struct SlotTensors {
  std::array<const Tensor*, kNumSlots> t{};
};

bool is_batch_slot(int slot) { return slot == kInit || slot == kGradInit; }

ScanParams make_params(const SlotTensors& slots, int64_t dim, bool reverse, bool backward) {
  const Tensor& ref = *slots.t[kOut];
  const int64_t ndim = ref.dim();
  ScanParams p{};
  p.len = ref.size(dim);
  p.backward = backward;

  // Batch dims, innermost (smallest stride of the output) first.
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < ndim; ++i)
    if (i != dim && ref.size(i) != 1) dims.push_back(i);
  std::stable_sort(dims.begin(), dims.end(),
                   [&](int64_t a, int64_t b) { return std::abs(ref.stride(a)) < std::abs(ref.stride(b)); });

  auto stride_of = [&](int slot, int64_t d) -> int64_t {
    const Tensor& t = *slots.t[slot];
    if (is_batch_slot(slot)) return t.stride(d < dim ? d : d - 1);
    return t.stride(d);
  };

  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, kNumSlots>> strides;
  for (int64_t d : dims) {
    std::array<int64_t, kNumSlots> s{};
    for (int slot = 0; slot < kNumSlots; ++slot)
      if (slots.t[slot]) s[slot] = stride_of(slot, d);
    if (!sizes.empty()) {  // coalesce with the previous (inner) dim where every slot allows it
      bool ok = true;
      for (int slot = 0; slot < kNumSlots; ++slot)
        if (slots.t[slot] && s[slot] != strides.back()[slot] * sizes.back()) ok = false;
      if (ok) {
        sizes.back() *= ref.size(d);
        continue;
      }
    }
    sizes.push_back(ref.size(d));
    strides.push_back(s);
  }
  TORCH_CHECK(static_cast<int>(sizes.size()) <= kMaxBatchDims, "linrec.scan: the layout of x needs ",
              num(static_cast<int64_t>(sizes.size())), " batch dims after coalescing, at most ", num(kMaxBatchDims),
              " are supported; call .contiguous() on the inputs");
  p.nbatch = static_cast<int>(sizes.size());
  p.num_seq = 1;
  for (int i = 0; i < p.nbatch; ++i) {
    p.bsize[i] = sizes[i];
    p.num_seq *= sizes[i];
    for (int slot = 0; slot < kNumSlots; ++slot) p.bstride[slot][i] = strides[i][slot];
  }
  for (int slot = 0; slot < kNumSlots; ++slot) {
    const Tensor* t = slots.t[slot];
    if (!t) continue;
    char* base = static_cast<char*>(t->data_ptr());
    if (!is_batch_slot(slot)) {
      int64_t ls = t->stride(dim);
      if (reverse && p.len > 0) {
        base += (p.len - 1) * ls * static_cast<int64_t>(t->element_size());
        ls = -ls;
      }
      p.lstride[slot] = ls;
    }
    p.ptr[slot] = base;
  }
  return p;
}

std::optional<Tensor> expand_initial(const std::optional<Tensor>& initial, const Tensor& x, int64_t dim) {
  if (!initial.has_value()) return std::nullopt;
  return initial->expand(batch_shape(x, dim));
}

}  // namespace

Tensor scan_impl(const Tensor& x, const Tensor& coeffs, const std::optional<Tensor>& initial,
                 int64_t dim, bool reverse, ScanLauncher launch) {
  const int64_t d = check_inputs("linrec.scan", x, coeffs, initial, dim);
  Tensor y = at::empty_like(x);
  if (y.numel() == 0) return y;
  const Tensor c = coeffs.expand(x.sizes());
  const auto h0 = expand_initial(initial, x, d);
  SlotTensors s;
  s.t[kIn] = &x;
  s.t[kCoeff] = &c;
  s.t[kOut] = &y;
  if (h0) s.t[kInit] = &*h0;
  launch(make_params(s, d, reverse, /*backward=*/false), x.scalar_type(), x.device());
  return y;
}

std::tuple<Tensor, Tensor, Tensor> scan_backward_impl(
    const Tensor& grad_y, const Tensor& coeffs, const Tensor& y, const std::optional<Tensor>& initial,
    int64_t dim, bool reverse, ScanLauncher launch) {
  const int64_t d = check_inputs("linrec.scan_backward", y, coeffs, initial, dim);
  TORCH_CHECK(grad_y.sizes() == y.sizes(), "linrec.scan_backward: grad_y must have the shape of y (",
              shape(y.sizes()), "), got ", shape(grad_y.sizes()));
  TORCH_CHECK(grad_y.scalar_type() == y.scalar_type() && grad_y.device() == y.device(),
              "linrec.scan_backward: grad_y must have the dtype and device of y (", dt(y.scalar_type()), ", ",
              dev(y.device()), "), got ", dt(grad_y.scalar_type()), ", ", dev(grad_y.device()));
  // Broadcast coeffs: on CUDA the kernels add their gradient into a float32 buffer of the
  // coeffs' shape (no full-size temporary); elsewhere it is computed full size and reduced.
  const bool broadcast_c = coeffs.sizes() != y.sizes();
  const bool accumulate = broadcast_c && y.is_cuda();
  Tensor grad_x = at::empty_like(y);
  Tensor grad_c = accumulate ? at::zeros(coeffs.sizes(), y.options().dtype(at::kFloat)) : at::empty_like(y);
  const Tensor grad_c_view = accumulate ? grad_c.expand(y.sizes()) : grad_c;
  Tensor grad_h0 = at::empty(batch_shape(y, d), y.options());
  if (y.size(d) == 0) {
    grad_h0.zero_();
  } else if (y.numel() > 0) {
    const Tensor c = coeffs.expand(y.sizes());
    const auto h0 = expand_initial(initial, y, d);
    SlotTensors s;
    s.t[kIn] = &grad_y;
    s.t[kCoeff] = &c;
    s.t[kOut] = &y;
    if (h0) s.t[kInit] = &*h0;
    s.t[kGradIn] = &grad_x;
    s.t[kGradCoeff] = &grad_c_view;
    s.t[kGradInit] = &grad_h0;
    // The vector-Jacobian product is a scan in the opposite direction.
    ScanParams p = make_params(s, d, !reverse, /*backward=*/true);
    p.accumulate_grad_coeff = accumulate;
    launch(p, y.scalar_type(), y.device());
  }
  if (accumulate) grad_c = grad_c.to(y.scalar_type());
  else if (broadcast_c) grad_c = grad_c.sum_to_size(coeffs.sizes());
  return {grad_x, grad_c, grad_h0};
}

}  // namespace linrec
