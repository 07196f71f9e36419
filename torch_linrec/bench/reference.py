"""A chunked float64 reference fast enough for sequences of millions of steps, and error metrics.

:func:`torch_linrec.scan_ref` loops over every step in Python. :func:`chunked_scan` splits the
scanned dim into ``n`` chunks of ``K ~ sqrt(L)`` steps and runs ``K + n`` vectorized steps instead:

1. the scan of every chunk from a zero state (``scan_ref`` over the ``K`` steps of all chunks);
2. the decay of every chunk, ``cumprod(coeffs)`` within the chunk: the factor by which the state
   entering the chunk reaches each step (small products underflow towards zero, which is exact
   up to rounding: that state's true contribution is that small);
3. the state entering every chunk, a scan over the chunks with the chunk-end values and decays;
4. ``y = local + decay * state_in``.

All in float64 on the CPU; the error against the step-by-step loop is a few ulps times ``K``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..reference import scan_ref

__all__ = ["chunked_scan", "chunked_scan_backward", "rel_err"]


def _chunk_len(length: int) -> int:
    return 1 << max(0, round(math.log2(max(1.0, math.sqrt(length)))))


def chunked_scan(x: torch.Tensor, coeffs: torch.Tensor, initial: torch.Tensor | None = None, dim: int = -1,
                 reverse: bool = False, chunk: int | None = None) -> torch.Tensor:
    """Float64 CPU reference of :func:`torch_linrec.scan` with ``O(sqrt(L))`` Python steps.

    Args:
        x, coeffs, initial, dim, reverse: as for :func:`torch_linrec.scan` (any device and
            float dtype; coeffs and initial broadcast).
        chunk: steps per chunk; default the power of two nearest ``sqrt(L)``.

    Returns:
        ``y`` of ``x``'s shape, float64, on the CPU.
    """
    dim = dim % x.dim()
    x = x.detach().to("cpu", torch.float64)
    c = coeffs.detach().to("cpu", torch.float64).expand(x.shape)
    xs, cs = x.movedim(dim, -1), c.movedim(dim, -1)
    batch, length = xs.shape[:-1], xs.shape[-1]
    if length == 0:
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


def chunked_scan_backward(grad_y: torch.Tensor, coeffs: torch.Tensor, y: torch.Tensor,
                          initial: torch.Tensor | None = None, dim: int = -1, reverse: bool = False):
    """Float64 CPU ``(grad_x, grad_coeffs, grad_initial)`` of the scan, by :func:`chunked_scan`.

    The math of :func:`torch_linrec.scan_backward_ref`: ``grad_x`` is the scan of ``grad_y`` in the
    other direction with coefficients shifted by one step, ``grad_coeffs = grad_x * y_prev``
    (reduced to ``coeffs``' shape) and ``grad_initial = c_first * grad_x_first``.
    """
    dim = dim % y.dim()
    cpu = dict(device="cpu", dtype=torch.float64)
    grad_y, y = grad_y.detach().to(**cpu), y.detach().to(**cpu)
    c = coeffs.detach().to(**cpu).expand(y.shape)
    length = y.shape[dim]
    if length == 0:
        return torch.zeros_like(y), torch.zeros(coeffs.shape, **cpu), torch.zeros_like(y.sum(dim))
    c_next = torch.roll(c, 1 if reverse else -1, dims=dim)
    grad_x = chunked_scan(grad_y, c_next, None, dim, not reverse)
    h0 = torch.zeros_like(y.select(dim, 0)) if initial is None else \
        initial.detach().to(**cpu).expand(y.select(dim, 0).shape)
    h0 = h0.unsqueeze(dim)
    rest = y.narrow(dim, 0, length - 1) if not reverse else y.narrow(dim, 1, length - 1)
    y_prev = torch.cat([h0, rest] if not reverse else [rest, h0], dim)
    grad_c = (grad_x * y_prev).sum_to_size(coeffs.shape)
    first = 0 if not reverse else length - 1
    grad_h0 = grad_x.select(dim, first) * c.select(dim, first)
    return grad_x, grad_c, grad_h0


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|actual - expected| / max|expected|`` in float64: a relative error that stays finite
    where single entries of ``expected`` are near zero. NaN or inf in ``actual`` give NaN or inf.
    """
    if expected.numel() == 0:
        return 0.0
    expected = expected.detach().to("cpu", torch.float64)
    diff = (actual.detach().to("cpu", torch.float64) - expected).abs().max().item()
    scale = expected.abs().max().item()
    return diff / scale if scale > 0 else diff
