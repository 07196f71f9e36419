"""The log-space scan: ``linrec::log_scan`` (C++ CPU kernel in csrc/logscan, Triton kernels in
:mod:`.triton`, loaded on first use), its fake kernel and autograd (:mod:`.ops`), the float64
reference (:mod:`.reference`) and the public :func:`log_scan` (:mod:`.api`)."""
from . import ops  # noqa: F401  (registers the CUDA implementation, fake kernel and autograd)
from .api import log_scan
from .reference import log_scan_ref

__all__ = ["log_scan", "log_scan_ref"]
