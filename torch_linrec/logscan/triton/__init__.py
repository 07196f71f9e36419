"""Triton kernels of the log-space scan (imported on first use: it imports triton)."""
from .ops import log_scan_triton

__all__ = ["log_scan_triton"]
