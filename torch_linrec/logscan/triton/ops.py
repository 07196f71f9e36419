"""Launcher of the Triton log-space scan: :func:`log_scan_triton`, the CUDA implementation of
``linrec::log_scan`` (torch_linrec/logscan/ops.py imports this module on first use, so that
``import torch_linrec`` does not import triton).

Layout and launch heuristics are the linear scan's (torch_linrec/linrec/triton/ops.py): every
operand read in place as a strided ``(outer, L, inner)`` view, the channel kernel where the inner
batch axis is the output's most contiguous one, else the sequence kernel; layouts needing three
or more batch axes run on contiguous copies.
"""
from __future__ import annotations

import importlib

import torch
from triton.runtime.jit import JITFunction

from ...linrec.checks import batch_shape
from ...linrec.triton import ops as _linrec_triton
from . import kernels

__all__ = ["log_scan_triton"]


def _kernels():
    """The kernels module, re-decorated when ``TRITON_INTERPRET`` changed since it was imported
    (see ``_sync_interpret_mode`` of the linear scan, whose tile helpers the kernels import)."""
    global kernels
    _linrec_triton._sync_interpret_mode()
    interpreted = not isinstance(kernels.log_scan_fwd_seq_kernel, JITFunction)
    if interpreted != _linrec_triton._interpret_requested():
        kernels = importlib.reload(kernels)
    return kernels


def _launch(y: torch.Tensor, x: torch.Tensor, c: torch.Tensor, h0, d: int, reverse: bool) -> bool:
    """Runs the kernel into ``y`` (c expanded to x's shape, h0 to its batch shape or None); False,
    launching nothing, when the layout needs contiguous copies."""
    plan = _linrec_triton._layout(y, d, [x, c, y], [] if h0 is None else [h0])
    if plan is None:
        return False
    k = _kernels()
    n_outer, n_inner, strides = plan
    sx, sc, sy = strides[:3]
    sh = strides[3] if h0 is not None else (0, 0)
    length = x.shape[d]
    tiles = _linrec_triton.CONFIGS[_linrec_triton.DEFAULT_CONFIG]
    num_sms = _linrec_triton._num_sms(y.device)
    ptrs = (x, c, x if h0 is None else h0, y)
    flags = {"HAS_INIT": h0 is not None, "WALK_BACK": reverse}
    if n_inner > 1 and abs(sy[2]) < abs(sy[1]):
        meta = _linrec_triton._chan_meta(n_outer, n_inner, length, tiles, num_sms)
        grid = (n_outer * _linrec_triton._cdiv(n_inner, meta["BLOCK_D"]),)
        k.log_scan_fwd_chan_kernel[grid](*ptrs, n_outer, length, n_inner, *sx, *sc, *sh, *sy, **flags, **meta)
    else:
        meta = _linrec_triton._seq_meta(n_outer * n_inner, length, tiles, num_sms)
        grid = (_linrec_triton._cdiv(n_outer * n_inner, meta["BLOCK_N"]),)
        k.log_scan_fwd_seq_kernel[grid](*ptrs, n_outer * n_inner, length, n_inner, *sx, *sc, *sh, *sy,
                                        **flags, **meta)
    return True


def log_scan_triton(log_x: torch.Tensor, log_coeffs: torch.Tensor, initial: torch.Tensor | None, dim: int,
                    reverse: bool) -> torch.Tensor:
    """``log_h`` of the log-space scan by the Triton kernels (arguments checked by the caller).

    Args:
        log_x: float32, float16 or bfloat16, any strides; on CUDA (on the CPU under
            ``TRITON_INTERPRET=1``). log_coeffs: broadcastable to log_x (read in place).
        initial: log state before the first step, broadcastable to log_x without ``dim``; None: -inf.
        dim: the scanned dim, wrapped. reverse: scan from the end.

    Returns:
        ``log_h`` allocated as ``torch.empty_like(log_x)``, computed in float32.
    """
    y = torch.empty_like(log_x)
    if y.numel() == 0:
        return y
    c = log_coeffs.expand(log_x.shape)
    h0 = None if initial is None else initial.expand(batch_shape(log_x, dim))
    if not _launch(y, log_x, c, h0, dim, reverse):
        tmp = torch.empty(log_x.shape, dtype=log_x.dtype, device=log_x.device)
        _launch(tmp, log_x.contiguous(), c.contiguous(), None if h0 is None else h0.contiguous(), dim, reverse)
        y.copy_(tmp)
    return y
