"""Beyond first order: double backward (gradgradcheck in float64 on every backend, the scan_backward op's
own autograd) and torch.func (grad, vjp, jvp, jacrev, jacfwd, hessian, vmap) against the float64
reference, plus the structural check that plain calls never take the functorch route."""
from __future__ import annotations

import zlib

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import torch_linrec
from conftest import DEVICES
from torch_linrec.dispatch import triton_runs_on
from torch_linrec.linrec import functorch as linrec_functorch

F64 = torch.float64
_HAS_TRITON_CPU = triton_runs_on(torch.device("cpu"))
BACKENDS = ["native", "auto", "reference",
            pytest.param("triton", marks=pytest.mark.skipif(not _HAS_TRITON_CPU, reason="needs TRITON_INTERPRET=1"))]


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _x(shape, g, rg=True, device="cpu"):
    return torch.randn(shape, generator=g, dtype=F64).to(device).requires_grad_(rg)


def _c(shape, g, rg=True, device="cpu"):
    return (torch.rand(shape, generator=g, dtype=F64) * 0.5 + 0.5).to(device).requires_grad_(rg)


def _case(coeffs_kind: str, initial_kind: str, shape, dim: int, g):
    """x, coeffs (full, time-invariant (D,), (B,1,D) or a stride-0 expand), initial (none, full, broadcast)."""
    x = _x(shape, g)
    d = dim % len(shape)
    if coeffs_kind == "full":
        c = _c(shape, g)
    elif coeffs_kind == "D":
        c = _c(shape[-1:], g)
    elif coeffs_kind == "B1D":
        c = _c(tuple(1 if i == d else s for i, s in enumerate(shape)), g)
    else:  # "expand": a stride-0 view of a leaf, so gradcheck perturbs the leaf
        leaf = _c(shape[-1:], g)
        c = leaf.expand(shape)
        c.leaf = leaf
    bshape = [s for i, s in enumerate(shape) if i != d]
    h0 = {"none": None, "full": _x(bshape, g) if bshape else None, "bcast": _x(bshape[-1:], g) if bshape else None}
    return x, c, h0[initial_kind]


def _inputs(x, c, h0):
    """The leaves gradgradcheck perturbs (the leaf behind an expanded coeffs)."""
    return [x, getattr(c, "leaf", c)] + ([h0] if h0 is not None else [])


def _fn(backend, c, h0, dim, reverse):
    expand = c.shape if hasattr(c, "leaf") else None

    def f(x, cc, *h):
        cc = cc.expand(expand) if expand is not None else cc
        return torch_linrec.scan(x, cc, h[0] if h else None, dim, reverse, backend=backend)
    return f


