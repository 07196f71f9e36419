"""Registration of the scan ops beside their schemas: fake (meta) kernels and autograd, each once.

``linrec::scan`` / ``linrec::scan_backward`` are defined in C++ (csrc/module.cpp) with CPU and CUDA
kernels (csrc/linrec), and the autograd of ``linrec::scan`` is registered in C++ too
(csrc/linrec/autograd.cpp: the Python autograd wrapper costs about 50 us of host time per call,
more than the kernels of a small call). ``linrec::scan_triton`` / ``linrec::scan_backward_triton``
are Triton ops (torch_linrec/linrec/triton) whose autograd is :func:`register_scan_autograd`. Both
autograds run the backward op that ``backward_config`` names: a ``"triton."`` config runs
``scan_backward_triton``, any other ``scan_backward``, so a forward and its backward may run on
different backends. With ``create_graph=True`` both build the backward from differentiable ops (a
reverse scan through the scan op itself, products, sums), so second and higher orders are exact;
``torch.func`` transforms run :mod:`.functorch`'s route.
"""
from __future__ import annotations

import torch

from .._library import document_op  # (loads the library that defines the linrec ops)
from .checks import batch_shape, check_batch_dims, check_scan_args, check_scan_backward_args
from .functorch import register_functorch
from .reference import scan_backward_ref

__all__ = ["fake_scan", "fake_scan_backward", "register_scan_autograd", "is_triton_config", "NATIVE", "TRITON", "AUTO",
           "TRITON_PREFIX", "PREFER_PREFIX", "TUNED_PREFIX"]

# Config names (csrc/linrec/ops.h has the same rules): "native" and "triton" name each backend's
# default config, "triton.<...>" the Triton configs, "<template>.<...>" the native ones; a name
# behind "prefer:" is a preference (the backend's default runs where it does not apply); "auto" asks
# the native ops for the tuned cache's choice (csrc/linrec/tuned.h), which they pass on behind
# "tuned:" (a preference that also yields to the CUDA planner's newer rules) for a native config.
NATIVE, TRITON, AUTO = "native", "triton", "auto"
TRITON_PREFIX = "triton."
PREFER_PREFIX = "prefer:"
TUNED_PREFIX = "tuned:"


def is_triton_config(config: str | None) -> bool:
    """Whether ``config`` (after any ``"prefer:"`` or ``"tuned:"``) names a Triton config."""
    if config is None:
        return False
    name = config.removeprefix(TUNED_PREFIX) if config.startswith(TUNED_PREFIX) else config.removeprefix(PREFER_PREFIX)
    return name == TRITON or name.startswith(TRITON_PREFIX)


def fake_scan(x, coeffs, initial=None, dim=-1, reverse=False, config=None, backward_config=None):
    """Fake kernel of every scan forward op: ``y`` has the shape, dtype and strides ``empty_like(x)`` gives."""
    d = check_scan_args("linrec.scan", x, coeffs, initial, dim, float64_ok=x.device.type == "cpu")
    y = torch.empty_like(x)
    check_batch_dims("linrec.scan", y, d, [x, coeffs.expand(x.shape), y],
                     [] if initial is None else [initial.expand(batch_shape(x, d))])
    return y


def fake_scan_backward(grad_y, coeffs, y, initial, dim, reverse, config=None):
    """Fake kernel of every scan backward op, allocating exactly as csrc/linrec/ops.cpp does."""
    d = check_scan_backward_args("linrec.scan_backward", grad_y, coeffs, y, initial, dim,
                                 float64_ok=y.device.type == "cpu")
    grad_x = torch.empty_like(y)
    grad_c = torch.empty_like(y)
    check_batch_dims("linrec.scan_backward", y, d, [grad_y, coeffs.expand(y.shape), y, grad_x, grad_c],
                     [grad_x.new_empty(batch_shape(y, d))])
    if coeffs.shape != y.shape:
        grad_c = grad_c.sum_to_size(coeffs.shape)
    grad_h0 = y.new_empty(batch_shape(y, d))
    return grad_x, grad_c, grad_h0


