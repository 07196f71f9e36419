"""Values of ``torch.ops.linrec.scan`` / ``scan_backward`` (the native op) against float64 references."""
from __future__ import annotations

import zlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_linrec
from conftest import DEVICES, device_dtype_params
from samples import SAMPLE_NAMES, TOL, assert_close_scaled, batch_shape, make_sample, poison_allocator, ref_scan, unpack
from torch_linrec import chunked_scan, scan_backward_ref, scan_ref

scan_op = torch.ops.linrec.scan
scan_backward_op = torch.ops.linrec.scan_backward


def randn_like_seeded(t: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.device, t.dtype)


def _forward(name, device, dtype):
    sample = make_sample(name, device, dtype)
    x, c, h0, dim, reverse = unpack(sample)
    args, kwargs = sample
    poison_allocator(x)
    y = scan_op(*args, **kwargs)
    return sample, (x, c, h0, dim, reverse), y


# ----------------------------------------------------------------------------------------------- forward


@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_forward_matches_reference(name, device, dtype):
    _, (x, c, h0, dim, reverse), y = _forward(name, device, dtype)
    ref = ref_scan(x, c, h0, dim, reverse)
    like = torch.empty_like(x)
    assert y.dtype == dtype and y.device == x.device
    assert y.shape == x.shape
    assert y.stride() == like.stride(), f"strides {y.stride()} != empty_like(x)'s {like.stride()}"
    assert bool(torch.isfinite(y).all()), "output has NaN/inf (an element left unwritten?)"
    assert_close_scaled(y, ref, dtype)


@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_backward_op_matches_reference(name, device, dtype):
    _, (x, c, h0, dim, reverse), y = _forward(name, device, dtype)
    grad_y = randn_like_seeded(y, zlib.crc32(name.encode()) + 1)
    poison_allocator(y, copies=6)
    gx, gc, gh = scan_backward_op(grad_y, c, y, h0, dim, reverse)
    rx, rc, rh = scan_backward_ref(grad_y, c, y, h0, dim, reverse, scan=chunked_scan)
    assert gx.shape == x.shape and gc.shape == c.shape and tuple(gh.shape) == batch_shape(x, dim)
    for what, g in (("grad_x", gx), ("grad_coeffs", gc), ("grad_initial", gh)):
        assert g.dtype == dtype and g.device == x.device, what
        assert bool(torch.isfinite(g).all()), f"{what} has NaN/inf"
    assert_close_scaled(gx, rx, dtype, "grad_x")
    assert_close_scaled(gc, rc, dtype, "grad_coeffs")
    assert_close_scaled(gh, rh, dtype, "grad_initial")


# ----------------------------------------------------------------------------------------------- special values


@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dim", [-1, 1])
def test_coeffs_one_is_cumsum(device, dtype, reverse, dim):
    g = torch.Generator().manual_seed(3)
    shape = (3, 300, 5) if dim == 1 else (3, 5, 300)
    x = torch.randn(shape, generator=g, dtype=torch.float64).to(device, dtype)
    h0 = torch.randn(batch_shape(x, dim), generator=g, dtype=torch.float64).to(device, dtype)
    c = torch.ones((), device=device, dtype=dtype).expand(x.shape)
    y = scan_op(x, c, h0, dim, reverse)
    x64 = x.double().cpu()
    ref = (x64.flip(dim).cumsum(dim).flip(dim) if reverse else x64.cumsum(dim)) + h0.double().cpu().unsqueeze(dim)
    assert_close_scaled(y, ref, dtype, "scan with coeffs=1 vs cumsum")
    # Without initial and with full-shape ones: exactly torch.cumsum's math, compare again.
    y2 = scan_op(x, torch.ones_like(x), None, dim, reverse)
    assert_close_scaled(y2, ref - h0.double().cpu().unsqueeze(dim), dtype, "scan with coeffs=1 vs cumsum")


