"""The CPU kernel's paths against float64 references: the walk kernel ((N, L) rows contiguous along
L, 8 or 16 steps per vector, partial vectors at both ends), the rows kernel ((B, L, D) with
contiguous channels, remainder channels), the strided fallback, power-of-two lengths, long
sequences split along L across threads (chained scan), and the pool of the backward's outputs."""
from __future__ import annotations

import threading

import pytest
import torch

import torch_linrec
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
@pytest.mark.parametrize("shape,dim", [((1, LONG), -1), ((3, LONG), -1), ((1, LONG, 3), 1), ((1, 8192, 19), 1),
                                       ((LONG,), 0)],
                         ids=["1xL", "3xL", "BLD", "BLD19", "1d"])
def test_long_sequences_split_across_threads(four_threads, shape, dim, reverse, dtype):
    """Each chunk's summary multiplies its coefficients, uniform in (0.5, 1): over 1600-16000 steps
    their product passes through the subnormal floats, which the summary flushes to zero
    (scan_avx2.h's advance_product; BLD19: 8-channel vectors and a scalar tail)."""
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


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape", [(4000, 33), (1999, 9), (517, 47), (333, 127), (64, 3)],
                         ids=["33", "9", "47", "127", "3"])
def test_segmented_short_rows(threads, shape, reverse, dtype):
    """Short contiguous rows without `initial`: blocks of several rows walked as one sequence, the
    coefficient across each row start zeroed (scan_cpu.cpp's segment_rows; the last block shorter;
    the 4-byte rows of 47 steps and all of 127 (2-byte only) at the rule's edges), grad_initial from
    each row's first step."""
    x, c, gy, _ = _inputs(shape, -1, dtype, with_initial=False, seed=shape[1])
    _check(x, c, gy, None, -1, reverse, dtype)
    y = scan_op(x, c, None, -1, reverse, None, None)
    dh0 = scan_backward_op(gy, c, y, None, -1, reverse, None)[2]
    dh0_ref = scan_backward_ref(gy.double(), c.double(), y.double(), torch.zeros(shape[0], dtype=torch.float64), -1,
                                reverse, scan=chunked_scan)[2]
    assert_close_scaled(dh0, dh0_ref, dtype, "grad_initial")


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("reverse", [False, True])
def test_segmented_rows_keep_nan_inf_in_their_row(threads, reverse, dtype):
    """An inf in one row's x, a NaN and an inf coefficient (the latter at a row's first step, whose
    product with the zero initial state is NaN) and an inf gradient leave every other row finite and
    as without them (the segmented walk would carry 0 x inf into the next rows: its blocks with a
    non-finite state walk again row by row; their other rows may round differently)."""
    rows, length = 4096, 33
    x, c, _, _ = _inputs((rows, length), -1, dtype, with_initial=False)
    last = 0 if reverse else length - 1
    xb, cb = x.clone(), c.clone()
    xb[2, last] = float("inf")
    cb[5, 10] = float("nan")
    cb[7, length - 1 - last] = float("inf")
    outs = []
    for xi, ci in ((x, c), (xb, cb)):
        xi, ci = xi.clone().requires_grad_(), ci.clone().requires_grad_()
        y = torch_linrec.scan(xi, ci, None, -1, reverse, backend="native")
        gy = torch.ones_like(y)
        gy[9, length - 1 - last] = float("inf")
        outs.append((y.detach(), *torch.autograd.grad(y, (xi, ci), gy)))
    poisoned = torch.zeros(rows, dtype=torch.bool)
    poisoned[[2, 5, 7, 9]] = True
    for clean, bad in zip(*outs):
        assert torch.isfinite(bad[~poisoned]).all()
        torch.testing.assert_close(bad[~poisoned], clean[~poisoned])
    assert torch.isnan(outs[1][0][7]).all()  # c h_{-1} = inf x 0 at row 7's first step


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


