"""torch_linrec: the linear recurrence ``y[l] = coeffs[l] * y[l-1] + x[l]`` as a PyTorch op.

``torch.ops.linrec.scan`` is the op (CPU and CUDA C++ kernels), ``torch.ops.linrec.scan_triton``
its Triton twin; :func:`scan` is the Python entry point that picks a backend and kernel config
(:mod:`torch_linrec.dispatch`, the tuned cache of :mod:`torch_linrec.configs`).

Layout: one folder per op family (:mod:`torch_linrec.linrec`: checks, layout, registration,
reference, Triton kernels; :mod:`torch_linrec.selective`: Mamba's selective scan; :mod:`torch_linrec.logscan`: the
log-space scan);
:mod:`torch_linrec.bench` holds the main job and the tuner.
"""
__version__ = "0.1.0"

from .linrec import ops  # noqa: F401,E402  (registers fakes and autograd)
from .api import scan  # noqa: E402
from .dispatch import BACKENDS, available_backends, get_backend, use_backend  # noqa: E402
from .linrec.configs import config_names  # noqa: E402
from .linrec.reference import chunked_scan, scan_backward_ref, scan_ref  # noqa: E402
from .selective import (selective_scan, selective_scan_fn, selective_scan_ref,  # noqa: E402
                        selective_state_update)
from .logscan import log_scan, log_scan_ref  # noqa: E402
from ._library import cpu_pool_stats, set_cpu_pool_limit  # noqa: E402

__all__ = ["scan", "scan_ref", "scan_backward_ref", "chunked_scan", "use_backend", "get_backend",
           "available_backends", "config_names", "BACKENDS", "selective_scan", "selective_scan_fn",
           "selective_state_update", "selective_scan_ref", "log_scan", "log_scan_ref", "cpu_pool_stats",
           "set_cpu_pool_limit"]
