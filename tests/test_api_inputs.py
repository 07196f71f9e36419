"""torch_linrec.scan's forgiving inputs (Python-number coeffs and initial, keepdim initial), its dtype
policy (PyTorch's type promotion) and autocast (the op's "promote" rule, registered in C++), in a small
model under torch.autocast on the CPU in bfloat16."""
from __future__ import annotations

import pytest
import torch

import torch_linrec
from conftest import DEVICES

F64 = torch.float64


def _x(shape, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=F64).to(device, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", [0.9, 1, -0.5])
def test_python_number_coeffs(device, value):
    x = _x((2, 7, 3), device=device).requires_grad_()
    y = torch_linrec.scan(x, value, dim=1)
    ref = torch_linrec.scan_ref(x.detach().double().cpu(), torch.tensor(float(value), dtype=F64), None, 1)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double().cpu(), ref, rtol=1e-5, atol=1e-5)
    y.sum().backward()
    assert x.grad is not None


def test_python_number_keeps_its_precision_in_bfloat16():
    """0.999 is 1.0 in bfloat16: the scan runs in float32 (as `x * 0.999` would) and rounds only y."""
    x = torch.ones(4096, dtype=torch.bfloat16)
    y = torch_linrec.scan(x, 0.999)
    assert y.dtype == torch.bfloat16
    exact = (1 - 0.999 ** 4096) / (1 - 0.999)  # ~ 983, far from the 4096 of a decay of 1.0
    assert abs(y[-1].item() - exact) / exact < 1e-2
    y_half = torch_linrec.scan(x, 0.5)  # exact in bfloat16: runs in bfloat16
    assert y_half.dtype == torch.bfloat16 and abs(y_half[-1].item() - 2.0) < 1e-2


@pytest.mark.parametrize("device", DEVICES)
def test_python_number_initial_and_keepdim_initial(device):
    x, c = _x((2, 6, 3), device=device), _x((2, 6, 3), device=device, seed=1).sigmoid()
    h0 = _x((2, 3), device=device, seed=2)
    expect = torch_linrec.scan(x, c, h0, 1)
    torch.testing.assert_close(torch_linrec.scan(x, c, h0.unsqueeze(1), 1), expect)  # (B, 1, D) for dim=1
    torch.testing.assert_close(torch_linrec.scan(x, c, h0[:, None, :].expand(2, 1, 3), 1), expect)
    torch.testing.assert_close(torch_linrec.scan(x, c, 2.0, 1), torch_linrec.scan(x, c, torch.full((2, 3), 2.0,
                                                                                                  device=device), 1))
    h_leaf = h0.unsqueeze(1).requires_grad_()
    torch_linrec.scan(x, c, h_leaf, 1).sum().backward()
    assert h_leaf.grad.shape == (2, 1, 3)


def test_bad_python_inputs_raise():
    x = torch.ones(3, 4)
    with pytest.raises(ValueError, match=r"coeffs must be a tensor or a real number, got str"):
        torch_linrec.scan(x, "0.9")
    with pytest.raises(ValueError, match=r"initial must be a tensor or a real number, got list"):
        torch_linrec.scan(x, 0.9, [1.0])
    with pytest.raises(ValueError, match=r"x must be a tensor, got list"):
        torch_linrec.scan([1.0], 0.9)
    with pytest.raises(ValueError, match=r"dim must be in \[-2, 1\]"):
        torch_linrec.scan(x, 0.9, dim=2)
    with pytest.raises(ValueError, match=r"initial must have shape"):  # keepdim form of the wrong size
        torch_linrec.scan(torch.ones(2, 5, 3), torch.ones(3), torch.ones(2, 5, 3), 1)


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize("x_dtype,c_dtype,h_dtype", [
    (torch.bfloat16, torch.float32, None), (torch.float32, torch.bfloat16, None),
    (torch.float16, torch.bfloat16, None), (torch.bfloat16, torch.bfloat16, torch.float32),
    (torch.float32, F64, None)])
