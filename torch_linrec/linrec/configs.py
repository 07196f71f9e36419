"""The named kernel configs of the scan, per backend and device (the tuner's search space)."""
from __future__ import annotations

import torch

from .._library import HAS_CUDA_KERNELS, scan_cuda_configs
from .ops import NATIVE

__all__ = ["config_names"]


def config_names(device: torch.device | str = "cuda", dtype: torch.dtype = torch.float32,
                 backend: str | None = None) -> list[str]:
    """Names of the kernel configs a scan of ``dtype`` may request on ``device``.

    Args:
        device: ``"cpu"`` or a CUDA device. dtype: the element type (configs differ by its size).
        backend: ``"native"`` or ``"triton"``; None: both (Triton's where the triton package is
            installed).

    Returns:
        Names for :func:`torch_linrec.scan`'s ``config`` / ``backward_config``; which of them apply
        to a call depends on its layout (an inapplicable name raises ValueError naming the valid ones).
    """
    device = torch.device(device)
    names: list[str] = []
    if backend in (None, NATIVE):
        if device.type == "cpu":
            names.append("cpu.g16")
        elif HAS_CUDA_KERNELS:
            names += scan_cuda_configs(2 if torch.empty((), dtype=dtype).element_size() == 2 else 4)
    if backend in (None, "triton"):
        try:
            from .triton.ops import CONFIGS
        except ImportError:
            CONFIGS = {}
        names += list(CONFIGS)
    return names
