"""Public entry point :func:`scan` and backend selection.

Backends:
    ``"native"``    ``torch.ops.linrec.scan``: the C++ kernels (CPU; CUDA when built with CUDA).
    ``"triton"``    ``torch.ops.linrec.scan_triton``: Triton kernels (CUDA; CPU under TRITON_INTERPRET=1).
    ``"reference"`` the pure-PyTorch loop of :mod:`torch_linrec.reference` (slow, for checking).
    ``"auto"``      the default: ``"native"`` where its kernels exist for the device, else ``"triton"``.

The backend of a call is, in order: the ``backend=`` argument, the innermost :func:`use_backend`
context, the ``TORCH_LINREC_BACKEND`` environment variable, ``"auto"``. The choice is made in
Python at call time, so ``torch.compile`` traces the op the choice names (and guards on it).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os

import torch

from ._checks import check_scan_args
from .ops import HAS_CUDA_KERNELS
from .reference import scan_ref

__all__ = ["BACKENDS", "scan", "use_backend", "get_backend", "available_backends"]

BACKENDS = ("auto", "native", "triton", "reference")
ENV_VAR = "TORCH_LINREC_BACKEND"
_stack: list[str] = []

HAS_TRITON = importlib.util.find_spec("triton") is not None
if HAS_TRITON:
    from . import triton as _triton_ops  # noqa: F401  (registers linrec::scan_triton)


def _validate(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    return name


def get_backend() -> str:
    """The backend in force: innermost :func:`use_backend`, else ``$TORCH_LINREC_BACKEND``, else ``"auto"``."""
    if _stack:
        return _stack[-1]
    return _validate(os.environ.get(ENV_VAR, "auto"))


@contextlib.contextmanager
def use_backend(name: str):
    """Context manager selecting the backend of :func:`scan` calls inside it (see module docs).

    Raises:
        ValueError: if ``name`` is not one of :data:`BACKENDS`.
    """
    _stack.append(_validate(name))
    try:
        yield
    finally:
        _stack.pop()


def _triton_runs_on(device: torch.device) -> bool:
    return HAS_TRITON and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """The concrete backends that can run on ``device`` in this process."""
    device = torch.device(device)
    out = []
    if device.type == "cpu" or (device.type == "cuda" and HAS_CUDA_KERNELS):
        out.append("native")
    if _triton_runs_on(device):
        out.append("triton")
    out.append("reference")
    return out


def _resolve(backend: str | None, device: torch.device) -> str:
    name = _validate(backend) if backend is not None else get_backend()
    if name == "auto":
        return "native" if device.type == "cpu" or HAS_CUDA_KERNELS else "triton"
    if name not in available_backends(device):
        raise ValueError(f"backend {name!r} cannot run on {device}; available: {available_backends(device)}")
    return name


def scan(x: torch.Tensor, coeffs: torch.Tensor, initial: torch.Tensor | None = None, dim: int = -1,
         reverse: bool = False, *, backend: str | None = None) -> torch.Tensor:
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
            force (see :func:`use_backend`).

    Returns:
        ``y`` with the shape and dtype of ``x`` (reduced dtypes accumulate in float32). The final
        state is ``y.select(dim, -1)`` (``0`` when ``reverse``).

    Raises:
        ValueError or RuntimeError: naming the argument, with expected vs got, for a dtype or device
            mismatch, an integer dtype, ``dim`` out of range, ``coeffs`` not broadcastable to ``x``
            or ``initial`` of the wrong shape; ValueError for an unknown or unavailable backend.
    """
    name = _resolve(backend, x.device)
    if name == "native":
        return torch.ops.linrec.scan(x, coeffs, initial, dim, reverse)
    if name == "triton":
        return torch.ops.linrec.scan_triton(x, coeffs, initial, dim, reverse)
    d = check_scan_args("linrec.scan", x, coeffs, initial, dim)
    return scan_ref(x, coeffs, initial, d, reverse)