# ----------------------------------------------------------------------------------------------- double backward


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("dim", [1, -1])
@pytest.mark.parametrize("coeffs_kind", ["full", "D", "B1D", "expand"])
@pytest.mark.parametrize("initial_kind", ["none", "full", "bcast"])
def test_gradgradcheck_native(initial_kind, coeffs_kind, dim, reverse):
    g = _gen(initial_kind, coeffs_kind, dim, reverse)
    x, c, h0 = _case(coeffs_kind, initial_kind, (2, 5, 3), dim, g)
    assert gradgradcheck(_fn("native", c, h0, dim, reverse), _inputs(x, c, h0), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", ["native", "auto", "reference"])  # Triton (no float64): second order below
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((3, 6), -1), ((2, 4, 3), 1), ((2, 3, 4, 2), 2)],
                         ids=["1d", "NL", "BLD", "4d"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_gradgradcheck_backends(backend, shape, dim, reverse):
    g = _gen(backend, shape, dim, reverse)
    x, c, h0 = _case("full" if len(shape) < 3 else "B1D", "full" if len(shape) > 1 else "none", shape, dim, g)
    assert gradgradcheck(_fn(backend, c, h0, dim, reverse), _inputs(x, c, h0), eps=1e-6, atol=1e-6, rtol=1e-5)


def _second_order(backend, dtype, dim, reverse):
    """Second derivatives of sum(grad_coeffs^2 + grad_x^2 + grad_initial^2) w.r.t. every input.
    ``"native+triton-bwd"``: the native forward with a Triton backward_config (C++ autograd, Triton scan)."""
    g = _gen("so", dim, reverse)
    x, c, h0 = (t.detach().to(dtype).requires_grad_() for t in _case("full", "full", (2, 6, 3), dim, g))
    kw = {"backend": backend} if backend != "native+triton-bwd" else {"config": "native", "backward_config": "triton"}
    y = torch_linrec.scan(x, c, h0, dim, reverse, **kw)
    gx, gc, gh = torch.autograd.grad((y ** 2).sum(), (x, c, h0), create_graph=True)
    return torch.autograd.grad((gc ** 2).sum() + (gx ** 2).sum() + (gh ** 2).sum(), (x, c, h0))


@pytest.mark.parametrize("backend", BACKENDS + [pytest.param("native+triton-bwd", marks=BACKENDS[-1].marks)])
@pytest.mark.parametrize("dim,reverse", [(1, False), (-1, True)])
def test_second_order_matches_reference(backend, dim, reverse):
    """The issue's reproduction: second-order gradients were zeros; now they match the reference's."""
    dtype = torch.float32 if "triton" in backend else F64
    got = _second_order(backend, dtype, dim, reverse)
    ref = _second_order("reference", F64, dim, reverse)
    for a, b in zip(got, ref):
        assert b.abs().max() > 1.0  # not trivially zero
        torch.testing.assert_close(a.double(), b, rtol=1e-4 if dtype == torch.float32 else 1e-9, atol=1e-4)


def test_issue_reproduction():
    gen = _gen("issue")
    x = torch.randn(2, 6, dtype=F64, generator=gen, requires_grad=True)
    c = torch.rand(2, 6, dtype=F64, generator=gen, requires_grad=True)
    out = {}
    for backend in ("native", "reference"):
        gx, gc = torch.autograd.grad((torch_linrec.scan(x, c, backend=backend) ** 2).sum(), (x, c), create_graph=True)
        out[backend] = torch.autograd.grad((gc ** 2).sum(), (x, c))
    for a, b in zip(out["native"], out["reference"]):
        assert b.abs().max() > 1.0
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_create_graph_first_order_unchanged(device):
    """With create_graph the first-order gradients are those of the fused kernel path."""
    g = _gen("cg")
    dtype = F64 if device == "cpu" else torch.float32
    x, c, h0 = (t.detach().to(device, dtype).requires_grad_() for t in _case("B1D", "bcast", (2, 9, 4), 1, g))
    plain = torch.autograd.grad(torch.ops.linrec.scan(x, c, h0, 1, True).square().sum(), (x, c, h0))
    graph = torch.autograd.grad(torch.ops.linrec.scan(x, c, h0, 1, True).square().sum(), (x, c, h0),
                                create_graph=True)
    for a, b in zip(plain, graph):
        assert b.requires_grad
        torch.testing.assert_close(a, b.detach())


def test_scan_backward_op_is_differentiable():
    """linrec::scan_backward has an autograd of its own (direct calls), gradchecked in every input."""
    g = _gen("sbw")
    x, c, h0 = _case("full", "full", (2, 5, 3), 1, g)
    y = torch.ops.linrec.scan(x, c, h0, 1, False).detach().requires_grad_()
    gy = _x(y.shape, g)
    for reverse in (False, True):
        assert gradcheck(lambda gy, c, y, h0: torch.ops.linrec.scan_backward(gy, c, y, h0, 1, reverse),
                         (gy, c, y, h0), eps=1e-6, atol=1e-8)


def test_selective_scan_double_backward_raises():
    """The fused selective scan has first-order gradients only: double backward raises, clearly."""
    g = _gen("ss")
    b, d, n, length = 1, 2, 3, 4
    u, delta = _x((b, d, length), g), _x((b, d, length), g)
    A, B, C = -_c((d, n), g), _x((b, n, length), g), _x((b, n, length), g)
    out, _ = torch.ops.linrec.selective_scan(u, delta, A, B, C)
    grads = torch.autograd.grad(out.square().sum(), (u, delta), create_graph=True)
    with pytest.raises(RuntimeError, match=r"second-order gradients \(double backward\) are not supported"):
        torch.autograd.grad(grads[0].sum(), u)


# ----------------------------------------------------------------------------------------------- torch.func

FUNC_OPS = [pytest.param("native", id="native"),
            pytest.param("triton", id="triton",
                         marks=pytest.mark.skipif(not _HAS_TRITON_CPU, reason="needs TRITON_INTERPRET=1"))]


def _op(name):
    return torch.ops.linrec.scan if name == "native" else torch.ops.linrec.scan_triton


def _func_case(name, seed):
    dtype = F64 if name == "native" else torch.float32
    g = _gen("func", seed)
    x, c, h0 = (t.detach().to(dtype) for t in _case("full", "full", (2, 5, 3), 1, g))
    return x, c, h0, dtype


def _tol(dtype):
    return {"rtol": 1e-9, "atol": 1e-9} if dtype == F64 else {"rtol": 1e-4, "atol": 1e-4}


def _ref(x, c, h0, dim=1, reverse=False):
    return torch_linrec.scan_ref(x.double(), c.double(), None if h0 is None else h0.double(), dim, reverse)


@pytest.mark.parametrize("name", FUNC_OPS)
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_func_grad_vjp_hessian(name, reverse):
    x, c, h0, dtype = _func_case(name, reverse)
    op = _op(name)

    def loss(f):
        return lambda x, c, h0: (f(x, c, h0, 1, reverse) ** 2).sum()
    got = torch.func.grad(loss(op), argnums=(0, 1, 2))(x, c, h0)
    ref = torch.func.grad(loss(_ref), argnums=(0, 1, 2))(x, c, h0)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b.double(), **_tol(dtype))
    y, vjp = torch.func.vjp(lambda x, c: op(x, c, h0, 1, reverse), x, c)
    cot = torch.ones_like(y)
    for a, b in zip(vjp(cot), torch.func.vjp(lambda x, c: _ref(x, c, h0, 1, reverse), x, c)[1](cot.double())):
        torch.testing.assert_close(a.double(), b.double(), **_tol(dtype))
    small = (x[:1, :3, :2], c[:1, :3, :2], h0[:1, :2])
    hess = torch.func.hessian(loss(op), argnums=1)(*small)
    hess_ref = torch.func.hessian(loss(_ref), argnums=1)(*small)
    torch.testing.assert_close(hess.double(), hess_ref.double(), **_tol(dtype))


