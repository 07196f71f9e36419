"""The float64-capable pure-PyTorch reference of the selective scan (Mamba's selective SSM).

For batch b, channel d, state n and step l (Gu & Dao, "Mamba: Linear-Time Sequence Modeling with
Selective State Spaces", 2023, Algorithm 2; the same as mamba_ssm's ``selective_scan_ref``)::

    dt[b,d,l]  = softplus(delta[b,d,l] + delta_bias[d])          (softplus if delta_softplus; bias optional)
    h[b,d,n,l] = exp(dt[b,d,l] A[d,n]) h[b,d,n,l-1] + dt[b,d,l] B[b,n,l] u[b,d,l]     (h[..,-1] = initial_state)
    y[b,d,l]   = sum_n C[b,n,l] h[b,d,n,l] + D[d] u[b,d,l]
    out        = y * silu(z)                                        (z optional)

Differentiable by autograd (it is the gradient reference of the tests). Slow: a Python loop over L.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["selective_scan_ref", "expand_bc", "compute_dtype"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for the reduced dtypes, float64 for float64: what the kernels accumulate in."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def expand_bc(t: torch.Tensor, dim: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    """B or C in any of its three forms as a ``(batch or 1, dim, length or 1, N)`` tensor of ``dtype``:
    time-invariant ``(D, N)``, input-dependent ``(B, N, L)``, grouped ``(B, G, N, L)``."""
    t = t.to(dtype)
    if t.dim() == 2:
        return t[None, :, None, :]
    if t.dim() == 3:
        return t.transpose(1, 2)[:, None]
    groups = t.shape[1]
    return t.repeat_interleave(dim // groups, dim=1).transpose(2, 3)


def selective_scan_ref(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                       D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                       delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                       initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, last_state)`` of the selective scan (module docs), computed in float32 (float64 for
    float64 inputs); ``out`` in u's dtype, ``last_state`` ``(B, D, N)`` in the compute dtype.

    Shapes as :func:`torch_linrec.selective_scan`. No argument checks (the ops check).
    """
    ct = compute_dtype(u.dtype)
    batch, dim, length = u.shape
    n = A.shape[1]
    u_c, dt = u.to(ct), delta.to(ct)
    if delta_bias is not None:
        dt = dt + delta_bias.to(ct)[:, None]
    if delta_softplus:
        dt = F.softplus(dt)
    dA = torch.exp(dt.unsqueeze(-1) * A.to(ct)[:, None, :])               # (b, d, l, n)
    dBu = (dt * u_c).unsqueeze(-1) * expand_bc(B, dim, length, ct)         # (b, d, l, n)
    Cx = expand_bc(C, dim, length, ct).expand(batch, dim, length, n)
    h = u_c.new_zeros(batch, dim, n) if initial_state is None else initial_state.to(ct).expand(batch, dim, n)
    ys = []
    for i in range(length):
        h = dA[:, :, i] * h + dBu[:, :, i]
        ys.append((h * Cx[:, :, i]).sum(-1))
    y = torch.stack(ys, dim=-1) if ys else u_c.new_zeros(batch, dim, 0)
    if D is not None:
        y = y + D.to(ct)[:, None] * u_c
    if z is not None:
        y = y * F.silu(z.to(ct))
    return y.to(u.dtype), h
