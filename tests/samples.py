"""Sample inputs and float64 references for the tests of ``torch.ops.linrec.scan``.

``sample_inputs(device, dtype, requires_grad)`` yields ``(args, kwargs)`` pairs for the op covering
layouts (contiguous, transposed, sliced, permuted, expanded), odd and empty lengths, broadcast
``coeffs`` / ``initial``, negative ``dim``, both scan directions and ranks 1 to 7. Each yielded pair
also carries a ``.name``; :data:`SAMPLE_NAMES` lists them so tests can be parametrized per sample.

Values: ``x`` and ``initial`` ~ randn, ``coeffs`` ~ uniform(0.5, 1), drawn on the CPU from a
generator seeded by the sample's name (so the CPU and CUDA runs see the same numbers).

References are the library's (:mod:`torch_linrec.linrec.reference`): :func:`ref_scan` runs
``scan_ref`` (or ``chunked_scan`` for long sequences) on float64 CPU copies; for the backward, tests
call ``scan_backward_ref(..., scan=chunked_scan)``, which reads inputs of any dtype and device as
float64 on the CPU.
"""
from __future__ import annotations

import zlib
from typing import Callable, NamedTuple

import torch

from torch_linrec import chunked_scan, scan_ref

__all__ = ["Sample", "SAMPLE_NAMES", "SMALL_SAMPLE_NAMES", "make_sample", "sample_inputs", "unpack",
           "ref_scan", "scaled_err", "assert_close_scaled", "TOL", "batch_shape", "poison_allocator",
           "check_against_cpu_kernel"]

# Max allowed  max|out - ref| / max(max|ref|, 1)  per dtype.
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


class Sample(tuple):
    """``(args, kwargs)`` for ``torch.ops.linrec.scan``, with a ``.name``."""

    def __new__(cls, name: str, args: tuple, kwargs: dict):
        s = super().__new__(cls, (args, kwargs))
        s.name = name
        return s


class _Maker:
    """Draws the tensors of one sample: on the CPU from a seeded generator, then moved to ``device``."""

    def __init__(self, name: str, device, dtype, requires_grad: bool):
        self.gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        self.device, self.dtype, self.rg = torch.device(device), dtype, requires_grad

    def _fin(self, t: torch.Tensor) -> torch.Tensor:
        # Keeps the strides of views (transposed, sliced, expanded) and makes a leaf.
        return t.detach().requires_grad_(self.rg)

    def _new(self, shape, kind):
        if kind == "c":
            t = torch.rand(shape, generator=self.gen, dtype=torch.float64) * 0.5 + 0.5
        else:
            t = torch.randn(shape, generator=self.gen, dtype=torch.float64)
        return t.to(self.device, self.dtype)

    def x(self, shape, view: Callable | None = None):
        t = self._new(shape, "x")
        return self._fin(view(t) if view else t)

    def c(self, shape, view: Callable | None = None):
        t = self._new(shape, "c")
        return self._fin(view(t) if view else t)

    def h(self, shape, view: Callable | None = None):
        t = self._new(shape, "x")
        return self._fin(view(t) if view else t)


# name -> (builder(maker) -> (x, coeffs, initial, dim), big). Every spec runs with reverse False and True.
_SPECS: dict[str, tuple[Callable, bool]] = {}


def _spec(name: str, big: bool = False):
    def deco(fn):
        _SPECS[name] = (fn, big)
        return fn
    return deco


