"""linrec::selective_scan (Mamba's selective SSM, fused): forward, last state and every gradient
against the float64 reference (torch_linrec/selective/reference.py), for each B/C form, with and
without D, z, delta_bias/softplus and initial_state, odd lengths, L = 0 and 1, the (B, L, D) strided
layout; gradcheck, opcheck, torch.compile, errors, the drop-in API and the decoding step.

Devices: the CPU kernel always; on CUDA the op (small problems run the Triton kernels), the CUDA C++
kernels through the internal ops, and the Triton kernels on the CPU under ``TRITON_INTERPRET=1``
(called through their launchers, small shapes).
"""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import torch_linrec
from conftest import CUDA_MARKS, requires_cuda
from torch_linrec.selective import selective_scan_ref
from torch_linrec.selective.ops import _kernel_args

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = pytest.param("cuda", marks=CUDA_MARKS)
DEVICES = ["cpu", CUDA]

# name -> (B/C form, D, z, delta_bias + softplus, initial_state)
VARIANTS = {
    "var": ("var", False, False, False, False),
    "var-D-z-bias": ("var", True, True, True, False),
    "var-all": ("var", True, True, True, True),
    "ti-D-z": ("ti", True, True, False, False),
    "ti-all": ("ti", True, True, True, True),
    "grp-all": ("grp", True, True, True, True),
    "mixed-bias-h0": ("mixed", False, False, True, True),
}


def make(variant: str, batch=2, dim=4, length=37, nstate=3, dtype=torch.float64, device="cpu", layout="BDL",
         seed=0):
    """Inputs ``(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state)`` (float64 made,
    then cast). layout "BLD": u, delta, z are (B, L, D)-contiguous tensors seen as (B, D, L)."""
    bc, has_d, has_z, has_bias, has_h0 = VARIANTS[variant]
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    def seq(scale=1.0):
        t = rnd(batch, length, dim, scale=scale).transpose(1, 2) if layout == "BLD" else rnd(batch, dim, length,
                                                                                               scale=scale)
        return t

    u, delta = seq(), seq(0.5)
    A = -torch.rand(dim, nstate, generator=g, dtype=torch.float64) * 2
    if bc == "var":
        B, C = rnd(batch, nstate, length), rnd(batch, nstate, length)
    elif bc == "ti":
        B, C = rnd(dim, nstate), rnd(dim, nstate)
    elif bc == "grp":
        B, C = rnd(batch, 2, nstate, length), rnd(batch, dim, nstate, length)
    else:  # time-invariant B, input-dependent C
        B, C = rnd(dim, nstate), rnd(batch, nstate, length)
    D = rnd(dim) if has_d else None
    z = seq() if has_z else None
    bias = rnd(dim, scale=0.5) if has_bias else None
    h0 = rnd(batch, dim, nstate) if has_h0 else None
    ct = torch.float64 if dtype == torch.float64 else torch.float32

    def cast(t, to):
        if t is None:
            return None
        return (t.transpose(1, 2).to(device, to).transpose(1, 2) if layout == "BLD" and t.dim() == 3
                and t.shape == u.shape else t.to(device, to))
    return (cast(u, dtype), cast(delta, dtype), cast(A, ct), cast(B, dtype), cast(C, dtype), cast(D, ct),
            cast(z, dtype), cast(bias, ct), has_bias, cast(h0, ct))


def _tol(dtype):
    return {torch.float64: dict(rtol=1e-9, atol=1e-9), torch.float32: dict(rtol=2e-4, atol=2e-4),
            torch.float16: dict(rtol=2e-2, atol=2e-2), torch.bfloat16: dict(rtol=6e-2, atol=6e-2)}[dtype]


