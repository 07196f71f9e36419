"""linrec::log_scan (the log-space scan): forward and gradients against the float64 reference
(torch_linrec/logscan/reference.py) on every small layout sample of tests/samples.py, -inf (log 0)
handled exactly with NaN-free gradients, reduced dtypes, gradcheck and gradgradcheck, opcheck,
torch.compile with no graph breaks, errors.

Devices: the CPU kernel always; the Triton kernels on CUDA, and on the CPU under
``TRITON_INTERPRET=1`` (through their launcher, a few samples).
"""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import torch_linrec
from conftest import CUDA_MARKS, DEVICES
from samples import SMALL_SAMPLE_NAMES, assert_close_scaled, make_sample, poison_allocator, unpack
from torch_linrec import log_scan, log_scan_ref

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
NEG_INF = float("-inf")


def log_sample(name: str, device="cpu", dtype=torch.float64, requires_grad=False):
    """A scan sample as log-space operands: ``log_x`` ~ randn (any real), ``log_coeffs = log(coeffs)``
    (coeffs ~ U(0.5, 1)), ``initial`` ~ randn; ``(log_x, log_coeffs, initial, dim, reverse)``."""
    x, c, h0, dim, reverse = unpack(make_sample(name, "cpu", torch.float64))

    def fin(t):
        return None if t is None else t.to(device, dtype).detach().requires_grad_(requires_grad)
    # the log of the whole storage, seen through c's view: keeps the sample's strides (expanded too)
    storage = torch.empty(0, dtype=torch.float64).set_(c.untyped_storage())
    lc = storage.log().as_strided(c.shape, c.stride(), c.storage_offset())
    return fin(x), fin(lc), fin(h0), dim, reverse


def ref(log_x, log_coeffs, initial, dim, reverse):
    f64 = [None if t is None else t.detach().to("cpu", torch.float64) for t in (log_x, log_coeffs, initial)]
    return log_scan_ref(*f64, dim, reverse)


def finite(t: torch.Tensor | None) -> torch.Tensor | None:
    """``-inf`` replaced by -1e4: in float64 ``exp(-1e4) = 0``, so the reference's values and (finite)
    gradients there are the limits the kernels must give exactly."""
    return None if t is None else t.masked_fill(t == NEG_INF, -1e4)