# --- contiguous, odd lengths
_spec("NL")(lambda m: (m.x((4, 64)), m.c((4, 64)), None, -1))
_spec("NL_init")(lambda m: (m.x((4, 64)), m.c((4, 64)), m.h((4,)), -1))
_spec("BLD_dim1")(lambda m: (m.x((2, 33, 8)), m.c((2, 33, 8)), m.h((2, 8)), 1))
_spec("BLD_odd_tail")(lambda m: (m.x((3, 37, 19)), m.c((3, 37, 19)), m.h((3, 19)), 1))
_spec("BLD_D1")(lambda m: (m.x((2, 33, 1)), m.c((2, 33, 1)), None, 1))
_spec("dim0_contig")(lambda m: (m.x((19, 6)), m.c((19, 6)), m.h((6,)), 0))
_spec("1d")(lambda m: (m.x((50,)), m.c((50,)), m.h(()), 0))
_spec("len1")(lambda m: (m.x((3, 1)), m.c((3, 1)), m.h((3,)), -1))
_spec("len7")(lambda m: (m.x((3, 7)), m.c((3, 7)), None, -1))
_spec("len33")(lambda m: (m.x((5, 33)), m.c((5, 33)), m.h((5,)), -1))
_spec("len1000", big=True)(lambda m: (m.x((3, 1000)), m.c((3, 1000)), None, -1))
_spec("len4097", big=True)(lambda m: (m.x((2, 4097)), m.c((2, 4097)), m.h((2,)), -1))
_spec("many_seq")(lambda m: (m.x((37, 70)), m.c((37, 70)), m.h((37,)), -1))
# --- empty
_spec("L0")(lambda m: (m.x((3, 0)), m.c((3, 0)), m.h((3,)), -1))
_spec("L0_BLD_bcast")(lambda m: (m.x((2, 0, 4)), m.c((4,)), m.h((2, 4)), 1))
_spec("batch0")(lambda m: (m.x((0, 5)), m.c((0, 5)), m.h((0,)), -1))
_spec("batch0_BLD_bcast")(lambda m: (m.x((2, 5, 0)), m.c((1, 5, 0)), None, 1))
# --- non-contiguous layouts
_spec("transposed")(lambda m: (m.x((17, 5), lambda t: t.t()), m.c((17, 5), lambda t: t.t()), m.h((5,)), -1))
_spec("transposed_dim0")(lambda m: (m.x((5, 17), lambda t: t.t()), m.c((5, 17), lambda t: t.t()), None, 0))
_spec("transposed_mixed")(lambda m: (m.x((17, 5), lambda t: t.t()), m.c((5, 17)), m.h((5,)), -1))
_spec("sliced")(lambda m: (m.x((4, 40), lambda t: t[:, ::2]), m.c((4, 40), lambda t: t[:, ::2]),
                           m.h((8,), lambda t: t[::2]), -1))
_spec("sliced_offset")(lambda m: (m.x((6, 30), lambda t: t[::2, 1:]), m.c((3, 29)), None, -1))
_spec("sliced_BLD")(lambda m: (m.x((2, 66, 9), lambda t: t[:, ::2, 1:]), m.c((2, 33, 8)), m.h((2, 8)), 1))
_spec("permuted")(lambda m: (m.x((8, 3, 19), lambda t: t.permute(1, 2, 0)),
                             m.c((19, 3, 8), lambda t: t.permute(1, 0, 2)), m.h((3, 8)), 1))
_spec("permuted_4d")(lambda m: (m.x((5, 4, 3, 2), lambda t: t.permute(3, 1, 0, 2)), m.c((2, 4, 5, 3)),
                                m.h((2, 4, 3)), 2))
