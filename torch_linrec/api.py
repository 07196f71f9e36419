"""The public entry point :func:`scan`.

Backends (see :mod:`torch_linrec.dispatch` for how a call picks one and its configs):
    ``"native"``    ``torch.ops.linrec.scan``: the C++ kernels (CPU; CUDA when built with CUDA).
    ``"triton"``    ``torch.ops.linrec.scan_triton``: Triton kernels (CUDA; CPU under TRITON_INTERPRET=1).
    ``"reference"`` the pure-PyTorch loop of :mod:`torch_linrec.linrec.reference` (slow, for checking).
    ``"auto"``      the default: per direction, the tuned config cache's choice for the call's bucket,
                    else the native kernels' defaults.
"""
from __future__ import annotations

import torch

from .dispatch import HAS_TRITON, choose
from .linrec.checks import check_scan_args
from .linrec.reference import scan_ref

if HAS_TRITON:
    from .linrec import triton as _triton_ops  # noqa: F401  (registers linrec::scan_triton)

__all__ = ["scan"]


def scan(x: torch.Tensor, coeffs: torch.Tensor, initial: torch.Tensor | None = None, dim: int = -1,
         reverse: bool = False, *, backend: str | None = None, config: str | None = None,
         backward_config: str | None = None) -> torch.Tensor:
    """Linear recurrence ``y[l] = coeffs[l] * y[l-1] + x[l]`` along ``dim``, with ``y[-1] = initial``.

    This is the scan inside Mamba's selective SSM, minGRU/minLSTM and LRU/Griffin-style gated RNNs
    (math and the backward pass: the linrec article, Part I; Blelloch, "Prefix sums and their
    applications", 1990, for the parallel scan). Differentiable in ``x``, ``coeffs`` and ``initial``.

    Args:
        x: inputs of any shape with at least one dim; float32, float16, bfloat16 (float64 on CPU).
            Any strides: transposed, sliced and the (B, L, D) layout with ``dim=1`` run natively.
        coeffs: coefficients of x's dtype and device, broadcastable to ``x`` (e.g. a time-invariant
            ``(D,)`` or ``(B, 1, D)``); broadcast coefficients are read in place, not materialized.
        initial: state before the first step, shape of ``x`` without ``dim`` (or broadcastable to
            it). Default None: zero.
        dim: the scanned dim, negative allowed. Default -1.
        reverse: scan from the end towards the start (``y[l] = coeffs[l] * y[l+1] + x[l]``).
            Default False.
        backend: ``"auto"``, ``"native"``, ``"triton"`` or ``"reference"``; None: the backend in
            force (see :func:`torch_linrec.use_backend`).
        config: the forward's kernel config by name, e.g. ``"tile.e16t256"``, ``"channel.s16r8b2"``,
            ``"triton.t4096"``; ``"native"`` / ``"triton"`` for a backend's default. The name says
            the backend. :func:`torch_linrec.config_names` lists them. None: the tuned cache's
            choice (backend ``"auto"``) or the backend's default.
        backward_config: the same for the backward (it may name another backend than ``config``).

    Returns:
        ``y`` with the shape and dtype of ``x`` (reduced dtypes accumulate in float32). The final
        state is ``y.select(dim, -1)`` (``0`` when ``reverse``).

    Raises:
        ValueError: naming the argument, with expected vs got, for a dtype or device mismatch, an
            integer dtype, ``dim`` out of range, ``coeffs`` not broadcastable to ``x`` or ``initial``
            of the wrong shape; an unknown or unavailable backend; an unknown config, or one that
            does not apply to the call (the message lists the valid names).
    """
    if x.dim() == 0 or not -x.dim() <= dim < x.dim() or backend == "reference":
        check_scan_args("linrec.scan", x, coeffs, initial, dim)  # raises for the first two
    d = dim % x.dim()  # the op checks the rest (a Python check here would double small calls' host time)
    choice = choose(x, coeffs, d, backend, config, backward_config)
    if choice.backend == "native":
        return torch.ops.linrec.scan(x, coeffs, initial, dim, reverse, choice.config, choice.backward_config)
    if choice.backend == "triton":
        return torch.ops.linrec.scan_triton(x, coeffs, initial, dim, reverse, choice.config, choice.backward_config)
    return scan_ref(x, coeffs, initial, d, reverse)