def _same_bits(a, b):
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    return torch.equal(a.contiguous().view(ints[a.dtype]), b.contiguous().view(ints[b.dtype]))


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shared_coeffs", [False, True])
@pytest.mark.parametrize("length", [1037, 12, 20])
def test_batch_invariant(reverse, shared_coeffs, dtype, length):
    """Each row's forward output and gradients have the same bits alone as in any batch, wherever it
    falls: the walk kernel takes rows two at a time (the pair walk: row j with row j + ceil(n/2)),
    the middle one of an odd number alone, with the same operations in the same order (finite
    values; compared as bit patterns). Short rows: partial vectors only (the backward's rows with no
    steps to pair walk alone)."""
    x, c, gy, h0 = _inputs((7, length), -1, dtype, with_initial=True)
    if shared_coeffs:
        c = c[:1].expand(7, length)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no split along L (a single long row is chained across threads)
    try:
        y = scan_op(x, c, h0, -1, reverse, None, None)
        grads = scan_backward_op(gy, c, y, h0, -1, reverse, None)
        for i in range(7):
            for rows in (slice(i, i + 1), slice(i, i + 2), slice(i, i + 3)):
                args = (c[rows], y[rows], h0[rows], -1, reverse, None)
                assert _same_bits(scan_op(x[rows], c[rows], h0[rows], -1, reverse, None, None)[0], y[i]), (i, rows)
                for part, whole in zip(scan_backward_op(gy[rows], *args), grads):
                    assert _same_bits(part[0], whole[i]), (i, rows)
    finally:
        torch.set_num_threads(threads)
    y_ref = chunked_scan(x.double(), c.double(), h0.double(), dim=-1, reverse=reverse)
    assert_close_scaled(y, y_ref, dtype, "y")


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


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_streamed_outputs(threads):
    """float32 (B, L, D) outputs of 16 MiB or more go out by non-temporal stores where aligned
    (csrc/linrec/cpu/scan_cpu.cpp: kStreamMinBytes): on one thread the forward's first 4095 steps
    have the bits of a 4095-step scan (just under the size: plain stores), and both directions match
    the float64 reference, reversed too, on one and two threads (the chained split)."""
    x, c, gy, h0 = _inputs((1, 4096, 1024), 1, torch.float32, with_initial=True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if threads == 1:
            y = scan_op(x, c, h0, 1, False, None, None)
            assert _same_bits(y[:, :4095], scan_op(x[:, :4095], c[:, :4095], h0, 1, False, None, None))
        for reverse in (False, True):
            _check(x, c, gy, h0, 1, reverse, torch.float32)
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------------ output pool
# The CPU forward's y and the backward's grad_x and grad_coeffs take their storage from a pool of
# blocks freed by earlier outputs (csrc/common/host_pool.cpp). 512 x 512 float32: 1 MiB blocks,
# which it keeps.
POOL_SHAPE = (512, 512)


@pytest.fixture
def pool():
    """The pool at its default limit with zeroed counts; the default limit again afterwards."""
    default = torch_linrec.cpu_pool_stats()["limit_bytes"]
    torch_linrec.set_cpu_pool_limit(default)
    yield default
    torch_linrec.set_cpu_pool_limit(default)


def _backward(seed=0):
    x, c, gy, _ = _inputs(POOL_SHAPE, -1, torch.float32, False, seed)
    y = scan_op(x, c, None, -1, False, None, None)
    return gy, c, y, scan_backward_op(gy, c, y, None, -1, False, None)


def _expected(gy, c, y):
    f64 = (lambda t: t.to(torch.float64))
    return scan_backward_ref(f64(gy), f64(c), f64(y), None, -1, False, scan=chunked_scan)


def test_pool_recycles_freed_outputs(pool):
    _, _, y, (dx, dc, _) = _backward()
    first = {y.data_ptr(), dx.data_ptr(), dc.data_ptr()}
    del y, dx, dc
    assert torch_linrec.cpu_pool_stats()["idle_bytes"] >= 3 * 2**20
    gy, c, y, (dx, dc, _) = _backward(seed=1)
    assert {y.data_ptr(), dx.data_ptr(), dc.data_ptr()} == first  # the forward's y too
    stats = torch_linrec.cpu_pool_stats()
    assert stats["hits"] >= 3 and stats["misses"] >= 3, stats
    dx_ref, dc_ref, _ = _expected(gy, c, y)
    assert_close_scaled(dx, dx_ref, torch.float32, "grad_x")
    assert_close_scaled(dc, dc_ref, torch.float32, "grad_coeffs")


def test_pool_never_hands_out_live_outputs(pool):
    _, _, _, (dx, dc, _) = _backward()
    kept = (dx.clone(), dc.clone())
    for seed in (1, 2):
        _, _, _, (dx2, dc2, _) = _backward(seed)
        assert not {dx2.data_ptr(), dc2.data_ptr()} & {dx.data_ptr(), dc.data_ptr()}
        del dx2, dc2
    torch.testing.assert_close(dx, kept[0], rtol=0, atol=0)
    torch.testing.assert_close(dc, kept[1], rtol=0, atol=0)


def test_pooled_grads_accumulate_and_take_inplace_ops(pool):
    x, c, gy, _ = _inputs(POOL_SHAPE, -1, torch.float32, False)
    xg, cg = x.requires_grad_(), c.requires_grad_()
    y = torch_linrec.scan(xg, cg)
    dx_ref, dc_ref, _ = _expected(gy, cg.detach(), y.detach())
    y.backward(gy)
    stats = torch_linrec.cpu_pool_stats()
    assert stats["hits"] + stats["misses"] >= 2, stats  # .grad holds the pool's blocks
    torch_linrec.scan(xg, cg).backward(gy)  # accumulated into them
    assert_close_scaled(xg.grad, 2 * dx_ref, torch.float32, "grad_x accumulated")
    assert_close_scaled(cg.grad, 2 * dc_ref, torch.float32, "grad_coeffs accumulated")
    xg.grad.mul_(0.5).add_(1.0)
    assert_close_scaled(xg.grad, dx_ref + 1.0, torch.float32, "grad_x after in-place ops")
    cg.grad.resize_(2 * cg.numel())  # a pooled storage resizes like any CPU storage
    cg.grad[cg.numel():] = 3.0
    assert_close_scaled(cg.grad[:cg.numel()].view(POOL_SHAPE), 2 * dc_ref, torch.float32, "grad_coeffs resized")
    idle = torch_linrec.cpu_pool_stats()["idle_bytes"]
    xg.grad = cg.grad = None  # optimizer.zero_grad(set_to_none=True): the blocks return to the pool
    assert torch_linrec.cpu_pool_stats()["idle_bytes"] > idle


def test_pool_takes_blocks_freed_on_other_threads(pool):
    outs = [_backward(seed)[3] for seed in range(2)]
    idle = torch_linrec.cpu_pool_stats()["idle_bytes"]
    worker = threading.Thread(target=outs.clear)
    worker.start()
    worker.join()
    assert torch_linrec.cpu_pool_stats()["idle_bytes"] >= idle + 4 * 2**20


def test_pool_keeps_a_forward_backward_of_large_tensors(pool):
    """The default limit keeps the three 32 MiB outputs of an eager forward+backward idle together,
    so a second step takes all three from the pool (at 64 MiB, the former default, some missed it and
    page-faulted fresh memory in: 2.5-5x slower steps on the 2-core CPU machine)."""
    assert pool == 256 * 2**20
    n = 8 * 2**20  # float32: 32 MiB per tensor
    x = torch.rand(1, n).requires_grad_()
    c = torch.rand(1, n).requires_grad_()
    gy = torch.ones(1, n)
    for step in range(2):
        if step == 1:
            torch_linrec.set_cpu_pool_limit(pool)  # zero the counts
        y = torch_linrec.scan(x, c)
        grads = torch.autograd.grad(y, (x, c), gy)
        del y, grads
    stats = torch_linrec.cpu_pool_stats()
    assert stats["hits"] == 3 and stats["misses"] == 0, stats


def test_pool_limit(pool):
    assert pool == 256 * 2**20
    _backward()
    torch_linrec.set_cpu_pool_limit(0)  # off: idle blocks released, freed outputs not kept
    assert torch_linrec.cpu_pool_stats() == {"hits": 0, "misses": 0, "idle_bytes": 0, "limit_bytes": 0}
    gy, c, y, (dx, dc, _) = _backward()
    del dx, dc
    assert torch_linrec.cpu_pool_stats()["idle_bytes"] == 0
    torch_linrec.set_cpu_pool_limit(3 * 2**20)  # keeps blocks up to 1.5 MiB, 3 MiB of them
    outs = [_backward(seed)[3] for seed in range(3)]
    del outs
    assert 2 * 2**20 <= torch_linrec.cpu_pool_stats()["idle_bytes"] <= 3 * 2**20
    torch_linrec.set_cpu_pool_limit(2 * 2**20 - 1)  # 1 MiB blocks are now more than half of it
    assert torch_linrec.cpu_pool_stats()["idle_bytes"] == 0
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="nbytes"):
            torch_linrec.set_cpu_pool_limit(bad)
