"""The public entry point :func:`log_scan`."""
from __future__ import annotations

import torch

__all__ = ["log_scan"]


def log_scan(log_x: torch.Tensor, log_coeffs: torch.Tensor, initial: torch.Tensor | None = None, dim: int = -1,
             reverse: bool = False) -> torch.Tensor:
    """Log-space linear recurrence ``log_h[l] = logaddexp(log_coeffs[l] + log_h[l-1], log_x[l])`` along ``dim``.

    It is ``h[l] = coeffs[l] * h[l-1] + x[l]`` for positive states kept as logarithms, the form in
    which minGRU and minLSTM are trained on long sequences (Feng et al. 2024, "Were RNNs All We
    Needed?", Appendix B; Heinsen 2023, "Efficient Parallelization of a Ubiquitous Sequential
    Computation"): products of many coefficients become sums and cannot underflow. ``-inf`` is
    log 0 and handled exactly (``logaddexp(-inf, -inf) = -inf``), with zero gradients there.
    Differentiable in ``log_x``, ``log_coeffs`` and ``initial`` (to second order: the backward is
    a reverse :func:`torch_linrec.scan` of softmax weights, see :mod:`torch_linrec.logscan.ops`).

    Kernels: C++ on the CPU, Triton on CUDA; float32 accumulation for float16 and bfloat16.

    Args:
        log_x: log inputs, any shape with at least one dim; float32, float16, bfloat16 (float64
            on the CPU); any strides.
        log_coeffs: log coefficients of log_x's dtype and device, broadcastable to ``log_x``
            (e.g. a time-invariant ``(D,)``); read in place.
        initial: log of the state before the first step, shape of ``log_x`` without ``dim`` (or
            broadcastable to it). Default None: a zero state (``-inf``).
        dim: the scanned dim, negative allowed. Default -1.
        reverse: scan from the end towards the start. Default False.

    Returns:
        ``log_h`` with the shape and dtype of ``log_x``. The final log state is
        ``log_h.select(dim, -1)`` (``0`` when ``reverse``).

    Raises:
        ValueError: naming the argument, with expected vs got, for a dtype or device mismatch,
            an unsupported dtype, ``dim`` out of range, ``log_coeffs`` not broadcastable to
            ``log_x`` or ``initial`` of the wrong shape; CUDA tensors without triton installed.
    """
    return torch.ops.linrec.log_scan(log_x, log_coeffs, initial, dim, reverse)