@pytest.mark.parametrize("name", FUNC_OPS)
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_func_jvp_jacfwd_jacrev(name, reverse):
    """Forward mode: the tangent of the recurrence is a scan of dx + dc * y[l-1] from d_initial."""
    x, c, h0, dtype = _func_case(name, 10 + reverse)
    op = _op(name)
    g = _gen("tan", name, reverse)
    tangents = tuple(torch.randn(t.shape, generator=g, dtype=F64).to(dtype) for t in (x, c, h0))
    y, dy = torch.func.jvp(lambda x, c, h0: op(x, c, h0, 1, reverse), (x, c, h0), tangents)
    y_ref, dy_ref = torch.func.jvp(lambda x, c, h0: _ref(x, c, h0, 1, reverse), (x, c, h0), tangents)
    torch.testing.assert_close(dy.double(), dy_ref.double(), **_tol(dtype))
    small = c[:1, :4, :2]
    jf = torch.func.jacfwd(lambda c: op(x[:1, :4, :2], c, h0[:1, :2], 1, reverse))(small)
    jr = torch.func.jacrev(lambda c: op(x[:1, :4, :2], c, h0[:1, :2], 1, reverse))(small)
    jref = torch.func.jacrev(lambda c: _ref(x[:1, :4, :2], c, h0[:1, :2], 1, reverse))(small)
    torch.testing.assert_close(jf.double(), jref.double(), **_tol(dtype))
    torch.testing.assert_close(jr.double(), jref.double(), **_tol(dtype))


def test_func_jvp_time_invariant_coeffs_no_initial():
    x, c = _x((3, 7), _gen("ti"), rg=False), _c((1,), _gen("ti2"), rg=False)
    tangents = (torch.zeros_like(x), torch.ones_like(c))
    _, dy = torch.func.jvp(lambda x, c: torch.ops.linrec.scan(x, c), (x, c), tangents)
    _, dy_ref = torch.func.jvp(lambda x, c: torch_linrec.scan_ref(x, c), (x, c), tangents)
    torch.testing.assert_close(dy, dy_ref)


@pytest.mark.parametrize("name", FUNC_OPS)
@pytest.mark.parametrize("in_dims", [(0, 0, 0), (1, None, None), (None, 0, None), (None, None, 0), (2, 0, 1)],
                         ids=["all0", "x1", "coeffs", "initial", "mixed"])
