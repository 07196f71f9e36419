"""``torch.func`` for ``linrec::selective_scan`` and ``linrec::_selective_scan_train``: reverse mode
(``grad``, ``vjp``) and ``vmap`` (so ``jacrev`` too).

Why a route of its own: the ops' autograd is a C++ ``torch::autograd::Function``
(csrc/selective/autograd.cpp), which functorch refuses ("cannot use C++ torch::autograd::Function
with functorch transforms"), and a Python autograd would cost every eager call its host time. As
for the scan (torch_linrec/linrec/functorch.py), a Python kernel on the
``FuncTorchDynamicLayerFrontMode`` dispatch key, which is in the key set only while a functorch
transform is active, runs :class:`SelectiveScanFunction` there; plain eager calls,
``torch.compile`` and ``torch.export`` never reach it. The gradient is the same fused backward op
(``linrec::selective_scan_backward``); it has no derivative, so differentiating it again raises,
and there is no forward mode (``jvp``: raises). ``vmap`` runs the op once per sample and stacks the
results (the vmapped dim may be on any argument, A included, so it cannot always fold into B).
"""
from __future__ import annotations

import torch

__all__ = ["SelectiveScanFunction", "register_functorch"]

_FRONT_MODE = "FuncTorchDynamicLayerFrontMode"
_libs: list = []  # keeps the registrations alive
_NO_SECOND_ORDER = ("linrec.selective_scan: second-order gradients (double backward) are not supported; "
                    "the backward is a fused kernel without a derivative")


def _per_sample(info, in_dims, fn, args) -> tuple:
    """A vmap rule: ``fn`` on each sample of the vmapped arguments (the others as they are), each
    output stacked along a new leading dim. Returns ``(outputs, out_dims)``."""
    results = [fn(*(a if d is None else a.select(d, i) for a, d in zip(args, in_dims)))
               for i in range(info.batch_size)]
    outputs = tuple(torch.stack(outs) for outs in zip(*results))
    return outputs, (0,) * len(outputs)


class SelectiveScanFunction(torch.autograd.Function):
    """``apply(op, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state)``: ``op`` is
    ``torch.ops.linrec.selective_scan`` or ``_selective_scan_train`` (whose third output, the chunk
    checkpoints, is not differentiable and is handed to the backward)."""

    @staticmethod
    def forward(op, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state):
        return op(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _op, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state = inputs
        checkpoints = output[2] if len(output) > 2 else None
        if checkpoints is not None:
            ctx.mark_non_differentiable(checkpoints)
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, initial_state, checkpoints)
        ctx.delta_softplus = delta_softplus
        ctx.set_materialize_grads(False)

    @staticmethod
    def vmap(info, in_dims, op, *args):
        return _per_sample(info, in_dims[1:], op, args)

    @staticmethod
    def backward(ctx, grad_out, grad_last, *_grad_checkpoints):
        u, delta, A, B, C, D, z, delta_bias, initial_state, checkpoints = ctx.saved_tensors
        if grad_out is None and grad_last is None:
            return (None,) * 11
        if grad_out is None:
            grad_out = torch.zeros_like(u)
        grads = torch.ops.linrec.selective_scan_backward(grad_out, grad_last, u, delta, A, B, C, D, z, delta_bias,
                                                         ctx.delta_softplus, initial_state, checkpoints)
        du, ddelta, dA, dB, dC, dD, dz, dbias, dh0 = grads

        def present(t, g):
            return None if t is None else g
        return (None, du, ddelta, dA, dB, dC, present(D, dD), present(z, dz), present(delta_bias, dbias), None,
                present(initial_state, dh0))


class _SelectiveBackwardFunction(torch.autograd.Function):
    """``linrec::selective_scan_backward`` under a transform: its outputs raise when differentiated."""

    @staticmethod
    def forward(*args):
        return torch.ops.linrec.selective_scan_backward(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def vmap(info, in_dims, *args):
        return _per_sample(info, in_dims, torch.ops.linrec.selective_scan_backward, args)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(_NO_SECOND_ORDER)


def register_functorch() -> None:
    """Routes the selective-scan ops through :class:`SelectiveScanFunction` while a functorch
    transform is active (module docs)."""
    lib = torch.library.Library("linrec", "IMPL")
    for name in ("selective_scan", "_selective_scan_train"):
        op = getattr(torch.ops.linrec, name).default

        def under_transforms(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                             initial_state=None, _op=op):
            return SelectiveScanFunction.apply(_op, u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                               initial_state)
        lib.impl(name, under_transforms, _FRONT_MODE)

    def backward_under_transforms(*args):
        return _SelectiveBackwardFunction.apply(*args)
    lib.impl("selective_scan_backward", backward_under_transforms, _FRONT_MODE)
    _libs.append(lib)
