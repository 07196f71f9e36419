"""Op glue for ``torch.ops.linrec``: fake (meta) kernels and autograd, each written once.

``linrec::scan`` / ``linrec::scan_backward`` are defined in C++ (csrc/module.cpp) with CPU and
CUDA kernels, and the autograd of ``linrec::scan`` is registered in C++ too
(csrc/scan_autograd.cpp: the Python autograd wrapper costs about 50 us of host time per call,
more than the kernels of a small call). ``linrec::scan_triton`` / ``linrec::scan_backward_triton``
are Triton ops (torch_linrec/triton) whose autograd is :func:`register_scan_autograd` below:
the same formula, ``scan_backward`` then ``initial``'s gradient summed to its shape.
"""
from __future__ import annotations

import torch

from . import _C  # noqa: F401  (loads the library that defines the linrec ops)
from ._checks import batch_shape, check_scan_args, check_scan_backward_args

__all__ = ["fake_scan", "fake_scan_backward", "register_scan_autograd", "HAS_CUDA_KERNELS"]

HAS_CUDA_KERNELS: bool = torch._C._dispatch_has_kernel_for_dispatch_key("linrec::scan", "CUDA")


def fake_scan(x, coeffs, initial=None, dim=-1, reverse=False):
    """Fake kernel of every scan forward op: ``y`` has the shape, dtype and strides ``empty_like(x)`` gives."""
    check_scan_args("linrec.scan", x, coeffs, initial, dim, float64_ok=x.device.type == "cpu")
    return torch.empty_like(x)


def fake_scan_backward(grad_y, coeffs, y, initial, dim, reverse):
    """Fake kernel of every scan backward op, allocating exactly as csrc/scan_ops.cpp does."""
    d = check_scan_backward_args("linrec.scan_backward", grad_y, coeffs, y, initial, dim,
                                 float64_ok=y.device.type == "cpu")
    grad_x = torch.empty_like(y)
    grad_c = torch.empty_like(y)
    if coeffs.shape != y.shape:
        grad_c = grad_c.sum_to_size(coeffs.shape)
    grad_h0 = y.new_empty(batch_shape(y, d))
    return grad_x, grad_c, grad_h0


torch.library.register_fake("linrec::scan")(fake_scan)
torch.library.register_fake("linrec::scan_backward")(fake_scan_backward)


def _setup_context(ctx, inputs, output):
    x, coeffs, initial, dim, reverse = inputs
    ctx.save_for_backward(coeffs, output, initial)
    ctx.dim, ctx.reverse = dim, reverse


def register_scan_autograd(forward_op, backward_op) -> None:
    """Registers the scan gradient for ``forward_op``, computed by ``backward_op``.

    ``backward_op(grad_y, coeffs, y, initial, dim, reverse) -> (grad_x, grad_coeffs, grad_initial)``
    (see ``linrec::scan_backward``). Saved for backward: ``coeffs`` and the output ``y`` only.
    """

    def backward(ctx, grad_y):
        coeffs, y, initial = ctx.saved_tensors
        grad_x, grad_c, grad_h0 = backward_op(grad_y, coeffs, y, initial, ctx.dim, ctx.reverse)
        if initial is None:
            grad_h0 = None
        elif grad_h0.shape != initial.shape:
            grad_h0 = grad_h0.sum_to_size(initial.shape)
        return grad_x, grad_c, grad_h0, None, None

    torch.library.register_autograd(forward_op, backward, setup_context=_setup_context)

