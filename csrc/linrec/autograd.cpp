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
#include <torch/autograd.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>

#include "ops.h"

namespace linrec {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using Config = std::optional<c10::string_view>;

const auto& scan_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("linrec::scan", "")
                       .typed<ScanSig>();
  return op;
}

// linrec::scan_backward, or linrec::scan_backward_triton for a Triton config.
const c10::TypedOperatorHandle<ScanBackwardSig>& backward_op(bool triton) {
  static auto native = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("linrec::scan_backward", "")
                           .typed<ScanBackwardSig>();
  return triton ? scan_backward_triton_op() : native;
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
    auto [grad_x, grad_c, grad_h0] =
        backward_op(is_triton_config(config))
            .call(grad_y, coeffs, y, initial, ctx->saved_data["dim"].toInt(), ctx->saved_data["reverse"].toBool(), config);
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
  return ScanFunction::apply(x, coeffs, initial, dim, reverse, config, backward_config);
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, Autograd, m) { m.impl("scan", &scan_autograd); }

}  // namespace linrec
