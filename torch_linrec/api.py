"""The public entry point :func:`scan`.

Backends (see :mod:`torch_linrec.dispatch` for how a call picks one and its configs):
    ``"native"``    ``torch.ops.linrec.scan``: the C++ kernels (CPU; CUDA when built with CUDA).
    ``"triton"``    ``torch.ops.linrec.scan_triton``: Triton kernels (CUDA; CPU under TRITON_INTERPRET=1).
    ``"reference"`` the pure-PyTorch loop of :mod:`torch_linrec.linrec.reference` (slow, for checking).
    ``"auto"``      the default: per direction, the tuned config cache's choice for the call's bucket,
                    else the native kernels' defaults.
"""
from __future__ import annotations

import numbers
import struct

import torch

from .dispatch import choose
from .linrec.checks import check_scan_args
from .linrec.reference import scan_ref

__all__ = ["scan"]

_REDUCED = (torch.float16, torch.bfloat16)


def scan(x: torch.Tensor, coeffs: torch.Tensor | float, initial: torch.Tensor | float | None = None, dim: int = -1,
         reverse: bool = False, *, backend: str | None = None, config: str | None = None,
         backward_config: str | None = None) -> torch.Tensor:
    """Linear recurrence ``y[l] = coeffs[l] * y[l-1] + x[l]`` along ``dim``, with ``y[-1] = initial``.

    This is the scan inside Mamba's selective SSM, minGRU/minLSTM and LRU/Griffin-style gated RNNs
    (math and the backward pass: the linrec article, Part I; Blelloch, "Prefix sums and their
    applications", 1990, for the parallel scan). Differentiable in ``x``, ``coeffs`` and ``initial``.

    Args:
        x: inputs of any shape with at least one dim; float32, float16, bfloat16 (float64 on CPU).
            Any strides: transposed, sliced and the (B, L, D) layout with ``dim=1`` run natively.
        coeffs: coefficients on x's device, broadcastable to ``x`` (e.g. a time-invariant ``(D,)``
            or ``(B, 1, D)``), or a Python number (one decay for every step, e.g. ``0.9``); broadcast
            coefficients are read in place, not materialized.
        initial: state before the first step, shape of ``x`` without ``dim`` (or broadcastable to
            it), or that shape with ``dim`` kept as size 1 (``(B, 1, D)`` for ``dim=1``), or a
            Python number. Default None: zero.
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
        ``y`` with the shape of ``x``, in PyTorch's promoted dtype of the inputs
        (``torch.result_type``: bfloat16 ``x`` with float32 ``coeffs`` gives float32, a Python
        number keeps x's dtype), inside and outside ``torch.autocast`` (scan is
        never cast down to the autocast dtype, see the README's *Mixed precision*). Reduced dtypes
        accumulate in float32; a Python-number ``coeffs`` or ``initial`` that bfloat16/float16 cannot
        hold exactly (0.999 would round to 1.0) makes the scan run in float32 and round only ``y``
        (as ``x * 0.999`` keeps the number at float32 precision). The
        final state is ``y.select(dim, -1)`` (``0`` when ``reverse``).

    Raises:
        ValueError: naming the argument, with expected vs got, for a dtype or device mismatch, an
            integer dtype, ``dim`` out of range, ``coeffs`` not broadcastable to ``x`` or ``initial``
            of the wrong shape; an unknown or unavailable backend; an unknown config, or one that
            does not apply to the call (the message lists the valid names).
    """
    if not isinstance(coeffs, torch.Tensor) or coeffs.dtype != x.dtype or (initial is not None and (
            not isinstance(initial, torch.Tensor) or initial.dtype != x.dtype or initial.dim() == x.dim())):
        x, coeffs, initial, out_dtype = _convert(x, coeffs, initial, dim)
        y = _scan(x, coeffs, initial, dim, reverse, backend, config, backward_config)
        return y if y.dtype == out_dtype else y.to(out_dtype)
    return _scan(x, coeffs, initial, dim, reverse, backend, config, backward_config)


