"""Property-based fuzzing (hypothesis) of torch_linrec.scan: forward and gradients against the float64
reference over shapes (rank 1-5, lengths 0..5000 with primes and powers of two), scanned dims, layouts
(transposed, sliced, stride-0 broadcast of x, coeffs and initial, keepdim initial, Python-number
coeffs and initial), dtypes, both directions and every backend that runs here.

Runs: CPU (native / auto / reference) >= 1000 examples; the Triton kernels under TRITON_INTERPRET=1
on tiny sizes; CUDA (marked ``cuda``) >= 2000 examples of the native kernels and 500 of Triton's
(their compile time bounds it). Reproducible: derandomized,
no example database. Each test counts the examples it ran and fails below its minimum, so a strategy
that silently filters everything out cannot pass.

Reference: :func:`torch_linrec.chunked_scan` (float64, O(sqrt L) Python steps) and
:func:`torch_linrec.scan_backward_ref` on it, from the same (rounded) inputs; gradients of the leaves
behind views come from autograd through the same view functions in float64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_linrec
from conftest import HAS_CUDA
from samples import TOL, scaled_err
from torch_linrec.dispatch import triton_runs_on

F64 = torch.float64
LENGTHS = [0, 1, 2, 3, 5, 7, 13, 16, 31, 64, 127, 128, 257, 509, 1021, 1024, 2048, 2053, 4093, 4096, 4999, 5000]
_PRIMES = {2, 3, 5, 7, 13, 31, 127, 257, 509, 1021, 2053, 4093}


@dataclass
class Problem:
    shape: tuple
    dim: int
    reverse: bool
    dtype: torch.dtype
    backend: str
    x_layout: str
    coeffs_kind: str
    initial_kind: str
    perm: tuple
    seed: int


@st.composite
def problems(draw, backends, dtypes, max_len, max_numel):
    rank = draw(st.integers(1, 5))
    dim = draw(st.integers(-rank, rank - 1))
    d = dim % rank
    length = draw(st.one_of(st.sampled_from([n for n in LENGTHS if n <= max_len]), st.integers(0, max_len)))
    empty_batch = draw(st.integers(0, 19)) == 0
    shape = [draw(st.integers(1, 4)) for _ in range(rank)]
    shape[d] = length
    while math.prod(shape) > max_numel:  # shrink the largest batch dim to keep the element count small
        k = max((i for i in range(rank) if i != d), key=lambda i: shape[i])
        shape[k] = max(1, shape[k] // 2)
    if empty_batch and rank > 1:
        shape[(d + 1) % rank] = 0
    dtype = draw(st.sampled_from(dtypes))
    backend = draw(st.sampled_from(backends))
    numel = math.prod(shape)
    if backend == "reference" and (length > 64 or numel > 2048 or dtype in (torch.float16, torch.bfloat16)):
        backend = "native"  # the Python loop: short float32/64 problems only
    api = backend != "triton-op"
    return Problem(tuple(shape), dim, draw(st.booleans()), dtype, backend,
                   draw(st.sampled_from(["contiguous", "transposed", "sliced", "expanded"])),
                   draw(st.sampled_from(["full", "bcast", "expanded", "transposed"] + (["number"] if api else []))),
                   draw(st.sampled_from(["none", "full", "bcast", "expanded"] + (["keepdim", "number"] if api else []))),
                   tuple(draw(st.permutations(range(rank)))), draw(st.integers(0, 2 ** 31 - 1)))


class _Build:
    """Leaves (what gets gradients) and the view functions that turn them into the call's operands."""

    def __init__(self, p: Problem, device):
        self.p, self.device = p, device
        self.gen = torch.Generator().manual_seed(p.seed)
        self.d = p.dim % len(p.shape)
        self.ref_initial = None  # the reference's view of initial, where it differs from the call's

    def _values(self, shape, kind):
        if kind == "c":  # |c| in [0.5, 1], either sign: bounded states over any length
            mag = torch.rand(shape, generator=self.gen, dtype=F64) * 0.5 + 0.5
            sign = torch.randint(0, 2, shape, generator=self.gen, dtype=F64) * 2 - 1
            return mag * sign
        return torch.randn(shape, generator=self.gen, dtype=F64)

    def _number(self):
        return round(float(torch.rand((), generator=self.gen, dtype=F64)) * 0.5 + 0.5, 3)

    def operand(self, shape, kind, layout):
        """(leaf or number, view function); ``shape`` the operand's full shape."""
        shape = list(shape)
        rank = len(shape)
        if layout == "number":
            return self._number(), None
        if layout == "bcast" and rank:
            keep = torch.randint(0, 2, (rank,), generator=self.gen).tolist()
            bshape = [s if k else 1 for s, k in zip(shape, keep)]
            drop = int(torch.randint(0, rank + 1, (), generator=self.gen))
            return self._leaf(bshape[drop:], kind), lambda t: t
        if layout == "expanded" and rank:
            k = int(torch.randint(0, rank, (), generator=self.gen))
            base = list(shape)
            base[k] = 1
            return self._leaf(base, kind), lambda t: t.expand(shape)
        if layout == "transposed" and rank > 1:
            perm = [i for i in self.p.perm if i < rank] if rank != len(self.p.shape) else list(self.p.perm)
            inv = [perm.index(i) for i in range(rank)]
            return self._leaf([shape[i] for i in perm], kind), lambda t: t.permute(inv)
        if layout == "sliced" and rank:
            k = int(torch.randint(0, rank, (), generator=self.gen))
            big = list(shape)
            big[k] *= 2
            return self._leaf(big, kind), lambda t: t.movedim(k, 0)[::2].movedim(0, k)
        return self._leaf(shape, kind), lambda t: t

    def _leaf(self, shape, kind):
        return self._values(shape, kind).to(self.device, self.p.dtype).requires_grad_()

    def build(self):
        p, d = self.p, self.d
        batch = [s for i, s in enumerate(p.shape) if i != d]
        ops = [self.operand(p.shape, "x", p.x_layout), self.operand(p.shape, "c", p.coeffs_kind)]
        if p.initial_kind == "none":
            ops.append((None, None))
        elif p.initial_kind == "keepdim":  # the API squeezes it; the reference gets it squeezed
            leaf = self._leaf([1 if i == d else s for i, s in enumerate(p.shape)], "x")
            ops.append((leaf, lambda t: t))
            self.ref_initial = lambda t: t.squeeze(d)
        else:
            ops.append(self.operand(batch, "x", p.initial_kind))
        return ops


