// Autograd of linrec::scan (every device of the native op): the gradient is the
// linrec::scan_backward op (or linrec::scan_backward_triton when `backward_config` names a Triton
// config), called through the dispatcher so compiled graphs trace it.
//
// Why C++ and not torch.library.register_autograd: the Python autograd wrapper costs
// about 45 us of host time per forward+backward call (93 vs 49 us measured on the
// 2-core dev CPU for a 1x4x8 tensor, see bench/NOTES.md), longer than the kernels of a
// small call. The Triton ops keep the Python registration of torch_linrec/linrec/ops.py.
//
// Math (the linrec article, Part I): with y[l] = c[l] y[l-1] + x[l],
//   grad_x = reverse scan of grad_y with coefficients c shifted by one,
//   grad_c[l] = grad_x[l] * y[l-1],  grad_initial = grad_x[0] * c[0];
// scan_backward returns grad_c already reduced to the shape of c, and grad_initial
// with x's batch shape; it is summed here to initial's own shape when initial broadcasts.
//
// Second order: with create_graph=True (grad mode on inside the backward) the backward is built
// from differentiable ops instead of the fused kernel -- the reverse scan through linrec::scan
// itself (or linrec::scan_triton for a Triton backward_config), whose autograd is this file's,
// plus products and sums -- so autograd differentiates it again, to any order. Without
// create_graph the fused backward op runs below autograd, as fast as before. linrec::scan_backward
// gets the same differentiable formula as its own autograd kernel, for direct calls.
#include <torch/autograd.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ATen.h>
#include <ATen/WrapDimUtils.h>

#include <optional>
#include <string>

#include "ops.h"

namespace linrec {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using Config = std::optional<c10::string_view>;

// linrec::scan_backward, or linrec::scan_backward_triton for a Triton config.
const c10::TypedOperatorHandle<ScanBackwardSig>& backward_op(bool triton) {
  static auto native = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("linrec::scan_backward", "")
                           .typed<ScanBackwardSig>();
  return triton ? scan_backward_triton_op() : native;
}

// The backward of scan from differentiable ops (see the file's comment): grad_x is the scan of
// grad_y in the opposite direction with coefficients shifted by one step (zero past the end),
// grad_c = grad_x * y_prev summed to coeffs' shape, grad_initial = grad_x * coeffs at the first step
// (x's batch shape). `triton`: the reverse scan runs linrec::scan_triton.
std::tuple<Tensor, Tensor, Tensor> differentiable_backward(const Tensor& grad_y, const Tensor& coeffs, const Tensor& y,
                                                           const std::optional<Tensor>& initial, int64_t dim,
                                                           bool reverse, bool triton) {
  const int64_t d = at::maybe_wrap_dim(dim, y.dim());
  const int64_t length = y.size(d);
  auto batch = y.sizes().vec();
  batch.erase(batch.begin() + d);
  if (length == 0) return {at::zeros_like(y), at::zeros_like(coeffs), at::zeros(batch, y.options())};
  Tensor c = coeffs;  // aligned to y's rank, so that dim d is coeffs' time dim
  while (c.dim() < y.dim()) c = c.unsqueeze(0);
  Tensor c_next = c;  // time-invariant coefficients shift onto themselves
  if (c.size(d) != 1) {
    const Tensor edge = at::zeros_like(c.narrow(d, 0, 1));
    c_next = reverse ? at::cat({edge, c.narrow(d, 0, length - 1)}, d) : at::cat({c.narrow(d, 1, length - 1), edge}, d);
  }
  const auto& op = triton ? scan_triton_op() : scan_op();
  Tensor grad_x = op.call(grad_y, c_next, std::nullopt, d, !reverse, std::nullopt, std::nullopt);
  const Tensor h0 = initial ? initial->expand(batch).unsqueeze(d) : at::zeros_like(y.narrow(d, 0, 1));
  const Tensor y_prev = reverse ? at::cat({y.narrow(d, 1, length - 1), h0}, d) : at::cat({h0, y.narrow(d, 0, length - 1)}, d);
  Tensor grad_c = (grad_x * y_prev).sum_to_size(coeffs.sizes());
  const int64_t first = reverse ? length - 1 : 0;
  Tensor grad_h0 = grad_x.select(d, first) * c.expand(y.sizes()).select(d, first);
  return {grad_x, grad_c, grad_h0};
}

bool needs_graph(std::initializer_list<const Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const Tensor* t : ts)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

// Whether an input carries a forward-mode tangent (torch.autograd.forward_ad): the op has no
// forward rule outside functorch, and ScanFunction::apply raises for it.
bool has_tangent(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && t->_fw_grad(/*level=*/0).defined()) return true;
  return false;
}

