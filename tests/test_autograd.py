"""Autograd of the native op: gradcheck (float64, CPU), float32 gradients against autograd through the
reference, and torch.library.opcheck of linrec::scan and linrec::scan_backward."""
from __future__ import annotations

import zlib

import pytest
import torch
from torch.autograd import gradcheck

import torch_linrec
from conftest import DEVICES, device_dtype_params
from samples import SMALL_SAMPLE_NAMES, assert_close_scaled, batch_shape, make_sample, ref_scan, unpack

scan_op = torch.ops.linrec.scan


def _rand(shape, kind, gen, dtype=torch.float64, device="cpu", rg=True):
    t = torch.rand(shape, generator=gen, dtype=torch.float64) * 0.5 + 0.5 if kind == "c" else \
        torch.randn(shape, generator=gen, dtype=torch.float64)
    return t.to(device, dtype).requires_grad_(rg)


def _has_overlap(t: torch.Tensor) -> bool:
    return any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))


# ----------------------------------------------------------------------------------------------- gradcheck


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("dim", [-1, 1])
@pytest.mark.parametrize("coeffs_kind", ["full", "D", "B1D"])
@pytest.mark.parametrize("initial_kind", ["none", "full", "bcast"])
def test_gradcheck(initial_kind, coeffs_kind, dim, reverse):
    g = torch.Generator().manual_seed(zlib.crc32(f"{initial_kind}{coeffs_kind}{dim}{reverse}".encode()))
    B, L, D = 2, 6, 3
    x = _rand((B, L, D), "x", g)
    c = _rand({"full": (B, L, D), "D": (D,), "B1D": (B, 1, D)}[coeffs_kind], "c", g)
    bshape = batch_shape(x, dim)
    h0 = {"none": None, "full": _rand(bshape, "x", g), "bcast": _rand(bshape[-1:], "x", g)}[initial_kind]
    inputs = (x, c, h0, dim, reverse)
    assert gradcheck(lambda *a: scan_op(*a), inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("name", SMALL_SAMPLE_NAMES)
def test_gradcheck_samples(name):
    """gradcheck (fast mode) over every layout of the small samples; stride-0 inputs are held constant
    (gradcheck cannot perturb overlapping memory)."""
    x, c, h0, dim, reverse = unpack(make_sample(name, "cpu", torch.float64, requires_grad=True))
    for t in (x, c, h0):
        if t is not None and _has_overlap(t):
            t.requires_grad_(False)
    if not any(t is not None and t.requires_grad for t in (x, c, h0)):
        pytest.skip("no input can be perturbed")
    assert gradcheck(lambda *a: scan_op(*a), (x, c, h0, dim, reverse), eps=1e-6, atol=1e-8, rtol=1e-6,
                     fast_mode=True)


# ----------------------------------------------------------------------------------------------- float32 vs reference


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", SMALL_SAMPLE_NAMES)
def test_grads_match_reference_autograd(name, device):
    """Gradients of the op (float32) against autograd through scan_ref in float64."""
    sample = make_sample(name, device, torch.float32, requires_grad=True)
    x, c, h0, dim, reverse = unpack(sample)
    inputs = [t for t in (x, c, h0) if t is not None]
    y = scan_op(*sample[0], **sample[1])
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    grad_y = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad(y, inputs, grad_y.to(device, torch.float32), allow_unused=True)
    ref_inputs = [t.detach().to("cpu", torch.float64).requires_grad_() for t in inputs]
    y_ref = torch_linrec.scan_ref(ref_inputs[0], ref_inputs[1], ref_inputs[2] if h0 is not None else None,
                                  dim, reverse)
    if y_ref.requires_grad:
        ref_grads = torch.autograd.grad(y_ref, ref_inputs, grad_y, allow_unused=True)
    else:  # L == 0: scan_ref returns a fresh empty tensor
        ref_grads = [None] * len(ref_inputs)
    for what, t, gr, rr in zip(("x", "coeffs", "initial"), inputs, grads, ref_grads):
        if rr is None:  # L == 0 or numel == 0: the reference graph does not reach the input
            rr = torch.zeros(t.shape, dtype=torch.float64)
        assert gr is not None, f"no gradient for {what}"
        assert gr.shape == t.shape and gr.dtype == torch.float32, what
        assert_close_scaled(gr, rr, torch.float32, f"grad {what}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["x", "coeffs", "initial"])
def test_grad_of_one_input(which, device):
    """Only one input requires grad: that one gets the right gradient, the others stay None."""
    x, c, h0, dim, reverse = unpack(make_sample("c_B1D-rev", device, torch.float32))
    ts = {"x": x, "coeffs": c, "initial": h0}
    ts[which].requires_grad_()
    y = scan_op(x, c, h0, dim, reverse)
    y.pow(2).sum().backward()
    for k, t in ts.items():
        assert (t.grad is None) == (k != which), k
    ref = {k: v.detach().double().cpu().requires_grad_(k == which) for k, v in ts.items()}
    torch_linrec.scan_ref(ref["x"], ref["coeffs"], ref["initial"], dim, reverse).pow(2).sum().backward()
    assert_close_scaled(ts[which].grad, ref[which].grad, torch.float32, f"grad {which}")


@pytest.mark.parametrize("device", DEVICES)
def test_grads_accumulate_over_two_calls(device):
    x, c, h0, dim, reverse = unpack(make_sample("c_D-fwd", device, torch.float32, requires_grad=True))
    scan_op(x, c, h0, dim, reverse).sum().backward()
    first = c.grad.clone()
    scan_op(x, c, h0, dim, reverse).sum().backward()
    torch.testing.assert_close(c.grad, 2 * first)


@pytest.mark.parametrize("device", DEVICES)
def test_x_is_not_saved_but_y_is(device):
    """Only coeffs and y are saved: modifying x in place after the forward is fine, modifying y is not."""
    x0, c, h0, dim, reverse = unpack(make_sample("BLD_dim1-fwd", device, torch.float32, requires_grad=True))
    x = x0 * 1.0
    y = scan_op(x, c, h0, dim, reverse)
    x.add_(1.0)
    y.sum().backward()  # raises if x had been saved
    assert x0.grad is not None and c.grad is not None
    y = scan_op(x0 * 1.0, c, h0, dim, reverse)
    y.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("device,dtype", device_dtype_params((torch.float16, torch.bfloat16)))
def test_low_precision_grads(device, dtype):
    sample = make_sample("c_B1D-rev", device, dtype, requires_grad=True)
    x, c, h0, dim, reverse = unpack(sample)
    y = scan_op(*sample[0], **sample[1])
    y.float().square().sum().backward()
    ref = [t.detach().double().cpu().requires_grad_() for t in (x, c, h0)]
    ref_scan_y = torch_linrec.scan_ref(*ref, dim, reverse)
    # d/dy of sum(y^2) uses the (rounded) y of the op.
    torch.autograd.backward(ref_scan_y, 2 * y.detach().double().cpu())
    for what, t, r in zip(("x", "coeffs", "initial"), (x, c, h0), ref):
        assert t.grad.dtype == dtype and t.grad.shape == t.shape
        assert_close_scaled(t.grad, r.grad, dtype, f"grad {what}")


# ----------------------------------------------------------------------------------------------- opcheck


def _opcheck(op, args, kwargs=None):
    result = torch.library.opcheck(op, args, kwargs)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", SMALL_SAMPLE_NAMES)
def test_opcheck_scan(name, device, requires_grad):
    args, kwargs = make_sample(name, device, torch.float32, requires_grad)
    _opcheck(torch.ops.linrec.scan.default, args, kwargs)


@pytest.mark.parametrize("device,dtype", device_dtype_params((torch.float64, torch.float16, torch.bfloat16)))
@pytest.mark.parametrize("name", ["BLD_dim1-rev", "permuted-fwd", "c_D-rev", "L0_BLD_bcast-fwd"])
def test_opcheck_scan_dtypes(name, device, dtype):
    for rg in (False, True):
        args, kwargs = make_sample(name, device, dtype, rg)
        _opcheck(torch.ops.linrec.scan.default, args, kwargs)


_BWD_NAMES = ["NL-fwd", "NL_init-rev", "BLD_dim1-fwd", "permuted-rev", "sliced-fwd", "c_D-rev", "c_B1D-fwd",
              "c_1-rev", "init_bcast_D-fwd", "4d_dim2-rev", "L0_BLD_bcast-fwd", "batch0-rev", "1d-fwd"]


@pytest.mark.parametrize("device,dtype", device_dtype_params((torch.float32, torch.bfloat16)))
@pytest.mark.parametrize("name", _BWD_NAMES)
def test_opcheck_scan_backward(name, device, dtype):
    x, c, h0, dim, reverse = unpack(make_sample(name, device, dtype))
    y = scan_op(x, c, h0, dim, reverse)
    gen = torch.Generator().manual_seed(1)
    grad_y = torch.randn(y.shape, generator=gen).to(device, dtype)
    _opcheck(torch.ops.linrec.scan_backward.default, (grad_y, c, y, h0, dim, reverse))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["BLD_dim1-rev", "c_D-fwd"])
def test_opcheck_with_configs(name, device):
    """The config arguments through schema, fake, autograd and AOT dispatch: the device's default by
    name for the forward, and a backward_config that autograd hands to the backward op."""
    x, c, h0, dim, reverse = unpack(make_sample(name, device, torch.float32, requires_grad=True))
    _opcheck(torch.ops.linrec.scan.default, (x, c, h0, dim, reverse, "native", "native"))
    _opcheck(torch.ops.linrec.scan.default, (x, c, h0, dim, reverse), {"config": "prefer:cpu.g16"})
    y = scan_op(x, c, h0, dim, reverse).detach()
    grad_y = torch.ones_like(y)
    _opcheck(torch.ops.linrec.scan_backward.default,
             (grad_y, c.detach(), y, None if h0 is None else h0.detach(), dim, reverse, "native"))
