"""Naive PyTorch references for the linear recurrence and its backward.

They loop over the scan dim in Python, so they are slow; they exist to define the math
and to check the kernels (run them in float64). Math: the linrec article (Part I),
"Linear recurrences: forward and backward", where unrolling y_l = c_l y_{l-1} + x_l gives
dx_k = c_{k+1} dx_{k+1} + dy_k (a reverse scan of dy with coefficients shifted by one),
dc_k = dx_k * y_{k-1} and d_initial = c_0 * dx_0.
"""
from __future__ import annotations

import torch

__all__ = ["scan_ref", "scan_backward_ref"]


def scan_ref(x: torch.Tensor, coeffs: torch.Tensor, initial: torch.Tensor | None = None, dim: int = -1,
             reverse: bool = False) -> torch.Tensor:
    """Reference of :func:`torch_linrec.scan`: ``y[l] = coeffs[l] * y[l-1] + x[l]`` along ``dim``.

    Args:
        x: inputs, any shape with at least one dim, floating dtype.
        coeffs: coefficients, broadcastable to ``x``.
        initial: state before the first step, broadcastable to ``x`` without ``dim``; zero if None.
        dim: the scanned dim. reverse: scan from the end towards the start.

    Returns:
        ``y`` with the shape of ``x``, computed in the promoted dtype of the inputs and differentiable
        through ordinary autograd.
    """
    dim = dim % x.dim()
    c = coeffs.expand(x.shape)
    xs, cs = x.movedim(dim, 0), c.movedim(dim, 0)
    h = torch.zeros_like(xs[0]) if initial is None else initial.expand(xs.shape[1:]).to(xs.dtype)
    order = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
    out = [None] * xs.shape[0]
    for i in order:
        h = cs[i] * h + xs[i]
        out[i] = h
    if xs.shape[0] == 0:
        return torch.empty_like(x)
    return torch.stack(out, 0).movedim(0, dim)


def scan_backward_ref(grad_y: torch.Tensor, coeffs: torch.Tensor, y: torch.Tensor,
                      initial: torch.Tensor | None = None, dim: int = -1, reverse: bool = False):
    """Reference of ``torch.ops.linrec.scan_backward``: returns ``(grad_x, grad_coeffs, grad_initial)``.

    ``grad_coeffs`` is reduced to the shape of ``coeffs``; ``grad_initial`` has the shape of ``y``
    without ``dim``.
    """
    dim = dim % y.dim()
    L = y.shape[dim]
    c = coeffs.expand(y.shape)
    # Coefficients shifted by one step against the scan direction; the boundary value is never used.
    c_next = torch.roll(c, 1 if reverse else -1, dims=dim)
    grad_x = scan_ref(grad_y, c_next, None, dim, not reverse)
    h0 = torch.zeros_like(y.select(dim, 0)) if initial is None else initial.expand(y.select(dim, 0).shape)
    h0 = h0.unsqueeze(dim)
    y_prev = torch.cat([h0, y.narrow(dim, 0, L - 1)], dim) if not reverse else \
        torch.cat([y.narrow(dim, 1, L - 1), h0], dim)
    grad_c = (grad_x * y_prev).sum_to_size(coeffs.shape)
    first = 0 if not reverse else L - 1
    if L == 0:
        grad_h0 = torch.zeros_like(y.select(dim, 0) if y.shape[dim] else h0.squeeze(dim))
    else:
        grad_h0 = grad_x.select(dim, first) * c.select(dim, first)
    return grad_x, grad_c, grad_h0
