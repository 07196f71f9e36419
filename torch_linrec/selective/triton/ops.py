"""Launchers of the Triton selective-scan kernels (torch_linrec/selective/triton/kernels.py).

Called by the op's CUDA implementation (torch_linrec/selective/ops.py) after its argument checks,
with B and C normalized to ``(D, N)`` or ``(batch, G, N, L)`` and A, D, delta_bias, initial_state
float32. Tile sizes come from :func:`tiles`: the state tile is ``(BLOCK_D, BLOCK_N)`` and a chunk's
tiles ``(BLOCK_D, BLOCK_N, CHUNK)``.
"""
from __future__ import annotations

import math

import torch
import triton

from . import kernels

__all__ = ["tiles", "selective_scan_fwd", "selective_scan_bwd", "MAX_STATE"]

MAX_STATE = 256  # the largest N whose (BLOCK_D, BLOCK_N, CHUNK) tiles fit in registers


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def tiles(dim: int, nstate: int, dpg: int, channels_contiguous: bool, backward: bool) -> dict:
    """``BLOCK_D``, ``BLOCK_N``, ``CHUNK`` and ``num_warps`` of a problem.

    A chunk's tile holds about 1024 elements (8 per thread of 4 warps): on the H100 at the
    mamba-370m shape (N = 16) the sweep of bench/NOTES.md found (BLOCK_D, CHUNK) = (2, 32) fastest in
    both directions, larger tiles slower (the scans along the chunk are the cost). ``BLOCK_D``
    divides the channels per group (a block reads one group's B and C); when channels are
    contiguous in memory (the ``(B, L, D)`` layout) it is widened to 8 so a step's loads span
    several channels.
    """
    block_n = max(2, _pow2(nstate))
    budget = 1024
    chunk = max(8, min(32, budget // block_n))
    block_d = max(1, budget // (block_n * chunk))
    if channels_contiguous:
        block_d = max(block_d, min(8, budget // (block_n * 8)))
        chunk = max(8, budget // (block_n * block_d))
    block_d = min(block_d, _pow2(dim))
    while dpg % block_d:
        block_d //= 2
    return {"BLOCK_D": block_d, "BLOCK_N": block_n, "CHUNK": chunk, "num_warps": 4}


def _like(t: torch.Tensor | None) -> tuple:
    """``(t', g)``: ``g = empty_like(t)`` (the strides the fake kernel gives a gradient) and ``t'``
    equal to ``t`` with ``g``'s strides (a copy only where ``t``'s strides are not dense), so the
    backward stores a gradient with the strides of the input it reads."""
    if t is None:
        return None, None
    g = torch.empty_like(t)
    if g.stride() != t.stride():
        t = torch.empty_like(t).copy_(t)
    return t, g


def _bc_strides(t: torch.Tensor) -> tuple:
    """(batch, group, n, l) strides of a 4-D B or C; (0, d, n, 0) of a (D, N) one."""
    if t.dim() == 4:
        return tuple(t.stride())
    return (0, t.stride(0), t.stride(1), 0)


def _channels_per_group(t: torch.Tensor, dim: int) -> int:
    """Channels that share one group of a 4-D B or C; ``dim`` for a time-invariant one (any block fits)."""
    return dim // t.shape[1] if t.dim() == 4 else dim


def _meta(u, A, B, C, backward):
    batch, dim, length = u.shape
    dpg = (_channels_per_group(B, dim), _channels_per_group(C, dim))
    meta = tiles(dim, A.shape[1], math.gcd(*dpg), u.stride(1) == 1 and length > 1, backward)
    return batch, dim, length, dpg, meta


def _launch_fwd(u, delta, A, B, C, D, z, delta_bias, initial, out, last, ckpt, meta, dpg, n_chunks):
    batch, dim, length = u.shape
    dummy = last
    grid = (triton.cdiv(dim, meta["BLOCK_D"]), batch)
    zs = z.stride() if z is not None else (0, 0, 0)
    os_ = out.stride() if out is not None else (0, 0, 0)
    hs = initial.stride() if initial is not None else (0, 0, 0)
    kernels.selective_scan_fwd_kernel[grid](
        u, delta, A, B, C, D if D is not None else dummy, z if z is not None else dummy,
        delta_bias if delta_bias is not None else dummy, initial if initial is not None else dummy,
        out if out is not None else dummy, last, ckpt if ckpt is not None else dummy,
        dim, length, A.shape[1], *dpg, n_chunks,
        *u.stride(), *delta.stride(), *zs, *os_, *_bc_strides(B), *_bc_strides(C), *hs,
        B_VAR=B.dim() == 4, C_VAR=C.dim() == 4, HAS_D=D is not None, HAS_Z=z is not None,
        HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(meta["softplus"]), HAS_H0=initial is not None,
        STORE_OUT=out is not None, STORE_CKPT=ckpt is not None,
        BLOCK_D=meta["BLOCK_D"], BLOCK_N=meta["BLOCK_N"], CHUNK=meta["CHUNK"], num_warps=meta["num_warps"])


def selective_scan_fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial):
    """``(out, last_state)``: out like ``u``, last_state ``(B, D, N)`` float32."""
    batch, dim, length, dpg, meta = _meta(u, A, B, C, backward=False)
    meta["softplus"] = delta_softplus
    out = torch.empty_like(u)
    last = torch.empty(batch, dim, A.shape[1], device=u.device, dtype=torch.float32)
    if u.numel() == 0 or length == 0:
        last.copy_(initial if initial is not None else torch.zeros_like(last))
        return out, last
    _launch_fwd(u, delta, A, B, C, D, z, delta_bias, initial, out, last, None, meta, dpg,
                triton.cdiv(length, meta["CHUNK"]))
    return out, last


def _bc_grad(t: torch.Tensor, batch: int, length: int) -> tuple[torch.Tensor, tuple]:
    """A zeroed float32 buffer for the gradient of B or C, and its (batch, group, n, l) strides."""
    buf = torch.zeros(t.shape, device=t.device, dtype=torch.float32)
    return buf, _bc_strides(buf)


def selective_scan_bwd(grad_out, grad_last, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial):
    """The 9 gradients of linrec::selective_scan_backward (float32 for A, B, C, D, delta_bias and
    the initial state; du, ddelta, dz like their inputs)."""
    (u, du), (delta, ddelta), (z, dz) = _like(u), _like(delta), _like(z)
    batch, dim, length, dpg, meta = _meta(u, A, B, C, backward=True)
    meta["softplus"] = delta_softplus
    nstate = A.shape[1]
    f32 = dict(device=u.device, dtype=torch.float32)
    dz = dz if z is not None else u.new_empty(0)
    dA = torch.zeros(A.shape, **f32)
    dD = torch.zeros(D.shape, **f32) if D is not None else torch.empty(0, **f32)
    dbias = torch.zeros(delta_bias.shape, **f32) if delta_bias is not None else torch.empty(0, **f32)
    dh0 = torch.empty(batch, dim, nstate, **f32)
    dB, dB_s = _bc_grad(B, batch, length)
    dC, dC_s = _bc_grad(C, batch, length)
    if u.numel() == 0 or length == 0:
        du.zero_(), ddelta.zero_(), dz.zero_()
        dh0.copy_(grad_last if grad_last is not None else torch.zeros_like(dh0))
        return du, ddelta, dA, dB, dC, dD, dz, dbias, dh0
    n_chunks = triton.cdiv(length, meta["CHUNK"])
    ckpt = torch.empty(batch, n_chunks, dim, meta["BLOCK_N"], **f32)
    last = torch.empty(batch, dim, nstate, **f32)
    fwd_meta = dict(meta, BLOCK_D=tiles(dim, nstate, math.gcd(*dpg), False, False)["BLOCK_D"])
    _launch_fwd(u, delta, A, B, C, None, None, delta_bias, initial, None, last, ckpt, fwd_meta, dpg, n_chunks)
    grid = (triton.cdiv(dim, meta["BLOCK_D"]), batch)
    zs = z.stride() if z is not None else (0, 0, 0)
    kernels.selective_scan_bwd_kernel[grid](
        grad_out, grad_last if grad_last is not None else dh0, u, delta, A, B, C,
        D if D is not None else dA, z if z is not None else u, delta_bias if delta_bias is not None else dA, ckpt,
        du, ddelta, dz if z is not None else du, dA, dB, dC, dD if D is not None else dA,
        dbias if delta_bias is not None else dA, dh0,
        dim, length, nstate, *dpg, n_chunks,
        *grad_out.stride(), *u.stride(), *delta.stride(), *zs, *_bc_strides(B), *_bc_strides(C), *dB_s, *dC_s,
        B_VAR=B.dim() == 4, C_VAR=C.dim() == 4, HAS_D=D is not None, HAS_Z=z is not None,
        HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(delta_softplus), HAS_GLAST=grad_last is not None,
        BLOCK_D=meta["BLOCK_D"], BLOCK_N=meta["BLOCK_N"], CHUNK=meta["CHUNK"], num_warps=meta["num_warps"])
    return du, ddelta, dA, dB, dC, dD, dz, dbias, dh0