struct ScanFunction : public torch::autograd::Function<ScanFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& coeffs,
                        const std::optional<Tensor>& initial, int64_t dim, bool reverse, Config config,
                        Config backward_config) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    Tensor y = scan_op().call(x, coeffs, initial, dim, reverse, config, backward_config);
    // Saved: coeffs and the output y (not x); an undefined tensor stands for no initial.
    ctx->save_for_backward({coeffs, y, initial.value_or(Tensor())});
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["reverse"] = reverse;
    if (backward_config.has_value())
      ctx->saved_data["backward_config"] = std::string(backward_config->data(), backward_config->size());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& coeffs = saved[0];
    const Tensor& y = saved[1];
    std::optional<Tensor> initial;
    if (saved[2].defined()) initial = saved[2];
    const Tensor& grad_y = grad_outputs[0];
    const variable_list none(7);
    if (!grad_y.defined()) return none;
    std::string config_str;
    Config config;
    if (ctx->saved_data.count("backward_config")) {
      config_str = ctx->saved_data["backward_config"].toStringRef();
      config = c10::string_view(config_str);
    }
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const bool reverse = ctx->saved_data["reverse"].toBool();
    const bool triton = is_triton_config(config);
    const Tensor none_t;
    Tensor grad_x, grad_c, grad_h0;
    if (needs_graph({&grad_y, &coeffs, &y, initial ? &*initial : &none_t})) {  // create_graph=True
      std::tie(grad_x, grad_c, grad_h0) = differentiable_backward(grad_y, coeffs, y, initial, dim, reverse, triton);
    } else {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(grad_x, grad_c, grad_h0) = backward_op(triton).call(grad_y, coeffs, y, initial, dim, reverse, config);
    }
    if (!initial) {
      grad_h0 = Tensor();
    } else if (!grad_h0.sym_sizes().equals(initial->sym_sizes())) {
      grad_h0 = grad_h0.sum_to_size_symint(initial->sym_sizes());
    }
    return {grad_x, grad_c, grad_h0, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

Tensor scan_autograd(const Tensor& x, const Tensor& coeffs, const std::optional<Tensor>& initial, int64_t dim,
                     bool reverse, Config config, Config backward_config) {
  const Tensor none_t;
  const auto inputs = {&x, &coeffs, initial ? &*initial : &none_t};
  if (!needs_graph(inputs) && !has_tangent(inputs)) {
    // No gradient wanted (inference, torch.no_grad, or no input requiring one): straight to the
    // kernel, without the node and context ScanFunction::apply builds even then (6-7 us of host time
    // per call, more than a small call's kernel).
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return scan_op().call(x, coeffs, initial, dim, reverse, config, backward_config);
  }
  return ScanFunction::apply(x, coeffs, initial, dim, reverse, config, backward_config);
}

// Autograd kernel of linrec::scan_backward: differentiable when a graph is needed, else the kernel.
std::tuple<Tensor, Tensor, Tensor> scan_backward_autograd(const Tensor& grad_y, const Tensor& coeffs, const Tensor& y,
                                                          const std::optional<Tensor>& initial, int64_t dim,
                                                          bool reverse, Config config) {
  const Tensor none_t;
  if (needs_graph({&grad_y, &coeffs, &y, initial ? &*initial : &none_t}))
    return differentiable_backward(grad_y, coeffs, y, initial, dim, reverse, is_triton_config(config));
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return backward_op(false).call(grad_y, coeffs, y, initial, dim, reverse, config);
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, Autograd, m) {
  m.impl("scan", &scan_autograd);
  m.impl("scan_backward", &scan_backward_autograd);
}

}  // namespace linrec
