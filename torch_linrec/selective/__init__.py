"""The selective scan (Mamba's selective SSM): ``linrec::selective_scan`` and its public functions."""
from . import ops  # noqa: F401  (registers the implementations, fake kernels and autograd)
from .api import selective_scan, selective_scan_fn, selective_state_update
from .reference import selective_scan_ref

__all__ = ["selective_scan", "selective_scan_fn", "selective_state_update", "selective_scan_ref"]
