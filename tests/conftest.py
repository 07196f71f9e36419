"""Shared fixtures and parameters of the native-op tests (test_scan, test_autograd, test_compile,
test_errors, test_cuda). Sample inputs live in tests/samples.py.

Devices: "cpu" always; "cuda" only where a GPU is visible and torch_linrec was built with its CUDA
kernels (``torch_linrec._library.HAS_CUDA_KERNELS``); CUDA params carry the ``cuda`` mark.
"""
from __future__ import annotations

import pytest
import torch

import torch_linrec  # noqa: F401  (registers the ops)
from torch_linrec._library import HAS_CUDA_KERNELS
from torch_linrec.dispatch import HAS_TRITON

if HAS_TRITON:  # the tests call torch.ops.linrec.scan_triton directly (import torch_linrec loads it lazily)
    import torch_linrec.linrec.triton  # noqa: F401

HAS_CUDA = torch.cuda.is_available() and HAS_CUDA_KERNELS

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and torch_linrec's CUDA kernels")
CUDA_MARKS = (pytest.mark.cuda, requires_cuda)

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=CUDA_MARKS)]

DTYPES = {
    "cpu": (torch.float64, torch.float32, torch.float16, torch.bfloat16),
    "cuda": (torch.float32, torch.float16, torch.bfloat16),  # float64 is CPU only
}

_DT_ID = {torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def dtype_id(dtype: torch.dtype) -> str:
    return _DT_ID[dtype]


def device_dtype_params(dtypes=None) -> list:
    """``pytest.param((device, dtype))`` for every supported pair (cuda pairs marked)."""
    out = []
    for dev in ("cpu", "cuda"):
        for dt in DTYPES[dev]:
            if dtypes is not None and dt not in dtypes:
                continue
            marks = CUDA_MARKS if dev == "cuda" else ()
            out.append(pytest.param(dev, dt, id=f"{dev}-{dtype_id(dt)}", marks=marks))
    return out


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """"cpu", and "cuda" where the CUDA kernels can run."""
    return request.param



@pytest.fixture
def no_tuned_configs(monkeypatch):
    """No tuned cache entries: config "auto" runs the defaults (on CUDA a shipped cache would pick
    per-bucket configs, whose results may differ from the defaults' in the last bits)."""
    import torch_linrec.dispatch as dispatch
    dispatch.clear_memo()
    monkeypatch.setattr(dispatch, "_tuned_table", lambda index: {})
    yield
    dispatch.clear_memo()
