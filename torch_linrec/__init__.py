"""torch_linrec: the linear recurrence ``y[l] = coeffs[l] * y[l-1] + x[l]`` as a PyTorch op.

``torch.ops.linrec.scan`` is the op (CPU and CUDA C++ kernels), ``torch.ops.linrec.scan_triton``
its Triton twin; :func:`scan` is the Python entry point that picks a backend.
"""
from . import ops  # noqa: F401  (registers fakes and autograd)
from .api import BACKENDS, available_backends, get_backend, scan, use_backend
from .reference import scan_backward_ref, scan_ref

__all__ = ["scan", "scan_ref", "scan_backward_ref", "use_backend", "get_backend", "available_backends",
           "BACKENDS"]
__version__ = "0.1.0"