def _check_against_reference(run, args, dtype, grads=True):
    """``run(*tensor args, grad_out, grad_last)`` -> (out, last, grads) vs the float64 reference."""
    names = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state"]
    tensors = [args[i] for i in (0, 1, 2, 3, 4, 5, 6, 7, 9)]
    ref_leaves = [None if t is None else t.detach().cpu().double().requires_grad_() for t in tensors]
    ref_out, ref_last = selective_scan_ref(*ref_leaves[:8], args[8], ref_leaves[8])
    g = torch.Generator().manual_seed(1)
    grad_out = torch.randn(ref_out.shape, generator=g, dtype=torch.float64)
    grad_last = torch.randn(ref_last.shape, generator=g, dtype=torch.float64)
    out, last, got_grads = run(tensors, grad_out, grad_last)
    tol = _tol(dtype)
    torch.testing.assert_close(out.detach().cpu().double(), ref_out.detach(), **tol, msg=lambda m: f"out: {m}")
    assert out.dtype == args[0].dtype and out.shape == args[0].shape
    torch.testing.assert_close(last.detach().cpu().double(), ref_last.detach(), **tol, msg=lambda m: f"last: {m}")
    if not grads:
        return
    used = [(n, t) for n, t in zip(names, ref_leaves) if t is not None]
    ref_grads = torch.autograd.grad((ref_out * grad_out).sum() + (ref_last * grad_last).sum(), [t for _, t in used],
                                    allow_unused=True, materialize_grads=True)
    for (name, t), a, b in zip(used, [x for x in got_grads if x is not None], ref_grads):
        assert a.shape == t.shape, name
        scale = (b.abs().max().item() if b.numel() else 0) + 1
        torch.testing.assert_close(a.detach().cpu().double() / scale, b / scale, **tol,
                                   msg=lambda m: f"grad {name}: {m}")


def _run_op(tensors, grad_out, grad_last, softplus):
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in tensors]
    out, last = torch.ops.linrec.selective_scan(*leaves[:8], softplus, leaves[8])
    dev = out.device
    loss = (out.double() * grad_out.to(dev)).sum() + (last.double() * grad_last.to(dev)).sum()
    used = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(loss, used, allow_unused=True, materialize_grads=True))
    return out, last, [None if t is None else next(grads) for t in leaves]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("layout", ["BDL", "BLD"])
def test_op_matches_reference_float64_or_float32(device, variant, layout):
    dtype = torch.float64 if device == "cpu" else torch.float32
    args = make(variant, dtype=dtype, device=device, layout=layout)
    _check_against_reference(lambda t, go, gl: _run_op(t, go, gl, args[8]), args, dtype)


@pytest.mark.parametrize("device,dtype", [("cpu", torch.float32), ("cpu", torch.bfloat16),
                                          pytest.param("cuda", torch.bfloat16, marks=CUDA_MARKS),
                                          pytest.param("cuda", torch.float16, marks=CUDA_MARKS)])
