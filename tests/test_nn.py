"""torch_linrec.nn: every layer's parallel forward equals step-by-step decoding and chunked forward
(float64 on the CPU; fp32/bf16 tolerance on CUDA), gradients equal those of the step loop, state
continuation, Mamba's mamba_ssm parameter names and its plain-PyTorch selective scan, and
torch.compile(fullgraph=True, dynamic=True) with no graph breaks for forward+backward and for a
decode loop.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

from conftest import CUDA_MARKS
from torch_linrec.nn import GatedSSM, Mamba, MinGRU, MinLSTM
from torch_linrec.nn.reference import plain_mamba, selective_scan_chunked, step_loop

D_MODEL = 6

LAYERS = {
    "mingru-linear": lambda **kw: MinGRU(D_MODEL, 10, mode="linear", **kw),
    "mingru-log": lambda **kw: MinGRU(D_MODEL, 10, mode="log", **kw),
    "minlstm-linear": lambda **kw: MinLSTM(D_MODEL, 10, mode="linear", **kw),
    "minlstm-log": lambda **kw: MinLSTM(D_MODEL, 10, mode="log", **kw),
    "mamba": lambda **kw: Mamba(D_MODEL, d_state=4, d_conv=3, **kw),
    "gatedssm": lambda **kw: GatedSSM(D_MODEL, 8, **kw),
}


def make(name, device="cpu", dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    layer = LAYERS[name]().to(device, dtype)
    return layer


def flat(state) -> torch.Tensor:
    return torch.cat([t.reshape(-1).double() for t in (state if isinstance(state, tuple) else (state,))])


def warm_state(layer, batch, device="cpu", dtype=torch.float64):
    """A non-zero state (valid for every mode: the final state of a short random prefix)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(batch, 3, D_MODEL, generator=g, dtype=torch.float64).to(device, dtype)
    with torch.no_grad():
        return layer(x, return_state=True)[1]


