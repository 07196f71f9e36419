"""The selective-scan fusion of torch_linrec.compile: Mamba's selective SSM written with plain torch
and torch_linrec.scan is rewritten into torch.ops.linrec.selective_scan, with the same outputs and
gradients as eager, exactly once per pattern; near misses are left unchanged.

Most variants compile with Dynamo and a backend that runs the pass itself and then aot_eager (cheap:
no Inductor compile); three tests compile with Inductor and the pass enabled as users enable it,
which checks the hook (training included) end to end. Where torch.ops.linrec.selective_scan is not
registered, this module registers a stand-in around selective_scan_ref (fake kernel and autograd).
"""
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import torch_linrec
import torch_linrec.compile as tc
from torch_linrec.bench import selective as _bench_selective
from torch_linrec.compile import _inductor, fusion
from torch_linrec.selective.reference import compute_dtype, selective_scan_ref

_SCHEMA = ("(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D=None, Tensor? z=None, "
           "Tensor? delta_bias=None, bool delta_softplus=False, Tensor? initial_state=None)")


def _register_standin() -> None:
    """``linrec::selective_scan`` as selective_scan_ref, with a fake kernel and autograd (its backward,
    an op of its own, runs autograd through the reference)."""
    @torch.library.custom_op("linrec::selective_scan", mutates_args=(), schema=_SCHEMA + " -> (Tensor, Tensor)")
    def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial_state=None):
        out, last = selective_scan_ref(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state)
        return out.contiguous(), last.contiguous()

    @selective_scan.register_fake
    def _(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial_state=None):
        return u.new_empty(u.shape), u.new_empty((u.shape[0], u.shape[1], A.shape[1]), dtype=compute_dtype(u.dtype))

    backward_schema = "(Tensor grad_out, Tensor grad_last, " + _SCHEMA[1:] + " -> Tensor[]"

    @torch.library.custom_op("linrec_test::selective_scan_backward", mutates_args=(), schema=backward_schema)
    def backward(grad_out, grad_last, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                 initial_state=None):
        inputs = [u, delta, A, B, C, D, z, delta_bias, initial_state]
        where = [i for i, t in enumerate(inputs) if t is not None]

        def forward(*present):
            args = list(inputs)
            for i, t in zip(where, present):
                args[i] = t
            return selective_scan_ref(*args[:8], delta_softplus, args[8])

        _, vjp = torch.func.vjp(forward, *[inputs[i] for i in where])
        return [g.contiguous() for g in vjp((grad_out, grad_last))]

    @backward.register_fake
    def _(grad_out, grad_last, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
          initial_state=None):
        return [t.new_empty(t.shape) for t in (u, delta, A, B, C, D, z, delta_bias, initial_state) if t is not None]

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:8], inputs[9])
        ctx.delta_softplus = inputs[8]

    def grad(ctx, grad_out, grad_last):
        saved = ctx.saved_tensors
        u, A = saved[0], saved[2]
        grad_out = torch.zeros_like(u) if grad_out is None else grad_out
        if grad_last is None:
            grad_last = u.new_zeros((u.shape[0], u.shape[1], A.shape[1]), dtype=compute_dtype(u.dtype))
        grads = iter(backward(grad_out, grad_last, *saved[:8], ctx.delta_softplus, saved[8]))
        out = [None if t is None else next(grads) for t in saved]
        return (*out[:8], None, out[8])

    selective_scan.register_autograd(grad, setup_context=setup_context)


if not tc.fused_op_available():
    _register_standin()

pytestmark = pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")

SIZES = dict(batch=2, dim=4, length=7, nstate=3)


@pytest.fixture(autouse=True)
def _fresh():
    """A fresh Dynamo, zero counts, the pass off and no compile caches (a cache hit skips the pass)."""
    torch._dynamo.reset()
    tc.reset_fusion_stats()
    with tc.selective_scan_fusion(False), torch.compiler.config.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()


def _dt(delta, bias, softplus, bias_view):
    dt = delta if bias is None else delta + bias_view(bias)
    return F.softplus(dt) if softplus else dt


