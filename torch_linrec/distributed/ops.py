"""``linrec::context_parallel_scan`` and its backward: custom ops whose kernels talk to the other ranks.

Math (every rank ``r`` of the group holds chunk ``r`` of the sequence; the walk runs over ranks
``0, 1, ...``, or from the last rank when ``reverse``):

* forward: ``(A_r, b_r)`` = :func:`~.summary.chunk_summary` of the rank's chunk (on the first rank
  of the walk ``b`` also carries ``initial``: ``b = A * initial + b``, so only that rank needs it);
  an all-gather of the pairs (O(state x world) bytes); every rank scans the gathered pairs over
  the rank axis (``h_out[r] = A_r h_out[r-1] + b_r``, a :func:`torch_linrec.scan` of ``world``
  steps) and takes the state entering its chunk, the carry; then
  ``y = scan(x, coeffs, initial=carry)`` on its chunk.
* backward: the gradient walks the other way. With ``g_r`` the gradient of rank r's carry,
  ``g_r = S_r + A_r g_{r+1}`` where ``S_r`` is the summary of ``(coeffs, coeffs * grad_y)`` walked
  against the scan (``d_initial`` of the chunk alone). One all-gather of ``(A_r, S_r)``, the
  reverse scan over ranks, then ``g_{r+1}`` joins ``grad_y`` at the chunk's last step and
  ``linrec::scan_backward`` runs on the chunk with the carry as its initial state. ``g`` of the
  first rank is the gradient of ``initial``.

The collectives run inside the ops (``torch.distributed``, eager, on the group named by
``group_name``), so ``torch.compile`` sees two opaque ops and no collective: no graph break, and
nothing for the compiler to reorder across ranks. Every rank must call the op (and run its
backward) the same number of times, as with any collective.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .. import _library
from ..dispatch import choose
from ..linrec.checks import batch_shape, check_scan_args, check_scan_backward_args
from ..linrec.ops import NATIVE, TRITON, is_triton_config
from ..linrec.reference import scan_backward_ref
from .summary import chunk_summary

__all__ = ["context_parallel_scan_op", "context_parallel_scan_backward_op", "resolve_group", "all_gather_states"]

_OP, _BWD = "linrec.context_parallel_scan", "linrec.context_parallel_scan_backward"


def resolve_group(group_name: str):
    """The process group registered under ``group_name`` (``ProcessGroup.group_name``)."""
    from torch.distributed.distributed_c10d import _resolve_process_group
    return _resolve_process_group(group_name)


def all_gather_states(t: torch.Tensor, group) -> torch.Tensor:
    """``(world, *t.shape)``: every rank's ``t``, in group rank order (one all-gather)."""
    world = group.size()
    out = t.new_empty(world * t.numel())  # flat: gloo takes no other output shape
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    gather(out, t.reshape(-1).contiguous(), group=group)
    return out.view(world, *t.shape)


def _neighbour(rank: int, world: int, upstream: bool, reverse: bool) -> Optional[int]:
    """The rank before (``upstream``) or after this one in the scan's walk order, None past an end."""
    step = -1 if upstream != reverse else 1
    r = rank + step
    return r if 0 <= r < world else None


def _scan(x, c, initial, d, reverse):
    from ..api import scan
    return scan(x, c, initial, d, reverse)


def _scan_backward(grad_y, coeffs, y, initial, d, reverse):
    """The backward op the forward's dispatch choice names (as the scan's own autograd runs)."""
    choice = choose(y, coeffs, d)
    if choice.backend == "reference":
        return scan_backward_ref(grad_y, coeffs, y, initial, d, reverse)
    cfg = choice.backward_config
    if is_triton_config(cfg) or (cfg is None and choice.backend == TRITON):
        return torch.ops.linrec.scan_backward_triton(grad_y, coeffs, y, initial, d, reverse, cfg)
    return torch.ops.linrec.scan_backward(grad_y, coeffs, y, initial, d, reverse, None if cfg == NATIVE else cfg)