def test_func_vmap(name, in_dims):
    """vmap runs the op once (the batch dim becomes a leading batch dim), matching a per-sample loop."""
    dtype = F64 if name == "native" else torch.float32
    g = _gen("vmap", in_dims)
    n, per = 4, (3, 5)  # per-sample x (3, 5), scanned dim -1; coeffs per sample (5,), initial (3,)
    shapes = {0: per, 1: (5,), 2: (3,)}
    args = []
    for i, bd in enumerate(in_dims):
        s = list(shapes[i])
        if bd is not None:
            s.insert(bd, n)
        args.append((_c if i == 1 else _x)(tuple(s), g, rg=False).to(dtype))
    op = _op(name)
    calls = []
    real = linrec_functorch.ScanFunction.vmap

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)
    linrec_functorch.ScanFunction.vmap = staticmethod(counting)
    try:
        out = torch.func.vmap(lambda x, c, h: op(x, c, h, -1, True), in_dims=in_dims)(*args)
    finally:
        linrec_functorch.ScanFunction.vmap = staticmethod(real)
    assert calls == [1]
    sample = [[a.select(bd, i) if bd is not None else a for a, bd in zip(args, in_dims)] for i in range(n)]
    ref = torch.stack([_ref(*s, -1, True) for s in sample])
    torch.testing.assert_close(out.double(), ref, **_tol(dtype))


def test_func_vmap_of_grad_and_api():
    """Per-sample gradients (vmap of grad) through torch_linrec.scan."""
    g = _gen("psg")
    x, c = _x((4, 6, 2), g, rg=False), _c((4, 6, 2), g, rg=False)
    f = lambda x, c: torch_linrec.scan(x, c, None, 0).square().sum()  # noqa: E731
    got = torch.func.vmap(torch.func.grad(f, argnums=1))(x, c)
    ref = torch.stack([torch.func.grad(lambda x, c: _ref(x, c, None, 0).square().sum(), argnums=1)(x[i], c[i])
                       for i in range(4)])
    torch.testing.assert_close(got, ref)


def test_func_vmap_bad_dim_raises():
    with pytest.raises(ValueError, match=r"dim must be in \[-2, 1\]"):
        torch.func.vmap(lambda x: torch.ops.linrec.scan(x, x, None, 2))(torch.ones(3, 4, 5))


def test_plain_calls_skip_the_functorch_route(monkeypatch):
    """The Python route is registered on the functorch key only: plain eager calls, with autograd,
    never run it (their host time is the C++ autograd's), transforms always do."""
    assert torch._C._dispatch_has_kernel_for_dispatch_key("linrec::scan", "FuncTorchDynamicLayerFrontMode")
    calls = []
    real = linrec_functorch.ScanFunction.apply

    def counting(*a):
        calls.append(1)
        return real(*a)
    monkeypatch.setattr(linrec_functorch.ScanFunction, "apply", counting)
    x, c = _x((2, 5), _gen("p")), _c((2, 5), _gen("q"))
    torch_linrec.scan(x, c).sum().backward()
    torch.ops.linrec.scan(x, c).sum().backward()
    assert calls == []
    torch.func.grad(lambda x: torch.ops.linrec.scan(x, c).sum())(x.detach())
    assert calls  # the forward, once per transform level, and the backward's reverse scan


def test_forward_ad_outside_functorch_raises():
    """torch.autograd.forward_ad on the plain op: the C++ autograd has no forward rule; it raises (use
    torch.func.jvp)."""
    import torch.autograd.forward_ad as fwAD
    x, c = _x((2, 5), _gen("f"), rg=False), _c((2, 5), _gen("g"), rg=False)
    with fwAD.dual_level(), pytest.raises(RuntimeError):
        torch.ops.linrec.scan(fwAD.make_dual(x, torch.ones_like(x)), c)


def test_no_grad_forward_has_no_graph():
    """Inputs that want no gradient (or torch.no_grad) take the op straight to its kernel: no grad_fn
    and the values of the graph-building call; a forward-mode tangent on coeffs or initial must still
    raise (the kernel without the node would drop it silently)."""
    import torch.autograd.forward_ad as fwAD
    x, c = _x((2, 5), _gen("f"), rg=False), _c((2, 5), _gen("g"), rg=False)
    h0 = torch.randn(2, dtype=x.dtype)
    y = torch.ops.linrec.scan(x, c, h0)
    assert y.grad_fn is None and not y.requires_grad
    y_graph = torch.ops.linrec.scan(x.detach().requires_grad_(), c, h0)
    assert y_graph.grad_fn is not None and torch.equal(y, y_graph.detach())
    with torch.no_grad():
        assert torch.ops.linrec.scan(x.detach().requires_grad_(), c, h0).grad_fn is None
    with fwAD.dual_level(), pytest.raises(RuntimeError):
        torch.ops.linrec.scan(x, fwAD.make_dual(c, torch.ones_like(c)), h0)
    with fwAD.dual_level(), pytest.raises(RuntimeError):
        torch.ops.linrec.scan(x, c, fwAD.make_dual(h0, torch.ones_like(h0)))
