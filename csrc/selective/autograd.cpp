// Autograd of linrec::selective_scan and linrec::_selective_scan_train (every device): the gradient
// is linrec::selective_scan_backward, called through the dispatcher so compiled graphs trace it.
// linrec::selective_scan_backward's own autograd lets a backward run with create_graph=True and
// raises when its result is differentiated again (the fused backward kernel has no derivative).
//
// Why C++ and not torch.library.register_autograd: the Python autograd wrapper (its
// autograd.Function, fill_defaults and the Python backward) was about half of the host time of an
// eager forward+backward (bench/NOTES.md item 35), and the host time of the Mamba-370m layer's
// forward+backward came close to its 1.5 ms of GPU time. csrc/linrec/autograd.cpp does the same
// for linrec::scan.
//
// Math: torch_linrec/selective/reference.py (the float64 reference whose vjp the tests compare
// against); the backward kernels: csrc/selective/cuda/selective_bwd.cuh, csrc/selective/cpu.
#include <torch/autograd.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ATen.h>

#include <optional>
#include <tuple>
#include <vector>

namespace linrec {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ForwardSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                                              bool, const OptTensor&);
using TrainSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                    const Tensor&, const OptTensor&, const OptTensor&,
                                                    const OptTensor&, bool, const OptTensor&);
using Grads = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
using BackwardSig = Grads(const Tensor&, const OptTensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const OptTensor&, const OptTensor&, const OptTensor&, bool,
                          const OptTensor&, const OptTensor&);

const c10::TypedOperatorHandle<ForwardSig>& forward_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("linrec::selective_scan", "").typed<ForwardSig>();
  return op;
}

const c10::TypedOperatorHandle<TrainSig>& train_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("linrec::_selective_scan_train", "").typed<TrainSig>();
  return op;
}

const c10::TypedOperatorHandle<BackwardSig>& backward_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("linrec::selective_scan_backward", "").typed<BackwardSig>();
  return op;
}

OptTensor present(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// The forward of selective_scan (kTrain = false) or _selective_scan_train (kTrain = true, which
// also returns the chunk checkpoints the backward then reads instead of recomputing them).
template <bool kTrain>
struct SelectiveScanFunction : public torch::autograd::Function<SelectiveScanFunction<kTrain>> {
  static variable_list forward(AutogradContext* ctx, const Tensor& u, const Tensor& delta, const Tensor& A,
                               const Tensor& B, const Tensor& C, const OptTensor& D, const OptTensor& z,
                               const OptTensor& delta_bias, bool delta_softplus, const OptTensor& initial_state) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    Tensor out, last, checkpoints;
    if constexpr (kTrain) {
      std::tie(out, last, checkpoints) =
          train_op().call(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state);
    } else {
      std::tie(out, last) = forward_op().call(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state);
    }
    // An undefined tensor stands for an absent optional input (and for no checkpoints).
    ctx->save_for_backward({u, delta, A, B, C, D.value_or(Tensor()), z.value_or(Tensor()),
                            delta_bias.value_or(Tensor()), initial_state.value_or(Tensor()), checkpoints});
    ctx->saved_data["delta_softplus"] = delta_softplus;
    // Outputs without a gradient arrive undefined, not as zeros (a materialized zero gradient of
    // the checkpoints would cost their size in memory).
    ctx->set_materialize_grads(false);
    if constexpr (kTrain) {
      ctx->mark_non_differentiable({checkpoints});
      return {out, last, checkpoints};
    } else {
      return {out, last};
    }
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto s = ctx->get_saved_variables();
    const Tensor &u = s[0], &D = s[5], &z = s[6], &delta_bias = s[7], &initial_state = s[8];
    Tensor grad_out = grad_outputs[0];
    if (!grad_out.defined() && !grad_outputs[1].defined()) return variable_list(10);
    if (!grad_out.defined()) grad_out = at::zeros_like(u);
    Tensor du, ddelta, dA, dB, dC, dD, dz, dbias, dh0;
    std::tie(du, ddelta, dA, dB, dC, dD, dz, dbias, dh0) =
        backward_op().call(grad_out, present(grad_outputs[1]), u, s[1], s[2], s[3], s[4], present(D), present(z),
                           present(delta_bias), ctx->saved_data["delta_softplus"].toBool(), present(initial_state),
                           present(s[9]));
    auto if_present = [](const Tensor& input, const Tensor& grad) { return input.defined() ? grad : Tensor(); };
    return {du, ddelta, dA, dB, dC, if_present(D, dD), if_present(z, dz), if_present(delta_bias, dbias), Tensor(),
            if_present(initial_state, dh0)};
  }
};

