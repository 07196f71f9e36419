"""Pure-PyTorch reference of the log-space scan: the math, once.

``log_h[l] = logaddexp(log_coeffs[l] + log_h[l-1], log_x[l])`` is ``h[l] = coeffs[l] h[l-1] + x[l]``
for positive states ``h = exp(log_h)`` (Feng et al. 2024, "Were RNNs All We Needed?", Section 3.3
and Appendix B: minGRU and minLSTM trained by this scan). :func:`log_scan_ref` loops over the
scanned dim; run it in float64 to check the kernels.
"""
from __future__ import annotations

import torch

__all__ = ["log_scan_ref"]


def log_scan_ref(log_x: torch.Tensor, log_coeffs: torch.Tensor, initial: torch.Tensor | None = None,
                 dim: int = -1, reverse: bool = False) -> torch.Tensor:
    """Reference of :func:`torch_linrec.log_scan` by a Python loop of ``torch.logaddexp``.

    Args:
        log_x: log inputs, any shape with at least one dim, floating dtype; ``-inf`` is log 0.
        log_coeffs: log coefficients, broadcastable to ``log_x``.
        initial: log state before the first step, broadcastable to ``log_x`` without ``dim``;
            ``-inf`` (a zero state) if None.
        dim: the scanned dim. reverse: scan from the end towards the start.

    Returns:
        ``log_h`` of ``log_x``'s shape, in the promoted dtype of the inputs, differentiable by
        autograd to any order where the states are finite (``torch.logaddexp`` has NaN gradients
        at ``(-inf, -inf)``; the kernels' gradients are 0 there).
    """
    dim = dim % log_x.dim()
    c = log_coeffs.expand(log_x.shape)
    xs, cs = log_x.movedim(dim, 0), c.movedim(dim, 0)
    if xs.shape[0] == 0:
        return torch.empty_like(log_x)
    if initial is None:
        h = torch.full_like(xs[0], float("-inf"))
    else:
        h = initial.expand(xs.shape[1:]).to(xs.dtype)
    order = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
    out = [None] * xs.shape[0]
    for i in order:
        h = torch.logaddexp(cs[i] + h, xs[i])
        out[i] = h
    return torch.stack(out, 0).movedim(0, dim)