def broadcast_bdln(u, delta, A, B, C, D=None, z=None, bias=None, softplus=False, h0=None):
    """(B, D, L, N) with broadcast products; B, C (B, N, L) or (D, N)."""
    dt = _dt(delta, bias, softplus, lambda b: b[:, None])
    dA = torch.exp(dt.unsqueeze(-1) * A[:, None, :])
    bx, cx = ((t[:, None, :] if t.dim() == 2 else t.transpose(1, 2).unsqueeze(1)) for t in (B, C))
    h = torch_linrec.scan((dt * u).unsqueeze(-1) * bx, dA, h0, dim=2)
    y = (h * cx).sum(-1)
    y = y if D is None else y + D[:, None] * u
    return y if z is None else y * F.silu(z)


def broadcast_bldn(u, delta, A, B, C, D=None, z=None, bias=None, softplus=False, h0=None):
    """(B, L, D, N) with broadcast products (mamba.py's arrangement); B, C (B, L, N) or (D, N)."""
    dt = _dt(delta, bias, softplus, lambda b: b)
    dA = torch.exp(dt.unsqueeze(-1) * A)
    bx, cx = (t if t.dim() == 2 else t.unsqueeze(2) for t in (B, C))
    h = torch_linrec.scan(dt.unsqueeze(-1) * bx * u.unsqueeze(-1), dA, h0, dim=1)
    y = (h * cx).sum(3)
    y = y if D is None else y + u * D
    return y if z is None else y * F.silu(z)


def einsum_bdln(u, delta, A, B, C, D=None, z=None, bias=None, softplus=False, h0=None):
    """(B, D, L, N) with einsum (mamba_ssm's reference); B, C (B, N, L) or (D, N)."""
    dt = _dt(delta, bias, softplus, lambda b: b.unsqueeze(-1))
    dA = torch.exp(torch.einsum("bdl,dn->bdln", dt, A))
    sb, sc = ("dn" if t.dim() == 2 else "bnl" for t in (B, C))
    h = torch_linrec.scan(torch.einsum(f"bdl,{sb},bdl->bdln", dt, B, u), dA, h0, dim=-2)
    y = torch.einsum(f"bdln,{sc}->bdl", h, C)
    y = y if D is None else y + torch.einsum("bdl,d->bdl", u, D)
    return y if z is None else y * F.silu(z)


def einsum_bldn(u, delta, A, B, C, D=None, z=None, bias=None, softplus=False, h0=None):
    """(B, L, D, N) with einsum; B, C (B, L, N) or (D, N)."""
    dt = _dt(delta, bias, softplus, lambda b: b)
    dA = torch.exp(torch.einsum("bld,dn->bldn", dt, A))
    sb, sc = ("dn" if t.dim() == 2 else "bln" for t in (B, C))
    h = torch_linrec.scan(torch.einsum(f"bld,{sb},bld->bldn", dt, B, u), dA, h0, dim=1)
    y = torch.einsum(f"bldn,{sc}->bld", h, C)
    y = y if D is None else y + u * D
    return y if z is None else y * F.silu(z)


MODELS = {"broadcast_bdln": broadcast_bdln, "broadcast_bldn": broadcast_bldn, "einsum_bdln": einsum_bdln,
          "einsum_bldn": einsum_bldn}


def _inputs(model, options, dtype=torch.float32, seed=0, length=None):
    """Inputs of ``model`` (its arrangement) as leaves requiring grad, and the keyword options."""
    g = torch.Generator().manual_seed(seed)
    b, d, l, n = SIZES["batch"], SIZES["dim"], length or SIZES["length"], SIZES["nstate"]
    bdl = model.__name__.endswith("bdln")

    def make(*shape, low=-1.0, high=1.0):
        return (torch.rand(*shape, generator=g) * (high - low) + low).to(dtype).requires_grad_()

    seq = (b, d, l) if bdl else (b, l, d)
    bc = (b, n, l) if bdl else (b, l, n)
    tensors = dict(u=make(*seq), delta=make(*seq, low=0.05, high=0.6), A=make(d, n, low=-1.5, high=-0.1),
                   B=make(*((d, n) if options.get("time_invariant") else bc)),
                   C=make(*((d, n) if options.get("time_invariant") else bc)))
    if options.get("D"):
        tensors["D"] = make(d)
    if options.get("z"):
        tensors["z"] = make(*seq)
    if options.get("bias"):
        tensors["bias"] = make(d, low=-0.5, high=0.5)
    if options.get("initial"):
        tensors["h0"] = make(b, d, n)
    return tensors, {"softplus": bool(options.get("softplus"))}