def _call(p: Problem, x, c, h0):
    if p.backend == "triton-op":
        return torch.ops.linrec.scan_triton(x, c, h0, p.dim, p.reverse)
    return torch_linrec.scan(x, c, h0, p.dim, p.reverse, backend=p.backend)


def _tol(p: Problem, reduced: bool = False) -> float:
    """TOL of the dtype; float32 x4 (sums of up to 5000 terms round at ~sqrt(n) ulps). ``reduced``:
    the gradient of a broadcast operand, a sum over up to 5000 elements of terms that may cancel,
    checked relative to the sum of |terms| (the float16/bfloat16 output y the backward reads is
    rounded; on the CPU each term is also rounded before the sum), x4."""
    return TOL[p.dtype] * (4 if p.dtype == torch.float32 else 1) * (4 if reduced else 1)


def check_problem(p: Problem, device="cpu") -> None:
    builder = _Build(p, device)
    ops = builder.build()
    views = [None if leaf is None else (leaf if fn is None else fn(leaf)) for leaf, fn in ops]
    y = _call(p, *views)
    assert y.shape == p.shape and y.dtype == p.dtype
    gy = torch.randn(p.shape, generator=torch.Generator().manual_seed(p.seed + 1), dtype=F64).to(device, p.dtype)
    leaves = [leaf for leaf, fn in ops if isinstance(leaf, torch.Tensor)]
    grads = torch.autograd.grad(y, leaves, gy, allow_unused=True) if y.requires_grad else [None] * len(leaves)

    # float64 reference from the same rounded values
    leaves64 = [None if not isinstance(leaf, torch.Tensor) else leaf.detach().to("cpu", F64).requires_grad_()
                for leaf, fn in ops]
    ref_views = []
    for (leaf, fn), l64 in zip(ops, leaves64):
        if leaf is None:
            ref_views.append(None)
        elif l64 is None:
            ref_views.append(torch.tensor(leaf, dtype=F64))
        else:
            v = fn(l64)
            ref_views.append(builder.ref_initial(v) if builder.ref_initial and len(ref_views) == 2 else v)
    xr, cr, hr = ref_views
    y_ref = torch_linrec.chunked_scan(xr.detach(), cr.detach(), None if hr is None else hr.detach(), p.dim, p.reverse)
    err = scaled_err(y, y_ref)
    assert err <= _tol(p), f"forward: scaled error {err:.3g} ({p})"
    # per-element gradients (coeffs and initial expanded to full shape), reduced per operand below
    batch = [n for i, n in enumerate(p.shape) if i != p.dim % len(p.shape)]
    g_ops = torch_linrec.scan_backward_ref(gy.to("cpu", F64), cr.detach().expand(p.shape), y_ref,
                                           None if hr is None else hr.detach().expand(batch),
                                           p.dim, p.reverse, scan=torch_linrec.chunked_scan)
    got = iter(grads)
    for what, l64, view, g_ref in zip(("x", "coeffs", "initial"), leaves64, ref_views, g_ops):
        if l64 is None:
            continue
        g = next(got)
        ref_leaf = torch.autograd.grad(view, l64, g_ref.sum_to_size(view.shape))[0]
        if g is None:  # the graph did not reach the input (nothing to scan)
            g = torch.zeros_like(l64, dtype=p.dtype)
        assert g.shape == l64.shape and g.dtype == p.dtype, what
        if ref_leaf.numel() and ref_leaf.abs().max() > torch.finfo(p.dtype).max:  # overflows the dtype: inf is right
            assert not torch.isfinite(g).all(), f"grad {what}: finite where the sum overflows ({p})"
            continue
        full = p.shape if what != "initial" else [n for i, n in enumerate(p.shape) if i != p.dim % len(p.shape)]
        reduced = l64.numel() < math.prod(full)
        if reduced:  # a sum of terms that may cancel: errors scale with the sum of |terms|
            terms = torch.autograd.grad(view, l64, g_ref.abs().sum_to_size(view.shape))[0]
            floor = ref_leaf.abs().max().clamp_min(1.0) if ref_leaf.numel() else 1.0
            err = ((g.to("cpu", F64) - ref_leaf).abs() / terms.clamp_min(floor)).max().item() if g.numel() else 0.0
        else:
            err = scaled_err(g, ref_leaf)
        assert err <= _tol(p, reduced), f"grad {what}: scaled error {err:.3g} ({p})"


