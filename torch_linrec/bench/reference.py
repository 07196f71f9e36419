"""Error metric of the checks and the benchmark (the references themselves live in
:mod:`torch_linrec.linrec.reference`)."""
from __future__ import annotations

import torch

__all__ = ["rel_err"]


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|actual - expected| / max|expected|`` in float64: a relative error that stays finite
    where single entries of ``expected`` are near zero. NaN or inf in ``actual`` give NaN or inf.
    """
    if expected.numel() == 0:
        return 0.0
    expected = expected.detach().to("cpu", torch.float64)
    diff = (actual.detach().to("cpu", torch.float64) - expected).abs().max().item()
    scale = expected.abs().max().item()
    return diff / scale if scale > 0 else diff
