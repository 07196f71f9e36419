"""Argument checks of the selective-scan ops, shared by their CPU and CUDA implementations and the
fake kernels (so ``torch.compile`` rejects at trace time what the kernels reject at run time).
"""
from __future__ import annotations

import torch

from ..linrec.checks import _fail

__all__ = ["check_selective_scan_args", "check_selective_scan_backward_args"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _shape(t: torch.Tensor) -> list:
    return list(t.shape)


def _check_param(op: str, name: str, t, shape: list, dtype: torch.dtype, device) -> None:
    """A float parameter (A, D, delta_bias, initial_state): exact shape, the compute dtype, u's device."""
    if t is None:
        return
    _fail(t.dim() == len(shape), lambda: f"{op}: {name} must have shape {shape}, got {_shape(t)}")
    for got, want in zip(t.shape, shape):
        _fail(got == want, lambda: f"{op}: {name} must have shape {shape}, got {_shape(t)}")
    _fail(t.dtype == dtype, lambda: f"{op}: {name} must be {dtype} (the compute dtype of u), got {t.dtype}")
    _fail(t.device == device, lambda: f"{op}: {name} must be on the device of u ({device}), got {t.device}")


def _check_bc(op: str, name: str, t: torch.Tensor, u: torch.Tensor, nstate) -> None:
    """B or C: (D, N), (B, N, L) or (B, G, N, L) with G dividing D; u's dtype or the compute dtype."""
    batch, dim, length = u.shape
    forms = f"(D, N) = {[dim, nstate]}, (B, N, L) = {[batch, nstate, length]} or (B, G, N, L) with G dividing D"
    _fail(t.dim() in (2, 3, 4), lambda: f"{op}: {name} must have shape {forms}, got {_shape(t)}")
    if t.dim() == 2:
        want = [dim, nstate]
    elif t.dim() == 3:
        want = [batch, nstate, length]
    else:
        groups = t.shape[1]
        want = [batch, groups, nstate, length]
        _fail(groups >= 1, lambda: f"{op}: {name} must have at least one group, got shape {_shape(t)}")
        _fail(dim % groups == 0, lambda: f"{op}: {name} has {groups} groups, which must divide D = {dim}")
    for got, exp in zip(t.shape, want):
        _fail(got == exp, lambda: f"{op}: {name} must have shape {forms}, got {_shape(t)}")
    ct = torch.float64 if u.dtype == torch.float64 else torch.float32
    _fail(t.dtype in (u.dtype, ct), lambda: f"{op}: {name} must be {u.dtype} (u's dtype) or {ct}, got {t.dtype}")
    _fail(t.device == u.device, lambda: f"{op}: {name} must be on the device of u ({u.device}), got {t.device}")


def check_selective_scan_args(op: str, u, delta, A, B, C, D, z, delta_bias, initial_state) -> None:
    """Validates the arguments of ``linrec::selective_scan`` (shapes in its schema's comment), one
    argument at a time. csrc/selective/ops.cpp (``valid_args``) tests the same rules without the
    messages on every call, and sends what fails here.

    Raises:
        ValueError: naming the argument, with the expected and the received shape, dtype or device.
    """
    _fail(u.dim() == 3, lambda: f"{op}: u must have shape (B, D, L), got {_shape(u)}")
    _fail(u.dtype in _DTYPES, lambda: f"{op}: u must be float32, float16, bfloat16 or float64, got {u.dtype}")
    _fail(u.dtype != torch.float64 or u.device.type == "cpu",
          lambda: f"{op}: float64 is supported on the CPU only, got u on {u.device}")
    for name, t in (("delta", delta), ("z", z)):
        if t is None:
            continue
        _fail(t.dim() == 3 and all(a == b for a, b in zip(t.shape, u.shape)),
              lambda: f"{op}: {name} must have the shape of u {_shape(u)}, got {_shape(t)}")
        _fail(t.dtype == u.dtype, lambda: f"{op}: {name} must have the dtype of u ({u.dtype}), got {t.dtype}")
        _fail(t.device == u.device, lambda: f"{op}: {name} must be on the device of u ({u.device}), got {t.device}")
    batch, dim, _ = u.shape
    ct = torch.float64 if u.dtype == torch.float64 else torch.float32
    _fail(A.dim() == 2, lambda: f"{op}: A must have shape (D, N) with D = {dim}, got {_shape(A)}")
    nstate = A.shape[1]
    _fail(nstate >= 1, lambda: f"{op}: A must have at least one state (N >= 1), got shape {_shape(A)}")
    _check_param(op, "A", A, [dim, nstate], ct, u.device)
    _check_bc(op, "B", B, u, nstate)
    _check_bc(op, "C", C, u, nstate)
    _check_param(op, "D", D, [dim], ct, u.device)
    _check_param(op, "delta_bias", delta_bias, [dim], ct, u.device)
    _check_param(op, "initial_state", initial_state, [batch, dim, nstate], ct, u.device)


def check_selective_scan_backward_args(op: str, grad_out, grad_last_state, u, delta, A, B, C, D, z, delta_bias,
                                       initial_state) -> None:
    """Validates ``linrec::selective_scan_backward``: the forward's arguments, ``grad_out`` like
    u and ``grad_last_state`` like the last state."""
    check_selective_scan_args(op, u, delta, A, B, C, D, z, delta_bias, initial_state)
    _fail(grad_out.dim() == 3 and all(a == b for a, b in zip(grad_out.shape, u.shape)),
          lambda: f"{op}: grad_out must have the shape of u {_shape(u)}, got {_shape(grad_out)}")
    _fail(grad_out.dtype == u.dtype and grad_out.device == u.device,
          lambda: f"{op}: grad_out must have the dtype and device of u, got {grad_out.dtype} on {grad_out.device}")
    ct = torch.float64 if u.dtype == torch.float64 else torch.float32
    _check_param(op, "grad_last_state", grad_last_state, [u.shape[0], u.shape[1], A.shape[1]], ct, u.device)
