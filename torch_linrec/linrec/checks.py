"""Argument checks of the scan ops, shared by the fake (meta) kernels and the Triton ops.

They mirror the C++ checks of csrc/linrec/ops.cpp (same messages, same ValueError) and work on
symbolic shapes, so ``torch.compile`` rejects at trace time what the kernels reject at run time.
"""
from __future__ import annotations

import torch

from .layout import MAX_BATCH_DIMS, coalesce_batch_dims

_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _fail(cond, msg) -> None:
    """Raises ValueError(msg()) unless ``cond``; ``msg`` is a callable so passing checks format nothing.

    Plain bools are checked in Python (``torch._check_with`` cannot be traced by Dynamo with a
    message closure); symbolic conditions go through ``torch._check_with``.
    """
    if isinstance(cond, bool):
        if not cond:
            raise ValueError(msg())
        return
    torch._check_with(ValueError, cond, msg)


def batch_shape(x: torch.Tensor, dim: int) -> list:
    return [s for i, s in enumerate(x.shape) if i != dim]


def check_scan_args(op: str, x: torch.Tensor, coeffs: torch.Tensor, initial, dim: int,
                    float64_ok: bool = True, names: tuple[str, str] = ("x", "coeffs")) -> int:
    """Validates the arguments of a scan op and returns ``dim`` wrapped to ``[0, x.dim())``.

    ``names`` are the names of ``x`` and ``coeffs`` in messages (``("log_x", "log_coeffs")`` for the
    log-space scan).

    Raises:
        ValueError: naming the argument, with the expected and the received value.
    """
    xn, cn = names
    _fail(x.dim() >= 1, lambda: f"{op}: {xn} must have at least one dimension, got a 0-d tensor")
    _fail(x.dtype in _DTYPES, lambda: f"{op}: {xn} must be float32, float16, bfloat16 or float64, got {x.dtype}")
    _fail(coeffs.dtype == x.dtype, lambda: f"{op}: {cn} must have the dtype of {xn} ({x.dtype}), got {coeffs.dtype}")
    _fail(coeffs.device == x.device, lambda:
          f"{op}: {cn} must be on the device of {xn} ({x.device}), got {coeffs.device}")
    _fail(float64_ok or x.dtype != torch.float64, lambda:
          f"{op}: float64 is supported on the CPU only, got {xn} on {x.device}")
    _fail(-x.dim() <= dim < x.dim(), lambda: f"{op}: dim must be in [{-x.dim()}, {x.dim() - 1}] for {xn} of shape "
          f"{tuple(x.shape)}, got {dim}")
    dim = dim % x.dim()
    ok = coeffs.dim() <= x.dim()
    if ok:
        for cs, xs in zip(reversed(coeffs.shape), reversed(x.shape)):
            ok = ok and (cs == 1 or cs == xs)
    _fail(ok, lambda: f"{op}: {cn} of shape {tuple(coeffs.shape)} must be broadcastable to {xn} of shape "
          f"{tuple(x.shape)}")
    if initial is not None:
        expect = batch_shape(x, dim)
        _fail(initial.dtype == x.dtype, lambda:
              f"{op}: initial must have the dtype of {xn} ({x.dtype}), got {initial.dtype}")
        _fail(initial.device == x.device, lambda:
              f"{op}: initial must be on the device of {xn} ({x.device}), got {initial.device}")
        ok = initial.dim() <= len(expect)
        if ok:
            for s, e in zip(reversed(initial.shape), reversed(expect)):
                ok = ok and (s == 1 or s == e)
        _fail(ok, lambda: f"{op}: initial must have shape {tuple(expect)} ({xn} without dim {dim}) or broadcast to "
              f"it, got {tuple(initial.shape)}")
    return dim


def check_batch_dims(op: str, out: torch.Tensor, dim: int, scan_ts: list, batch_ts: list) -> None:
    """Raises what the C++ ops raise when the operands' batch dims do not coalesce into
    :data:`MAX_BATCH_DIMS` strided axes (only tensors of more dims than that can fail, so no size
    of ordinary rank is inspected, and no guard is added under ``torch.compile``).
    """
    if out.dim() - 1 <= MAX_BATCH_DIMS:
        return
    n = len(coalesce_batch_dims(out, dim, scan_ts, batch_ts))
    _fail(n <= MAX_BATCH_DIMS, lambda: f"{op}: the layout of x needs {n} batch dims after coalescing, at most "
          f"{MAX_BATCH_DIMS} are supported; call .contiguous() on the inputs")


def check_scan_backward_args(op: str, grad_y: torch.Tensor, coeffs: torch.Tensor, y: torch.Tensor, initial,
                             dim: int, float64_ok: bool = True) -> int:
    """Validates the arguments of a scan backward op (as :func:`check_scan_args`, plus ``grad_y``
    of y's shape, dtype and device) and returns the wrapped ``dim``.

    Raises:
        ValueError: naming the argument, with the expected and the received value.
    """
    d = check_scan_args(op, y, coeffs, initial, dim, float64_ok=float64_ok)
    _fail(grad_y.shape == y.shape,
          lambda: f"{op}: grad_y must have the shape of y ({tuple(y.shape)}), got {tuple(grad_y.shape)}")
    _fail(grad_y.dtype == y.dtype and grad_y.device == y.device,
          lambda: f"{op}: grad_y must have the dtype and device of y ({y.dtype}, {y.device}), "
                  f"got {grad_y.dtype}, {grad_y.device}")
    return d
