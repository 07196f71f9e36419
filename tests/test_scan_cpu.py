"""The CPU kernel's paths against float64 references: the walk kernel ((N, L) rows contiguous along
L, 8 or 16 steps per vector, partial vectors at both ends), the rows kernel ((B, L, D) with
contiguous channels, remainder channels), the strided fallback, power-of-two lengths, and long
sequences split along L across threads (chained scan)."""
from __future__ import annotations

import pytest
import torch

from samples import TOL, assert_close_scaled, poison_allocator
from torch_linrec import chunked_scan, scan_backward_ref

scan_op = torch.ops.linrec.scan
scan_backward_op = torch.ops.linrec.scan_backward

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# The split along L needs chunks of at least 16384 elements (csrc/linrec/cpu/scan_cpu.cpp: kMinChunk).
LONG = 4 * 16384 + 37


@pytest.fixture
def four_threads():
    """Four intra-op threads, so a few long sequences are split into several chunks on any machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


def _inputs(shape, dim, dtype, with_initial, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    c = torch.empty(shape, dtype=torch.float64).uniform_(0.5, 1.0, generator=g)
    gy = torch.randn(shape, generator=g, dtype=torch.float64)
    bshape = tuple(s for i, s in enumerate(shape) if i != dim % len(shape))
    h0 = torch.randn(bshape, generator=g, dtype=torch.float64) if with_initial else None
    cast = (lambda t: None if t is None else t.to(dtype))
    return cast(x), cast(c), cast(gy), cast(h0)


def _check(x, c, gy, h0, dim, reverse, dtype):
    poison_allocator(x)
    y = scan_op(x, c, h0, dim, reverse, None, None)
    f64 = (lambda t: None if t is None else t.to(torch.float64))
    y_ref = chunked_scan(x, c, h0, dim, reverse)
    assert_close_scaled(y, y_ref, dtype, "y")
    poison_allocator(x)
    dx, dc, dh0 = scan_backward_op(gy, c, y, h0, dim, reverse, None)
    dx_ref, dc_ref, dh0_ref = scan_backward_ref(f64(gy), f64(c), f64(y), f64(h0), dim, reverse, scan=chunked_scan)
    assert_close_scaled(dx, dx_ref, dtype, "grad_x")
    assert_close_scaled(dc, dc_ref, dtype, "grad_coeffs")
    if h0 is not None:
        assert_close_scaled(dh0, dh0_ref, dtype, "grad_initial")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape,dim", [((1, LONG), -1), ((3, LONG), -1), ((1, LONG, 3), 1), ((LONG,), 0)],
                         ids=["1xL", "3xL", "BLD", "1d"])
def test_long_sequences_split_across_threads(four_threads, shape, dim, reverse, dtype):
    x, c, gy, h0 = _inputs(shape, dim, dtype, with_initial=True)
    _check(x, c, gy, h0, dim, reverse, dtype)


def test_long_split_without_initial(four_threads):
    x, c, gy, _ = _inputs((2, LONG), -1, torch.float32, with_initial=False)
    _check(x, c, gy, None, -1, False, torch.float32)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape,dim", [((37, 2048), -1), ((16, 1024), -1), ((2, 512, 64), 1), ((2, 257, 130), 1),
                                       ((5, 129), -1), ((3, 1), -1)],
                         ids=["pow2-NL", "pow2-NL-16", "pow2-BLD", "odd-BLD", "odd-NL", "L1"])
def test_layouts(shape, dim, reverse, dtype):
    x, c, gy, h0 = _inputs(shape, dim, dtype, with_initial=True)
    _check(x, c, gy, h0, dim, reverse, dtype)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [2, 7, 8, 9, 15, 16, 17, 24, 31, 33, 47])
def test_walk_vector_boundaries(length, reverse, dtype):
    """Lengths around the walk kernel's 8- and 16-step vectors: body, partial first and last vectors."""
    x, c, gy, h0 = _inputs((3, length), -1, dtype, with_initial=True, seed=length)
    _check(x, c, gy, h0, -1, reverse, dtype)


@pytest.mark.parametrize("reverse", [False, True])
def test_broadcast_coeffs(reverse):
    """Coeffs broadcast along L (the strided path) and along the batch of a (B, L, D) input (rows)."""
    x, c, gy, h0 = _inputs((4, 300), -1, torch.float32, with_initial=True)
    _check(x, c[:, :1].expand(4, 300), gy, h0, -1, reverse, torch.float32)
    x, c, gy, h0 = _inputs((3, 70, 20), 1, torch.float32, with_initial=True)
    _check(x, c[:1].expand(3, 70, 20), gy, h0, 1, reverse, torch.float32)


@pytest.mark.parametrize("reverse", [False, True])
def test_transposed_rows(reverse):
    """(N, L) scanned along L with the sequences contiguous (steps N apart): the rows kernel."""
    x, c, gy, h0 = _inputs((300, 21), 0, torch.float32, with_initial=True)
    _check(x.t(), c.t(), gy.t(), h0, -1, reverse, torch.float32)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_layouts_agree_to_the_bit(dtype):
    """A broadcast grad_y (the strided path) and the same values materialised (the rows kernel, or the
    walk kernel, which reads a constant input in place) give the same bits."""
    for shape, dim in (((2, 300, 29), 1), ((3, 300), -1)):
        _, c, _, h0 = _inputs(shape, dim, dtype, with_initial=True)
        y = scan_op(torch.randn(shape).to(dtype), c, h0, dim, False, None, None)
        gy = torch.ones((1,) * len(shape), dtype=dtype).expand(shape)
        expanded = scan_backward_op(gy, c, y, h0, dim, False, None)
        materialised = scan_backward_op(gy.contiguous(), c, y, h0, dim, False, None)
        for a, b in zip(expanded, materialised):
            assert torch.equal(a, b)