@pytest.mark.parametrize("name", SMALL_SAMPLE_NAMES)
def test_forward_float64(name):
    lx, lc, h0, dim, reverse = log_sample(name)
    poison_allocator(lx)
    out = log_scan(lx, lc, h0, dim, reverse)
    assert out.shape == lx.shape and out.dtype == lx.dtype
    assert_close_scaled(out, ref(lx, lc, h0, dim, reverse), torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", ["BLD_odd_tail-fwd", "c_D-rev", "transposed-fwd", "len33-rev"])
def test_forward_reduced(name, dtype):
    lx, lc, h0, dim, reverse = log_sample(name, dtype=dtype)
    out = log_scan(lx, lc, h0, dim, reverse)
    assert out.dtype == dtype
    assert_close_scaled(out, ref(lx, lc, h0, dim, reverse), dtype)


@pytest.mark.parametrize("name", ["NL_init-fwd", "BLD_dim1-rev", "c_B1D-fwd", "init_bcast_D-rev", "L0-fwd",
                                  "len1-rev", "sliced_BLD-fwd", "4d_dim2-rev"])
def test_gradients_float64(name):
    lx, lc, h0, dim, reverse = log_sample(name, requires_grad=True)
    out = log_scan(lx, lc, h0, dim, reverse)
    g = torch.randn_like(out)
    leaves = [t for t in (lx, lc, h0) if t is not None]
    grads = torch.autograd.grad(out, leaves, g)
    r_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    r_args = r_leaves + ([None] if h0 is None else [])
    r_out = log_scan_ref(*r_args, dim, reverse) + sum(0 * t.sum() for t in r_leaves)  # a graph at L = 0 too
    r_grads = torch.autograd.grad(r_out, r_leaves, g)
    for what, a, b in zip(("log_x", "log_coeffs", "initial"), grads, r_grads):
        assert a.shape == b.shape
        assert_close_scaled(a, b, torch.float64, f"grad {what}")


@pytest.mark.parametrize("coeffs_shape,init_shape,reverse", [((2, 6, 3), (2, 3), False), ((3,), (3,), True),
                                                          ((2, 1, 3), None, False)])
def test_gradcheck_gradgradcheck(coeffs_shape, init_shape, reverse):
    g = torch.Generator().manual_seed(1)
    lx = torch.randn(2, 6, 3, generator=g, dtype=torch.float64).requires_grad_()
    lc = (-torch.rand(coeffs_shape, generator=g, dtype=torch.float64)).requires_grad_()
    args = (lx, lc) if init_shape is None else (lx, lc, torch.randn(init_shape, generator=g, dtype=torch.float64)
                                                .requires_grad_())

    def fn(*a):
        return log_scan(*a, dim=1, reverse=reverse) if len(a) == 3 else log_scan(*a, None, 1, reverse)
    assert torch.autograd.gradcheck(fn, args)
    assert torch.autograd.gradgradcheck(fn, args)


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_neg_inf_exact(reverse):
    """log 0 everywhere it can appear: leading zero inputs (the state stays -inf), a zero
    coefficient (the state resets), a zero initial state; forward exact, gradients NaN-free and equal
    to the limits."""
    g = torch.Generator().manual_seed(3)
    lx = torch.randn(3, 12, generator=g, dtype=torch.float64)
    lc = -torch.rand(3, 12, generator=g, dtype=torch.float64)
    h0 = torch.randn(3, generator=g, dtype=torch.float64)
    def at(steps):  # positions of the scan's steps `steps`
        return [11 - i for i in steps] if reverse else list(steps)
    lx[0, at(range(5))] = NEG_INF  # row 0: zero inputs first and a zero initial state -> -inf states
    lx[1, at([4])] = NEG_INF
    lc[1, at([4])] = NEG_INF   # row 1: h = 0 at step 4
    lc[2, at([0])] = NEG_INF   # row 2: the initial state is forgotten
    h0[0] = NEG_INF
    leaves = [t.clone().requires_grad_() for t in (lx, lc, h0)]
    out = log_scan(*leaves, dim=-1, reverse=reverse)
    expect = log_scan_ref(lx, lc, h0, -1, reverse)
    assert torch.equal(out == NEG_INF, expect == NEG_INF)
    assert bool((out[0, at(range(5))] == NEG_INF).all()) and out[1, at([4])] == NEG_INF
    torch.testing.assert_close(out.masked_fill(out == NEG_INF, 0), expect.masked_fill(expect == NEG_INF, 0))
    # Where the output is finite, the gradients are the limits of finite inputs (-inf as -1e4, whose
    # exp is 0 in float64); at -inf outputs they are 0 by definition, so those get no output gradient.
    gy = torch.randn(out.shape, generator=g, dtype=torch.float64).masked_fill(out == NEG_INF, 0)
    grads = torch.autograd.grad(out, leaves, gy, retain_graph=True)
    assert all(bool(torch.isfinite(t).all()) for t in grads)
    f_leaves = [finite(t).requires_grad_() for t in (lx, lc, h0)]
    f_grads = torch.autograd.grad(log_scan_ref(*f_leaves, -1, reverse), f_leaves, gy)
    for a, b in zip(grads, f_grads):
        torch.testing.assert_close(a, b)
    at_inf = torch.autograd.grad(out, leaves[0], (out == NEG_INF).double())[0]
    assert bool((at_inf == 0).all())


def test_all_neg_inf():
    lx = torch.full((2, 7), NEG_INF, dtype=torch.float32, requires_grad=True)
    lc = torch.zeros(2, 7, requires_grad=True)
    out = log_scan(lx, lc)
    assert bool((out == NEG_INF).all())
    out.sum().backward()
    assert bool((lx.grad == 0).all()) and bool((lc.grad == 0).all())


@pytest.mark.parametrize("name", ["NL_init-fwd", "BLD_odd_tail-rev", "c_D-fwd", "init_bcast_1-rev", "L0-fwd",
                                  "permuted-fwd"])
def test_opcheck(name):
    lx, lc, h0, dim, reverse = log_sample(name, dtype=torch.float32, requires_grad=True)
    result = torch.library.opcheck(torch.ops.linrec.log_scan.default, (lx, lc, h0, dim, reverse))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_compile_fullgraph_dynamic():
    def fn(lx, lc, h0):
        return log_scan(lx, lc, h0, dim=1).exp().sum()

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    for length in (9, 17):
        lx, lc, h0, _, _ = log_sample("BLD_dim1-fwd", dtype=torch.float32, requires_grad=True)
        lx, lc = (t.detach()[:, :length].requires_grad_() for t in (lx, lc))
        expect = torch.autograd.grad(fn(lx, lc, h0), (lx, lc, h0))
        got = torch.autograd.grad(compiled(lx, lc, h0), (lx, lc, h0))
        for a, b in zip(got, expect):
            torch.testing.assert_close(a, b)
    assert counter.frame_count == 1


def test_errors():
    lx, lc = torch.randn(2, 5), torch.randn(2, 5)
    with pytest.raises(ValueError, match="log_coeffs must have the dtype of log_x"):
        log_scan(lx, lc.double())
    with pytest.raises(ValueError, match="log_coeffs of shape"):
        log_scan(lx, torch.randn(3, 5))
    with pytest.raises(ValueError, match="dim must be in"):
        log_scan(lx, lc, dim=2)
    with pytest.raises(ValueError, match="initial must have shape"):
        log_scan(lx, lc, torch.randn(3))
    with pytest.raises(ValueError, match="log_x must be float32"):
        log_scan(lx.int(), lc.int())
    with pytest.raises(ValueError, match="log_x must have at least one dimension"):
        log_scan(torch.tensor(1.0), torch.tensor(1.0))


def _triton_check(name, device, dtype):
    from torch_linrec.logscan.triton import log_scan_triton
    lx, lc, h0, dim, reverse = log_sample(name, device, dtype)
    zeros = torch.rand(lx.shape, generator=torch.Generator().manual_seed(5)) < 0.3
    lx = lx.masked_fill(zeros.to(lx.device), NEG_INF)  # log 0 inputs; keeps lx's strides
    poison_allocator(lx)
    out = log_scan_triton(lx, lc, h0, dim % lx.dim(), reverse)
    expect = ref(lx, lc, h0, dim, reverse)
    assert torch.equal(out.cpu() == NEG_INF, expect == NEG_INF)
    assert_close_scaled(out.masked_fill(out == NEG_INF, 0), expect.masked_fill(expect == NEG_INF, 0), dtype)


@pytest.mark.skipif(not (HAS_TRITON and INTERPRET), reason="needs triton and TRITON_INTERPRET=1")
@pytest.mark.parametrize("name", ["NL_init-rev", "BLD_odd_tail-fwd", "c_D-rev", "transposed-fwd", "L0-fwd"])
def test_triton_interpreted(name):
    _triton_check(name, "cpu", torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", ["NL_init-rev", "BLD_odd_tail-fwd", "c_D-rev", "len4097-fwd", "permuted_4d-rev"])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA_MARKS)])
def test_cuda(name, device, dtype):
    _triton_check(name, device, dtype)
    lx, lc, h0, dim, reverse = log_sample(name, device, dtype, requires_grad=True)
    out = log_scan(lx, lc, h0, dim, reverse)
    out.float().exp().sum().backward()
    leaves = [t for t in (lx, lc, h0) if t is not None]
    r_leaves = [t.detach().to("cpu", torch.float64).requires_grad_() for t in leaves]
    r_args = r_leaves + ([None] if h0 is None else [])
    log_scan_ref(*r_args, dim, reverse).exp().sum().backward()
    for t, r in zip(leaves, r_leaves):
        assert_close_scaled(t.grad, r.grad, dtype, "gradient", tol=2e-2 if dtype != torch.float32 else 1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_device_matches_public_api(device):
    lx, lc, h0, dim, reverse = log_sample("BLD_dim1-fwd", device, torch.float32)
    torch.testing.assert_close(torch_linrec.log_scan(lx, lc, h0, dim, reverse).cpu(),
                               ref(lx, lc, h0, dim, reverse).float())
