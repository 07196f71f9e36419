"""Plain-PyTorch counterparts of the layers, for tests and the benchmark (``python -m torch_linrec layers``).

* :func:`step_loop`: any layer run token by token through its ``step`` (a Python loop over time:
  the unfused minGRU/minLSTM/gated-SSM of cuRNN's CPU demo).
* :func:`selective_scan_chunked`: the selective scan in chunks of closed-form prefix products, in
  the style of mamba-mini's ``selective_scan_easy`` (no custom kernel; materializes
  ``(B, D, chunk, N)`` tensors); :func:`plain_mamba` makes a :class:`~torch_linrec.nn.Mamba` run on it.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

__all__ = ["step_loop", "selective_scan_chunked", "plain_mamba"]


def step_loop(layer, x: torch.Tensor, state=None, return_state: bool = False):
    """``layer(x, state, return_state)`` computed by ``layer.step`` one token at a time (``x`` ``(B, L, D)``)."""
    if state is None:
        state = layer.allocate_state(x.shape[0], x.device, x.dtype)
    ys = []
    for t in range(x.shape[1]):
        y, state = layer.step(x[:, t], state)
        ys.append(y)
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(x.shape)
    return (y, state) if return_state else y


def selective_scan_chunked(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                           initial_state=None, return_last_state=False, chunk: int = 64):
    """The selective scan (arguments and result as :func:`torch_linrec.selective_scan`, B and C as
    ``(B, N, L)``) in pure PyTorch: within a chunk of ``T`` steps, ``h_t = e^{S_t} (h_0 + sum_{i<=t}
    e^{-S_i} dt_i B_i u_i)`` with ``S_t = A sum_{i<=t} dt_i`` (mamba-mini's derivation); a Python loop
    over chunks carries ``h``. ``exp(-S)`` grows with the chunk, hence short chunks."""
    ct = torch.float64 if u.dtype == torch.float64 else torch.float32
    batch, dim, length = u.shape
    dt = delta.to(ct) + (0 if delta_bias is None else delta_bias.to(ct)[:, None])
    if delta_softplus:
        dt = F.softplus(dt)
    uc = u.to(ct)
    h = u.new_zeros(batch, dim, A.shape[1], dtype=ct) if initial_state is None else initial_state.to(ct)
    ys = []
    for s in range(0, length, chunk):
        dts, us = dt[..., s:s + chunk], uc[..., s:s + chunk]
        Bs, Cs = B[..., s:s + chunk].to(ct), C[..., s:s + chunk].to(ct)
        S = torch.cumsum(dts, -1).unsqueeze(-1) * A.to(ct)[:, None, :]                 # (b, d, t, n)
        contrib = torch.exp(-S) * (dts * us).unsqueeze(-1) * Bs.transpose(1, 2).unsqueeze(1)
        hs = torch.exp(S) * (h.unsqueeze(2) + torch.cumsum(contrib, 2))                # (b, d, t, n)
        ys.append((hs * Cs.transpose(1, 2).unsqueeze(1)).sum(-1))
        h = hs[:, :, -1]
    y = torch.cat(ys, -1) if ys else uc.new_zeros(batch, dim, 0)
    if D is not None:
        y = y + D.to(ct)[:, None] * uc
    if z is not None:
        y = y * F.silu(z.to(ct))
    y = y.to(u.dtype)
    return (y, h) if return_last_state else y


def plain_mamba(layer):
    """A copy of the :class:`~torch_linrec.nn.Mamba` ``layer`` whose forward runs :func:`selective_scan_chunked`."""
    plain = copy.deepcopy(layer)
    plain.scan_impl = selective_scan_chunked
    return plain
