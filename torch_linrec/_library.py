"""Loads ``torch_linrec._C``, the compiled library that defines every ``torch.ops.linrec`` op.

Importing it registers the schemas (csrc/module.cpp) and the CPU and, when built with CUDA, the CUDA
kernels of the native ops.
"""
from __future__ import annotations

import torch

from . import _C

__all__ = ["HAS_CUDA_KERNELS", "scan_cuda_configs", "document_op", "build_info", "cpu_pool_stats",
           "set_cpu_pool_limit"]

HAS_CUDA_KERNELS: bool = torch._C._dispatch_has_kernel_for_dispatch_key("linrec::scan", "CUDA")


def scan_cuda_configs(elem_size: int) -> list[str]:
    """Names of every compiled CUDA config of the native scan for ``elem_size``-byte elements (4 or 2).

    Which of them apply to a given problem and device is decided by the op (an inapplicable name
    raises ValueError listing the ones that apply).
    """
    return list(_C.scan_cuda_configs(elem_size))


def build_info() -> str:
    """Which kernels this install has, e.g. ``"kernels: CPU C++, CUDA C++ (built), Triton (installed)"``
    (pip hides the build's own line unless ``-v``; the main job and scripts/quickstart.sh print this)."""
    import importlib.util
    cuda = "CUDA C++ (built)" if HAS_CUDA_KERNELS else "CUDA C++ (not built: no CUDA torch or nvcc at build time)"
    triton = "Triton (installed)" if importlib.util.find_spec("triton") else "Triton (not installed)"
    return f"kernels: CPU C++, {cuda}, {triton}"


def document_op(name: str, doc: str) -> None:
    """Sets the ``__doc__`` of ``torch.ops.linrec.<name>`` and of its overloads (``help()`` and
    IDEs show it; ops registered from C++ have none)."""
    packet = getattr(torch.ops.linrec, name)
    packet.__doc__ = doc
    for overload in packet.overloads():
        getattr(packet, overload).__doc__ = doc


def cpu_pool_stats() -> dict[str, int]:
    """Counts of the pool that recycles the memory of the CPU kernels' outputs.

    On the CPU, ``linrec.scan`` (its ``y``), ``linrec.scan_backward`` (the backward of
    :func:`torch_linrec.scan`: ``grad_x`` and ``grad_coeffs``) and ``linrec.log_scan`` take their
    outputs' storage from a small per-process pool of blocks freed by earlier outputs of about their
    size, and a freed output's block goes back to it. glibc malloc would otherwise return the memory
    to the system between calls and page-fault it in again on the next one, which costs as much as
    the kernel or several times it (bench/NOTES.md items 22, 78). The pool holds at most
    :func:`set_cpu_pool_limit`'s bytes idle; the outputs' storage is an ordinary, resizable CPU
    storage.

    Returns:
        ``{"hits": int, "misses": int, "idle_bytes": int, "limit_bytes": int}``: allocations served by
        an idle block and allocations of a new block (of a size the pool keeps) since the last
        :func:`set_cpu_pool_limit`, the bytes held idle now, and the most it holds.
    """
    hits, misses, idle, limit = _C.host_pool_stats()
    return {"hits": hits, "misses": misses, "idle_bytes": idle, "limit_bytes": limit}


def set_cpu_pool_limit(nbytes: int) -> None:
    """Sets the most bytes the CPU output pool (:func:`cpu_pool_stats`) holds idle; resets its counts.

    Default 256 MiB: a forward+backward's three outputs stay pooled up to ~85 MiB each (glibc maps
    blocks over 32 MiB anew for every allocation, ``torch.add``'s output included, and page-faults
    them in; bench/NOTES.md item 83). Blocks of more than half the limit are not kept, nor blocks of
    less than 128 KiB. ``0`` turns the pool off: every idle block is released at once, and outputs in
    use are released when freed.

    Args:
        nbytes: an int >= 0.

    Raises:
        ValueError: ``nbytes`` is not an int or is negative.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"set_cpu_pool_limit: nbytes must be an int >= 0, got {nbytes!r}")
    _C.set_host_pool_limit(nbytes)