_spec("x_expand_batch")(lambda m: (m.x((1, 33, 8), lambda t: t.expand(3, 33, 8)), m.c((3, 33, 8)), None, 1))
_spec("x_expand_L")(lambda m: (m.x((4, 1), lambda t: t.expand(4, 20)), m.c((4, 20)), m.h((4,)), -1))
# --- broadcast coeffs
_spec("c_D")(lambda m: (m.x((2, 33, 8)), m.c((8,)), None, 1))
_spec("c_B1D")(lambda m: (m.x((2, 33, 8)), m.c((2, 1, 8)), m.h((2, 8)), 1))
_spec("c_BL1")(lambda m: (m.x((2, 33, 8)), m.c((2, 33, 1)), m.h((2, 8)), 1))
_spec("c_1")(lambda m: (m.x((4, 33)), m.c((1,)), m.h((4,)), -1))
_spec("c_0d")(lambda m: (m.x((4, 33)), m.c(()), None, -1))
_spec("c_L")(lambda m: (m.x((4, 33)), m.c((33,)), None, -1))
_spec("c_expand")(lambda m: (m.x((2, 33, 8)), m.c((2, 1, 8), lambda t: t.expand(2, 33, 8)), None, 1))
# --- broadcast initial
_spec("init_bcast_D")(lambda m: (m.x((2, 33, 8)), m.c((2, 33, 8)), m.h((8,)), 1))
_spec("init_bcast_1")(lambda m: (m.x((4, 33)), m.c((4, 33)), m.h((1,)), -1))
_spec("init_0d")(lambda m: (m.x((4, 33)), m.c((4, 33)), m.h(()), -1))
_spec("init_expand")(lambda m: (m.x((2, 33, 8)), m.c((8,)), m.h((1, 8), lambda t: t.expand(2, 8)), 1))
# --- dims
_spec("dim_neg2")(lambda m: (m.x((2, 9, 5)), m.c((9, 1)), m.h((2, 5)), -2))
_spec("4d_dim2")(lambda m: (m.x((2, 3, 17, 4)), m.c((3, 1, 4)), m.h((2, 3, 4)), 2))
_spec("4d_dim_neg4")(lambda m: (m.x((13, 2, 3, 2)), m.c((13, 2, 3, 2)), m.h((2, 1, 2)), -4))
_spec("high_rank")(lambda m: (m.x((2, 1, 2, 3, 1, 2, 9)), m.c((2, 1, 2, 3, 1, 2, 9)), m.h((2, 3, 1, 2)), -1))

SAMPLE_NAMES: list[str] = [f"{n}-{d}" for n in _SPECS for d in ("fwd", "rev")]
SMALL_SAMPLE_NAMES: list[str] = [n for n in SAMPLE_NAMES if not _SPECS[n.rsplit("-", 1)[0]][1]]


def make_sample(name: str, device="cpu", dtype=torch.float32, requires_grad: bool = False) -> Sample:
    """The sample ``name`` (one of :data:`SAMPLE_NAMES`) as ``(args, kwargs)`` for ``torch.ops.linrec.scan``."""
    base, direction = name.rsplit("-", 1)
    builder, _ = _SPECS[base]
    x, c, h0, dim = builder(_Maker(name, device, dtype, requires_grad))
    reverse = direction == "rev"
    # Vary how arguments are passed: positional or keyword, defaults left out where they apply.
    if h0 is None and not reverse and dim == -1:
        return Sample(name, (x, c), {})
    if zlib.crc32(name.encode()) % 2:
        return Sample(name, (x, c, h0, dim, reverse), {})
    kwargs = {"dim": dim, "reverse": reverse}
    if h0 is not None:
        kwargs["initial"] = h0
    return Sample(name, (x, c), kwargs)


def sample_inputs(device="cpu", dtype=torch.float32, requires_grad: bool = False, small: bool = False):
    """Yields every sample as ``(args, kwargs)`` (with ``.name``); ``small`` leaves out the long ones."""
    for name in (SMALL_SAMPLE_NAMES if small else SAMPLE_NAMES):
        yield make_sample(name, device, dtype, requires_grad)


def unpack(sample) -> tuple:
    """``(x, coeffs, initial, dim, reverse)`` of a sample, defaults filled in."""
    args, kwargs = sample
    names = ("x", "coeffs", "initial", "dim", "reverse")
    vals = dict(zip(names, args))
    vals.update(kwargs)
    defaults = {"initial": None, "dim": -1, "reverse": False}
    return tuple(vals.get(n, defaults.get(n)) for n in names)


def batch_shape(x: torch.Tensor, dim: int) -> tuple:
    dim = dim % x.dim()
    return tuple(s for i, s in enumerate(x.shape) if i != dim)