@pytest.mark.parametrize("variant", ["var-all", "ti-all", "grp-all"])
def test_op_reduced_dtypes(device, dtype, variant):
    args = make(variant, dtype=dtype, device=device, layout="BLD")
    _check_against_reference(lambda t, go, gl: _run_op(t, go, gl, args[8]), args, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("length", [0, 1, 2, 65, 130])
def test_lengths(device, length):
    """L = 0 (out empty, last = initial), 1, and lengths across chunk boundaries."""
    dtype = torch.float64 if device == "cpu" else torch.float32
    args = make("var-all", length=length, dtype=dtype, device=device, nstate=5, dim=3)
    _check_against_reference(lambda t, go, gl: _run_op(t, go, gl, args[8]), args, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_large_state_and_float32_B_with_bf16_u(device):
    """N = 33 (padded to 64 state lanes); B, C float32 with bf16 u, delta, z."""
    args = list(make("var-all", nstate=33, dtype=torch.bfloat16, device=device, length=20))
    args[3], args[4] = args[3].float(), args[4].float()
    _check_against_reference(lambda t, go, gl: _run_op(t, go, gl, args[8]), args, torch.bfloat16)


def _kernel_grads(grads, tensors):
    """The internal ops' 9 gradients as ``_check_against_reference`` takes them (None when absent)."""
    u, delta, A, B, C, D, z, bias, h0 = tensors
    du, ddelta, dA, dB, dC, dD, dz, dbias, dh0 = grads
    squeeze = [g.squeeze(1) if t.dim() == 3 else g for g, t in ((dB, B), (dC, C))]
    return [du, ddelta, dA, *squeeze, dD if D is not None else None, dz if z is not None else None,
            dbias if bias is not None else None, dh0 if h0 is not None else None]


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("variant,dim", [("var", 37), ("var-D-z-bias", 37), ("var-all", 130), ("grp-all", 4)])
@pytest.mark.parametrize("layout", ["BDL", "BLD"])
@pytest.mark.parametrize("nstate", [1, 16, 33, 100, 256])
@pytest.mark.parametrize("length", [1, 45, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_kernels(variant, dim, layout, nstate, length, dtype):
    """The CUDA C++ kernels through the internal ops (the op itself routes small problems to Triton):
    every launch shape (N padded to 16..256), lengths across tiles, channels not filling a block."""
    args = list(make(variant, dtype=dtype, device="cuda", layout=layout, length=length, dim=dim, nstate=nstate))
    if not args[8]:  # dt > 0, as softplus gives: negative dt grows the states ~1e10 in 70 steps, where
        args[1] = args[1].abs()  # float32 itself (the CPU kernel too) is 1e-3 off the float64 reference

    def run(tensors, grad_out, grad_last):
        kargs = _kernel_args(*tensors, same_bc_dtype=False)
        out, last, ckpt = torch.ops.linrec._selective_scan_fwd(*kargs[:8], args[8], kargs[8], save_checkpoints=True)
        go, gl = grad_out.to("cuda", dtype), grad_last.float().cuda()
        grads = torch.ops.linrec._selective_scan_bwd(go, gl, *kargs[:8], args[8], kargs[8], checkpoints=ckpt)
        # the backward's own checkpoint pass (no saved checkpoints) gives the same gradients, up to
        # the order of the atomic adds that sum dA, dB, dC, dD and d(delta_bias) over blocks
        again = torch.ops.linrec._selective_scan_bwd(go, gl, *kargs[:8], args[8], kargs[8])
        for i, (a, b) in enumerate(zip(grads, again)):
            # dB and dC (3, 4) come in B's and C's dtype: another order of the adds flips bf16 roundings
            tol = 1e-3 if i in (3, 4) and a.dtype != torch.float32 else 1e-5
            assert _rel_err(a, b) <= tol, (i, _rel_err(a, b), a.shape)
        return out, last, _kernel_grads(grads, tensors)
    _check_against_reference(run, args, dtype)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Norm-wise relative difference (float64)."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("nstate,length", [(16, 70), (100, 33), (256, 40), (16, 32)])
def test_training_op_saves_checkpoints(nstate, length):
    """linrec::_selective_scan_train on the CUDA C++ kernels: its checkpoints have the size the fake
    kernel gives (one slot per chunk), opcheck passes, and a training step through
    torch_linrec.selective_scan (which calls it) matches the op without saved checkpoints."""
    from torch_linrec.selective.ops import checkpoint_numel
    args = list(make("var-all", dtype=torch.float32, device="cuda", batch=1, dim=32768 // nstate + 1,
                     length=length, nstate=nstate))
    tensors = [t.requires_grad_() if isinstance(t, torch.Tensor) else t for t in args]
    _, _, ckpt = torch.ops.linrec._selective_scan_train(*tensors)
    expected = checkpoint_numel(args[0], args[2], args[3], args[4])
    chunk = 32 if nstate <= 128 else 16
    n_pad = max(16, 1 << (nstate - 1).bit_length())
    assert ckpt.numel() == expected == args[0].shape[1] * -(-length // chunk) * n_pad, (ckpt.shape, expected)
    # (opcheck's eager-vs-AOT comparison is left out: the CUDA backward's atomic sums are not
    # bitwise reproducible; test_opcheck runs it on the deterministic kernels)
    torch.library.opcheck(torch.ops.linrec._selective_scan_train.default, tuple(tensors),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    out = torch_linrec.selective_scan(*tensors)
    got = torch.autograd.grad(out, [t for t in tensors if isinstance(t, torch.Tensor)], torch.ones_like(out))
    out2, _ = torch.ops.linrec.selective_scan(*tensors)
    want = torch.autograd.grad(out2, [t for t in tensors if isinstance(t, torch.Tensor)], torch.ones_like(out2))
    for a, b in zip(got, want):
        assert _rel_err(a, b) <= 1e-5, (_rel_err(a, b), a.shape)


@pytest.mark.skipif(not (HAS_TRITON and INTERPRET), reason="needs triton and TRITON_INTERPRET=1")
@pytest.mark.parametrize("variant", ["var-all", "ti-D-z", "grp-all", "mixed-bias-h0"])
@pytest.mark.parametrize("layout", ["BDL", "BLD"])
def test_triton_kernels_interpreted(variant, layout):
    """The Triton kernels on the CPU (interpreter), through their launchers."""
    from torch_linrec.selective.triton import ops as tops
    args = make(variant, dtype=torch.float32, layout=layout, length=21, dim=4, nstate=3)

    def run(tensors, grad_out, grad_last):
        u, delta, A, B, C, D, z, bias, h0 = tensors
        kargs = _kernel_args(u, delta, A, B, C, D, z, bias, h0, same_bc_dtype=False)
        out, last = tops.selective_scan_fwd(*kargs[:8], args[8], kargs[8])
        grads = tops.selective_scan_bwd(grad_out.float(), grad_last.float(), *kargs[:8], args[8], kargs[8])
        return out, last, _kernel_grads(grads, tensors)
    _check_against_reference(run, args, torch.float32)


def test_gradcheck_cpu():
    args = make("ti-all", batch=1, dim=2, length=5, nstate=2)
    grp = make("grp-all", batch=1, dim=2, length=4, nstate=2)
    for a in (args, grp):
        tensors = [t.clone().requires_grad_() if isinstance(t, torch.Tensor) else t for t in a]
        assert torch.autograd.gradcheck(lambda *ts: torch.ops.linrec.selective_scan(*ts[:8], a[8], ts[9]),
                                        tensors, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["var", "ti-all", "grp-all"])
@pytest.mark.parametrize("op", ["selective_scan", "_selective_scan_train"])
def test_opcheck(device, variant, op):
    dtype = torch.float64 if device == "cpu" else torch.float32
    args = make(variant, dtype=dtype, device=device, length=9, layout="BLD")
    args = [t.requires_grad_() if isinstance(t, torch.Tensor) else t for t in args]
    torch.library.opcheck(getattr(torch.ops.linrec, op).default, tuple(args))


def test_api_runs_the_training_op_only_with_gradients():
    """torch_linrec.selective_scan calls linrec::_selective_scan_train (the form that saves the CUDA
    forward's checkpoints) when a gradient will be taken, linrec::selective_scan otherwise."""
    args = make("var-all", dtype=torch.float32)

    def ops_called(tensors, grad):
        with torch.set_grad_enabled(grad), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            torch_linrec.selective_scan(*tensors)
        return {e.key for e in prof.key_averages() if "selective_scan" in e.key}

    leaves = [t.clone().requires_grad_() if isinstance(t, torch.Tensor) else t for t in args]
    assert "linrec::_selective_scan_train" in ops_called(leaves, True)
    assert "linrec::_selective_scan_train" not in ops_called(leaves, False)
    assert "linrec::_selective_scan_train" not in ops_called(args, True)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_dynamic_no_graph_break(device):
    dtype = torch.float32
    torch._dynamo.reset()

    def f(u, delta, A, B, C, D, z, bias, h0):
        out, last = torch_linrec.selective_scan(u, delta, A, B, C, D, z, bias, True, h0, return_last_state=True)
        return out.sin().sum() + last.sum()

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    cf = torch.compile(f, fullgraph=True, dynamic=True, backend=counter)
    for length in (9, 14):
        args = make("var-all", dtype=dtype, device=device, length=length)
        tensors = [t for t in args if isinstance(t, torch.Tensor)]
        leaves = [t.clone().requires_grad_() for t in tensors]
        ref_leaves = [t.clone().requires_grad_() for t in tensors]
        got = torch.autograd.grad(cf(*leaves), leaves)
        want = torch.autograd.grad(f(*ref_leaves), ref_leaves)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 1
    torch._dynamo.reset()


def _mutated_args():
    """Valid arguments (every B/C form reached by mutation) and every single or paired mutation of a
    shape, dtype or optional argument: ``[(combo, kwargs)]``."""
    u, delta, A, B, C, D, z, bias, _, h0 = make("var-all", dtype=torch.float32)
    base = dict(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=bias, initial_state=h0)
    mutations = {
        "u 2-D": ("u", u[0]), "u int": ("u", u.int()), "u float64": ("u", u.double()),
        "u bf16": ("u", u.bfloat16()), "delta short": ("delta", delta[:, :, :5]),
        "delta bf16": ("delta", delta.bfloat16()),
        "z 2-D": ("z", z[0]), "z none": ("z", None), "z float64": ("z", z.double()),
        "A rows": ("A", A[:3]), "A 1-D": ("A", A[0]), "A no states": ("A", A[:, :0]),
        "A float64": ("A", A.double()), "A 3 -> 2 states": ("A", A[:, :2]),
        "B (D, N)": ("B", torch.randn(4, 3)), "B (D, N) bad": ("B", torch.randn(4, 2)),
        "B groups 1": ("B", B.unsqueeze(1)), "B groups 2": ("B", B.unsqueeze(1).expand(2, 2, 3, 37)),
        "B groups 3": ("B", B.unsqueeze(1).expand(2, 3, 3, 37)), "B groups 0": ("B", B.unsqueeze(1)[:, :0]),
        "B short": ("B", B[:, :, :5]), "B fp16": ("B", B.half()), "B float64": ("B", B.double()),
        "B 5-D": ("B", B[None, None]), "C (D, N)": ("C", torch.randn(4, 3)), "C states": ("C", C[:, :2]),
        "C bf16": ("C", C.bfloat16()), "D short": ("D", D[:2]), "D none": ("D", None),
        "D float64": ("D", D.double()), "bias 2-D": ("delta_bias", bias[None]), "bias none": ("delta_bias", None),
        "h0 2-D": ("initial_state", h0[0]), "h0 none": ("initial_state", None),
        "h0 float64": ("initial_state", h0.double()),
    }
    keys = list(mutations)
    combos = [()] + [(k,) for k in keys] + [(a, b) for i, a in enumerate(keys) for b in keys[i + 1:]
                                             if mutations[a][0] != mutations[b][0]]
    out = []
    for combo in combos:
        args = dict(base)
        for key in combo:
            name, value = mutations[key]
            args[name] = value
        out.append((combo, args))
    return out


def _checks_message(check, *args):
    """The ValueError message of a Python check, or None when it passes."""
    try:
        check(*args)
    except (ValueError, RuntimeError, IndexError) as exc:
        return str(exc)
    return None


def _count_python_calls(monkeypatch, name: str) -> list:
    """Wraps ``torch_linrec.selective.ops.<name>`` (the Python implementation the C++ host path falls
    back to) so that each call is recorded; returns the list of calls' arguments."""
    from torch_linrec.selective import ops
    calls, real = [], getattr(ops, name)

    def counted(*args):
        calls.append(args)
        return real(*args)
    monkeypatch.setattr(ops, name, counted)
    return calls


def test_cpp_argument_test_agrees_with_checks(monkeypatch):
    """The C++ host path (csrc/selective/ops.cpp) runs exactly the calls whose arguments pass every
    Python check: valid forms of every B/C variant run without reaching Python, and every single or
    paired mutation of a shape, dtype or optional argument goes to the Python checks and raises their
    ValueError (a wrong accept would run the kernels on bad arguments, a wrong reject lose speed)."""
    from torch_linrec.selective.checks import check_selective_scan_args
    calls = _count_python_calls(monkeypatch, "_python_forward")
    accepted = 0
    for combo, a in _mutated_args():
        order = [a[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
        message = _checks_message(check_selective_scan_args, "linrec.selective_scan", *order, a["initial_state"])
        calls.clear()
        if message is None:
            out, last = torch.ops.linrec.selective_scan(*order, True, a["initial_state"])
            assert not calls and out.shape == a["u"].shape and torch.isfinite(last).all(), combo
            accepted += 1
        else:
            with pytest.raises(ValueError) as err:
                torch.ops.linrec.selective_scan(*order, True, a["initial_state"])
            assert str(err.value) == message and len(calls) == 1, (combo, str(err.value), message)
    assert accepted > 30  # the valid forms are covered, not only the invalid ones


def test_cpp_backward_argument_test_agrees_with_checks(monkeypatch):
    """As above for linrec::selective_scan_backward, with grad_out and grad_last_state mutated too."""
    from torch_linrec.selective.checks import check_selective_scan_backward_args
    calls = _count_python_calls(monkeypatch, "_python_backward")
    u = make("var-all", dtype=torch.float32)[0]
    grad_out, grad_last = torch.randn_like(u), torch.randn(2, 4, 3)
    grads = {"ok": (grad_out, grad_last), "no grad_last": (grad_out, None), "grad_out bf16": (grad_out.bfloat16(), grad_last),
             "grad_out short": (grad_out[:, :, :5], grad_last), "grad_last float64": (grad_out, grad_last.double()),
             "grad_last states": (grad_out, grad_last[:, :, :2])}
    accepted = 0
    for combo, a in _mutated_args()[:40]:
        order = [a[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
        for name, (go, gl) in grads.items():
            message = _checks_message(check_selective_scan_backward_args, "linrec.selective_scan_backward", go, gl,
                                      *order, a["initial_state"])
            calls.clear()
            if message is None:
                result = torch.ops.linrec.selective_scan_backward(go, gl, *order, True, a["initial_state"])
                assert not calls and result[0].shape == a["u"].shape, (combo, name)
                accepted += 1
            else:
                with pytest.raises(ValueError) as err:
                    torch.ops.linrec.selective_scan_backward(go, gl, *order, True, a["initial_state"])
                assert str(err.value) == message and len(calls) == 1, (combo, name, str(err.value), message)
    assert accepted > 15


@pytest.mark.cuda
@requires_cuda
def test_compile_dynamic_length_training_native():
    """The training op on the CUDA C++ route under dynamic shapes: lengths within one chunk and over
    several (checkpoint sizes 1 and 3 chunks) share one compiled graph (no guard on L)."""
    torch._dynamo.reset()

    def f(u, delta, A, B, C, D, z, bias, h0):
        return torch_linrec.selective_scan(u, delta, A, B, C, D, z, bias, True, h0).float().square().sum()

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    cf = torch.compile(f, fullgraph=True, dynamic=True, backend=counter)
    for length in (20, 70):
        args = make("var-all", dtype=torch.float32, device="cuda", batch=1, dim=2049, length=length, nstate=16)
        tensors = [t for t in args if isinstance(t, torch.Tensor)]
        leaves = [t.clone().requires_grad_() for t in tensors]
        ref_leaves = [t.clone().requires_grad_() for t in tensors]
        got = torch.autograd.grad(cf(*leaves), leaves)
        want = torch.autograd.grad(f(*ref_leaves), ref_leaves)
        for a, b in zip(got, want):
            assert _rel_err(a, b) <= 1e-5, (_rel_err(a, b), a.shape)
    assert counter.frame_count == 1
    torch._dynamo.reset()


def test_errors():
    u, delta, A, B, C, D, z, bias, _, h0 = make("var-all")
    op = torch.ops.linrec.selective_scan
    cases = [
        ((u[0], delta, A, B, C), r"u must have shape \(B, D, L\), got \[4, 37\]"),
        ((u, delta[:, :, :5], A, B, C), r"delta must have the shape of u \[2, 4, 37\], got \[2, 4, 5\]"),
        ((u, delta, A[:3], B, C), r"A must have shape \[4, 3\], got \[3, 3\]"),
        ((u, delta, A, B[:, :2], C), r"B must have shape \(D, N\) = \[4, 3\], \(B, N, L\) = \[2, 3, 37\]"),
        ((u, delta, A, B, C.unsqueeze(1).expand(2, 3, 3, 37)), r"C has 3 groups, which must divide D = 4"),
        ((u, delta, A.float(), B, C), r"A must be torch.float64 \(the compute dtype of u\), got torch.float32"),
        ((u, delta, A, B.half(), C), r"B must be torch.float64 \(u's dtype\) or torch.float64, got torch.float16"),
        ((u, delta, A, B, C, D[:2]), r"D must have shape \[4\], got \[2\]"),
        ((u.int(), delta, A, B, C), r"u must be float32, float16, bfloat16 or float64, got torch.int32"),
    ]
    for args, msg in cases:
        with pytest.raises(ValueError, match=msg):
            op(*args)
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, 4, 3\], got \[4, 3\]"):
        op(u, delta, A, B, C, initial_state=h0[0])


def test_double_backward_raises():
    args = make("var")
    leaves = [t.clone().requires_grad_() if isinstance(t, torch.Tensor) else t for t in args]
    out, _ = torch.ops.linrec.selective_scan(*leaves[:8], leaves[8], leaves[9])
    gu, = torch.autograd.grad(out.square().sum(), leaves[0], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(gu.sum(), leaves[0])


@pytest.mark.parametrize("op", ["selective_scan", "_selective_scan_train"])
def test_torch_func_reverse_mode(op):
    """torch.func.grad, vjp, jacrev and vmap (their own route: functorch refuses the ops' C++
    autograd) match the float64 reference for every input; differentiating the gradient again raises."""
    args = make("var-all", length=11)
    names = (0, 1, 2, 3, 4, 5, 6, 7, 9)  # every tensor input
    fn = getattr(torch.ops.linrec, op)

    def loss(*tensors, f=fn):
        full = list(args)
        for i, t in zip(names, tensors):
            full[i] = t
        out, last = f(*full[:8], full[8], full[9])[:2]
        return (out * out.detach().sin()).sum() + last.square().sum()

    tensors = [args[i] for i in names]
    got = torch.func.grad(loss, argnums=tuple(range(len(names))))(*tensors)
    want = torch.func.grad(lambda *ts: loss(*ts, f=selective_scan_ref), argnums=tuple(range(len(names))))(*tensors)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda m: f"input {names[i]}: {m}")
    out, vjp = torch.func.vjp(lambda u: fn(u, *args[1:8], args[8], args[9])[0], args[0])
    _, vjp_ref = torch.func.vjp(lambda u: selective_scan_ref(u, *args[1:8], args[8], args[9])[0], args[0])
    cot = torch.randn_like(out)
    torch.testing.assert_close(vjp(cot)[0], vjp_ref(cot)[0], rtol=1e-9, atol=1e-9)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.func.grad(lambda u: torch.func.grad(lambda v: fn(v, *args[1:8], args[8], args[9])[0].sum())(u).sum())(
            args[0])
    # jacrev (vmap over the vjp) and vmap over a stack of inputs, one sample per call
    small = make("var-all", batch=1, dim=2, length=5, nstate=2)
    jac = torch.func.jacrev(lambda u: fn(u, *small[1:8], small[8], small[9])[0])(small[0])
    jac_ref = torch.func.jacrev(lambda u: selective_scan_ref(u, *small[1:8], small[8], small[9])[0])(small[0])
    torch.testing.assert_close(jac, jac_ref, rtol=1e-9, atol=1e-9)
    us = torch.stack([small[0], small[0].flip(-1), 2 * small[0]])
    got = torch.func.vmap(lambda u: fn(u, *small[1:8], small[8], small[9])[0])(us)
    want = torch.stack([selective_scan_ref(u, *small[1:8], small[8], small[9])[0] for u in us])
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_selective_scan_fn_drop_in_and_state_update():
    """mamba_ssm's return convention, and decoding step by step equals the scan, from a carried
    state too (chunked processing)."""
    u, delta, A, B, C, D, z, bias, sp, h0 = make("var-all", length=12)
    out = torch_linrec.selective_scan_fn(u, delta, A, B, C, D, z, bias, sp)
    out2, last = torch_linrec.selective_scan_fn(u, delta, A, B, C, D, z, bias, sp, return_last_state=True,
                                                initial_state=None)
    assert torch.equal(out, out2) and last.shape == (2, 4, 3)
    state = torch.zeros(2, 4, 3, dtype=torch.float64)
    steps = [torch_linrec.selective_state_update(state, u[:, :, i], delta[:, :, i], A, B[:, :, i], C[:, :, i], D,
                                                 z[:, :, i], bias, sp) for i in range(12)]
    torch.testing.assert_close(torch.stack(steps, -1), out)
    torch.testing.assert_close(state, last)
    first, mid = torch_linrec.selective_scan_fn(u[:, :, :5], delta[:, :, :5], A, B[:, :, :5], C[:, :, :5], D,
                                                z[:, :, :5], bias, sp, return_last_state=True)
    rest = torch_linrec.selective_scan_fn(u[:, :, 5:], delta[:, :, 5:], A, B[:, :, 5:], C[:, :, 5:], D, z[:, :, 5:],
                                          bias, sp, initial_state=mid)
    torch.testing.assert_close(torch.cat([first, rest], -1), out)
    y, new = torch_linrec.selective_state_update(last, u[:, :, 0], delta[:, :, 0], A, B[:, :, 0], C[:, :, 0],
                                                 inplace=False)
    assert not torch.equal(new, last) and y.shape == (2, 4)


@pytest.mark.parametrize("device", DEVICES)
def test_fake_kernels_give_the_real_strides(device):
    """Fake outputs have the real outputs' shapes, dtypes and strides (Inductor asserts them), for
    transposed B and C, a non-dense u and the (B, L, D) layout."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    dtype = torch.float64 if device == "cpu" else torch.float32
    args = list(make("var-all", dtype=dtype, device=device, layout="BLD", length=11))
    args[3] = args[3].transpose(1, 2).contiguous().transpose(1, 2)
    args[4] = args[4].transpose(1, 2).contiguous().transpose(1, 2)
    args[0] = torch.cat([args[0], args[0]], dim=2)[:, :, ::2]  # not dense
    tensors = [t for t in args if isinstance(t, torch.Tensor)]
    grad_out = torch.randn_like(args[0])
    real = torch.ops.linrec.selective_scan(*args[:9], args[9])
    real_bwd = torch.ops.linrec.selective_scan_backward(grad_out, None, *args[:8], args[8], args[9])
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fargs = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in args]
        fake = torch.ops.linrec.selective_scan(*fargs[:9], fargs[9])
        fake_bwd = torch.ops.linrec.selective_scan_backward(mode.from_tensor(grad_out), None, *fargs[:8], fargs[8],
                                                            fargs[9])
    for i, (r, f) in enumerate(zip(list(real) + list(real_bwd), list(fake) + list(fake_bwd))):
        assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride()), i
    assert len(tensors) == 9


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_algorithms(device):
    """Under torch.use_deterministic_algorithms(True) the CUDA backward (atomic sums over blocks)
    raises, or warns with warn_only=True, as ATen's nondeterministic ops do; the CPU backward is
    deterministic: it runs, and twice gives the same bits."""
    dtype = torch.float64 if device == "cpu" else torch.float32
    args = [t.requires_grad_() if isinstance(t, torch.Tensor) else t
            for t in make("var-all", dtype=dtype, device=device)]
    tensors = [t for t in args if isinstance(t, torch.Tensor)]
    was, was_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        out = torch.ops.linrec.selective_scan(*args[:9], args[9])[0]
        if device == "cuda":
            with pytest.raises(RuntimeError, match="deterministic"):
                torch.autograd.grad(out.sum(), tensors)
            torch.use_deterministic_algorithms(True, warn_only=True)
            with pytest.warns(UserWarning, match="deterministic"):
                torch.autograd.grad(out.sum(), tensors)
        else:
            first = torch.autograd.grad(out.sum(), tensors, retain_graph=True)
            second = torch.autograd.grad(out.sum(), tensors)
            assert all(torch.equal(a, b) for a, b in zip(first, second))
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)


@pytest.mark.parametrize("op", ["selective_scan", "_selective_scan_train"])
def test_forward_ad_raises(op):
    """torch.autograd.forward_ad on the plain op: no forward rule; a tangent on any input raises
    (the forward without a graph must not drop it silently)."""
    import torch.autograd.forward_ad as fwAD
    args = list(make("var-all", dtype=torch.float32))
    for i in (0, 3, 9):  # u, B, initial_state
        dual = list(args)
        with fwAD.dual_level():
            dual[i] = fwAD.make_dual(args[i], torch.ones_like(args[i]))
            with pytest.raises(RuntimeError):
                getattr(torch.ops.linrec, op)(*dual)


def test_no_grad_forward_matches_graph_forward():
    """Without a gradient wanted: no grad_fn, and the same outputs as the call that builds the graph."""
    args = make("var-all", dtype=torch.float32)
    with torch.no_grad():
        out, last = torch.ops.linrec.selective_scan(*args)
    assert out.grad_fn is None and last.grad_fn is None
    u = args[0].detach().requires_grad_()
    out_g, last_g = torch.ops.linrec.selective_scan(u, *args[1:])
    assert out_g.grad_fn is not None
    assert torch.equal(out, out_g.detach()) and torch.equal(last, last_g.detach())