torch.library.register_fake("linrec::scan")(fake_scan)
torch.library.register_fake("linrec::scan_backward")(fake_scan_backward)
register_functorch("scan", torch.ops.linrec.scan)

SCAN_DOC = """linrec::scan(x, coeffs, initial=None, dim=-1, reverse=False, config=None, backward_config=None) -> y

The linear recurrence y[l] = coeffs[l] * y[l-1] + x[l] along ``dim`` with y[-1] = initial (zero when
None); ``reverse`` runs from the end. The C++ kernels (CPU; CUDA when built with CUDA).

Args:
    x: any shape (rank >= 1) and strides; float32, float16, bfloat16 (float64 on the CPU).
    coeffs: x's dtype and device, broadcastable to x (read in place, stride 0 where broadcast).
    initial: x's shape without ``dim``, or broadcastable to it; x's dtype and device.
    dim: the scanned dim, negative allowed. reverse: scan from the end towards the start.
    config / backward_config: kernel configs by name (torch_linrec.config_names); None: defaults;
        "auto": the tuned cache's choice; a "triton." backward_config runs the Triton backward.

Returns:
    y, allocated as torch.empty_like(x); reduced dtypes accumulate in float32.

Raises:
    ValueError naming the argument (expected vs got): dtype or device mismatch (the op is strict;
    torch_linrec.scan promotes, and under torch.autocast the op runs in the widest input dtype),
    integer dtype, dim out of range, shapes not broadcastable, an unknown or inapplicable config.

Autograd to any order (C++; second order through differentiable ops), torch.func (grad, vjp,
jvp, vmap), torch.compile and torch.export. The friendlier entry point is torch_linrec.scan.
"""
SCAN_BACKWARD_DOC = """linrec::scan_backward(grad_y, coeffs, y, initial, dim, reverse, config=None) -> (grad_x, grad_coeffs, grad_initial)

The vector-Jacobian product of linrec::scan (the linrec article, Part I): grad_x is the reverse scan
of grad_y with coeffs shifted by one step, grad_coeffs = grad_x * y[l-1] summed to coeffs' shape
(y[-1] = initial), grad_initial = grad_x * coeffs at the first step, of x's shape without ``dim``.
``y`` is the forward's output. Differentiable (its own autograd, from differentiable ops).
Raises ValueError as linrec::scan, and for grad_y of another shape, dtype or device than y.
"""
document_op("scan", SCAN_DOC)
document_op("scan_backward", SCAN_BACKWARD_DOC)


def _setup_context(ctx, inputs, output):
    x, coeffs, initial, dim, reverse, config, backward_config = inputs
    ctx.save_for_backward(coeffs, output, initial)
    ctx.dim, ctx.reverse, ctx.backward_config = dim, reverse, backward_config


def _backward(ctx, grad_y):
    coeffs, y, initial = ctx.saved_tensors
    cfg = ctx.backward_config
    triton = cfg is None or is_triton_config(cfg)  # None: the forward's own (Triton) backend
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (grad_y, coeffs, y, initial)):
        scan = torch.ops.linrec.scan_triton if triton else torch.ops.linrec.scan  # create_graph: differentiable
        grad_x, grad_c, grad_h0 = scan_backward_ref(grad_y, coeffs, y, initial, ctx.dim, ctx.reverse, scan=scan)
    else:
        op = torch.ops.linrec.scan_backward_triton if triton else torch.ops.linrec.scan_backward
        grad_x, grad_c, grad_h0 = op(grad_y, coeffs, y, initial, ctx.dim, ctx.reverse, None if cfg == NATIVE else cfg)
    if initial is None:
        grad_h0 = None
    elif grad_h0.shape != initial.shape:
        grad_h0 = grad_h0.sum_to_size(initial.shape)
    return grad_x, grad_c, grad_h0, None, None, None, None


def register_scan_autograd(forward_op: str) -> None:
    """Registers the scan gradient for ``forward_op``, a Triton op of ``linrec::scan``'s schema.

    The backward runs the op that the call's ``backward_config`` names (see the module docs; None:
    the Triton backward with its default config).
    Saved for backward: ``coeffs`` and the output ``y`` only.
    """
    torch.library.register_autograd(forward_op, _backward, setup_context=_setup_context)