# The overload itself: calling it skips the packet's overload lookup (~1 us of a small call's host time).
_NATIVE_SCAN = torch.ops.linrec.scan.default


def _scan(x, coeffs, initial, dim, reverse, backend, config, backward_config) -> torch.Tensor:
    rank = x.dim()
    if rank == 0 or not -rank <= dim < rank or backend == "reference":
        check_scan_args("linrec.scan", x, coeffs, initial, dim)  # raises for the first two
    d = dim % rank  # the op checks the rest (a Python check here would double small calls' host time)
    choice = choose(x, coeffs, d, backend, config, backward_config)
    if choice.backend == "native":
        return _NATIVE_SCAN(x, coeffs, initial, dim, reverse, choice.config, choice.backward_config)
    if choice.backend == "triton":
        return torch.ops.linrec.scan_triton(x, coeffs, initial, dim, reverse, choice.config, choice.backward_config)
    return scan_ref(x, coeffs, initial, d, reverse)


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _convert(x, coeffs, initial, dim):
    """Python-number coeffs or initial, a keepdim ``initial`` and mixed dtypes as the ops take them
    (see :func:`scan`'s Returns): ``(x, coeffs, initial, dtype of the result)``.

    Raises:
        ValueError: x not a tensor, or coeffs / initial neither a tensor nor a real number.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"linrec.scan: x must be a tensor, got {type(x).__name__}")
    for name, v in (("coeffs", coeffs), ("initial", initial)):
        if v is not None and not isinstance(v, torch.Tensor) and not _is_number(v):
            raise ValueError(f"linrec.scan: {name} must be a tensor or a real number, got {type(v).__name__}")
    if not -x.dim() <= dim < x.dim():
        check_scan_args("linrec.scan", x, x, None, dim)  # raises, naming dim
    if isinstance(initial, torch.Tensor) and initial.dim() == x.dim() and x.dim() > 0 and initial.shape[dim] == 1:
        initial = initial.squeeze(dim)  # keepdim form
    out_dtype = _result_dtype(x, coeffs, initial)
    dtype = out_dtype
    if dtype in _REDUCED and any(_rounds(v, dtype) for v in (coeffs, initial)):
        dtype = torch.float32

    def conv(v):
        if v is None:
            return None
        if isinstance(v, torch.Tensor):
            return v if v.dtype == dtype or not v.is_floating_point() else v.to(dtype)
        return torch.full((), float(v), dtype=dtype, device=x.device)

    return conv(x), conv(coeffs), conv(initial), out_dtype


def _result_dtype(x, coeffs, initial) -> torch.dtype:
    """``torch.result_type`` of the inputs where all are floating (or numbers): the promotion of the
    tensors with dims (0-d tensors only when none has dims; Python numbers never promote); else x's
    dtype, leaving the op to name the non-float argument. Plain Python, so ``torch.compile`` traces it."""
    tensors = [t for t in (x, coeffs, initial) if isinstance(t, torch.Tensor)]
    if not all(t.is_floating_point() for t in tensors):
        return x.dtype
    ranked = [t for t in tensors if t.dim() > 0] or tensors
    dtype = ranked[0].dtype
    for t in ranked[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _rounds(v, dtype: torch.dtype) -> bool:
    """Whether the Python number ``v``, stored in float32, is not exact in ``dtype`` (float16 or
    bfloat16); plain Python, so ``torch.compile`` traces it as a constant."""
    if not _is_number(v):
        return False
    try:
        v32 = struct.unpack("<f", struct.pack("<f", float(v)))[0]
        if dtype == torch.float16:
            return struct.unpack("<e", struct.pack("<e", v32))[0] != v32
    except OverflowError:
        return True
    return struct.unpack("<I", struct.pack("<f", v32))[0] & 0xFFFF != 0  # bfloat16: float32's upper half
