// Autograd of linrec::scan (every backend of the native op): the gradient is the
// linrec::scan_backward op, called through the dispatcher so compiled graphs trace it.
//
// Why C++ and not torch.library.register_autograd: the Python autograd wrapper costs
// about 45 us of host time per forward+backward call (93 vs 49 us measured on the
// 2-core dev CPU for a 1x4x8 tensor, see bench/NOTES.md), which is longer than the
// kernels of a small call such as Mamba's decoding-size 1x1024x2048 on the H100. The
// Triton ops keep the Python registration of torch_linrec/ops.py (same formula).
//
// Math (the linrec article, Part I): with y[l] = c[l] y[l-1] + x[l],
//   grad_x = reverse scan of grad_y with coefficients c shifted by one,
//   grad_c[l] = grad_x[l] * y[l-1],  grad_initial = grad_x[0] * c[0];
// scan_backward returns grad_c already reduced to the shape of c, and grad_initial
// with x's batch shape; it is summed here to initial's own shape when initial broadcasts.
#include <torch/autograd.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

namespace linrec {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const auto& scan_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("linrec::scan", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t, bool)>();
  return op;
}

const auto& scan_backward_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("linrec::scan_backward", "")
                       .typed<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                                 const std::optional<Tensor>&, int64_t, bool)>();
  return op;
}

struct ScanFunction : public torch::autograd::Function<ScanFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& coeffs,
                        const std::optional<Tensor>& initial, int64_t dim, bool reverse) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    Tensor y = scan_op().call(x, coeffs, initial, dim, reverse);
    // Saved: coeffs and the output y (not x); an undefined tensor stands for no initial.
    ctx->save_for_backward({coeffs, y, initial.value_or(Tensor())});
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["reverse"] = reverse;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& coeffs = saved[0];
    const Tensor& y = saved[1];
    std::optional<Tensor> initial;
    if (saved[2].defined()) initial = saved[2];
    const Tensor& grad_y = grad_outputs[0];
    if (!grad_y.defined()) return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
    auto [grad_x, grad_c, grad_h0] = scan_backward_op().call(grad_y, coeffs, y, initial, ctx->saved_data["dim"].toInt(),
                                                             ctx->saved_data["reverse"].toBool());
    if (!initial) {
      grad_h0 = Tensor();
    } else if (!grad_h0.sym_sizes().equals(initial->sym_sizes())) {
      grad_h0 = grad_h0.sum_to_size_symint(initial->sym_sizes());
    }
    return {grad_x, grad_c, grad_h0, Tensor(), Tensor()};
  }
};

Tensor scan_autograd(const Tensor& x, const Tensor& coeffs, const std::optional<Tensor>& initial, int64_t dim,
                     bool reverse) {
  return ScanFunction::apply(x, coeffs, initial, dim, reverse);
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, Autograd, m) { m.impl("scan", &scan_autograd); }

}  // namespace linrec
