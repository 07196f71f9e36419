"""Robustness of the scan on every backend that runs here: NaN/Inf propagate causally only, results
are bitwise reproducible run to run (on CUDA with broadcast coeffs and look-back plans: under
torch.use_deterministic_algorithms(True)), concurrent calls from Python threads and CUDA streams are
correct, and CUDA graphs (capture/replay, torch.compile mode="reduce-overhead") give eager's bits."""
from __future__ import annotations

import threading
import zlib

import pytest
import torch

import torch_linrec
from conftest import DEVICES, HAS_CUDA
from torch_linrec.dispatch import triton_runs_on

_TRITON_CPU = triton_runs_on(torch.device("cpu"))
BACKENDS = ["native", "reference",
            pytest.param("triton", marks=pytest.mark.skipif(not _TRITON_CPU, reason="needs TRITON_INTERPRET=1"))]


def _gen(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _inputs(shape, device="cpu", dtype=torch.float32, key=()):
    g = _gen(shape, *key)
    x = torch.randn(shape, generator=g).to(device, dtype)
    c = (torch.rand(shape, generator=g) * 0.5 + 0.5).to(device, dtype)
    return x, c


# ----------------------------------------------------------------------------------------------- NaN / Inf


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("where", ["x", "coeffs", "grad_y"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nan_inf_propagate_causally(backend, reverse, where, bad):
    """A NaN/Inf at step l reaches only steps l and later (earlier ones when reverse) in the forward; in
    the backward, one in grad_y at step l reaches grad_x only at l and before (after, when reverse)."""
    length, step = 37, 17
    x, c = _inputs((3, length), key=(backend, reverse, where))
    xb, cb = x.clone().requires_grad_(), c.clone().requires_grad_()
    if where == "x":
        xb.data[:, step] = bad
    elif where == "coeffs":
        cb.data[:, step] = bad
    y = torch_linrec.scan(xb, cb, None, -1, reverse, backend=backend)
    clean = torch_linrec.scan(x, c, None, -1, reverse, backend=backend)
    before = slice(0, step) if not reverse else slice(step + 1, length)
    after = slice(step + 1, length) if not reverse else slice(0, step)
    if where != "grad_y":
        torch.testing.assert_close(y[:, before], clean[:, before], rtol=0, atol=0)
        if where == "x" or bad != bad:  # an infinite coefficient times a finite state may stay finite
            assert not torch.isfinite(y[:, step]).any()
        return
    gy = torch.ones_like(y)
    gy[:, step] = bad
    gx, = torch.autograd.grad(y, xb, gy)
    gx_clean, = torch.autograd.grad(torch_linrec.scan(x.requires_grad_(), c, None, -1, reverse, backend=backend), x,
                                    torch.ones_like(y))
    torch.testing.assert_close(gx[:, after], gx_clean[:, after], rtol=0, atol=0)
    assert not torch.isfinite(gx[:, step]).any()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_nan_inf_stay_in_their_row_cuda(reverse):
    """Many short rows, which the default CUDA plan groups into sequences of several rows
    (cuda/plan_segments.h): an Inf in one row's x and a NaN in another row's coefficients leave every
    other row's output and grad_x bit for bit as without them."""
    rows, length = 65536, 64
    x, c = _inputs((rows, length), "cuda", key=("segments", reverse))
    xb, cb = x.clone(), c.clone()
    last = 0 if reverse else length - 1
    xb[2, last] = float("inf")  # row 2 ends in an Inf state (in either walk direction)
    cb[5, 10] = float("nan")
    poisoned = torch.zeros(rows, dtype=torch.bool, device="cuda")
    poisoned[[2, 5]] = True
    outs = []
    for xi, ci in ((x, c), (xb, cb)):
        xi, ci = xi.clone().requires_grad_(), ci.clone().requires_grad_()
        y = torch_linrec.scan(xi, ci, None, -1, reverse, backend="native")
        gy = torch.ones_like(y)
        gy[9, length - 1 - last] = float("inf")  # row 9's backward walk ends in an Inf state
        outs.append((y.detach(), *torch.autograd.grad(y, (xi,), gy)))
    poisoned[9] = True
    for clean, bad in zip(*outs):
        torch.testing.assert_close(bad[~poisoned], clean[~poisoned], rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------- determinism


def _fwd_bwd(backend, x, c, h0, dim, device):
    x, c, h0 = (t.detach().clone().requires_grad_() for t in (x, c, h0))
    y = torch_linrec.scan(x, c, h0, dim, False, backend=backend)
    g = torch.autograd.grad(y, (x, c, h0), torch.ones_like(y) * 0.5)
    return (y.detach(), *g)


def _cases(device, small=False):
    """(x, coeffs, initial, dim): full coeffs, broadcast (D,) coeffs (CUDA: atomics unless
    deterministic), few long sequences (CUDA: look-back plans unless deterministic). ``small``: sizes
    for the Python loop and the Triton interpreter."""
    sizes = [((2, 24, 8), None, 1), ((2, 24, 8), (8,), 1), ((2, 100), (2, 1), -1)] if small else \
        [((4, 300, 64), None, 1), ((4, 300, 64), (64,), 1), ((2, 20000), (2, 1), -1)]
    for shape, cshape, dim in sizes:
        x, c = _inputs(shape, device, key=("det",))
        if cshape is not None:
            c = c.reshape(-1)[: torch.Size(cshape).numel()].reshape(cshape)
        bshape = [s for i, s in enumerate(shape) if i != dim % len(shape)]
        yield x, c, torch.randn(bshape, generator=_gen("h0")).to(device), dim


@pytest.mark.parametrize("backend", BACKENDS)
def test_deterministic_cpu(backend):
    for x, c, h0, dim in _cases("cpu", small=backend != "native"):
        first, second = _fwd_bwd(backend, x, c, h0, dim, "cpu"), _fwd_bwd(backend, x, c, h0, dim, "cpu")
        for a, b in zip(first, second):
            assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["native", "triton"])
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and torch_linrec's CUDA kernels")
def test_deterministic_cuda(backend):
    """Under torch.use_deterministic_algorithms(True): no atomics for broadcast coeffs, no look-back."""
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for x, c, h0, dim in _cases("cuda"):
            runs = [_fwd_bwd(backend, x, c, h0, dim, "cuda") for _ in range(3)]
            for other in runs[1:]:
                for a, b in zip(runs[0], other):
                    assert torch.equal(a, b)
            ref = _fwd_bwd("native", x.cpu(), c.cpu(), h0.cpu(), dim, "cpu")
            for a, b in zip(runs[0], ref):
                torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)
    finally:
        torch.use_deterministic_algorithms(prev)


def test_deterministic_mode_cpu_runs():
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        x, c, h0, dim = next(_cases("cpu"))
        first, second = _fwd_bwd("native", x, c[:1], h0, dim, "cpu"), _fwd_bwd("native", x, c[:1], h0, dim, "cpu")
    finally:
        torch.use_deterministic_algorithms(prev)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------------------------- concurrency


def _work(device, k):
    shape = [(3, 257), (2, 65, 8), (5, 1000), (1, 4, 33, 3)][k % 4]
    dim = 1 if len(shape) > 2 else -1
    x, c = _inputs(tuple(shape), device, key=("thr", k))
    x.requires_grad_()
    y = torch_linrec.scan(x, c, None, dim, k % 2 == 1)
    gx, = torch.autograd.grad(y, x, torch.ones_like(y))
    return y.detach(), gx


@pytest.mark.parametrize("device", DEVICES)
def test_threads(device):
    """8 Python threads x 20 calls each (forward and backward) give the sequential results."""
    expect = {k: _work(device, k) for k in range(8)}
    errors, results = [], {}

    def run(k):
        try:
            for _ in range(20):
                out = _work(device, k)
            results[k] = out
        except Exception as exc:  # reported below
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k, (y, gx) in expect.items():
        assert torch.equal(results[k][0], y) and torch.equal(results[k][1], gx)


@pytest.mark.parametrize("backend", ["native", "triton"])
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and torch_linrec's CUDA kernels")
def test_cuda_streams(backend):
    """Scans on 4 CUDA streams at once (look-back plans included) match the default stream's."""
    cases = [_inputs(s, "cuda", key=("stream", i)) for i, s in enumerate([(2, 1 << 16), (64, 4096), (8, 512, 64),
                                                                              (1, 1 << 18)])]
    expect = [torch_linrec.scan(x, c, backend=backend) for x, c in cases]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in cases]
    outs = []
    for s, (x, c) in zip(streams, cases):
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            outs.append([torch_linrec.scan(x, c, backend=backend) for _ in range(5)])
    torch.cuda.synchronize()
    for e, os_ in zip(expect, outs):
        for o in os_:
            assert torch.equal(o, e)


# ----------------------------------------------------------------------------------------------- CUDA graphs


@pytest.mark.parametrize("backend", ["native", "triton", "auto"])
@pytest.mark.parametrize("shape,cshape,dim", [((8, 1024), None, -1), ((2, 256, 64), (64,), 1), ((2, 1 << 17), None, -1)],
                         ids=["NL", "BLD-bcast", "few-long"])
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and torch_linrec's CUDA kernels")
def test_cuda_graph_capture_replay(backend, shape, cshape, dim):
    """Forward and forward+backward captured in a CUDA graph replay to eager's bits (new inputs copied in).
    Broadcast coeffs run deterministically: their gradient otherwise sums with atomics in any order."""
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(cshape is not None)
    try:
        _graph_capture_replay(backend, shape, cshape, dim)
    finally:
        torch.use_deterministic_algorithms(prev)


def _graph_capture_replay(backend, shape, cshape, dim):
    x, c = _inputs(shape, "cuda", key=("graph",))
    if cshape is not None:
        c = c.reshape(-1)[:64].reshape(cshape)
    x.requires_grad_()
    c.requires_grad_()

    def step():
        y = torch_linrec.scan(x, c, None, dim, False, backend=backend)
        gx, gc = torch.autograd.grad(y, (x, c), torch.ones_like(y))
        return y, gx, gc
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up: Triton compiles, allocator pools
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    # Replayed twice with new inputs: a look-back status or ticket counter left by one replay must
    # not reach the next (a captured launch takes a fresh workspace, zeroed in the graph).
    for key in ("new", "newer"):
        with torch.no_grad():
            x.copy_(torch.randn(shape, generator=_gen(key)).cuda())
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        for a, b in zip(static, eager):
            assert torch.equal(a, b)
    fwd_graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(fwd_graph):
        y_static = torch_linrec.scan(x, c, None, dim, False, backend=backend)
    for key in ("fwd", "fwd again"):  # one captured launch: a used workspace would show on the second
        with torch.no_grad():
            x.copy_(torch.randn(shape, generator=_gen(key)).cuda())
        fwd_graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            assert torch.equal(y_static, torch_linrec.scan(x, c, None, dim, False, backend=backend))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and torch_linrec's CUDA kernels")
def test_compile_reduce_overhead_training():
    """A minGRU-style model trained with torch.compile(mode="reduce-overhead") (CUDA graphs): losses
    match the eager model's step by step."""
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self, d=32):
            super().__init__()
            self.z, self.h = torch.nn.Linear(d, d), torch.nn.Linear(d, d)

        def forward(self, x):
            z = torch.sigmoid(self.z(x))
            return torch_linrec.scan(z * self.h(x), 1 - z, dim=1).square().mean()

    eager = Model().cuda()
    compiled_model = Model().cuda()
    compiled_model.load_state_dict(eager.state_dict())
    step = torch.compile(compiled_model, mode="reduce-overhead", fullgraph=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, compiled_model)]
    x = torch.randn(4, 128, 32, device="cuda")
    for _ in range(6):
        losses = []
        for model, opt in zip((eager, step), opts):
            opt.zero_grad()
            loss = model(x)
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)