@torch.library.custom_op("linrec::context_parallel_scan", mutates_args=())
def context_parallel_scan_op(x: torch.Tensor, coeffs: torch.Tensor, initial: Optional[torch.Tensor], dim: int,
                             reverse: bool, group_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's chunk of the scan of the sequence split over the group (module docs).

    Returns:
        ``(y, carry)``: y as :func:`torch_linrec.scan` returns it for this chunk; carry the state
        that entered the chunk (x's shape without ``dim``, x's dtype), saved for the backward.
    """
    d = check_scan_args(_OP, x, coeffs, initial, dim)
    group = resolve_group(group_name)
    rank, world = group.rank(), group.size()
    a, b = chunk_summary(x, coeffs, d, reverse)
    batch = batch_shape(x, d)
    prev = _neighbour(rank, world, upstream=True, reverse=reverse)
    if prev is None:  # the walk starts here: initial enters this chunk, and leaves it in b
        if initial is None:
            carry = torch.zeros(batch, dtype=x.dtype, device=x.device)
        else:
            carry = initial.expand(batch).to(x.dtype, copy=True)
            b = torch.addcmul(b, a, carry.to(a.dtype))
    states = all_gather_states(torch.stack([a, b]), group)
    if prev is not None:
        carry = _scan(states[:, 1], states[:, 0], None, 0, reverse)[prev].to(x.dtype, copy=True)
    return _scan(x, coeffs, carry, d, reverse), carry


@context_parallel_scan_op.register_fake
def _fake(x, coeffs, initial, dim, reverse, group_name):
    d = check_scan_args(_OP, x, coeffs, initial, dim)
    return torch.empty_like(x), x.new_empty(batch_shape(x, d))


@torch.library.custom_op("linrec::context_parallel_scan_backward", mutates_args=())
def context_parallel_scan_backward_op(grad_y: torch.Tensor, coeffs: torch.Tensor, y: torch.Tensor,
                                      carry: torch.Tensor, dim: int, reverse: bool,
                                      group_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Vector-Jacobian product of :func:`context_parallel_scan_op` (module docs).

    Returns:
        ``(grad_x, grad_coeffs, grad_initial)``: grad_coeffs reduced to coeffs' shape; grad_initial
        of the carry's shape, the gradient of ``initial`` on the rank where the walk starts
        (rank 0; the last rank when ``reverse``), zeros elsewhere.
    """
    d = check_scan_backward_args(_BWD, grad_y, coeffs, y, carry, dim)
    group = resolve_group(group_name)
    rank, world = group.rank(), group.size()
    a, s = chunk_summary(grad_y, coeffs, d, not reverse, scale_x=True)
    states = all_gather_states(torch.stack([a, s]), group)
    grad_carry = _scan(states[:, 1], states[:, 0], None, 0, not reverse)  # g_r for every rank
    nxt = _neighbour(rank, world, upstream=False, reverse=reverse)
    if nxt is not None and y.shape[d] > 0:
        grad_y = grad_y.clone()
        grad_y.select(d, 0 if reverse else -1).add_(grad_carry[nxt].to(grad_y.dtype))
    grad_x, grad_c, _ = _scan_backward(grad_y, coeffs, y, carry, d, reverse)
    if _neighbour(rank, world, upstream=True, reverse=reverse) is None:
        grad_h = grad_carry[rank].to(y.dtype, copy=True)
    else:
        grad_h = torch.zeros_like(carry)
    return grad_x, grad_c, grad_h


@context_parallel_scan_backward_op.register_fake
def _fake_backward(grad_y, coeffs, y, carry, dim, reverse, group_name):
    check_scan_backward_args(_BWD, grad_y, coeffs, y, carry, dim)
    return torch.empty_like(y), torch.empty_like(coeffs), torch.empty_like(carry)


def _setup_context(ctx, inputs, output):
    x, coeffs, initial, dim, reverse, group_name = inputs
    y, carry = output
    ctx.save_for_backward(coeffs, y, carry)
    ctx.mark_non_differentiable(carry)
    ctx.dim, ctx.reverse, ctx.group_name = dim, reverse, group_name
    ctx.initial_shape = None if initial is None else initial.shape


def _backward(ctx, grad_y, grad_carry):
    coeffs, y, carry = ctx.saved_tensors
    if grad_y is None:
        grad_y = torch.zeros_like(y)
    grad_x, grad_c, grad_h = torch.ops.linrec.context_parallel_scan_backward(
        grad_y, coeffs, y, carry, ctx.dim, ctx.reverse, ctx.group_name)
    grad_h = None if ctx.initial_shape is None else grad_h.sum_to_size(ctx.initial_shape)
    return grad_x, grad_c, grad_h, None, None, None


context_parallel_scan_op.register_autograd(_backward, setup_context=_setup_context)


def _no_double_backward(ctx, *grads):
    raise RuntimeError(f"{_OP}: second-order gradients (double backward) are not supported")


context_parallel_scan_backward_op.register_autograd(_no_double_backward, setup_context=lambda ctx, inputs, output: None)


_library.document_op("context_parallel_scan", """linrec::context_parallel_scan(x, coeffs, initial, dim, reverse, group_name) -> (y, carry)

This rank's chunk of the scan y[l] = coeffs[l] * y[l-1] + x[l] of a sequence split along `dim` over
the ranks of the process group `group_name` (rank order = sequence order): the chunk's summary
(product of coeffs, last output) is all-gathered, the ranks' summaries are scanned to the state
entering this chunk (carry), and the chunk is scanned from it. Public entry point:
torch_linrec.distributed.context_parallel_scan.""")
_library.document_op("context_parallel_scan_backward", """linrec::context_parallel_scan_backward(grad_y, coeffs, y, carry, dim, reverse, group_name) -> (grad_x, grad_coeffs, grad_initial)

The vector-Jacobian product of linrec::context_parallel_scan: the reverse context-parallel scan of
grad_y; grad_initial is non-zero on the rank where the walk starts.""")
