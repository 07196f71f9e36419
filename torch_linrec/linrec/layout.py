"""Strided layouts of the scan's operands: the batch dims (all but the scanned one) sorted innermost
first by a reference tensor's strides and merged where every operand allows it, as the C++ ops do
(csrc/common/layout.h).
"""
from __future__ import annotations

import torch

__all__ = ["coalesce_batch_dims", "MAX_BATCH_DIMS"]

# The C++ kernels' limit on batch dims after coalescing (csrc/common/strided.h: kMaxBatchDims).
MAX_BATCH_DIMS = 8


def coalesce_batch_dims(ref: torch.Tensor, dim: int, scan_ts: list, batch_ts: list) -> list:
    """Groups of batch dims that merge into one strided axis, innermost first.

    Args:
        ref: the output (scan-shaped); its strides order the batch dims.
        dim: the scanned dim (wrapped). scan_ts: tensors of ``ref``'s shape.
        batch_ts: tensors of ``ref``'s shape without ``dim``.

    Returns:
        ``[[size, strides], ...]``: per group its size and the stride of every operand
        (``scan_ts`` then ``batch_ts``).
    """
    dims = sorted((d for d in range(ref.dim()) if d != dim and ref.size(d) != 1), key=lambda d: abs(ref.stride(d)))
    groups: list = []
    for d in dims:
        s = [t.stride(d) for t in scan_ts] + [t.stride(d if d < dim else d - 1) for t in batch_ts]
        if groups and all(si == gi * groups[-1][0] for si, gi in zip(s, groups[-1][1])):
            groups[-1][0] *= ref.size(d)
        else:
            groups.append([ref.size(d), s])
    return groups