bool needs_graph(std::initializer_list<const OptTensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const OptTensor* t : ts)
    if (t->has_value() && (*t)->defined() && (*t)->requires_grad()) return true;
  return false;
}

// Whether any differentiable input of selective_scan wants a gradient or carries a forward-mode
// tangent (else the ops below skip the node and context that Function::apply builds even then).
bool forward_needs_graph(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                         const OptTensor& D, const OptTensor& z, const OptTensor& delta_bias,
                         const OptTensor& initial_state) {
  const OptTensor uu{u}, dl{delta}, a{A}, b{B}, c{C};
  const auto inputs = {&uu, &dl, &a, &b, &c, &D, &z, &delta_bias, &initial_state};
  if (needs_graph(inputs)) return true;
  for (const OptTensor* t : inputs)  // a forward-mode tangent: Function::apply raises for it
    if (t->has_value() && (*t)->defined() && (*t)->_fw_grad(/*level=*/0).defined()) return true;
  return false;
}

std::tuple<Tensor, Tensor> selective_scan_autograd(const Tensor& u, const Tensor& delta, const Tensor& A,
                                                   const Tensor& B, const Tensor& C, const OptTensor& D,
                                                   const OptTensor& z, const OptTensor& delta_bias,
                                                   bool delta_softplus, const OptTensor& initial_state) {
  if (!forward_needs_graph(u, delta, A, B, C, D, z, delta_bias, initial_state)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return forward_op().call(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state);
  }
  auto r = SelectiveScanFunction<false>::apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state);
  return {r[0], r[1]};
}

std::tuple<Tensor, Tensor, Tensor> selective_scan_train_autograd(const Tensor& u, const Tensor& delta,
                                                                 const Tensor& A, const Tensor& B, const Tensor& C,
                                                                 const OptTensor& D, const OptTensor& z,
                                                                 const OptTensor& delta_bias, bool delta_softplus,
                                                                 const OptTensor& initial_state) {
  if (!forward_needs_graph(u, delta, A, B, C, D, z, delta_bias, initial_state)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return train_op().call(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state);
  }
  auto r = SelectiveScanFunction<true>::apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state);
  return {r[0], r[1], r[2]};
}

// selective_scan_backward under a graph (create_graph=True): its outputs get a node whose
// backward raises, so differentiating them again fails loudly instead of returning zeros.
struct SelectiveBackwardFunction : public torch::autograd::Function<SelectiveBackwardFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& grad_out, const OptTensor& grad_last_state,
                               const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                               const Tensor& C, const OptTensor& D, const OptTensor& z, const OptTensor& delta_bias,
                               bool delta_softplus, const OptTensor& initial_state, const OptTensor& checkpoints) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto g = backward_op().call(grad_out, grad_last_state, u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                initial_state, checkpoints);
    return {std::get<0>(g), std::get<1>(g), std::get<2>(g), std::get<3>(g), std::get<4>(g),
            std::get<5>(g), std::get<6>(g), std::get<7>(g), std::get<8>(g)};
  }

  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false,
                "linrec.selective_scan: second-order gradients (double backward) are not supported; "
                "the backward is a fused kernel without a derivative");
  }
};

Grads selective_scan_backward_autograd(const Tensor& grad_out, const OptTensor& grad_last_state, const Tensor& u,
                                       const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                                       const OptTensor& D, const OptTensor& z, const OptTensor& delta_bias,
                                       bool delta_softplus, const OptTensor& initial_state,
                                       const OptTensor& checkpoints) {
  const OptTensor go{grad_out}, uu{u}, dl{delta}, a{A}, b{B}, c{C};
  if (needs_graph({&go, &grad_last_state, &uu, &dl, &a, &b, &c, &D, &z, &delta_bias, &initial_state})) {
    auto r = SelectiveBackwardFunction::apply(grad_out, grad_last_state, u, delta, A, B, C, D, z, delta_bias,
                                              delta_softplus, initial_state, checkpoints);
    return {r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8]};
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return backward_op().call(grad_out, grad_last_state, u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                            initial_state, checkpoints);
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, Autograd, m) {
  m.impl("selective_scan", &selective_scan_autograd);
  m.impl("_selective_scan_train", &selective_scan_train_autograd);
  m.impl("selective_scan_backward", &selective_scan_backward_autograd);
}

}  // namespace linrec