@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("name", ["NL_init-fwd", "NL_init-rev", "permuted-rev", "c_1-fwd", "4d_dim2-rev"])
def test_coeffs_zero_is_identity(name, device, dtype):
    x, c, h0, dim, reverse = unpack(make_sample(name, device, dtype))
    zero = torch.zeros_like(c)
    y = scan_op(x, zero, h0, dim, reverse)
    assert torch.equal(y, x), "coeffs=0 must give y == x exactly"
    gy = randn_like_seeded(y, 5)
    gx, gc, gh = scan_backward_op(gy, zero, y, h0, dim, reverse)
    assert torch.equal(gx, gy), "coeffs=0: grad_x must equal grad_y exactly"
    assert torch.equal(gh, torch.zeros_like(gh)), "coeffs=0: grad_initial must be zero"


@pytest.mark.parametrize("device,dtype", device_dtype_params())
def test_empty_sequences(device, dtype):
    g = torch.Generator().manual_seed(11)
    for shape, dim, c_shape in [((3, 0), -1, (3, 0)), ((2, 0, 4), 1, (4,)), ((2, 0, 4), 1, (2, 1, 4))]:
        x = torch.randn(shape, generator=g).to(device, dtype)
        c = torch.rand(c_shape, generator=g).to(device, dtype)
        h0 = torch.randn(batch_shape(x, dim), generator=g).to(device, dtype)
        for reverse in (False, True):
            y = scan_op(x, c, h0, dim, reverse)
            assert y.shape == x.shape and y.dtype == dtype and y.numel() == 0
            poison_allocator(h0, copies=8)
            poison_allocator(c, copies=8)
            gx, gc, gh = scan_backward_op(torch.empty_like(y), c, y, h0, dim, reverse)
            assert gx.shape == x.shape
            assert gc.shape == c.shape and torch.equal(gc, torch.zeros_like(gc)), "L=0: grad_coeffs must be 0"
            assert gh.shape == h0.shape and torch.equal(gh, torch.zeros_like(gh)), "L=0: grad_initial must be 0"


@pytest.mark.parametrize("device,dtype", device_dtype_params())
def test_zero_numel_batch(device, dtype):
    for shape, dim, c_shape in [((0, 5), -1, (0, 5)), ((0, 5), -1, (5,)), ((2, 5, 0), 1, (1, 5, 0))]:
        x = torch.ones(shape, device=device, dtype=dtype)
        c = torch.ones(c_shape, device=device, dtype=dtype)
        y = scan_op(x, c, None, dim, False)
        assert y.shape == x.shape and y.numel() == 0
        gx, gc, gh = scan_backward_op(y, c, y, None, dim, True)
        assert gx.shape == x.shape and gc.shape == c.shape and tuple(gh.shape) == batch_shape(x, dim)
        assert torch.equal(gc, torch.zeros_like(gc))


@pytest.mark.parametrize("device", DEVICES)
def test_initial_none_equals_zero_initial(device):
    x, c, h0, dim, reverse = unpack(make_sample("BLD_dim1-rev", device))
    y_none = scan_op(x, c, None, dim, reverse)
    y_zero = scan_op(x, c, torch.zeros_like(h0), dim, reverse)
    assert torch.equal(y_none, y_zero)
    y_h = scan_op(x, c, h0, dim, reverse)
    assert not torch.equal(y_none, y_h), "initial had no effect"


@pytest.mark.parametrize("device", DEVICES)
def test_does_not_modify_inputs(device):
    x, c, h0, dim, reverse = unpack(make_sample("permuted-fwd", device))
    saved = [t.clone() for t in (x, c, h0)]
    y = scan_op(x, c, h0, dim, reverse)
    gy = randn_like_seeded(y, 1)
    gy_saved, y_saved = gy.clone(), y.clone()
    scan_backward_op(gy, c, y, h0, dim, reverse)
    for t, s in zip((x, c, h0, gy, y), saved + [gy_saved, y_saved]):
        assert torch.equal(t, s)


