"""torch.compile of a model built on torch_linrec.scan (native backend): same results as eager,
no graph breaks, one frame for several sequence lengths with dynamic=True; CUDA graphs on CUDA.

CPU inductor compiles take ~10-30 s each on a small machine, so the CPU tests compile few graphs.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
from torch import nn

import torch_linrec
from conftest import CUDA_MARKS, DEVICES


class MinGRU(nn.Module):
    """minGRU (Feng et al., "Were RNNs all we needed?", 2024): h_t = (1 - z_t) h_{t-1} + z_t h~_t."""

    def __init__(self, d_in: int, d_hidden: int, reverse: bool = False, backend: str = "native"):
        super().__init__()
        self.backend = backend
        self.to_z = nn.Linear(d_in, d_hidden)
        self.to_h = nn.Linear(d_in, d_hidden)
        self.out = nn.Linear(d_hidden, d_in)
        self.reverse = reverse

    def forward(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:  # x: (B, L, d_in)
        z = torch.sigmoid(self.to_z(x))
        h = torch_linrec.scan(z * self.to_h(x), 1 - z, h0, dim=1, reverse=self.reverse, backend=self.backend)
        return x + self.out(torch.nn.functional.gelu(h))


def _model_and_inputs(device, L, seed=0, B=2, d_in=8, d_hidden=16, backend="native"):
    torch.manual_seed(seed)
    model = MinGRU(d_in, d_hidden, backend=backend).to(device)
    x = torch.randn(B, L, d_in, device=device, requires_grad=True)
    h0 = torch.randn(B, d_hidden, device=device, requires_grad=True)
    return model, x, h0


def _run(fn, model, x, h0):
    """Output and gradients w.r.t. x, h0 and every parameter of ``fn(x, h0)``."""
    model.zero_grad(set_to_none=True)
    x.grad = h0.grad = None
    out = fn(x, h0)
    (out.square().mean() + out.sum()).backward()
    return [out.detach().clone()] + [t.grad.clone() for t in (x, h0)] + [p.grad.clone() for p in model.parameters()]


def _assert_same(got, expect, rtol=1e-4, atol=1e-5):
    assert len(got) == len(expect)
    for i, (a, b) in enumerate(zip(got, expect)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"tensor {i}: {m}")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_matches_eager(device):
    model, x, h0 = _model_and_inputs(device, L=11)
    expect = _run(model, model, x, h0)
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    got = _run(compiled, model, x, h0)
    _assert_same(got, expect)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_dynamic_one_frame_no_graph_break(device):
    # Lengths differ from B, d_in and d_hidden: duck sizing would give equal sizes one symbol.
    model, x, h0 = _model_and_inputs(device, L=9)
    # No graph break (explain traces with dynamo only, cheap).
    explanation = torch._dynamo.explain(model)(x, h0)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    torch._dynamo.reset()

    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
    for L in (9, 13):
        _, x, h0 = _model_and_inputs(device, L=L, seed=L)
        expect = _run(model, model, x, h0)
        got = _run(compiled, model, x, h0)
        _assert_same(got, expect)
    assert counter.frame_count == 1, f"compiled {counter.frame_count} frames for 2 sequence lengths"
    assert counter.op_count > 0


@pytest.mark.parametrize("device", DEVICES)
def test_compile_raw_op_aot_eager_dynamic(device):
    """The raw op with its keyword arguments and broadcast coeffs/initial under AOT autograd
    (aot_eager: no inductor compile), dynamic shapes, reverse both ways, forward and backward."""
    def f(x, c, h0, reverse: bool):
        return torch.ops.linrec.scan(x, c, initial=h0, dim=-2, reverse=reverse).sin()

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    cf = torch.compile(f, fullgraph=True, dynamic=True, backend=counter)
    for L in (5, 9):
        g = torch.Generator().manual_seed(L)
        x = torch.randn(3, L, 4, generator=g).to(device).requires_grad_()
        c = (torch.rand(3, 1, 4, generator=g) * 0.5 + 0.5).to(device).requires_grad_()
        h0 = torch.randn(4, generator=g).to(device).requires_grad_()
        for reverse in (False, True):
            outs = []
            for fn in (f, cf):
                for t in (x, c, h0):
                    t.grad = None
                y = fn(x, c, h0, reverse)
                y.sum().backward()
                outs.append([y.detach(), x.grad, c.grad, h0.grad])
            _assert_same(outs[1], outs[0], rtol=1e-6, atol=1e-6)
    assert counter.frame_count == 2, "one frame per value of `reverse`, none per length"


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA_MARKS)])
def test_compile_reduce_overhead_cuda(device):
    model, x, h0 = _model_and_inputs(device, L=37)
    with torch.no_grad():
        expect = model(x, h0)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for step in range(4):  # warm-up runs, then CUDA graph replays
            x2 = x.detach() + step
            got = compiled(x2, h0)
            torch.testing.assert_close(got, model(x2, h0), rtol=1e-4, atol=1e-5)
            got = got.clone()  # cudagraph outputs are overwritten by the next replay
    torch.testing.assert_close(compiled(x.detach(), h0).clone(), expect, rtol=1e-4, atol=1e-5)
    # Training steps under CUDA graphs, forward and backward.
    expect_train = _run(model, model, x, h0)
    for _ in range(3):
        torch.compiler.cudagraph_mark_step_begin()
        got_train = _run(compiled, model, x, h0)
    _assert_same(got_train, expect_train)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA_MARKS)])
def test_compile_auto_applies_the_tuned_cache(device, monkeypatch):
    """Backend "auto" under torch.compile(dynamic=True): one frame, no graph break, and each call
    runs its bucket's tuned choice (here a table naming Triton configs for one length's buckets:
    the Triton launches are counted; a length that is a multiple of 16, where Triton choices apply),
    resolved by the op at run time."""
    pytest.importorskip("triton")
    from torch_linrec import dispatch
    from torch_linrec.linrec.triton import ops as triton_ops

    launches = []
    real = triton_ops._launch_forward
    monkeypatch.setattr(triton_ops, "_launch_forward", lambda *a: launches.append(a[-1]) or real(*a))
    monkeypatch.setattr(dispatch, "_tuned_table", lambda index: {
        dispatch.bucket_key("scan", d, torch.float32, "strided", 304, 2 * 16): "triton.t1024" for d in ("fwd", "bwd")})
    dispatch.clear_memo()
    try:
        counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
        model, _, _ = _model_and_inputs(device, L=9, backend="auto")
        compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
        for L, tuned in ((9, False), (304, True), (13, False)):
            _, x, h0 = _model_and_inputs(device, L=L, seed=L, backend="auto")
            launches.clear()
            got = _run(compiled, model, x, h0)
            assert launches == ([(1024, 2048)] if tuned else []), L
            _assert_same(got, _run(model, model, x, h0))
        assert counter.frame_count == 1, f"compiled {counter.frame_count} frames for 3 sequence lengths"
    finally:
        dispatch.clear_memo()
