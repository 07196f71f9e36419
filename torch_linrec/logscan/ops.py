"""Registration of ``linrec::log_scan`` beside its schema (csrc/module.cpp): the CUDA implementation
(Triton, imported on first use), the fake kernel and autograd, each once. The CPU kernel is C++
(csrc/logscan/cpu).

Backward (derived from ``h[l] = logaddexp(c[l] + h[l-1], x[l])`` with ``h = log_h``, ``c =
log_coeffs``, ``x = log_x``): the local derivatives are softmax weights,

    w[l] = dh[l]/dh[l-1] = dh[l]/dc[l] = exp(c[l] + h[l-1] - h[l]),   dh[l]/dx[l] = exp(x[l] - h[l]),

both in [0, 1] and defined as 0 where ``h[l] = -inf`` (then every term is ``-inf``). The total
gradient reaching ``h[l]`` is ``G[l] = grad[l] + w[l+1] G[l+1]``: a reverse *linear* scan of the
output gradient (``linrec::scan``, any backend), and

    grad_log_x[l] = G[l] exp(x[l] - h[l]),   grad_log_coeffs[l] = G[l] w[l],   grad_initial = G[0] w[0].

Every step is a differentiable op, so second-order gradients come from autograd. Reduced dtypes
compute it in float32.
"""
from __future__ import annotations

import torch

from .. import _library
from ..api import scan
from ..linrec.checks import batch_shape, check_batch_dims, check_scan_args

__all__ = ["fake_log_scan", "log_scan_backward"]

_OP = "linrec.log_scan"
NAMES = ("log_x", "log_coeffs")


def check_log_scan_args(log_x, log_coeffs, initial, dim, float64_ok: bool = True) -> int:
    """:func:`~torch_linrec.linrec.checks.check_scan_args` with the log-space scan's names."""
    return check_scan_args(_OP, log_x, log_coeffs, initial, dim, float64_ok=float64_ok, names=NAMES)


def _cuda(log_x, log_coeffs, initial=None, dim=-1, reverse=False):
    d = check_log_scan_args(log_x, log_coeffs, initial, dim, float64_ok=False)
    try:
        from .triton import log_scan_triton
    except ImportError as exc:
        raise ValueError(f"{_OP}: CUDA tensors need the Triton kernels, and triton cannot be imported: {exc}") from exc
    return log_scan_triton(log_x, log_coeffs, initial, d, reverse)


torch.library.impl("linrec::log_scan", "cuda")(_cuda)


@torch.library.register_fake("linrec::log_scan")
def fake_log_scan(log_x, log_coeffs, initial=None, dim=-1, reverse=False):
    """``log_h`` as ``empty_like(log_x)``, as the kernels allocate it."""
    d = check_log_scan_args(log_x, log_coeffs, initial, dim, float64_ok=log_x.device.type == "cpu")
    y = torch.empty_like(log_x)
    check_batch_dims(_OP, y, d, [log_x, log_coeffs.expand(log_x.shape), y],
                     [] if initial is None else [initial.expand(batch_shape(log_x, d))])
    return y


def _shift(t: torch.Tensor, first: torch.Tensor, dim: int, reverse: bool) -> torch.Tensor:
    """``t`` moved one step along the scan direction, ``first`` (one step thick) entering at its start."""
    n = t.shape[dim]
    if reverse:
        return torch.cat([t.narrow(dim, 1, n - 1), first], dim)
    return torch.cat([first, t.narrow(dim, 0, n - 1)], dim)


def log_scan_backward(grad: torch.Tensor, log_x: torch.Tensor, log_coeffs: torch.Tensor, log_h: torch.Tensor,
                      initial: torch.Tensor | None, dim: int, reverse: bool):
    """Vector-Jacobian product of the log-space scan (module docs); differentiable.

    Args:
        grad: gradient of ``log_h``. log_x, log_coeffs, initial, dim, reverse: the forward's
            arguments. log_h: its output.

    Returns:
        ``(grad_log_x, grad_log_coeffs, grad_initial)`` in the inputs' dtypes and shapes
        (``grad_initial`` None without ``initial``).
    """
    d = dim % log_h.dim()
    length = log_h.shape[d]
    ct = torch.float32 if log_h.dtype in (torch.float16, torch.bfloat16) else log_h.dtype
    if length == 0:
        gh0 = None if initial is None else torch.zeros_like(initial)
        return torch.zeros_like(log_x), torch.zeros_like(log_coeffs), gh0
    h, x, c, g = (t.to(ct) for t in (log_h, log_x, log_coeffs, grad))
    h_safe = torch.where(h == float("-inf"), 0.0, h)  # where h = -inf, every exponent below is -inf
    one_step = list(h.shape)
    one_step[d] = 1
    if initial is None:
        h0 = h.new_full(one_step, float("-inf"))
    else:
        h0 = initial.to(ct).expand(batch_shape(h, d)).unsqueeze(d)
    w = torch.exp(c + _shift(h, h0, d, reverse) - h_safe)
    w_next = _shift(w, w.new_zeros(one_step), d, not reverse)
    G = scan(g, w_next, None, d, not reverse)
    grad_x = (G * torch.exp(x - h_safe)).to(log_x.dtype)
    gw = G * w
    grad_c = gw.sum_to_size(log_coeffs.shape).to(log_coeffs.dtype)
    grad_h0 = None
    if initial is not None:
        grad_h0 = gw.select(d, length - 1 if reverse else 0).sum_to_size(initial.shape).to(initial.dtype)
    return grad_x, grad_c, grad_h0


def _setup_context(ctx, inputs, output):
    log_x, log_coeffs, initial, dim, reverse = inputs
    ctx.save_for_backward(log_x, log_coeffs, initial, output)
    ctx.dim, ctx.reverse = dim, reverse


def _backward(ctx, grad):
    log_x, log_coeffs, initial, log_h = ctx.saved_tensors
    grad_x, grad_c, grad_h0 = log_scan_backward(grad, log_x, log_coeffs, log_h, initial, ctx.dim, ctx.reverse)
    return grad_x, grad_c, grad_h0, None, None


torch.library.register_autograd("linrec::log_scan", _backward, setup_context=_setup_context)

_library.document_op("log_scan", """linrec::log_scan(log_x, log_coeffs, initial=None, dim=-1, reverse=False) -> Tensor

The linear recurrence of positive states in log space: log_h[l] = logaddexp(log_coeffs[l] + log_h[l-1],
log_x[l]) along `dim`, log_h[-1] = initial (a log state; -inf, i.e. h = 0, when None); reverse=True
runs from the end. log_coeffs broadcasts against log_x, initial against log_x's shape without `dim`;
-inf inputs (log 0) are exact. float32/float16/bfloat16 accumulate in float32 (float64 on the CPU).
Differentiable to any order (its backward is a linear scan). Math: Feng et al. 2024, "Were RNNs All
We Needed?"; torch_linrec/logscan/reference.py. Raises ValueError naming a bad argument.""")