@pytest.mark.parametrize("name", LAYERS)
def test_parallel_step_chunked_float64(name):
    layer = make(name)
    x = torch.randn(2, 17, D_MODEL, dtype=torch.float64)
    for state in (None, warm_state(layer, 2)):
        y, last = layer(x, state, return_state=True)
        y_step, last_step = step_loop(layer, x, state, return_state=True)
        torch.testing.assert_close(y, y_step, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(flat(last), flat(last_step), rtol=1e-10, atol=1e-12)
        ys, s = [], state
        for a, b in ((0, 5), (5, 6), (6, 13), (13, 17)):  # chunks of 5, 1, 7, 4
            y_c, s = layer(x[:, a:b], s, return_state=True)
            ys.append(y_c)
        torch.testing.assert_close(torch.cat(ys, 1), y, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(flat(s), flat(last), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(layer(x, state), y)  # return_state=False: the output alone


@pytest.mark.parametrize("name", LAYERS)
def test_empty_and_single_step(name):
    layer = make(name)
    state = warm_state(layer, 3)
    y, s = layer(torch.randn(3, 0, D_MODEL, dtype=torch.float64), state, return_state=True)
    assert y.shape == (3, 0, D_MODEL)
    torch.testing.assert_close(flat(s), flat(state))
    x = torch.randn(3, 1, D_MODEL, dtype=torch.float64)
    y1, s1 = layer(x, state, return_state=True)
    y_t, s_t = layer.step(x[:, 0], state)
    torch.testing.assert_close(y1[:, 0], y_t)
    torch.testing.assert_close(flat(s1), flat(s_t))


@pytest.mark.parametrize("name", LAYERS)
def test_gradients_match_step_loop(name):
    """Gradients of input, initial state and every parameter equal those of the step loop (plain
    PyTorch autograd through the recurrence)."""
    layer = make(name)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64, requires_grad=True)
    state = warm_state(layer, 2)
    state = tuple(t.detach().requires_grad_() for t in state) if isinstance(state, tuple) else \
        state.detach().requires_grad_()
    states = state if isinstance(state, tuple) else (state,)
    leaves = [x, *states, *layer.parameters()]
    gy = torch.randn(2, 9, D_MODEL, dtype=torch.float64)

    def grads(fn):
        y, last = fn(layer, x, state, return_state=True)
        loss = (y * gy).sum() + flat(last).square().sum()
        return torch.autograd.grad(loss, leaves)
    for a, b in zip(grads(lambda m, *args, **kw: m(*args, **kw)), grads(step_loop)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_mamba_state_dict_names():
    """mamba_ssm's Mamba(d_model=16) parameter names and shapes (d_inner 32, dt_rank 1, N 16, conv 4)."""
    expect = {"in_proj.weight": (64, 16), "conv1d.weight": (32, 1, 4), "conv1d.bias": (32,),
              "x_proj.weight": (33, 32), "dt_proj.weight": (32, 1), "dt_proj.bias": (32,), "A_log": (32, 16),
              "D": (32,), "out_proj.weight": (16, 32)}
    layer = Mamba(16)
    assert {k: tuple(v.shape) for k, v in layer.state_dict().items()} == expect
    assert layer.A_log.dtype == torch.float32 and torch.allclose(layer.A_log[3].exp(), torch.arange(1., 17.))
    other = Mamba(16)
    other.load_state_dict(layer.state_dict())
    x = torch.randn(1, 5, 16)
    torch.testing.assert_close(other(x), layer(x))
    with pytest.raises(ValueError, match="dt_init"):
        Mamba(16, dt_init="bad")


def test_plain_selective_scan_matches_fused():
    layer = make("mamba")
    x = torch.randn(2, 70, D_MODEL, dtype=torch.float64)
    state = warm_state(layer, 2)
    y, s = layer(x, state, return_state=True)
    y_p, s_p = plain_mamba(layer)(x, state, return_state=True)
    torch.testing.assert_close(y_p, y)
    torch.testing.assert_close(flat(s_p), flat(s))
    assert selective_scan_chunked is plain_mamba(layer).scan_impl


def test_errors():
    with pytest.raises(ValueError, match="mode must be one of"):
        MinGRU(4, mode="exp")
    with pytest.raises(ValueError, match="d_model and d_hidden must be positive"):
        MinLSTM(0)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["mingru-log", "minlstm-linear", "mamba", "gatedssm"])
def test_compile_forward_backward_and_decode(name, fresh_dynamo):
    """fullgraph=True fails on any graph break; one frame serves two lengths (dynamic=True)."""
    layer = make(name, dtype=torch.float32)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")

    def train_step(x, state):
        y, last = layer(x, state, return_state=True)
        return y.square().mean() + flat(last).float().mean()
    compiled = torch.compile(train_step, backend=counter, fullgraph=True, dynamic=True)
    for length in (7, 12):
        x = torch.randn(2, length, D_MODEL)
        state = warm_state(layer, 2, dtype=torch.float32)
        expect = torch.autograd.grad(train_step(x, state), list(layer.parameters()))
        got = torch.autograd.grad(compiled(x, state), list(layer.parameters()))
        for a, b in zip(got, expect):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1

    decode_counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    step = torch.compile(layer.step, backend=decode_counter, fullgraph=True, dynamic=True)
    with torch.no_grad():
        x = torch.randn(2, 5, D_MODEL)
        state = s_ref = layer.allocate_state(2)
        for t in range(5):
            y, state = step(x[:, t], state)
            y_ref, s_ref = layer.step(x[:, t], s_ref)
            torch.testing.assert_close(y, y_ref)
    assert decode_counter.frame_count == 1


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA_MARKS)])
def test_cuda_parallel_step_chunked(name, device, dtype, tol):
    layer = make(name, device, dtype)
    x = torch.randn(2, 300, D_MODEL, device=device, dtype=dtype)
    y, last = layer(x, return_state=True)
    ref = make(name)  # the float64 CPU layer with the same weights
    ref.load_state_dict({k: v.double().cpu() for k, v in layer.state_dict().items()})
    y_ref = ref(x.double().cpu())
    scale = y_ref.abs().max().clamp_min(1)
    assert ((y.double().cpu() - y_ref).abs().max() / scale).item() < tol
    y_step = step_loop(layer, x[:, :40])
    assert ((y_step.double().cpu() - y_ref[:, :40]).abs().max() / scale).item() < tol
    y1, s1 = layer(x[:, :100], return_state=True)
    y2 = layer(x[:, 100:], s1)
    assert ((torch.cat([y1, y2], 1).double().cpu() - y_ref).abs().max() / scale).item() < tol
    loss = layer(x).float().square().mean()
    loss.backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in layer.parameters())
