"""Registration of ``linrec::selective_scan``, ``_selective_scan_train`` and
``selective_scan_backward`` beside their schemas (csrc/module.cpp): their fake kernels, and the
Python implementation behind their C++ host path.

The ops' CPU and CUDA kernels and their autograd are C++ (csrc/selective/ops.cpp,
csrc/selective/autograd.cpp): valid arguments that the C++ kernels take (always on CPU; on CUDA
input-dependent B and C, N <= 256 and enough (channel, state) pairs) run them without Python. The
rest comes here, through the internal ops ``linrec::_selective_scan_python`` and
``_selective_scan_backward_python``: the checks of :mod:`.checks`, which raise ValueError naming the
argument, and the Triton kernels (torch_linrec/selective/triton, loaded on first use) for
time-invariant B or C, small problems, and an extension built without CUDA.
"""
from __future__ import annotations

import torch

from .. import _library
from .checks import check_selective_scan_args, check_selective_scan_backward_args
from .functorch import register_functorch
from .reference import compute_dtype

__all__ = ["checkpoint_numel", "fake_selective_scan", "fake_selective_scan_backward", "fake_selective_scan_train"]

_OP, _BWD = "linrec.selective_scan", "linrec.selective_scan_backward"


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` without the dispatcher round trip when it is already that dtype (each call
    is host time on the eager path)."""
    return t if t.dtype == dtype else t.to(dtype)


def _to(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if t is None:
        return None
    t = _cast(t, dtype)
    return t if t.is_contiguous() else t.contiguous()


def _bc(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(1) if t.dim() == 3 else t


def _bc_grad(g: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return _cast(g.squeeze(1) if t.dim() == 3 else g, t.dtype)


def _triton_ops():
    try:
        from .triton import ops
    except ImportError as exc:  # no triton in this environment
        raise ValueError(f"{_OP}: CUDA tensors need the Triton kernels, and triton cannot be imported: {exc}") from exc
    return ops


_CUDA_MAX_STATE = 256  # csrc/selective/cuda/selective_scan_cuda.cpp
# The CUDA kernels walk L sequentially, one thread per (channel, 4-16 states): below about this many
# (channel, state) pairs they leave the GPU short of threads and Triton's chunked scan is faster
# (H100, bf16, forward / backward ms, CUDA vs Triton: 1 x 1536 x N 16 (24,576 pairs) 0.40 / 1.99 vs
# 0.38 / 1.75; 2 x 1024 x N 16 (32,768) 0.21 / 1.02 vs 0.34 / 1.05; 1 x 256 x N 128 (32,768)
# 0.59 / 2.38 vs 0.75 / 3.72).
_CUDA_MIN_STATES = 32768


def _native(u, A, B, C) -> bool:
    """Whether the C++ kernels run this (valid) call: always on CPU; on CUDA for input-dependent B and
    C and enough (channel, state) pairs to fill the GPU (else the Triton kernels). The rule of
    csrc/selective/ops.cpp (``native``), which routes the calls; the fake kernels size the
    checkpoints by it."""
    if u.device.type == "cpu":
        return True
    nstate = A.shape[1]
    return (_library.HAS_CUDA_KERNELS and B.dim() > 2 and C.dim() > 2 and nstate <= _CUDA_MAX_STATE
            and u.shape[0] * u.shape[1] * nstate >= _CUDA_MIN_STATES)


def _kernel_args(u, delta, A, B, C, D, z, delta_bias, initial_state, same_bc_dtype: bool):
    """The arguments as the kernels take them (module docs; csrc/selective/ops.cpp's ``kernel_args``
    prepares the C++ kernels' the same way). ``same_bc_dtype``: the kernel reads B and C in u's
    dtype (the CPU kernel), so mixed dtypes run everything in the compute dtype."""
    ct = compute_dtype(u.dtype)
    if same_bc_dtype and (B.dtype != u.dtype or C.dtype != u.dtype):
        u, delta, z = u.to(ct), delta.to(ct), None if z is None else z.to(ct)
        B, C = B.to(ct), C.to(ct)
    return u, delta, _to(A, ct), _bc(B), _bc(C), _to(D, ct), z, _to(delta_bias, ct), _to(initial_state, ct)


def _triton_route(op: str, u: torch.Tensor) -> None:
    """What reaches the Python implementation with valid arguments: CUDA calls for the Triton kernels.
    Anything else means the C++ argument test and :mod:`.checks` disagree (tests/test_selective_scan.py
    checks they do not)."""
    if u.device.type != "cuda":
        raise RuntimeError(f"{op}: internal error: the C++ host path passed valid {u.device.type} arguments "
                           "to the Python implementation; please report it with the arguments' shapes and dtypes")


def _python_forward(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, save_checkpoints):
    """``linrec::_selective_scan_python``: the checks (raise ValueError), then the Triton forward.
    Returns ``(out, last_state, checkpoints)``, checkpoints empty (the Triton backward recomputes)."""
    check_selective_scan_args(_OP, u, delta, A, B, C, D, z, delta_bias, initial_state)
    _triton_route(_OP, u)
    ops = _triton_ops()
    if A.shape[1] > ops.MAX_STATE:
        raise ValueError(f"{_OP}: the CUDA kernels take N <= {ops.MAX_STATE} states, got A of shape {list(A.shape)}")
    args = _kernel_args(u, delta, A, B, C, D, z, delta_bias, initial_state, same_bc_dtype=False)
    out, last = ops.selective_scan_fwd(*args[:7], args[7], delta_softplus, args[8])
    return _cast(out, u.dtype), last, last.new_empty(0, dtype=torch.float32)


def checkpoint_numel(u: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor):
    """Elements of the checkpoints ``linrec::_selective_scan_train`` returns: on CUDA with the C++
    kernels, one float32 state per (batch, channel, chunk), ``(batch, D, chunks, N_pad)``, the state
    after every chunk but the last (whose slot is unused: the size has no case for a single chunk,
    so dynamic shapes put no guard on L); chunks of 32 steps, 16 above N_pad = 128; N_pad: N rounded
    up to a power of two, at least 16, as csrc/selective/cuda pads it. Else 0."""
    if u.device.type != "cuda" or not _native(u, A, B, C):
        return 0
    n_pad = max(16, 1 << (int(A.shape[1]) - 1).bit_length())
    chunk = 32 if n_pad <= 128 else 16
    return u.shape[0] * u.shape[1] * ((u.shape[2] + chunk - 1) // chunk) * n_pad


def _python_backward(grad_out, grad_last_state, u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                      initial_state, checkpoints=None):
    """``linrec::_selective_scan_backward_python``: the checks (raise ValueError), then the Triton
    backward, its gradients in their inputs' dtypes (empty for absent optional inputs)."""
    check_selective_scan_backward_args(_BWD, grad_out, grad_last_state, u, delta, A, B, C, D, z, delta_bias,
                                       initial_state)
    _triton_route(_BWD, u)
    args = _kernel_args(u, delta, A, B, C, D, z, delta_bias, initial_state, same_bc_dtype=False)
    grad_last_state = _to(grad_last_state, compute_dtype(u.dtype))
    grads = _triton_ops().selective_scan_bwd(grad_out, grad_last_state, *args[:7], args[7], delta_softplus, args[8])
    du, ddelta, dA, dB, dC, dD, dz, dbias, dh0 = grads

    def grad_of(t, g):  # a fresh empty tensor per absent input: outputs must not alias each other
        return u.new_empty(0) if t is None else _cast(g, t.dtype)
    return (_cast(du, u.dtype), _cast(ddelta, delta.dtype), _cast(dA, A.dtype), _bc_grad(dB, B), _bc_grad(dC, C),
            grad_of(D, dD), grad_of(z, dz), grad_of(delta_bias, dbias), grad_of(initial_state, dh0))


def _python_forward_kernel(*args):
    return _python_forward(*args)  # looked up per call: tests count the calls that reach Python


def _python_backward_kernel(*args):
    return _python_backward(*args)


for _device in ("cpu", "cuda"):
    torch.library.impl("linrec::_selective_scan_python", _device)(_python_forward_kernel)
    torch.library.impl("linrec::_selective_scan_backward_python", _device)(_python_backward_kernel)


@torch.library.register_fake("linrec::selective_scan")
def fake_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                        initial_state=None):
    """``out`` as ``empty_like(u)`` (as the kernels allocate it), ``last_state`` ``(B, D, N)``."""
    check_selective_scan_args(_OP, u, delta, A, B, C, D, z, delta_bias, initial_state)
    return torch.empty_like(u), u.new_empty((u.shape[0], u.shape[1], A.shape[1]), dtype=compute_dtype(u.dtype))


@torch.library.register_fake("linrec::_selective_scan_train")
def fake_selective_scan_train(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                              initial_state=None):
    """As :func:`fake_selective_scan`, and float32 checkpoints of :func:`checkpoint_numel` elements."""
    out, last = fake_selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state)
    return out, last, last.new_empty(checkpoint_numel(u, A, B, C), dtype=torch.float32)


@torch.library.register_fake("linrec::selective_scan_backward")
def fake_selective_scan_backward(grad_out, grad_last_state, u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                 initial_state, checkpoints=None):
    """Gradients shaped like their inputs (empty for absent optional inputs), with the kernels' strides."""
    check_selective_scan_backward_args(_BWD, grad_out, grad_last_state, u, delta, A, B, C, D, z, delta_bias,
                                       initial_state)

    def like(t):  # du, ddelta, dz: empty_like their input, as the kernels allocate them
        return u.new_empty(0) if t is None else torch.empty_like(t)

    def dense(t):  # the other gradients come from contiguous float32 accumulators
        return u.new_empty(0) if t is None else t.new_empty(t.shape)
    return (like(u), like(delta), dense(A), dense(B), dense(C), dense(D), like(z), dense(delta_bias),
            dense(initial_state))


_library.document_op("selective_scan", """linrec::selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial_state=None) -> (out, last_state)

Mamba's selective SSM, fused: dt = softplus(delta + delta_bias) (when delta_softplus),
h[l] = exp(dt A) h[l-1] + dt B[l] u[l], out = (sum_n C[l] h[l] + D u) * silu(z).
u, delta, z: (B, D, L), any strides; A: (D, N); B, C: (D, N), (B, N, L) or (B, G, N, L);
D, delta_bias: (D,); initial_state: (B, D, N). float32/float16/bfloat16 (float64 on the CPU).
Returns out (B, D, L) in u's dtype and last_state (B, D, N) in float32 (float64 for float64 u).
First-order gradients for every tensor input; double backward raises. Math:
torch_linrec/selective/reference.py. Raises ValueError naming a bad argument.""")
_library.document_op("selective_scan_backward", """linrec::selective_scan_backward(grad_out, grad_last_state, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, checkpoints=None) -> 9 gradients

The vector-Jacobian product of linrec::selective_scan: (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias,
dinitial_state), each of its input's shape; an empty tensor for an absent optional input.
checkpoints: the third output of linrec::_selective_scan_train on the same inputs (the CUDA kernel
then skips recomputing the chunk states); None recomputes them. Not differentiable (second order raises).""")
_library.document_op("_selective_scan_train", """linrec::_selective_scan_train(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial_state=None) -> (out, last_state, checkpoints)

linrec::selective_scan as training runs it (torch_linrec.selective_scan calls it when a gradient is
needed): the same out and last_state, and the float32 states the CUDA kernel saves at chunk
boundaries for the backward (flat; empty where the Triton or CPU kernels run). Same gradients.""")
for _name in ("_selective_scan_fwd", "_selective_scan_bwd"):
    _library.document_op(_name, "Internal: the CPU and CUDA C++ kernels behind linrec::selective_scan "
                                "(csrc/selective), called after its argument test (csrc/selective/ops.cpp); use "
                                "torch.ops.linrec.selective_scan.")
for _name in ("_selective_scan_python", "_selective_scan_backward_python"):
    _library.document_op(_name, "Internal: the Python implementation behind linrec::selective_scan and its backward "
                                "(argument checks, Triton kernels), for the calls its C++ host path does not take; "
                                "use torch.ops.linrec.selective_scan.")

register_functorch()