def _run(fn, tensors, kwargs):
    """Output and gradients of ``fn`` w.r.t. every tensor input."""
    out = fn(**tensors, **kwargs)
    weights = torch.linspace(-1, 1, out.numel()).view(out.shape)
    return [out.detach()] + list(torch.autograd.grad((out * weights).sum(), list(tensors.values())))


def _assert_close(got, expect, rtol=1e-4, atol=1e-5):
    assert len(got) == len(expect)
    for i, (a, b) in enumerate(zip(got, expect)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"tensor {i}: {m}")


def fusing_aot_eager(gm, example_inputs):
    """A backend that runs the pass on the Dynamo graph, then aot_eager."""
    tc.fuse_selective_scan(gm)
    return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def _check(fn, tensors, kwargs, rewrites, rtol=1e-4, atol=1e-5):
    """``fn`` compiled with the pass: ``rewrites`` rewrites, and the outputs and gradients of eager."""
    expect = _run(fn, tensors, kwargs)
    got = _run(torch.compile(fn, backend=fusing_aot_eager, fullgraph=True), tensors, kwargs)
    assert tc.fusion_stats()[tc.FUSION_COUNTER] == rewrites
    _assert_close(got, expect, rtol, atol)


CASES = [pytest.param(name, options, id=f"{name}-{'-'.join(options) or 'plain'}")
         for name in MODELS for options in ({}, dict(D=1, z=1, bias=1, softplus=1))] + [
    pytest.param("broadcast_bdln", options, id=f"broadcast_bdln-{'-'.join(options)}")
    for options in (dict(D=1), dict(z=1), dict(softplus=1), dict(bias=1), dict(time_invariant=1),
                    dict(initial=1, D=1, z=1))] + [
    pytest.param(name, dict(time_invariant=1, softplus=1, bias=1, initial=1), id=f"{name}-time_invariant-initial")
    for name in ("broadcast_bldn", "einsum_bdln", "einsum_bldn")]


@pytest.mark.parametrize("name, options", CASES)
def test_variant_is_fused_with_eager_results(name, options):
    tensors, kwargs = _inputs(MODELS[name], options)
    _check(MODELS[name], tensors, kwargs, rewrites=1)


def _wrong_sum_axis(u, delta, A, B, C):
    h = torch_linrec.scan((delta * u).unsqueeze(-1) * B.transpose(1, 2).unsqueeze(1),
                          torch.exp(delta.unsqueeze(-1) * A[:, None, :]), dim=2)
    return (h * C.transpose(1, 2).unsqueeze(1)).sum(1)


def _reverse(u, delta, A, B, C):
    h = torch_linrec.scan((delta * u).unsqueeze(-1) * B.transpose(1, 2).unsqueeze(1),
                          torch.exp(delta.unsqueeze(-1) * A[:, None, :]), dim=2, reverse=True)
    return (h * C.transpose(1, 2).unsqueeze(1)).sum(-1)


def _not_exp(u, delta, A, B, C):
    h = torch_linrec.scan((delta * u).unsqueeze(-1) * B.transpose(1, 2).unsqueeze(1),
                          torch.sigmoid(delta.unsqueeze(-1) * A[:, None, :]), dim=2)
    return (h * C.transpose(1, 2).unsqueeze(1)).sum(-1)


def _other_dt(u, delta, A, B, C):
    h = torch_linrec.scan((delta * u).unsqueeze(-1) * B.transpose(1, 2).unsqueeze(1),
                          torch.exp(F.softplus(delta).unsqueeze(-1) * A[:, None, :]), dim=2)
    return (h * C.transpose(1, 2).unsqueeze(1)).sum(-1)


def _scan_used_twice(u, delta, A, B, C):
    h = torch_linrec.scan((delta * u).unsqueeze(-1) * B.transpose(1, 2).unsqueeze(1),
                          torch.exp(delta.unsqueeze(-1) * A[:, None, :]), dim=2)
    return (h * C.transpose(1, 2).unsqueeze(1)).sum(-1) + h[:, :, -1:, :].sum(-1)


def _broadcast_initial(u, delta, A, B, C):
    h = torch_linrec.scan((delta * u).unsqueeze(-1) * B.transpose(1, 2).unsqueeze(1),
                          torch.exp(delta.unsqueeze(-1) * A[:, None, :]), A.detach(), dim=2)
    return (h * C.transpose(1, 2).unsqueeze(1)).sum(-1)