def test_type_promotion(backend, x_dtype, c_dtype, h_dtype):
    """Mixed dtypes follow torch.result_type, like `coeffs * x`; gradients come back in each input's dtype."""
    x = _x((2, 5, 3), x_dtype).requires_grad_()
    c = _x((3,), c_dtype, seed=1).sigmoid().detach().requires_grad_()
    h0 = None if h_dtype is None else _x((2, 3), h_dtype, seed=2).requires_grad_()
    y = torch_linrec.scan(x, c, h0, 1, backend=backend)
    expect = torch.result_type(x, c) if h0 is None else torch.promote_types(torch.result_type(x, c), h0.dtype)
    assert y.dtype == expect
    ref = torch_linrec.scan_ref(x.detach().to(expect).double(), c.detach().to(expect).double(),
                                None if h0 is None else h0.detach().to(expect).double(), 1)
    torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    for t in (x, c, h0):
        if t is not None:
            assert t.grad is not None and t.grad.dtype == t.dtype


def test_op_stays_strict():
    with pytest.raises(ValueError, match=r"coeffs must have the dtype of x"):
        torch.ops.linrec.scan(torch.ones(3, 4, dtype=torch.bfloat16), torch.ones(3, 4))


def test_autocast_registered_in_cpp():
    for key in ("AutocastCPU", "AutocastCUDA"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key("linrec::scan", key)


@pytest.mark.parametrize("device", DEVICES)
def test_op_under_autocast_promotes(device):
    """Inside autocast the op takes mixed dtypes and runs in the widest (never downcast)."""
    dev_type = torch.device(device).type
    x = _x((2, 5, 3), torch.bfloat16, device)
    c = _x((2, 5, 3), torch.float32, device, seed=1).sigmoid()
    with torch.autocast(dev_type, dtype=torch.bfloat16):
        y = torch.ops.linrec.scan(x, c, None, 1, False)
        y32 = torch.ops.linrec.scan(x.float(), c, None, 1, False)
    assert y.dtype == torch.float32 and y32.dtype == torch.float32  # float32 inputs are not cast down
    torch.testing.assert_close(y, torch.ops.linrec.scan(x.float(), c, None, 1, False))


class _MinGRU(torch.nn.Module):
    """A minGRU layer (Feng et al., "Were RNNs all we needed?", 2024): z = sigmoid(W_z x),
    h~ = W_h x, h[l] = (1 - z[l]) h[l-1] + z[l] h~[l]; plus a float32 learned decay skip path."""

    def __init__(self, d):
        super().__init__()
        self.z, self.h, self.out = torch.nn.Linear(d, d), torch.nn.Linear(d, d), torch.nn.Linear(d, d)
        self.decay = torch.nn.Parameter(torch.full((d,), 2.0))  # float32: sigmoid(2) = 0.88

    def forward(self, x):
        z = torch.sigmoid(self.z(x))
        h = torch_linrec.scan(z * self.h(x), 1 - z, dim=1)
        skip = torch_linrec.scan(x, torch.sigmoid(self.decay), dim=1)  # bf16 x with float32 coeffs under autocast
        return self.out(h + skip)


def test_autocast_model_cpu_bf16():
    """Training steps of a small model under torch.autocast("cpu", bfloat16): dtypes as autocast
    gives them, loss and gradients close to the float32 run."""
    torch.manual_seed(0)
    model = _MinGRU(8)
    x = torch.randn(2, 16, 8)
    loss32 = model(x).square().mean()
    grads32 = torch.autograd.grad(loss32, list(model.parameters()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
        loss = out.float().square().mean()
    assert out.dtype == torch.bfloat16
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert abs(loss.item() - loss32.item()) < 5e-2 * max(1.0, abs(loss32.item()))
    for g, g32 in zip(grads, grads32):
        assert g.dtype == torch.float32 and torch.isfinite(g).all()
        assert (g - g32).abs().max() <= 0.1 * g32.abs().max() + 1e-3
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)


def test_every_op_has_a_doc():
    import torch_linrec.linrec.triton  # noqa: F401  (loaded on first use otherwise)
    import torch_linrec.logscan  # noqa: F401
    names = sorted({n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                    if n.startswith("linrec::")})
    assert {"scan", "scan_backward", "scan_triton", "selective_scan", "log_scan"} <= set(names)
    for name in names:
        op = getattr(torch.ops.linrec, name)
        assert op.__doc__ and "CustomOpDef" not in op.__doc__, name
        assert op.default.__doc__ == op.__doc__
    assert "y[l] = coeffs[l] * y[l-1] + x[l]" in torch.ops.linrec.scan.__doc__
