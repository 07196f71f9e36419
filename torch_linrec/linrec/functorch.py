"""``torch.func`` support of the scan ops: ``grad`` / ``vjp`` / ``jacrev`` / ``hessian``, ``jvp`` /
``jacfwd`` (forward mode) and ``vmap``, for ``linrec::scan`` and ``linrec::scan_triton``.

Why a route of its own: the plain call's autograd is a C++ ``torch::autograd::Function``
(csrc/linrec/autograd.cpp), which functorch refuses ("cannot use C++ torch::autograd::Function with
functorch transforms"); a Python autograd would cost every eager call ~50 us of host time. So
:func:`register_functorch` puts a Python kernel on the ``FuncTorchDynamicLayerFrontMode`` dispatch
key of the op. That key is only in the dispatch key set while a functorch transform is active, so
plain eager calls, ``torch.compile`` and ``torch.export`` never reach it (no host time added), and
under a transform the op runs :class:`ScanFunction`, a Python ``torch.autograd.Function`` with
``setup_context``, ``jvp`` and an explicit ``vmap`` rule, which functorch composes level by level
(its forward calls the op again one transform level down).

Math (y[l] = c[l] y[l-1] + x[l]; the linrec article, Part I):
    backward: :func:`~torch_linrec.linrec.reference.scan_backward_ref` run on the op itself (a
        reverse scan with shifted coeffs, products and sums), so it is differentiable again;
    jvp: the tangent of a linear recurrence is a linear recurrence with the same coefficients,
        ``dy[l] = c[l] dy[l-1] + (dx[l] + dc[l] y[l-1])`` with ``dy[-1] = d_initial``;
    vmap: the op takes any rank, so the vmapped dim becomes a leading batch dim of every operand
        (coeffs and initial padded with size-1 dims to keep broadcasting) and the scan runs once.
"""
from __future__ import annotations

import torch

from .reference import previous_state, scan_backward_ref

__all__ = ["ScanFunction", "register_functorch"]

_FRONT_MODE = "FuncTorchDynamicLayerFrontMode"
_libs: list = []  # keeps the registrations alive


class ScanFunction(torch.autograd.Function):
    """The scan op under functorch transforms (module docs). ``apply(op, x, coeffs, initial, dim,
    reverse, config, backward_config)``, ``op`` the forward op (``torch.ops.linrec.scan`` or
    ``torch.ops.linrec.scan_triton``)."""

    @staticmethod
    def forward(op, x, coeffs, initial, dim, reverse, config, backward_config):
        return op(x, coeffs, initial, dim, reverse, config, backward_config)

    @staticmethod
    def setup_context(ctx, inputs, output):
        op, x, coeffs, initial, dim, reverse, config, backward_config = inputs
        ctx.save_for_backward(coeffs, output, initial)
        ctx.save_for_forward(coeffs, output, initial)
        ctx.op, ctx.dim, ctx.reverse = op, dim % x.dim(), reverse
        ctx.configs = (config, backward_config)

    @staticmethod
    def backward(ctx, grad_y):
        coeffs, y, initial = ctx.saved_tensors
        grad_x, grad_c, grad_h0 = scan_backward_ref(grad_y, coeffs, y, initial, ctx.dim, ctx.reverse,
                                                    scan=ctx.op)
        grad_h0 = None if initial is None else grad_h0.sum_to_size(initial.shape)
        return None, grad_x, grad_c, grad_h0, None, None, None, None

    @staticmethod
    def jvp(ctx, _op, dx, dc, dh0, *_args):
        coeffs, y, initial = ctx.saved_tensors
        drive = torch.zeros_like(y) if dx is None else dx
        if dc is not None and y.shape[ctx.dim] > 0:
            drive = drive + dc * previous_state(y, initial, ctx.dim, ctx.reverse)
        return ctx.op(drive, coeffs, dh0, ctx.dim, ctx.reverse, *ctx.configs)

    @staticmethod
    def vmap(info, in_dims, op, x, coeffs, initial, dim, reverse, config, backward_config):
        x_bdim, c_bdim, h_bdim = in_dims[1:4]
        rank = x.dim() - (x_bdim is not None)  # the rank the function sees
        if rank == 0:
            raise ValueError("linrec.scan: x must have at least one dimension, got a 0-d tensor")
        if not -rank <= dim < rank:  # else the leading dim would shift what dim names
            raise ValueError(f"linrec.scan: dim must be in [{-rank}, {rank - 1}] for x of rank {rank}, got {dim}")
        x = x.movedim(x_bdim, 0) if x_bdim is not None else x.expand(info.batch_size, *x.shape)
        coeffs = _leading(coeffs, c_bdim, rank)
        initial = _leading(initial, h_bdim, rank - 1)
        return op(x, coeffs, initial, dim % rank + 1, reverse, config, backward_config), 0


def _leading(t: torch.Tensor | None, bdim: int | None, rank: int) -> torch.Tensor | None:
    """A broadcast operand with its vmapped dim first and size-1 dims up to ``rank`` per sample."""
    if t is None or bdim is None:
        return t
    t = t.movedim(bdim, 0)
    return t.reshape(t.shape[:1] + (1,) * (rank - t.dim() + 1) + t.shape[1:])


def register_functorch(name: str, op) -> None:
    """Routes ``op`` (the op ``linrec::<name>``, of ``linrec::scan``'s schema) through
    :class:`ScanFunction` while a functorch transform is active (module docs)."""

    def under_transforms(x, coeffs, initial=None, dim=-1, reverse=False, config=None, backward_config=None):
        return ScanFunction.apply(op, x, coeffs, initial, dim, reverse, config, backward_config)

    lib = torch.library.Library("linrec", "IMPL")
    lib.impl(name, under_transforms, _FRONT_MODE)
    _libs.append(lib)