def _f64(t):
    return None if t is None else t.detach().to("cpu", torch.float64)


# Above this length the forward reference is chunked_scan (O(sqrt L) Python steps), below it the
# step-by-step scan_ref.
LONG = 2048


def ref_scan(x, coeffs, initial=None, dim=-1, reverse=False) -> torch.Tensor:
    """Float64 CPU reference of the forward from the (possibly low-precision, CUDA) inputs:
    :func:`torch_linrec.scan_ref` on float64 copies, :func:`torch_linrec.chunked_scan` for long sequences."""
    if x.shape[dim % x.dim()] > LONG:
        return chunked_scan(x, coeffs, initial, dim, reverse)
    return scan_ref(_f64(x), _f64(coeffs), _f64(initial), dim, reverse)


def scaled_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max|out - ref| / max(max|ref|, 1)`` (0 for empty tensors)."""
    if ref.numel() == 0:
        return 0.0
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1.0)).item()


def assert_close_scaled(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "output",
                        tol: float | None = None) -> None:
    assert tuple(out.shape) == tuple(ref.shape), f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    tol = TOL[dtype] if tol is None else tol
    err = scaled_err(out, ref)
    assert err <= tol, f"{what}: scaled error {err:.3g} > {tol:g}"


def poison_allocator(t_like: torch.Tensor, copies: int = 4) -> None:
    """Fills freed memory with NaN so that an output the kernel leaves unwritten likely shows NaN.

    Allocates and frees NaN-filled blocks of the byte size of ``t_like``; the CUDA caching allocator
    (and often the CPU one) hands the same blocks to the next allocations of that size. On the CPU
    the ops' outputs come from the pool of :func:`torch_linrec.cpu_pool_stats`: NaN-filled blocks
    are left there too, as outputs of the CPU backward of a NaN gradient.
    """
    n = max(1, t_like.numel())
    bufs = [torch.full((n,), float("nan"), dtype=t_like.dtype, device=t_like.device) for _ in range(copies)]
    if t_like.device.type == "cpu" and t_like.is_floating_point():
        one = torch.ones(n, dtype=t_like.dtype)
        bufs += [torch.ops.linrec.scan_backward(bufs[0], one, one, None, 0, False, None) for _ in range(copies // 2)]
    del bufs


def check_against_cpu_kernel(x, c, h0, dim, reverse, dtype, config=None, backward_config=None) -> None:
    """Runs the native op and its backward on ``x``'s device (freed memory poisoned with NaN first,
    so unwritten outputs show) and compares every output with the CPU kernel's.

    ``config`` / ``backward_config`` name the kernel configs of the forward / backward op on ``x``'s
    device (None: its default); the CPU kernel always runs with its default.
    """
    scan, scan_backward = torch.ops.linrec.scan, torch.ops.linrec.scan_backward
    h0_cpu = None if h0 is None else h0.cpu()
    poison_allocator(x, copies=6)
    y = scan(x, c, h0, dim, reverse, config)
    assert bool(torch.isfinite(y).all()), "forward left elements unwritten (NaN) or overflowed"
    gy = torch.randn_like(y)
    poison_allocator(x, copies=6)
    grads = scan_backward(gy, c, y, h0, dim, reverse, backward_config)
    for what, g in zip(("grad_x", "grad_coeffs", "grad_initial"), grads):
        assert bool(torch.isfinite(g).all()), f"{what} left elements unwritten (NaN)"
    assert_close_scaled(y, scan(x.cpu(), c.cpu(), h0_cpu, dim, reverse), dtype, "forward vs CPU kernel")
    grads_cpu = scan_backward(gy.cpu(), c.cpu(), y.cpu(), h0_cpu, dim, reverse)
    for what, g, gc in zip(("grad_x", "grad_coeffs", "grad_initial"), grads, grads_cpu):
        assert_close_scaled(g, gc, dtype, f"{what} vs CPU kernel")