def _negated(u, delta, A, B, C):
    h = torch_linrec.scan((delta * u).unsqueeze(-1) * B.transpose(1, 2).unsqueeze(1),
                          torch.exp(-delta.unsqueeze(-1) * A[:, None, :]), dim=2)
    return (h * C.transpose(1, 2).unsqueeze(1)).sum(-1)


@pytest.mark.parametrize("fn", [_wrong_sum_axis, _reverse, _not_exp, _other_dt, _scan_used_twice, _broadcast_initial,
                                _negated], ids=lambda f: f.__name__.strip("_"))
def test_near_miss_is_left_unchanged(fn):
    tensors, kwargs = _inputs(broadcast_bdln, {})
    _check(fn, tensors, {}, rewrites=0)
    assert tc.fusion_stats()[tc.SKIPPED_COUNTER] == 1


def test_partial_epilogue():
    """D added after the gate and a contraction with another user: the core is fused, the rest stays."""
    def gate_then_d(u, delta, A, B, C, D, z):
        return broadcast_bdln(u, delta, A, B, C, z=z) + D[:, None] * u

    def contraction_used_twice(u, delta, A, B, C, D, z):
        y = broadcast_bdln(u, delta, A, B, C)
        return (y + D[:, None] * u) * F.silu(z) + y

    tensors, _ = _inputs(broadcast_bdln, dict(D=1, z=1))
    _check(gate_then_d, tensors, {}, rewrites=1)
    tc.reset_fusion_stats()
    _check(contraction_used_twice, tensors, {}, rewrites=1)


def test_matcher_error_leaves_graph_unchanged(monkeypatch, caplog):
    """A bug in the matcher (here: any error while matching) is logged, and the compile goes on unfused."""
    def broken(self, coeffs):
        raise TypeError("matcher bug")

    monkeypatch.setattr(fusion.Match, "_coeffs", broken)
    tensors, kwargs = _inputs(broadcast_bdln, dict(D=1))
    _check(broadcast_bdln, tensors, kwargs, rewrites=0)
    assert "left unchanged after an error" in caplog.text


def test_two_layers_and_dynamic_length():
    def two_layers(u, delta, A, B, C, D, z):
        y = broadcast_bldn(u, delta, A, B, C, D, z)
        return broadcast_bldn(y, delta, A, B, C, D, z)

    tensors, _ = _inputs(broadcast_bldn, dict(D=1, z=1))
    _check(two_layers, tensors, {}, rewrites=2)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    tc.reset_fusion_stats()
    compiled = torch.compile(einsum_bdln, backend=fusing_aot_eager, fullgraph=True, dynamic=True)
    for length in (5, 9):
        tensors, kwargs = _inputs(einsum_bdln, dict(D=1, bias=1, softplus=1), seed=length, length=length)
        _assert_close(_run(compiled, tensors, kwargs), _run(einsum_bdln, tensors, kwargs))
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert tc.fusion_stats()[tc.FUSION_COUNTER] == graphs, "each compiled graph rewritten once"
    if torch.__version__ >= "2.13":  # torch 2.11 recompiles the second length (seen on the H100 image)
        assert graphs == 1, "one graph for both lengths"


def test_bfloat16_runs_in_float32_inside():
    tensors, kwargs = _inputs(broadcast_bdln, dict(D=1, z=1, bias=1, softplus=1), dtype=torch.bfloat16)
    _check(broadcast_bdln, tensors, kwargs, rewrites=1, rtol=0.05, atol=0.05)


def _profiled(fn, tensors, kwargs):
    """``_run(fn, ...)`` and the names of the ops that a second run calls (the first one compiles)."""
    _run(fn, tensors, kwargs)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        result = _run(fn, tensors, kwargs)
    return result, {event.key for event in profile.key_averages()}


@pytest.mark.parametrize("name, options", [("broadcast_bdln", dict(D=1, z=1, bias=1, softplus=1)),
                                           ("einsum_bldn", dict(D=1, z=1))])