@pytest.mark.parametrize("device,dtype", device_dtype_params((torch.float64, torch.float32)))
@pytest.mark.parametrize("layout", ["expanded", "permuted", "sliced"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_backward_op_any_grad_y_layout(layout, reverse, device, dtype):
    """grad_y's layout differs from y's: stride 0 (what y.sum().backward() passes), permuted, sliced."""
    x, c, h0, dim, _ = unpack(make_sample("BLD_odd_tail-fwd", device, dtype))
    y = scan_op(x, c, h0, dim, reverse)
    g = torch.Generator().manual_seed(2)
    if layout == "expanded":
        grad_y = torch.ones((), device=device, dtype=dtype).expand(y.shape)
    elif layout == "permuted":
        grad_y = torch.randn(y.shape[::-1], generator=g).to(device, dtype).permute(2, 1, 0)
    else:
        grad_y = torch.randn(y.shape[0], y.shape[1] * 2, y.shape[2], generator=g).to(device, dtype)[:, 1::2]
    got = scan_backward_op(grad_y, c, y, h0, dim, reverse)
    ref = scan_backward_ref(grad_y, c, y, h0, dim, reverse, scan=chunked_scan)
    for what, a, b in zip(("grad_x", "grad_coeffs", "grad_initial"), got, ref):
        assert_close_scaled(a, b, dtype, what)


def _sliced_rank(rank, device):
    g = torch.Generator().manual_seed(rank)
    full = (4,) * rank
    every_other = (slice(None, None, 2),) * rank  # no two dims can be coalesced
    x = torch.randn(full, generator=g).to(device)[every_other]
    c = (torch.rand(full, generator=g) * 0.5 + 0.5).to(device)[every_other]
    h0 = torch.randn((2,) * (rank - 1), generator=g).to(device)
    assert x.stride()[-1] == 2 and c.stride()[-1] == 2
    return x, c, h0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_eight_uncoalescable_batch_dims(reverse, device):
    """The most batch dims the kernels take (kMaxBatchDims = 8), none mergeable."""
    x, c, h0 = _sliced_rank(9, device)
    y = scan_op(x, c, h0, 0, reverse)
    assert_close_scaled(y, ref_scan(x, c, h0, 0, reverse), torch.float32)
    gy = torch.ones_like(y)
    got = scan_backward_op(gy, c, y, h0, 0, reverse)
    ref = scan_backward_ref(gy, c, y, h0, 0, reverse, scan=chunked_scan)
    for what, a, b in zip(("grad_x", "grad_coeffs", "grad_initial"), got, ref):
        assert_close_scaled(a, b, torch.float32, what)


_NINE_DIMS = r"the layout of x needs 9 batch dims after coalescing, at most 8 are supported; call .contiguous\(\)"


@pytest.mark.parametrize("device", DEVICES)
def test_nine_uncoalescable_batch_dims_raise_clearly(device):
    """Current limit: 9 batch dims that cannot be coalesced raise ValueError, telling the caller what
    to do; contiguous copies of the same inputs run."""
    x, c, h0 = _sliced_rank(10, device)
    with pytest.raises(ValueError, match=_NINE_DIMS):
        scan_op(x, c, h0, 0, False)
    with pytest.raises(ValueError, match=r"linrec.scan_backward: " + _NINE_DIMS):
        scan_backward_op(torch.ones_like(x), c, x, h0, 0, False)
    y = scan_op(x.contiguous(), c.contiguous(), h0, 0, False)
    assert_close_scaled(y, ref_scan(x, c, h0, 0, False), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_nine_uncoalescable_batch_dims_raise_in_fake_kernels(device):
    """The fake (meta) kernels model the limit too, so torch.compile rejects such calls at trace time
    rather than at run time; the same layout made contiguous, or with 8 batch dims, passes."""
    x, c, h0 = _sliced_rank(10, device)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fx, fc, fh = (mode.from_tensor(t) for t in (x, c, h0))
        with pytest.raises(ValueError, match=_NINE_DIMS):
            scan_op(fx, fc, fh, 0, False)
        with pytest.raises(ValueError, match=r"linrec.scan_backward: " + _NINE_DIMS):
            scan_backward_op(torch.ones_like(fx), fc, fx, fh, 0, False)
        y = scan_op(fx.contiguous(), fc.contiguous(), fh, 0, False)
        assert y.shape == x.shape
        x8, c8, h8 = (mode.from_tensor(t) for t in _sliced_rank(9, device))
        assert scan_op(x8, c8, h8, 0, True).shape == x8.shape
        assert scan_backward_op(torch.ones_like(x8), c8, x8, h8, 0, True)[0].shape == x8.shape
    # Meta tensors run the fake kernel as well.
    every_other = (slice(None, None, 2),) * 10
    xm = torch.empty((4,) * 10, device="meta")[every_other]
    with pytest.raises(ValueError, match=_NINE_DIMS):
        scan_op(xm, xm, None, 0, False)


# ----------------------------------------------------------------------------------------------- long sequences


def _long_case(case, device, dtype):
    shape, dim = case
    g = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    x = torch.randn(shape, generator=g).to(device, dtype)
    c = (torch.rand(shape, generator=g) * 0.5 + 0.5).to(device, dtype)
    h0 = torch.randn(batch_shape(x, dim), generator=g).to(device, dtype)
    return x, c, h0, dim


_LONG = [pytest.param(((3, 2 ** 20 + 3), -1), id="3x(2^20+3)"), pytest.param(((2, 70000, 64), 1), id="2x70000x64-dim1")]


@pytest.mark.parametrize("device,dtype", device_dtype_params((torch.float32, torch.bfloat16)))
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("case", _LONG)
def test_long_sequences(case, reverse, device, dtype):
    """Multi-chunk sequences (the CUDA kernel's look-back across chunks) against the library's chunked
    float64 reference (torch_linrec.chunked_scan, and scan_backward_ref on it)."""
    if device == "cpu" and dtype != torch.float32:
        pytest.skip("the CPU kernel is a plain loop; one dtype is enough there")
    x, c, h0, dim = _long_case(case, device, dtype)
    y = scan_op(x, c, h0, dim, reverse)
    assert bool(torch.isfinite(y).all())
    assert_close_scaled(y, chunked_scan(x, c, h0, dim, reverse), dtype, "long forward")
    gy = randn_like_seeded(y, 17)
    got = scan_backward_op(gy, c, y, h0, dim, reverse)
    ref = scan_backward_ref(gy, c, y, h0, dim, reverse, scan=chunked_scan)
    for what, a, b in zip(("long grad_x", "long grad_coeffs", "long grad_initial"), got, ref):
        assert_close_scaled(a, b, dtype, what)


@pytest.mark.parametrize("device", DEVICES)
def test_chunked_reference_matches_loop_reference(device):
    """The library's chunked reference, used for long sequences here, agrees with scan_ref, forward and
    backward, with several chunks and a partial last one (so the long tests are valid)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2500, 2, generator=g, dtype=torch.float64).to(device)
    c = (torch.rand(3, 1, 2, generator=g, dtype=torch.float64) * 0.5 + 0.5).to(device)
    h0 = torch.randn(3, 2, generator=g, dtype=torch.float64).to(device)
    gy = torch.randn(3, 2500, 2, generator=g, dtype=torch.float64).to(device)
    for reverse in (False, True):
        a = chunked_scan(x, c, h0, 1, reverse, chunk=64)
        b = scan_ref(x, c, h0, 1, reverse)
        assert a.dtype == torch.float64 and a.device.type == "cpu"
        assert_close_scaled(a, b, torch.float64, tol=1e-12)
        got = scan_backward_ref(gy, c, b, h0, 1, reverse, scan=chunked_scan)
        want = scan_backward_ref(gy, c, b, h0, 1, reverse)
        for what, u, v in zip(("grad_x", "grad_coeffs", "grad_initial"), got, want):
            assert u.shape == v.shape, what
            assert_close_scaled(u, v, torch.float64, what, tol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", _LONG + [pytest.param(((4, 3000, 33), 1), id="4x3000x33-dim1"),
                                          pytest.param(((64, 5000), -1), id="64x5000")])
def test_repeated_runs_agree(case, device):
    """Catches races. The single-block paths are bitwise reproducible; the CUDA multi-block paths
    chain blocks by decoupled look-back, whose association order depends on timing (as in CUB's
    DeviceScan), and add broadcast coeffs' gradient atomically, so runs may differ by float32
    rounding, never more: a race would show as O(1)."""
    x, c, h0, dim = _long_case(case, device, torch.float32)
    cb = c.narrow(dim, 0, 1)  # broadcast coeffs: grad_coeffs goes through a reduction too
    problems = []
    for kind, coeffs in (("full coeffs", c), ("broadcast coeffs", cb)):
        for reverse in (False, True):
            y0 = scan_op(x, coeffs, h0, dim, reverse)
            gy = randn_like_seeded(y0, 23)
            g0 = scan_backward_op(gy, coeffs, y0, h0, dim, reverse)
            for run in range(1, 4):
                y = scan_op(x, coeffs, h0, dim, reverse)
                g = scan_backward_op(gy, coeffs, y0, h0, dim, reverse)
                for what, a, b in zip(("y", "grad_x", "grad_coeffs", "grad_initial"), (y, *g), (y0, *g0)):
                    exact = device == "cpu"
                    diff = (a - b).abs().max().item()
                    scale = max(b.abs().max().item(), 1.0)
                    if (exact and not torch.equal(a, b)) or diff > 1e-4 * scale:
                        bad = (a != b).nonzero()
                        problems.append(f"{kind}, reverse={reverse}, run {run}: {what} differs in {len(bad)} of "
                                        f"{a.numel()} elements (first at {tuple(bad[0].tolist())}, max |diff| "
                                        f"{diff:.3g}, scale {scale:.3g})")
    assert not problems, "results differ between runs:\n" + "\n".join(problems)


# ----------------------------------------------------------------------------------------------- Python API


@pytest.mark.parametrize("device", DEVICES)
def test_api_native_and_auto_call_the_op(device, monkeypatch, no_tuned_configs):
    """Without tuned cache entries "auto" and "native" run the native defaults."""
    sample = make_sample("permuted-rev", device)
    x, c, h0, dim, reverse = unpack(sample)
    expect = scan_op(x, c, h0, dim, reverse)
    monkeypatch.delenv("TORCH_LINREC_BACKEND", raising=False)
    calls = []
    real_ref = torch_linrec.api.scan_ref
    monkeypatch.setattr(torch_linrec.api, "scan_ref", lambda *a, **k: calls.append(1) or real_ref(*a, **k))
    assert torch.equal(torch_linrec.scan(x, c, h0, dim, reverse, backend="native"), expect)
    assert torch.equal(torch_linrec.scan(x, c, initial=h0, dim=dim, reverse=reverse, backend="auto"), expect)
    with torch_linrec.use_backend("native"):
        assert torch.equal(torch_linrec.scan(x, c, h0, dim, reverse), expect)
    assert calls == []
    with torch_linrec.use_backend("reference"):
        out = torch_linrec.scan(x, c, h0, dim, reverse)
        with torch_linrec.use_backend("native"):  # innermost wins
            assert torch.equal(torch_linrec.scan(x, c, h0, dim, reverse), expect)
    assert calls == [1]
    assert_close_scaled(out, expect, torch.float32)
    monkeypatch.setenv("TORCH_LINREC_BACKEND", "reference")
    torch_linrec.scan(x, c, h0, dim, reverse)
    assert calls == [1, 1], "TORCH_LINREC_BACKEND=reference was not used"
    assert torch.equal(torch_linrec.scan(x, c, h0, dim, reverse, backend="native"), expect)  # argument wins
    assert calls == [1, 1]


@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("name", ["c_B1D-rev", "init_bcast_D-fwd", "transposed-rev", "1d-fwd"])
def test_api_reference_backend_matches_op(name, device, dtype):
    x, c, h0, dim, reverse = unpack(make_sample(name, device, dtype))
    out = torch_linrec.scan(x, c, h0, dim, reverse, backend="reference")
    assert out.dtype == dtype and out.shape == x.shape
    # The reference backend runs in the input dtype (no float32 accumulation): looser for 16-bit.
    tol = TOL[dtype] if dtype in (torch.float32, torch.float64) else 5e-2
    assert_close_scaled(out, ref_scan(x, c, h0, dim, reverse), dtype, tol=tol)