def _run(test_fn, minimum: int):
    seen = []
    test_fn(seen)
    assert len(seen) >= minimum, f"{len(seen)} examples ran, expected >= {minimum}"


_SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CPU_EXAMPLES, TRITON_CPU_EXAMPLES = 1000, 40
# CUDA: the Triton kernels compile once per new specialization (dtype, flags, divisibility of sizes
# and strides), so their examples cost compile time: 2000 took about 400 s on an H200, the native
# kernels' 2000 under 20 s.
CUDA_EXAMPLES = {"native": 2000, "triton": 500}
CPU_DTYPES = [F64, torch.float32, torch.float16, torch.bfloat16]
GPU_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def test_fuzz_cpu():
    @settings(max_examples=CPU_EXAMPLES, **_SETTINGS)
    @given(problems(["native", "auto", "reference"], CPU_DTYPES, max_len=5000, max_numel=6000))
    def run(seen, p):
        seen.append(p)
        check_problem(p)
    _run(run, CPU_EXAMPLES)


def test_fuzz_lengths_covered():
    """The length strategy reaches 0, 1, primes and powers of two up to 5000 (checked on the strategy)."""
    lengths = set()

    @settings(max_examples=300, **_SETTINGS)
    @given(problems(["native"], [torch.float32], max_len=5000, max_numel=6000))
    def run(p):
        lengths.add(p.shape[p.dim % len(p.shape)])
    run()
    assert {0, 1, 4096} <= lengths and lengths & _PRIMES and max(lengths) > 4000


@pytest.mark.skipif(not triton_runs_on(torch.device("cpu")), reason="needs triton and TRITON_INTERPRET=1")
def test_fuzz_triton_interpreted():
    @settings(max_examples=TRITON_CPU_EXAMPLES, **_SETTINGS)
    @given(problems(["triton", "triton-op"], GPU_DTYPES, max_len=40, max_numel=96))
    def run(seen, p):
        seen.append(p)
        check_problem(p)
    _run(run, TRITON_CPU_EXAMPLES)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and torch_linrec's CUDA kernels")
@pytest.mark.parametrize("backend", ["native", "triton"])
def test_fuzz_cuda(backend):
    @settings(max_examples=CUDA_EXAMPLES[backend], **_SETTINGS)
    @given(problems([backend], GPU_DTYPES, max_len=5000, max_numel=1 << 16))
    def run(seen, p):
        seen.append(p)
        check_problem(p, "cuda")
    _run(run, CUDA_EXAMPLES[backend])
