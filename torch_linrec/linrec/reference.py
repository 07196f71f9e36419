"""Pure-PyTorch references of the linear recurrence and its backward: the math, once.

:func:`scan_ref` loops over the scanned dim in Python (differentiable, any dtype); :func:`chunked_scan`
computes the same in float64 on the CPU with ``O(sqrt(L))`` vectorized steps, for long sequences;
:func:`scan_backward_ref` is the vector-Jacobian product, built on either. Tests and the benchmark
import these; run them in float64 to check kernels.

Math (the linrec article, Part I, "Linear recurrences: forward and backward"): unrolling
``y_l = c_l y_{l-1} + x_l`` gives ``dx_k = c_{k+1} dx_{k+1} + dy_k`` (a reverse scan of ``dy`` with
coefficients shifted by one), ``dc_k = dx_k * y_{k-1}`` and ``d_initial = c_0 * dx_0``.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["scan_ref", "chunked_scan", "scan_backward_ref", "previous_state", "shifted_coeffs"]


def scan_ref(x: torch.Tensor, coeffs: torch.Tensor, initial: torch.Tensor | None = None, dim: int = -1,
             reverse: bool = False) -> torch.Tensor:
    """Reference of :func:`torch_linrec.scan`: ``y[l] = coeffs[l] * y[l-1] + x[l]`` along ``dim``.

    Args:
        x: inputs, any shape with at least one dim, floating dtype.
        coeffs: coefficients, broadcastable to ``x``.
        initial: state before the first step, broadcastable to ``x`` without ``dim``; zero if None.
        dim: the scanned dim. reverse: scan from the end towards the start.

    Returns:
        ``y`` with the shape of ``x``, in the promoted dtype of the inputs, differentiable through
        ordinary autograd (to any order).
    """
    dim = dim % x.dim()
    c = coeffs.expand(x.shape)
    xs, cs = x.movedim(dim, 0), c.movedim(dim, 0)
    if xs.shape[0] == 0:
        return torch.empty_like(x)
    h = torch.zeros_like(xs[0]) if initial is None else initial.expand(xs.shape[1:]).to(xs.dtype)
    order = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
    out = [None] * xs.shape[0]
    for i in order:
        h = cs[i] * h + xs[i]
        out[i] = h
    return torch.stack(out, 0).movedim(0, dim)


def _chunk_len(length: int) -> int:
    return 1 << max(0, round(math.log2(max(1.0, math.sqrt(length)))))


def chunked_scan(x: torch.Tensor, coeffs: torch.Tensor, initial: torch.Tensor | None = None, dim: int = -1,
                 reverse: bool = False, chunk: int | None = None) -> torch.Tensor:
    """Float64 CPU reference of :func:`torch_linrec.scan` with ``O(sqrt(L))`` Python steps.

    Splits the scanned dim into chunks of ``K ~ sqrt(L)`` steps: (1) scans every chunk from a zero
    state, (2) takes each chunk's decay ``cumprod(coeffs)``, (3) scans the chunk-end states across
    chunks, (4) ``y = local + decay * state_in``. The error against :func:`scan_ref` is a few ulps
    times ``K`` (products that underflow are exact up to rounding).

    Args:
        x, coeffs, initial, dim, reverse: as for :func:`torch_linrec.scan` (any device and float
            dtype; coeffs and initial broadcast).
        chunk: steps per chunk; default the power of two nearest ``sqrt(L)``.

    Returns:
        ``y`` of ``x``'s shape, float64, on the CPU (not differentiable).
    """
    dim = dim % x.dim()
    x = x.detach().to("cpu", torch.float64)
    c = coeffs.detach().to("cpu", torch.float64).expand(x.shape)
    xs, cs = x.movedim(dim, -1), c.movedim(dim, -1)
    batch, length = xs.shape[:-1], xs.shape[-1]
    if length == 0 or xs.numel() == 0:
        return torch.empty_like(x)
    xs, cs = xs.reshape(-1, length), cs.reshape(-1, length)
    if reverse:
        xs, cs = xs.flip(-1), cs.flip(-1)
    if initial is None:
        h0 = xs.new_zeros(xs.shape[0])
    else:
        h0 = initial.detach().to("cpu", torch.float64).expand(batch).reshape(-1)
    k = chunk or _chunk_len(length)
    pad = (-length) % k
    xs = F.pad(xs, (0, pad)).view(xs.shape[0], -1, k)
    cs = F.pad(cs, (0, pad), value=1.0).view(cs.shape[0], -1, k)
    local = scan_ref(xs, cs, None, -1)
    decay = torch.cumprod(cs, -1)
    state_out = scan_ref(local[..., -1], decay[..., -1], h0, -1)
    state_in = torch.cat([h0[:, None], state_out[:, :-1]], 1)
    y = (local + decay * state_in[..., None]).reshape(xs.shape[0], -1)[:, :length]
    if reverse:
        y = y.flip(-1)
    return y.reshape(*batch, length).movedim(-1, dim)


def scan_backward_ref(grad_y: torch.Tensor, coeffs: torch.Tensor, y: torch.Tensor,
                      initial: torch.Tensor | None = None, dim: int = -1, reverse: bool = False,
                      scan: Callable[..., torch.Tensor] = scan_ref):
    """Reference of ``torch.ops.linrec.scan_backward``: returns ``(grad_x, grad_coeffs, grad_initial)``.

    Args:
        grad_y: gradient of ``y``. coeffs, initial, dim, reverse: as passed to the forward.
        y: the forward's output.
        scan: the forward scan the reverse scan of ``grad_y`` runs on: :func:`scan_ref`
            (differentiable, the inputs' dtype and device) or :func:`chunked_scan` (float64 CPU,
            long sequences).

    Returns:
        ``grad_coeffs`` reduced to the shape of ``coeffs``; ``grad_initial`` of ``y``'s shape
        without ``dim``; all zeros when that dim has length 0.
    """
    dim = dim % y.dim()
    length = y.shape[dim]
    c = coeffs.expand(y.shape)
    if length == 0:
        return torch.zeros_like(y), torch.zeros_like(coeffs), torch.zeros_like(y.sum(dim))
    grad_x = scan(grad_y, shifted_coeffs(coeffs, y.dim(), dim, reverse), None, dim, not reverse)
    grad_y, y, c = (t.to(grad_x.device, grad_x.dtype) for t in (grad_y, y, c))
    if initial is not None:
        initial = initial.to(grad_x.device, grad_x.dtype)
    grad_c = (grad_x * previous_state(y, initial, dim, reverse)).sum_to_size(coeffs.shape)
    first = 0 if not reverse else length - 1
    grad_h0 = grad_x.select(dim, first) * c.select(dim, first)
    return grad_x, grad_c, grad_h0


def shifted_coeffs(coeffs: torch.Tensor, ndim: int, dim: int, reverse: bool) -> torch.Tensor:
    """``coeffs`` one step ahead in the scan direction (``c[l+1]``; ``c[l-1]`` when ``reverse``), zero
    past the end: the coefficients of the backward's reverse scan. Time-invariant coeffs (size 1 or
    absent along ``dim``) are returned as they are, not materialized.

    Args:
        coeffs: broadcastable to a tensor of ``ndim`` dims. dim: the scanned dim, wrapped.
    """
    c = coeffs.reshape((1,) * (ndim - coeffs.dim()) + tuple(coeffs.shape))
    length = c.shape[dim]
    if length == 1:
        return coeffs
    edge = torch.zeros_like(c.narrow(dim, 0, 1))
    if reverse:
        return torch.cat([edge, c.narrow(dim, 0, length - 1)], dim)
    return torch.cat([c.narrow(dim, 1, length - 1), edge], dim)


def previous_state(y: torch.Tensor, initial: torch.Tensor | None, dim: int, reverse: bool) -> torch.Tensor:
    """``y[l-1]`` at every step (``y[l+1]`` when ``reverse``), with ``initial`` (zero if None) at the
    first step: the state each step's coefficient multiplies. ``dim`` wrapped, ``y.shape[dim] >= 1``."""
    length = y.shape[dim]
    first = y.narrow(dim, 0, 1)
    h0 = torch.zeros_like(first) if initial is None else initial.expand(first.squeeze(dim).shape).unsqueeze(dim)
    if reverse:
        return torch.cat([y.narrow(dim, 1, length - 1), h0], dim)
    return torch.cat([h0, y.narrow(dim, 0, length - 1)], dim)
