"""Bad arguments raise ValueError naming the argument: the raw ops (the C++ checks use
TORCH_CHECK_VALUE), torch_linrec.scan (native and reference backends), the fake kernels (meta /
FakeTensorMode), and backend selection."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_linrec
from conftest import DEVICES, requires_cuda

ERRORS = ValueError  # not RuntimeError: user errors of the C++ ops are ValueError too


def _op(x, c, initial=None, dim=-1, reverse=False):
    return torch.ops.linrec.scan(x, c, initial, dim, reverse)


def _api(backend):
    def call(x, c, initial=None, dim=-1, reverse=False):
        return torch_linrec.scan(x, c, initial, dim, reverse, backend=backend)
    return call


def _fake(x, c, initial=None, dim=-1, reverse=False):
    """The fake kernel (what torch.compile and meta tensors run)."""
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        conv = [None if t is None else mode.from_tensor(t) for t in (x, c, initial)]
        return torch.ops.linrec.scan(conv[0], conv[1], conv[2], dim, reverse)


_REFERENCE = _api("reference")
_API_CALLS = [_api("native"), _api("auto"), _REFERENCE]
CALLS = [pytest.param(_op, id="op"), pytest.param(_API_CALLS[0], id="api-native"),
         pytest.param(_API_CALLS[1], id="api-auto"), pytest.param(_REFERENCE, id="api-reference"),
         pytest.param(_fake, id="fake")]


def _t(shape, dtype=torch.float32, device="cpu"):
    return torch.ones(shape, dtype=dtype, device=device)


# (x, coeffs, initial, dim) builders and the message they must give
BAD = {
    "coeffs_not_broadcastable": (lambda d: (_t((2, 5, 3), device=d), _t((2, 5, 4), device=d), None, 1),
                                 r"coeffs of shape .*4.* must be broadcastable to x"),
    "coeffs_too_many_dims": (lambda d: (_t((5, 3), device=d), _t((2, 5, 3), device=d), None, 0),
                             r"coeffs of shape .* must be broadcastable to x"),
    "coeffs_wrong_dtype": (lambda d: (_t((4, 6), device=d), _t((4, 6), torch.float64, d), None, -1),
                           r"coeffs must have the dtype of x"),
    "coeffs_wrong_dtype_bf16": (lambda d: (_t((4, 6), torch.bfloat16, d), _t((4, 6), torch.float16, d), None, -1),
                                r"coeffs must have the dtype of x"),
    "x_int64": (lambda d: (_t((4, 6), torch.int64, d), _t((4, 6), torch.int64, d), None, -1),
                r"x must be float32, float16, bfloat16 or float64, got"),
    "x_int32_coeffs_float": (lambda d: (_t((4, 6), torch.int32, d), _t((4, 6), device=d), None, -1),
                             r"x must be float32, float16, bfloat16 or float64"),
    "x_complex": (lambda d: (_t((4, 6), torch.complex64, d), _t((4, 6), torch.complex64, d), None, -1),
                  r"x must be float32, float16, bfloat16 or float64"),
    "x_0d": (lambda d: (_t((), device=d), _t((), device=d), None, -1), r"x must have at least one dimension"),
    "dim_too_big": (lambda d: (_t((2, 5, 3), device=d), _t((2, 5, 3), device=d), None, 3),
                    r"dim must be in \[-3, 2\] .*got 3"),
    "dim_too_small": (lambda d: (_t((2, 5, 3), device=d), _t((2, 5, 3), device=d), None, -4),
                      r"dim must be in \[-3, 2\] .*got -4"),
    "initial_wrong_shape": (lambda d: (_t((2, 5, 3), device=d), _t((2, 5, 3), device=d), _t((2, 5), device=d), 1),
                            r"initial must have shape .*2, 3.* \(x without dim 1\)"),
    "initial_full_x_shape": (lambda d: (_t((2, 5, 3), device=d), _t((3,), device=d), _t((2, 5, 3), device=d), 1),
                             r"initial must have shape"),
    "initial_wrong_bcast": (lambda d: (_t((4, 6), device=d), _t((4, 6), device=d), _t((6,), device=d), -1),
                            r"initial must have shape"),
    "initial_wrong_dtype": (lambda d: (_t((4, 6), device=d), _t((4, 6), device=d), _t((4,), torch.float64, d), -1),
                            r"initial must have the dtype of x"),
    "initial_int": (lambda d: (_t((4, 6), device=d), _t((4, 6), device=d), _t((4,), torch.int64, d), -1),
                    r"initial must have the dtype of x"),
}

# Mixed float dtypes: the ops raise; torch_linrec.scan follows PyTorch's type promotion instead.
PROMOTED = {"coeffs_wrong_dtype", "coeffs_wrong_dtype_bf16", "initial_wrong_dtype"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("case", list(BAD))
def test_bad_arguments(case, call, device):
    build, match = BAD[case]
    x, c, h0, dim = build(device)
    if case in PROMOTED and call in _API_CALLS:  # the op is strict, torch_linrec.scan promotes
        expect = torch.result_type(x, c) if h0 is None else torch.promote_types(x.dtype, h0.dtype)
        if expect == torch.float64 and device == "cuda":  # the CUDA kernels lack it; the reference runs it
            try:
                out = call(x, c, h0, dim)
            except ValueError as exc:
                assert "float64 is supported on the CPU only" in str(exc)
                return
            assert out.dtype == expect
            return
        assert call(x, c, h0, dim).dtype == expect
        return
    with pytest.raises(ERRORS, match=match):
        call(x, c, h0, dim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(BAD))
def test_bad_arguments_backward_op(case, device):
    build, match = BAD[case]
    x, c, h0, dim = build(device)
    with pytest.raises(ERRORS, match=r"linrec.scan_backward: " + match):
        torch.ops.linrec.scan_backward(x, c, x, h0, dim, False)


def test_meta_tensors_raise():
    x, c = _t((2, 5, 3), device="meta"), _t((4,), device="meta")
    with pytest.raises(ERRORS, match=r"coeffs of shape .* must be broadcastable"):
        torch.ops.linrec.scan(x, c)
    with pytest.raises(ERRORS, match=r"dim must be in"):
        torch.ops.linrec.scan(x, _t((3,), device="meta"), None, 5)


def _backward_bad_calls(x, c, h0, y, check_dtype=True):
    bwd = torch.ops.linrec.scan_backward
    with pytest.raises(ERRORS, match=r"linrec.scan_backward: grad_y must have the shape of y"):
        bwd(y[:, :4], c, y, h0, 1, False)
    with pytest.raises(ERRORS, match=r"linrec.scan_backward: grad_y must have the shape of y"):
        bwd(y.reshape(2, 15), c, y, h0, 1, False)
    with pytest.raises(ERRORS, match=r"linrec.scan_backward: initial must have shape"):
        bwd(y, c, y, h0[:, :2], 1, False)
    with pytest.raises(ERRORS, match=r"linrec.scan_backward: coeffs of shape .* must be broadcastable"):
        bwd(y, c[:2], y, h0, 1, False)
    if check_dtype:
        with pytest.raises(ERRORS, match=r"linrec.scan_backward: grad_y must have the dtype"):
            bwd(y.double(), c, y, h0, 1, False)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_grad_y_checks(device):
    x, c, h0 = _t((2, 5, 3), device=device), _t((3,), device=device), _t((2, 3), device=device)
    y = torch.ops.linrec.scan(x, c, h0, 1, False)
    _backward_bad_calls(x, c, h0, y)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_grad_y_checks_fake(device):
    x, c, h0 = _t((2, 5, 3), device=device), _t((3,), device=device), _t((2, 3), device=device)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        x, c, h0 = (mode.from_tensor(t) for t in (x, c, h0))
        y = torch.ops.linrec.scan(x, c, h0, 1, False)
        _backward_bad_calls(x, c, h0, y, check_dtype=False)  # the fake kernel checks grad_y's shape only


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("call", CALLS)
def test_device_mismatch(call):
    x = _t((4, 6), device="cuda")
    with pytest.raises(ERRORS, match=r"coeffs must be on the device of x"):
        call(x, _t((4, 6)))
    with pytest.raises(ERRORS, match=r"initial must be on the device of x"):
        call(x, _t((4, 6), device="cuda"), _t((4,)))
    x64, c64 = _t((4, 6), torch.float64, "cuda"), _t((4, 6), torch.float64, "cuda")
    if call is _REFERENCE:  # the float64 reference runs anywhere
        assert call(x64, c64).dtype == torch.float64
        return
    with pytest.raises(ERRORS, match=r"float64 is supported on the CPU only"):
        call(x64, c64)


@pytest.mark.cuda
@requires_cuda
def test_backward_device_mismatch():
    x = _t((4, 6), device="cuda")
    with pytest.raises(ERRORS, match=r"grad_y must have the dtype and device of y"):
        torch.ops.linrec.scan_backward(_t((4, 6)), x, x, None, -1, False)
    with pytest.raises(ERRORS, match=r"coeffs must be on the device"):
        torch.ops.linrec.scan_backward(x, _t((4, 6)), x, None, -1, False)


# ----------------------------------------------------------------------------------------------- backends


def test_unknown_backend():
    x, c = _t((4, 6)), _t((4, 6))
    with pytest.raises(ValueError, match=r"backend must be one of .*'native'.*got 'fast'"):
        torch_linrec.scan(x, c, backend="fast")
    with pytest.raises(ValueError, match=r"backend must be one of"):
        with torch_linrec.use_backend("Native"):
            pass
    assert torch_linrec.get_backend() in torch_linrec.BACKENDS  # the failed context left nothing behind


def test_unknown_backend_env_var(monkeypatch):
    x, c = _t((4, 6)), _t((4, 6))
    monkeypatch.setenv("TORCH_LINREC_BACKEND", "bogus")
    with pytest.raises(ValueError, match=r"backend must be one of .*got 'bogus'"):
        torch_linrec.scan(x, c)
    # An explicit backend or a context does not read the variable.
    torch_linrec.scan(x, c, backend="native")
    with torch_linrec.use_backend("native"):
        torch_linrec.scan(x, c)


def test_triton_backend_unavailable_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"backend 'triton' cannot run on cpu"):
        torch_linrec.scan(_t((4, 6)), _t((4, 6)), backend="triton")
