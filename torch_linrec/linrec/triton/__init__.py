"""Triton backend: registers ``torch.ops.linrec.scan_triton`` and ``scan_backward_triton``.

Imported by torch_linrec.api when triton is installed. Kernels run on CUDA, and on CPU tensors
under ``TRITON_INTERPRET=1`` (read at launch time, see :func:`.ops._sync_interpret_mode`).
"""
from . import ops  # noqa: F401  (registers the ops)
from .ops import scan_backward_triton, scan_triton

__all__ = ["scan_triton", "scan_backward_triton"]
