"""Loads ``torch_linrec._C``, the compiled library that defines every ``torch.ops.linrec`` op.

Importing it registers the schemas (csrc/module.cpp) and the CPU and, when built with CUDA, the CUDA
kernels of the native ops.
"""
from __future__ import annotations

import torch

from . import _C

__all__ = ["HAS_CUDA_KERNELS", "scan_cuda_configs", "document_op", "build_info"]

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
