"""The public function :func:`context_parallel_scan`."""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import ops  # noqa: F401  (registers linrec::context_parallel_scan and its autograd)

__all__ = ["context_parallel_scan", "group_name"]

_NAME = "context_parallel_scan"


def _is_mesh(obj) -> bool:
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:
        return False
    return isinstance(obj, DeviceMesh)


def group_name(group=None, mesh=None, mesh_dim=None) -> str:
    """The name of the process group a call runs on (see :func:`context_parallel_scan`).

    Raises:
        ValueError: torch.distributed not initialized; both ``group`` and ``mesh`` given;
            ``mesh_dim`` without a mesh; ``group`` neither a ProcessGroup nor a DeviceMesh.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"{_NAME}: torch.distributed is not initialized; call "
                         "torch.distributed.init_process_group first")
    if mesh is not None and group is not None:
        raise ValueError(f"{_NAME}: pass either group or mesh, got both")
    if mesh is None and _is_mesh(group):
        mesh, group = group, None
    if mesh is not None:
        if not _is_mesh(mesh):
            raise ValueError(f"{_NAME}: mesh must be a torch.distributed.DeviceMesh, got {type(mesh).__name__}")
        group = mesh.get_group(mesh_dim)
    elif mesh_dim is not None:
        raise ValueError(f"{_NAME}: mesh_dim={mesh_dim!r} needs a DeviceMesh (group or mesh), got none")
    if group is None:
        group = dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise ValueError(f"{_NAME}: group must be a ProcessGroup or a DeviceMesh, got {type(group).__name__}")
    return group.group_name


def context_parallel_scan(x: torch.Tensor, coeffs: torch.Tensor, dim: int, group=None,
                          initial: torch.Tensor | None = None, reverse: bool = False, *, mesh=None,
                          mesh_dim: int | str | None = None) -> torch.Tensor:
    """The scan ``y[l] = coeffs[l] * y[l-1] + x[l]`` of a sequence split along ``dim`` over the ranks
    of a process group (context parallelism): returns this rank's chunk of the whole sequence's scan.

    Rank ``r`` of the group holds the ``r``-th contiguous chunk (group rank order is sequence
    order); chunks may differ in length, and may be empty. Each rank reduces its chunk to the
    state-sized summary ``(prod(coeffs), last output from zero)``, the ranks all-gather the
    summaries (``2 x state x world`` elements, independent of L), each combines those before it
    into the state entering its chunk, and scans its chunk from that state (math:
    :mod:`torch_linrec.distributed.ops`; cost model: README, "Context parallelism").

    Differentiable in ``x``, ``coeffs`` and ``initial`` (first order): the backward is the same
    scheme run against the scan. ``torch.compile`` traces it as one op (no graph break). Every rank
    of the group must call it with the same ``dim``, ``reverse`` and batch shape, and must run the
    backward whenever one does (it is a collective).

    Args:
        x: this rank's chunk, any shape with at least one dim; float32, float16, bfloat16 (float64
            on the CPU); any strides. Sizes other than ``dim`` must agree across ranks.
        coeffs: this rank's coefficients, x's dtype and device, broadcastable to x (e.g. ``(D,)``
            time-invariant, or size 1 along ``dim``: the same coefficient on every rank).
        dim: the scanned (sequence) dim, negative allowed.
        group: a ``ProcessGroup`` or a ``DeviceMesh`` (then ``mesh_dim`` picks its dim); None:
            the default group.
        initial: the state before the sequence's first step, x's shape without ``dim`` or
            broadcastable to it; x's dtype. Used on the rank where the walk starts (rank 0; the
            last rank when ``reverse``) and ignored elsewhere (its gradient is zero there).
            Default None: zero.
        reverse: scan from the end of the sequence (the last rank) towards its start.
        mesh: a ``DeviceMesh``, as an alternative to ``group``. mesh_dim: the mesh dim (index or
            name) whose group holds the sequence; needed for meshes of more than one dim.

    Returns:
        This rank's chunk of ``y``, x's shape and dtype. Summaries and carries are float32
        (float64 for float64 x); the carry enters the chunk's scan in x's dtype.

    Raises:
        ValueError: as :func:`torch_linrec.scan` for bad tensors; torch.distributed not initialized;
            a bad ``group`` / ``mesh`` / ``mesh_dim``.
    """
    name = group_name(group, mesh, mesh_dim)
    return torch.ops.linrec.context_parallel_scan(x, coeffs, initial, dim, reverse, name)[0]
