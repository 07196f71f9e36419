"""CUDA-only checks of the native op: > 2^31 elements, every output written on odd shapes,
large grids, streams, and peak memory of forward + backward. Skipped without a GPU and the CUDA kernels."""
from __future__ import annotations

import zlib

import pytest
import torch

import torch_linrec
from conftest import HAS_CUDA
from samples import assert_close_scaled, batch_shape, check_against_cpu_kernel, ref_scan
from torch_linrec import chunked_scan, scan_backward_ref

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and torch_linrec's CUDA kernels")]

scan_op = torch.ops.linrec.scan
scan_backward_op = torch.ops.linrec.scan_backward


def _inputs(shape, dim, dtype, coeffs_shape=None, initial=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    c = torch.empty(coeffs_shape or shape, device="cuda", dtype=torch.float32).uniform_(0.5, 1.0, generator=g).to(dtype)
    h0 = torch.randn(batch_shape(x, dim), generator=g, device="cuda", dtype=torch.float32).to(dtype) if initial else None
    return x, c, h0


# ----------------------------------------------------------------------------------------------- > 2^31 elements


@pytest.mark.slow
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_more_than_2_31_elements_rows(reverse):
    """bf16 x of shape (2^21 + 1, 1024), dim=-1: 2^31 + 1024 elements; the rows around the 2^31 element
    offset and at both ends against the reference, forward and backward."""
    R, L = 2 ** 21 + 1, 1024
    x = torch.empty(R, L, device="cuda", dtype=torch.bfloat16).normal_()
    c = torch.empty(R, L, device="cuda", dtype=torch.bfloat16).uniform_(0.5, 1.0)
    h0 = torch.randn(R, device="cuda", dtype=torch.bfloat16)
    assert x.numel() > 2 ** 31
    y = scan_op(x, c, h0, -1, reverse)
    rows = torch.tensor([0, 1, 2 ** 20, 2 ** 21 - 2, 2 ** 21 - 1, 2 ** 21], device="cuda")
    ref = ref_scan(x[rows], c[rows], h0[rows], -1, reverse)
    assert_close_scaled(y[rows], ref, torch.bfloat16, "forward rows")
    assert bool(torch.isfinite(y[-3:]).all())
    del ref
    grad_y = torch.empty_like(y).normal_()
    gx, gc, gh = scan_backward_op(grad_y, c, y, h0, -1, reverse)
    rx, rc, rh = scan_backward_ref(grad_y[rows], c[rows], y[rows], h0[rows], -1, reverse, scan=chunked_scan)
    assert_close_scaled(gx[rows], rx, torch.bfloat16, "grad_x rows")
    assert_close_scaled(gc[rows], rc, torch.bfloat16, "grad_coeffs rows")
    assert_close_scaled(gh[rows], rh, torch.bfloat16, "grad_initial rows")


@pytest.mark.slow
def test_more_than_2_31_elements_long_strided_dim():
    """Same tensor scanned along dim=0: sequences of 2^21 + 1 steps with stride 1024, so element offsets
    pass 2^31 inside every sequence; a few columns against the chunked float64 reference."""
    R, D = 2 ** 21 + 1, 1024
    x = torch.empty(R, D, device="cuda", dtype=torch.bfloat16).normal_()
    c = torch.empty(D, device="cuda", dtype=torch.bfloat16).uniform_(0.9, 1.0)  # broadcast along the scan
    y = scan_op(x, c, None, 0, False)
    cols = torch.tensor([0, 1, 511, D - 1], device="cuda")
    ref = chunked_scan(x[:, cols], c[cols], None, 0, False)
    assert_close_scaled(y[:, cols], ref, torch.bfloat16, "columns")


# ----------------------------------------------------------------------------------------------- every element written

_ODD = [
    ((3, 1), -1), ((5, 7), -1), ((7, 33), -1), ((3, 1025), -1), ((2, 4097, 3), 1), ((3, 65537), -1),
    ((33, 17, 19), 1), ((1, 2 ** 16 + 1), -1), ((129, 3), 0), ((5, 3, 7, 11), 2), ((2, 257, 65), 1),
    ((2 ** 17 + 3, 7), -1), ((3, 7, 2 ** 17 + 3), 1), ((70001, 2), 0),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("case", _ODD, ids=lambda c: f"{c[0]}-dim{c[1]}")
def test_every_element_written_and_matches_cpu(case, reverse, dtype):
    """Outputs are finite on shapes with odd tails and large grids (memory poisoned with NaN before the
    calls) and equal the CPU kernel's up to rounding."""
    shape, dim = case
    seed = zlib.crc32(repr(case).encode())
    x, c, h0 = _inputs(shape, dim, dtype, seed=seed)
    check_against_cpu_kernel(x, c, h0, dim, reverse, dtype)


@pytest.mark.parametrize("coeffs_shape", [None, (64,), (4, 1, 64), (4, 3000, 1)], ids=["full", "D", "B1D", "BL1"])
def test_broadcast_coeffs_multi_chunk(coeffs_shape):
    x, c, h0 = _inputs((4, 3000, 64), 1, torch.float32, coeffs_shape=coeffs_shape, seed=3)
    for reverse in (False, True):
        y = scan_op(x, c, h0, 1, reverse)
        assert_close_scaled(y, chunked_scan(x, c, h0, 1, reverse), torch.float32)


# ----------------------------------------------------------------------------------------------- streams, devices


def test_runs_on_current_stream():
    """The kernels must run on the current stream: their inputs are written on a side stream after
    the GPU was kept busy there, so a launch on another stream would read them too early."""
    c = torch.rand(8, 20000, device="cuda") * 0.5 + 0.5
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)
        x = torch.empty(8, 20000, device="cuda").normal_()
        y = scan_op(x, c, None, -1, False)
        torch.cuda._sleep(100_000_000)
        gy = torch.empty_like(y).normal_()
        gx, gc, gh = scan_backward_op(gy, c, y, None, -1, False)
    s.synchronize()
    assert_close_scaled(y, chunked_scan(x, c, None, -1, False), torch.float32, "forward on a side stream")
    rx, rc, rh = scan_backward_ref(gy, c, y, None, -1, False, scan=chunked_scan)
    for what, got, want in (("grad_x", gx, rx), ("grad_coeffs", gc, rc), ("grad_initial", gh, rh)):
        assert_close_scaled(got, want, torch.float32, f"{what} on a side stream")


def test_lookback_workspace_reuse():
    """Look-back launches of one stream share a kept workspace, each taking the half its predecessor
    left zero and zeroing the other (launch.h): a run of launches of different sizes, layouts and
    directions, some on a side stream in between, each matches the reference. A half left dirty
    (stale status entries of a larger earlier launch, a used ticket counter) would give wrong states
    or chunks out of range. The (40, 1000001) backward's workspace (625 KB) outgrows the first halves
    (512 KiB), so the buffer grows between launches; the (8, 4096, 512) channel scan's (2 MiB + 16
    bytes) is too large to keep and takes a fresh one between the others."""
    cases = [((2, 1 << 17), -1, False), ((3, 40000), -1, True), ((1, 3000, 64), 1, False), ((40, 1000001), -1, False),
             ((8, 4096, 512), 1, True), ((5, 1 << 15), -1, False), ((1, 3000, 64), 1, True), ((2, 1 << 17), -1, False)]
    side = torch.cuda.Stream()
    for i, (shape, dim, reverse) in enumerate(cases * 2):
        x, c, h0 = _inputs(shape, dim, torch.float32, seed=i)
        stream = side if i % 3 == 2 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            y = scan_op(x, c, h0, dim, reverse)
            gy = torch.randn_like(y)
            grads = scan_backward_op(gy, c, y, h0, dim, reverse)
        torch.cuda.current_stream().wait_stream(stream)
        assert_close_scaled(y, chunked_scan(x, c, h0, dim, reverse), torch.float32, f"forward {i} {shape}")
        refs = scan_backward_ref(gy, c, y, h0, dim, reverse, scan=chunked_scan)
        for what, got, want in zip(("grad_x", "grad_coeffs", "grad_initial"), grads, refs):
            assert_close_scaled(got, want, torch.float32, f"{what} {i} {shape}")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_second_device():
    x, c, h0 = (t.to("cuda:1") for t in _inputs((3, 5000), -1, torch.float32))
    with torch.cuda.device(0):
        y = scan_op(x, c, h0, -1, False)
    assert y.device == x.device
    assert_close_scaled(y, chunked_scan(x, c, h0, -1, False), torch.float32)


# ----------------------------------------------------------------------------------------------- peak memory


@pytest.mark.parametrize("coeffs_shape", [None, (512,)], ids=["full", "D"])
def test_peak_memory_forward_backward(coeffs_shape):
    """(8, 4096, 512) fp32, dim=1: forward allocates y only; forward + backward at most y, grad_x and
    grad_coeffs (full size, or for broadcast coeffs a float32 buffer of their shape that the kernel
    adds into: no full-size temporary), plus the look-back status (16 bytes per channel and span of
    32 steps, the float32 backward's 4-channel groups: 12.5% of a float32 tensor; plan.h's
    channel_wide) and < 1% slack."""
    x, c, _ = _inputs((8, 4096, 512), 1, torch.float32, coeffs_shape=coeffs_shape, initial=False, seed=5)
    x.requires_grad_()
    c.requires_grad_()
    grad_y = torch.randn_like(x)
    T = x.numel() * x.element_size()
    slack = (16 / (32 * 4) + 0.01) * T
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    # The native defaults in both directions (a tuned config may trade memory for speed).
    y = torch_linrec.scan(x, c, dim=1, backend="native", config="native", backward_config="native")
    torch.cuda.synchronize()
    fwd_peak = torch.cuda.max_memory_allocated() - base
    assert fwd_peak <= T + slack, f"forward peak {fwd_peak / T:.3f} x tensor size, expected <= {1 + slack / T:.3f}"
    y.backward(grad_y)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    full_size = 3 if coeffs_shape is None else 2  # y, grad_x (, grad_coeffs)
    assert peak <= full_size * T + slack, (f"forward + backward peak {peak / T:.3f} x tensor size, "
                                           f"expected <= {full_size + slack / T:.3f}")
    assert x.grad.shape == x.shape and c.grad.shape == c.shape
