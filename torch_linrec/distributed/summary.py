"""The chunk summary ``(A, b)``: the state leaving a chunk is ``A * h + b`` for the state ``h`` entering it.

:func:`chunk_summary` computes it with the Triton reduction of :mod:`.kernels` where it runs (CUDA
with triton; the CPU under ``TRITON_INTERPRET=1`` when asked with ``impl="triton"``): one read of
x and c, nothing written but the states. Elsewhere it falls back to a local scan in the compute
dtype whose last output is ``b`` and ``A = prod(c)`` (reads x and c twice and writes a scan-sized
temporary: fine on the CPU, where this module serves tests and gloo runs).
:func:`chunk_summary_ref` is the naive float64 reference.
"""
from __future__ import annotations

import importlib

import torch

from ..dispatch import HAS_TRITON
from ..linrec.checks import batch_shape

__all__ = ["chunk_summary", "chunk_summary_ref", "summary_dtype", "SUMMARY_IMPLS"]

SUMMARY_IMPLS = ("auto", "triton", "torch")
_PROGRAMS_PER_SM = 8  # programs per SM the segments aim for (two grid axes: rows x segments)


def summary_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of summaries and carries: float64 for float64 inputs, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunk_summary_ref(x: torch.Tensor, coeffs: torch.Tensor, dim: int, reverse: bool = False,
                      scale_x: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 reference of :func:`chunk_summary`: a Python loop over the chunk."""
    d = dim % x.dim()
    xs = x.detach().double().movedim(d, 0)
    cs = coeffs.detach().double().expand(x.shape).movedim(d, 0)
    a = torch.ones(xs.shape[1:], dtype=torch.float64, device=x.device)
    h = torch.zeros_like(a)
    for i in (range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])):
        h = cs[i] * (h + xs[i]) if scale_x else cs[i] * h + xs[i]
        a = a * cs[i]
    return a, h


def _summary_torch(x, c, d, reverse, scale_x):
    from ..api import scan
    ct = summary_dtype(x.dtype)
    xs, cs = x.to(ct), c.to(ct)
    if scale_x:
        xs = xs * cs
    a = cs.expand(x.shape).prod(d)
    b = scan(xs, cs, None, d, reverse).select(d, 0 if reverse else -1)
    return a, b


def _kernels():
    """The kernels module, re-decorated when ``TRITON_INTERPRET`` changed since it was imported
    (as the scan kernels are, :func:`torch_linrec.linrec.triton.ops._sync_interpret_mode`)."""
    from triton.runtime.jit import JITFunction

    from ..linrec.triton import ops as scan_ops
    from . import kernels
    scan_ops._sync_interpret_mode()
    if isinstance(kernels.chunk_summary_seq_kernel, JITFunction) == scan_ops._interpret_requested():
        kernels = importlib.reload(kernels)
    return kernels


def _summary_triton(x, c, d, reverse, scale_x):
    from ..linrec.triton.ops import (CONFIGS, DEFAULT_CONFIG, _cdiv, _chan_meta, _layout, _num_sms, _seq_meta,
                                     wrap_triton)
    k = _kernels()
    batch = batch_shape(x, d)
    ct = summary_dtype(x.dtype)
    probe = torch.empty(batch, device="meta")  # the strides of one segment's contiguous states
    plan = _layout(x, d, [x, c], [probe])
    if plan is None:  # batch dims that do not merge into two axes: contiguous copies
        x, c = x.contiguous(), c.contiguous()
        plan = _layout(x, d, [x, c], [probe])
    n_outer, n_inner, strides = plan
    length, sms = x.shape[d], _num_sms(x.device)
    tiles = CONFIGS[DEFAULT_CONFIG]
    chan = n_inner > 1 and abs(strides[0][2]) < abs(strides[0][1])
    if chan:
        meta = _chan_meta(n_outer, n_inner, length, tiles, sms)
        rows, block = n_outer * _cdiv(n_inner, meta["BLOCK_D"]), meta["BLOCK_T"]
        kernel = k.chunk_summary_chan_kernel
    else:
        meta = _seq_meta(n_outer * n_inner, length, tiles, sms)
        rows, block = _cdiv(n_outer * n_inner, meta["BLOCK_N"]), meta["BLOCK_L"]
        kernel = k.chunk_summary_seq_kernel
    n_tiles = _cdiv(length, block)
    n_seg = max(1, min(n_tiles, _cdiv(_PROGRAMS_PER_SM * sms, rows)))
    seg = _cdiv(n_tiles, n_seg) * block
    n_seg = _cdiv(length, seg)
    a = torch.empty((n_seg, *batch), dtype=ct, device=x.device)
    b = torch.empty_like(a)
    size = n_outer if chan else n_outer * n_inner
    wrap_triton(kernel)[(rows, n_seg)](x, c, a, b, size, length, n_inner, seg, probe.numel(), *strides[0],
                                       *strides[1], *strides[2], SCALE_X=scale_x, WALK_BACK=reverse, **meta)
    if n_seg == 1:
        return a[0], b[0]
    from ..api import scan
    return a.prod(0), scan(b, a, None, 0, reverse).select(0, 0 if reverse else -1)


def chunk_summary(x: torch.Tensor, coeffs: torch.Tensor, dim: int, reverse: bool = False, scale_x: bool = False,
                  impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """The summary ``(A, b)`` of a chunk of the scan: ``A = prod(coeffs)``, ``b`` = the last output
    (first when ``reverse``) of the chunk's scan from a zero state.

    With ``scale_x`` it reduces ``h -> coeffs[l] * (h + x[l])`` instead, which is the summary of the
    scan's backward (``b`` is then ``d_initial`` of the chunk for the gradient ``x``).

    Args:
        x: ``(..., L, ...)`` float tensor (``dim`` is L), any strides; L may be 0.
        coeffs: broadcastable to x, x's dtype and device.
        dim: the scanned dim, wrapped to ``[0, x.dim())``. reverse: reduce from the end.
        scale_x: reduce ``(c, c * x)`` (see above). Default False.
        impl: ``"triton"``, ``"torch"`` (local scan, then its last output), or ``"auto"``: Triton
            on CUDA when triton is installed, else torch.

    Returns:
        ``(A, b)``, each of x's shape without ``dim``, float32 (float64 for float64 x).

    Raises:
        ValueError: an unknown ``impl``; ``"triton"`` where Triton cannot run.
    """
    if impl not in SUMMARY_IMPLS:
        raise ValueError(f"chunk_summary: impl must be one of {SUMMARY_IMPLS}, got {impl!r}")
    from ..dispatch import triton_runs_on
    if impl == "triton" and (not triton_runs_on(x.device) or x.dtype == torch.float64):
        raise ValueError(f"chunk_summary: impl 'triton' cannot run on {x.device} with {x.dtype}")
    ct = summary_dtype(x.dtype)
    if x.shape[dim] == 0 or x.numel() == 0:
        batch = batch_shape(x, dim)
        return x.new_ones(batch, dtype=ct), x.new_zeros(batch, dtype=ct)
    c = coeffs.expand(x.shape)
    use_triton = impl == "triton" or (impl == "auto" and x.device.type == "cuda" and HAS_TRITON)
    if use_triton:
        return _summary_triton(x, c, dim, reverse, scale_x)
    return _summary_torch(x, c, dim, reverse, scale_x)
