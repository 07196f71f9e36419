"""Public functions of the selective scan: :func:`selective_scan`, the drop-in
:func:`selective_scan_fn` (mamba_ssm's signature and return convention) and the one-step
:func:`selective_state_update` for decoding."""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["selective_scan", "selective_scan_fn", "selective_state_update"]


def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                   delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                   initial_state: torch.Tensor | None = None, return_last_state: bool = False):
    """Mamba's selective scan, fused: no ``(B, D, L, N)`` tensor is materialized.

    For batch b, channel d, state n, step l (Gu & Dao, "Mamba: Linear-Time Sequence Modeling with
    Selective State Spaces", 2023, Algorithm 2)::

        dt[b,d,l]  = softplus(delta[b,d,l] + delta_bias[d])       (softplus if delta_softplus)
        h[b,d,n,l] = exp(dt A[d,n]) h[b,d,n,l-1] + dt B[b,n,l] u[b,d,l]     (h[..,-1] = initial_state)
        out[b,d,l] = (sum_n C[b,n,l] h[b,d,n,l] + D[d] u[b,d,l]) * silu(z[b,d,l])

    Differentiable in every tensor argument (first order; double backward raises).

    Args:
        u, delta: ``(B, D, L)``, float32, float16 or bfloat16 (float64 on the CPU), any strides
            (the ``(B, L, D)``-contiguous layout of real models, as a ``.transpose(1, 2)`` view, runs
            without copies).
        A: ``(D, N)`` float32 (float64 with float64 u): real, usually negative.
        B, C: time-invariant ``(D, N)``, input-dependent ``(B, N, L)``, or grouped ``(B, G, N, L)``
            (G dividing D; channel d uses group ``d // (D // G)``); u's dtype or float32.
        D: optional ``(D,)`` skip connection, float32. z: optional ``(B, D, L)`` gate, u's dtype.
        delta_bias: optional ``(D,)`` float32, added to delta before the softplus.
        delta_softplus: apply softplus to ``delta + delta_bias``. Default False.
        initial_state: optional ``(B, D, N)`` float32 state before the first step (zero if None).
        return_last_state: also return the state after the last step.

    Returns:
        ``out`` ``(B, D, L)`` in u's dtype (dense inputs give it u's strides), or
        ``(out, last_state)`` with ``last_state`` ``(B, D, N)`` float32 if ``return_last_state``.

    Raises:
        ValueError: naming the argument, for a shape, dtype or device that does not match; N > 256
            on CUDA; CUDA tensors without triton installed.
    """
    args = (u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in args):
        # the training form: the CUDA kernel saves its chunk states for the backward
        out, last, _ = torch.ops.linrec._selective_scan_train(*args)
    else:
        out, last = torch.ops.linrec.selective_scan(*args)
    return (out, last) if return_last_state else out


def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False, *, initial_state=None):
    """Drop-in for ``mamba_ssm.ops.selective_scan_interface.selective_scan_fn``: the same arguments,
    defaults and return convention (``out``, or ``(out, last_state)``), plus ``initial_state``.
    See :func:`selective_scan` (real A only)."""
    return selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, return_last_state)


def selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                           B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None = None,
                           z: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                           dt_softplus: bool = False, *, inplace: bool = True):
    """One step of the selective scan, for recurrent decoding (mamba_ssm's ``selective_state_update``).

    ``state <- exp(dt A) state + dt B x``, ``out = (sum_n C state + D x) * silu(z)``, in the compute
    dtype (float32; float64 for float64 inputs). Plain torch: fuses under ``torch.compile`` and
    captures in CUDA graphs.

    Args:
        state: ``(B, D, N)``, the state before this step (float32 as returned by
            :func:`selective_scan` with ``return_last_state=True``).
        x, dt: ``(B, D)`` this step's input and delta. z: optional ``(B, D)`` gate.
        A: ``(D, N)``. B, C: ``(B, N)`` or grouped ``(B, G, N)``. D, dt_bias: optional ``(D,)``.
        dt_softplus: apply softplus to ``dt + dt_bias``. Default False.
        inplace: write the new state into ``state`` and return ``out`` (mamba_ssm's convention,
            the default); else leave ``state`` unchanged and return ``(out, new_state)``.

    Returns:
        ``out`` ``(B, D)`` in x's dtype, or ``(out, new_state)`` when ``inplace=False``.

    Raises:
        ValueError: for a state, x or A of the wrong shape.
    """
    if state.dim() != 3 or x.shape != state.shape[:2] or A.shape != (state.shape[1], state.shape[2]):
        raise ValueError(f"selective_state_update: expected state (B, D, N), x (B, D), A (D, N); got state "
                         f"{list(state.shape)}, x {list(x.shape)}, A {list(A.shape)}")
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    d = dt.to(ct) + (dt_bias.to(ct) if dt_bias is not None else 0)
    if dt_softplus:
        d = F.softplus(d)

    def per_channel(t):  # (B, N) or (B, G, N) -> (B, D, N)
        t = t.to(ct)
        return t.unsqueeze(1) if t.dim() == 2 else t.repeat_interleave(state.shape[1] // t.shape[1], dim=1)
    new = torch.exp(d.unsqueeze(-1) * A.to(ct)) * state.to(ct) + (d * x.to(ct)).unsqueeze(-1) * per_channel(B)
    out = (new * per_channel(C)).sum(-1)
    if D is not None:
        out = out + D.to(ct) * x.to(ct)
    if z is not None:
        out = out * F.silu(z.to(ct))
    out = out.to(x.dtype)
    if inplace:
        state.copy_(new)
        return out
    return out, new.to(state.dtype)