def test_inductor_training_runs_the_fused_op(name, options):
    """Enabled as users enable it, the pass runs in Inductor before autograd: the compiled forward
    and backward call the fused op and not the scan."""
    model = MODELS[name]
    tensors, kwargs = _inputs(model, options)
    expect = _run(model, tensors, kwargs)
    before = torch._dynamo.utils.counters["torch_linrec"][tc.FUSION_COUNTER]
    with tc.selective_scan_fusion():
        assert tc.is_selective_scan_fusion_enabled()
        got, ops = _profiled(torch.compile(model, fullgraph=True), tensors, kwargs)
    assert not tc.is_selective_scan_fusion_enabled()
    assert tc.fusion_stats()[tc.FUSION_COUNTER] == 1
    assert torch._dynamo.utils.counters["torch_linrec"][tc.FUSION_COUNTER] == before + 1
    # the training form of the op (it saves the forward's checkpoints), where registered
    fused = "linrec::_selective_scan_train" if hasattr(torch.ops.linrec, "_selective_scan_train") else \
        "linrec::selective_scan"
    assert fused in ops and "linrec::scan" not in ops, sorted(ops)
    _assert_close(got, expect)


def test_inductor_disabled_by_default():
    assert not tc.is_selective_scan_fusion_enabled()
    tensors, kwargs = _inputs(broadcast_bdln, dict(D=1))
    with torch.no_grad():
        expect = broadcast_bdln(**tensors, **kwargs)
        got = torch.compile(broadcast_bdln, fullgraph=True)(**tensors, **kwargs)
    assert tc.fusion_stats() == {tc.FUSION_COUNTER: 0, tc.SKIPPED_COUNTER: 0}
    _assert_close([got], [expect])


def test_private_hooks_are_where_expected():
    """Fails loudly when a torch upgrade moves the Inductor APIs of torch_linrec/compile/_inductor.py."""
    _inductor.check_hooks()


def test_enable_matches_tangent_strides():
    """Enabling the fusion has AOT autograd take output gradients in the outputs' layout (no copy of a
    (B, L, D)-strided out's gradient on torch 2.11); disabling restores the user's setting."""
    import torch._functorch.config as aot_config
    user = aot_config.guess_tangent_strides_as_outputs
    try:
        for setting in (False, True):
            aot_config.guess_tangent_strides_as_outputs = setting
            with tc.selective_scan_fusion():
                assert aot_config.guess_tangent_strides_as_outputs is True
                tc.enable_selective_scan_fusion()  # again: still restores the user's value
            assert aot_config.guess_tangent_strides_as_outputs is setting
    finally:
        aot_config.guess_tangent_strides_as_outputs = user


def test_bld_backward_takes_out_layout_gradient():
    """(B, L, D) views through the rewritten graph: the backward graph's output gradient keeps out's
    (B, L, D) strides (no transposing copy before the fused backward)."""
    import torch._functorch.config as aot_config
    case = _bench_selective.Case("t", 2, 16, 24, 4, torch.float32, "BLD")
    inp = _bench_selective.make_inputs(case, "cpu")
    names = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
    args = [inp[k].detach().requires_grad_() for k in names]
    seen = []

    def backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def bw(g, inputs):
            seen.extend(n.meta["val"].stride() for n in g.graph.nodes
                        if n.op == "placeholder" and n.name.startswith("tangents"))
            return g
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, i: g, bw_compiler=bw)

    with tc.selective_scan_fusion():
        def fused_backend(gm, example_inputs):  # the pass itself runs only under Inductor
            assert tc.fuse_selective_scan(gm) == 1
            gm.recompile()
            return backend(gm, example_inputs)
        out = torch.compile(_bench_selective.unfused_selective_scan, backend=fused_backend, fullgraph=True)(*args)
        assert aot_config.guess_tangent_strides_as_outputs
        torch.autograd.grad(out, args, torch.randn_like(out))
    assert seen == [out.stride()], seen


def test_enable_keeps_other_passes():
    def other_pass(graph):
        pass

    _inductor.install(other_pass)
    try:
        tc.enable_selective_scan_fusion()
        tc.enable_selective_scan_fusion()
        assert tc.is_selective_scan_fusion_enabled() and _inductor.is_installed(other_pass)
        with tc.selective_scan_fusion(False):
            assert not tc.is_selective_scan_fusion_enabled() and _inductor.is_installed(other_pass)
        assert tc.is_selective_scan_fusion_enabled()
        tc.disable_selective_scan_fusion()
        assert not tc.is_selective_scan_fusion_enabled() and _inductor.is_installed(other_pass)
    finally:
        _inductor.uninstall(other_pass)
        tc.disable_selective_scan_fusion()
