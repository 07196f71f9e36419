"""Tests of the Triton backend (``linrec::scan_triton`` / ``linrec::scan_backward_triton``).

On CUDA the kernels are compiled; without CUDA they run in the Triton interpreter
(``TRITON_INTERPRET=1``, set here before any kernel is launched; the ops re-decorate their kernels
if torch_linrec was imported earlier without it). Sizes are small so the interpreter stays fast.
Results are checked against the float64 reference :func:`torch_linrec.scan_ref` and its autograd.
"""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.skipif(
    importlib.util.find_spec("triton") is None
    or not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
    reason="needs triton, and CUDA or TRITON_INTERPRET=1")]
if DEVICE == "cuda":
    pytestmark.append(pytest.mark.cuda)  # on a GPU these run compiled kernels: `-m cuda` selects them

import torch_linrec  # noqa: E402

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=3e-2, atol=5e-2),
       torch.float16: dict(rtol=1e-2, atol=1e-2)}


def _make(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(DEVICE, dtype)


def _coeffs(shape, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (0.5 + 0.5 * torch.rand(shape, generator=g, dtype=torch.float64)).to(DEVICE, dtype)


def _ref_with_grads(x, c, h0, dim, reverse, grad_y):
    """float64 reference output and gradients of (x, c, h0)."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (x, c, h0)]
    y = torch_linrec.scan_ref(leaves[0], leaves[1], leaves[2], dim, reverse)
    y.backward(grad_y.double())
    return y.detach(), [t.grad if t is not None else None for t in leaves]


def _check(x, c, h0=None, dim=-1, reverse=False, grad=True, config=None):
    """Runs the Triton op (and its backward) on the given tensors and compares with the reference
    (``config``: the forward's and the backward's; None: the default)."""
    tol = TOL[x.dtype]
    # detach() keeps the exact strides of the views under test (transposed, sliced, expanded)
    args = [t.detach().requires_grad_(grad) if t is not None else None for t in (x, c, h0)]
    y = torch.ops.linrec.scan_triton(args[0], args[1], args[2], dim, reverse, config, config)
    assert y.shape == x.shape and y.dtype == x.dtype and y.stride() == torch.empty_like(x).stride()
    assert not torch.isnan(y).any()
    grad_y = _make(x.shape, x.dtype, seed=7)
    y_ref, grads_ref = _ref_with_grads(x, c, h0, dim, reverse, grad_y)
    torch.testing.assert_close(y.double(), y_ref, **tol)
    if not grad:
        return
    y.backward(grad_y)
    for t, ref in zip(args, grads_ref):
        if t is None:
            continue
        assert t.grad.shape == t.shape
        assert not torch.isnan(t.grad).any()
        torch.testing.assert_close(t.grad.double(), ref, **tol)


@pytest.fixture(autouse=True)
def nan_filled_empty():
    """Deterministic mode: ``torch.empty*`` fill with NaN, so an element a kernel skips shows up."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)


@pytest.fixture(params=["one_tile", "many_tiles"])
def tiles(request, monkeypatch):
    """Default launch heuristic, or tiny tiles so that every sequence spans several tiles: the default
    config's ``(TILE, LONG_TILE)`` made 16 steps (16 is the smallest block the heuristic picks)."""
    ops = torch_linrec.linrec.triton.ops
    if request.param == "many_tiles":
        monkeypatch.setitem(ops.CONFIGS, ops.DEFAULT_CONFIG, (16, 16))
        tiny = ops._resolve_config("test", None)
        for sms in (1, 132):
            assert ops._seq_meta(3, 37, tiny, sms)["BLOCK_L"] == 16
            assert ops._chan_meta(2, 40, 19, tiny, sms)["BLOCK_T"] == 16
    return request.param


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("L", [1, 7, 37])
@pytest.mark.parametrize("with_init", [False, True])
def test_sequence_layout(tiles, L, reverse, with_init):
    """(N, L) with dim=-1: the sequence kernel."""
    x, c = _make((3, L)), _coeffs((3, L))
    _check(x, c, _make((3,), seed=3) if with_init else None, -1, reverse)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("L", [1, 19])
@pytest.mark.parametrize("with_init", [False, True])
def test_channel_layout(tiles, L, reverse, with_init):
    """(B, L, D) with dim=1: the channel kernel, D spanning two channel blocks."""
    x, c = _make((2, L, 40)), _coeffs((2, L, 40))
    _check(x, c, _make((2, 40), seed=3) if with_init else None, 1, reverse)


@pytest.mark.parametrize("reverse", [False, True])
def test_views(tiles, reverse):
    """Transposed, sliced and 4-D inputs, and a layout that needs the contiguous fallback."""
    base = _make((2, 24, 19))
    _check(base.transpose(1, 2), _coeffs((2, 19, 24)), None, 1, reverse)  # scan dim contiguous
    _check(base[:, ::2, 1:9], _coeffs((2, 12, 8)), _make((2, 8)), 1, reverse)  # sliced
    _check(_make((2, 3, 11, 5)), _coeffs((2, 3, 11, 5)), _make((2, 3, 5)), 2, reverse)  # (B, H, L, D)
    _check(_make((2, 3, 10, 4))[:, :, ::2], _coeffs((2, 3, 5, 4)), None, 1, reverse)  # 3 batch axes
    _check(_make((4, 6, 3)), _coeffs((4, 6, 3)), _make((4, 6)), -1, reverse)  # dim=-1 of 3-D


@pytest.fixture
def nan_filled_nondeterministic(monkeypatch):
    """Deterministic mode off (it turns the look-back off); ``torch.empty``, ``empty_like`` and
    ``Tensor.new_empty`` NaN-filled."""
    torch.use_deterministic_algorithms(False)

    def nan_filled(make):
        def wrapper(*args, **kwargs):
            t = make(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t
        return wrapper
    monkeypatch.setattr(torch, "empty", nan_filled(torch.empty))
    monkeypatch.setattr(torch, "empty_like", nan_filled(torch.empty_like))
    monkeypatch.setattr(torch.Tensor, "new_empty", nan_filled(torch.Tensor.new_empty))


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("tile", [16, 4096])
@pytest.mark.usefixtures("nan_filled_nondeterministic")
def test_look_back(monkeypatch, tile, reverse):
    """``triton.t4096.lookback``: sequence-layout rows cut into tiles, one program each, chained by
    look-back (16-step tiles: up to 7 per row; 4096, the shipped size, on the GPU only); rows of one
    tile, a partial last tile, initial given and broadcast, broadcast coeffs, a transposed view,
    bf16; the channel layout falls back to the walking kernel. Forward and backward."""
    if tile == 16:
        monkeypatch.setitem(torch_linrec.linrec.triton.ops.CONFIGS, "triton.t4096.lookback", (16, 16, True))
    elif DEVICE != "cuda":
        pytest.skip("4096-step tiles: too slow for the interpreter")
    name, n = "triton.t4096.lookback", 7 * tile + 3
    for rows, length in ((3, n), (1, n), (5, 16), (2, 1)):
        _check(_make((rows, length)), _coeffs((rows, length)), None, -1, reverse, config=name)
    _check(_make((3, n)), _coeffs((3, n)), _make((3,), seed=3), -1, reverse, config=name)
    _check(_make((2, 3, n)), _coeffs((n,)), _make((1, 3), seed=3), -1, reverse, config=name)
    _check(_make((2, n, 3)).transpose(1, 2), _coeffs((2, 3, n)), None, -1, reverse, config=name)
    _check(_make((2, n), torch.bfloat16), _coeffs((2, n), torch.bfloat16), None, -1, reverse, config=name)
    _check(_make((2, 9, 40)), _coeffs((2, 9, 40)), None, 1, reverse, config=name)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("where", ["x", "coeffs", "initial", "grad_y"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.usefixtures("nan_filled_nondeterministic")
def test_look_back_causal(monkeypatch, reverse, where, bad):
    """``triton.t4096.lookback`` (16-step tiles): a NaN/Inf at step 17 (in the second tile) leaves the
    steps before it as in a clean run, bit for bit, and reaches the step itself; in the backward, one
    in grad_y reaches grad_x only at and before it (against the walk: after, when reverse). A
    non-finite ``initial`` leaves grad_x as clean."""
    monkeypatch.setitem(torch_linrec.linrec.triton.ops.CONFIGS, "triton.t4096.lookback", (16, 16, True))
    name, length, step = "triton.t4096.lookback", 37, 17
    x, c, h0 = _make((3, length)), _coeffs((3, length)), _make((3,), seed=3)
    xb, cb, hb = x.clone(), c.clone(), h0.clone()
    if where == "x":
        xb[:, step] = bad
    elif where == "coeffs":
        cb[:, step] = bad
    elif where == "initial":
        hb[:] = bad
    before = slice(0, step) if not reverse else slice(step + 1, length)
    after = slice(step + 1, length) if not reverse else slice(0, step)
    y, clean = (torch.ops.linrec.scan_triton(a, b, h, -1, reverse, name, name)
                for a, b, h in ((xb, cb, hb), (x, c, h0)))
    if where in ("x", "coeffs"):
        assert torch.equal(y[:, before], clean[:, before])
        if where == "x" or bad != bad:  # an infinite coefficient times a finite state may stay finite
            assert not torch.isfinite(y[:, step]).any()
    gy = torch.ones_like(y)
    if where == "grad_y":
        gy[:, step] = bad
    gx, _, _ = torch.ops.linrec.scan_backward_triton(gy, c, clean, h0 if where != "initial" else hb, -1, reverse,
                                                     name)
    gx_clean, _, _ = torch.ops.linrec.scan_backward_triton(torch.ones_like(y), c, clean, h0, -1, reverse, name)
    if where == "grad_y":
        assert torch.equal(gx[:, after], gx_clean[:, after])
        assert not torch.isfinite(gx[:, step]).any()
    elif where == "initial":
        assert torch.equal(gx, gx_clean)


def test_look_back_deterministic(monkeypatch):
    """Under deterministic algorithms ``triton.t4096.lookback`` walks (no look-back launch); without,
    it launches the look-back (the spy can fail)."""
    ops = torch_linrec.linrec.triton.ops

    def spy(*args):
        raise AssertionError("look-back launched")
    monkeypatch.setattr(ops, "_look_back_launch", spy)
    x, c = _make((2, 40)), _coeffs((2, 40))
    y = torch.ops.linrec.scan_triton(x, c, None, -1, False, "triton.t4096.lookback", None)
    torch.testing.assert_close(y.double(), torch_linrec.scan_ref(x.double(), c.double()), **TOL[x.dtype])
    torch.use_deterministic_algorithms(False)
    with pytest.raises(AssertionError, match="look-back launched"):
        torch.ops.linrec.scan_triton(x, c, None, -1, False, "triton.t4096.lookback", None)


def test_look_back_rule():
    """Where the configs chain tiles by look-back: ``t4096.lookback`` always; the others for rows
    longer than LONG_TILE, fewer than the SMs; none under deterministic algorithms."""
    ops = torch_linrec.linrec.triton.ops
    default, forced = ops.CONFIGS[ops.DEFAULT_CONFIG], ops.CONFIGS["triton.t4096.lookback"]
    assert not ops._look_back(forced, 4096, 100, 132) and not ops._look_back(default, 16, 1 << 20, 132)
    torch.use_deterministic_algorithms(False)  # on in every test (the autouse fixture)
    assert ops._look_back(default, 16, default[1] + 1, 132) and ops._look_back(default, 131, 1 << 20, 132)
    assert not ops._look_back(default, 132, 1 << 20, 132) and not ops._look_back(default, 16, default[1], 132)
    assert ops._look_back(forced, 4096, 100, 132) and not ops._look_back(default, 4, 1 << 20, 1)


@pytest.mark.parametrize("rows,tiles", [(1, 1), (1, 2), (3, 5), (1, 32), (2, 33), (1, 70)])
@pytest.mark.parametrize("known", ["first", "random", "second_last", "last"])
@pytest.mark.parametrize("hops", [0, 2, 100])
def test_look_back_chain(rows, tiles, known, hops):
    """``kernels._chain`` against a float64 composition, on a status prepared as a running launch
    leaves it (the interpreter runs programs in order, so a launch there only ever finds its
    predecessor's state): every earlier tile has published its aggregate, and its state after only
    for tile 0 (``first``), at random, for the tile before the predecessor, or for the predecessor
    (``last``: the one-word path); windows of 32 tiles are composed one after another. The tile's
    own status words are checked too. ``hops``: predecessors read one at a time first (0: windows
    only, 100: never a window). Older states are wrong and older aggregates NaN: the look-back must
    stop at the latest state published."""
    import triton
    import triton.language as tl
    global _lb_chain  # a jit function resolves the names it calls among its module's globals
    torch_linrec.linrec.triton.ops._sync_interpret_mode()
    _lb_chain = torch_linrec.linrec.triton.ops.kernels._chain

    @triton.jit
    def chain_kernel(status, out, i_t, i_n, N, HOPS: tl.constexpr):  # out: (a_t, b_t, h_first) in, state out
        tl.store(out, _lb_chain(status, i_t, i_n, N, tl.load(out), tl.load(out + 1), tl.load(out + 2), HOPS))

    g = torch.Generator().manual_seed(rows * 1000 + tiles)
    a = 0.5 + 0.5 * torch.rand(tiles + 1, rows, generator=g, dtype=torch.float64)
    b = torch.randn(tiles + 1, rows, generator=g, dtype=torch.float64)
    h_first = torch.randn(rows, generator=g, dtype=torch.float64)
    a, b, h_first = a.float().double(), b.float().double(), h_first.float().double()  # float32 values
    states = torch.empty(tiles + 1, rows, dtype=torch.float64)
    h = h_first
    for k in range(tiles + 1):
        h = a[k] * h + b[k]
        states[k] = h
    if known == "first":
        inclusive = torch.zeros(tiles, rows, dtype=torch.bool)
    elif known == "random":
        inclusive = torch.rand(tiles, rows, generator=g) < 0.1
    else:
        inclusive = torch.zeros(tiles, rows, dtype=torch.bool)
        inclusive[-1 if known == "last" else max(0, tiles - 2)] = True
    inclusive[0] = True

    def word(flag, v):
        return (flag << 32) | (torch.tensor(v, dtype=torch.float32).view(torch.int32).item() & 0xFFFFFFFF)

    status = torch.zeros(tiles + 1, rows, 2, dtype=torch.int64)
    for k in range(tiles):
        for r in range(rows):
            if k > 0:
                status[k, r, 0] = word(1, a[k, r].item())
            status[k, r, 1] = word(2, states[k, r].item()) if inclusive[k, r] else word(1, b[k, r].item())
    for r in range(rows):  # what the look-back must not read: past the latest known state
        newest = int(inclusive[:, r].nonzero().max())
        for k in range(newest + 1):
            status[k, r, 0] = word(1, float("nan")) if k > 0 else 0
            if k < newest:
                status[k, r, 1] = word(2, 1e6) if inclusive[k, r] else word(1, float("nan"))
    status = status.to(DEVICE)
    for r in range(rows):
        out = torch.tensor([a[tiles, r], b[tiles, r], h_first[r]], dtype=torch.float32, device=DEVICE)
        chain_kernel[(1,)](status, out, tiles, r, rows, HOPS=hops)
        torch.testing.assert_close(out[:1].cpu().double(), states[tiles - 1, r].reshape(1), rtol=1e-5, atol=1e-5)
        words = status[tiles, r].cpu()
        assert words[0].item() == word(1, a[tiles, r].item())
        assert words[1].item() >> 32 == 2
        after = torch.tensor([words[1].item() & 0xFFFFFFFF], dtype=torch.int64).to(torch.int32).view(torch.float32)
        torch.testing.assert_close(after.double(), states[tiles, r].reshape(1), rtol=1e-5, atol=1e-5)


def test_look_back_waiting():
    """``kernels._waiting``: an entry is published with flag 2 in its second word, or flag 1 in both."""
    import triton
    import triton.language as tl
    global _lb_waiting
    torch_linrec.linrec.triton.ops._sync_interpret_mode()
    _lb_waiting = torch_linrec.linrec.triton.ops.kernels._waiting

    @triton.jit
    def waiting_kernel(w, out, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(out, _lb_waiting(tl.load(w + 2 * o), tl.load(w + 2 * o + 1)))

    one, two = 1 << 32, 2 << 32
    for words, expected in (([(0, two)], 0), ([(one, two)], 0), ([(one, one)], 0), ([(0, one)], 1), ([(0, 0)], 1),
                            ([(one, one), (0, two), (one, 0)], 1), ([(one, one), (0, two), (one | 7, one | 9)], 0)):
        words = words + [(one, one)] * (4 - len(words))
        out = torch.full((1,), -1, dtype=torch.int32, device=DEVICE)
        waiting_kernel[(1,)](torch.tensor(words, dtype=torch.int64, device=DEVICE), out, N=4)
        assert out.item() == expected, words


def _small_look_back(monkeypatch) -> list:
    """16-step tiles for the default and the look-back config, 132 SMs assumed (so the default's rule
    chains rows longer than 16 steps, fewer than 132); returns the list the look-back launches fill."""
    ops = torch_linrec.linrec.triton.ops
    monkeypatch.setitem(ops.CONFIGS, "triton.t4096.lookback", (16, 16, True))
    monkeypatch.setitem(ops.CONFIGS, ops.DEFAULT_CONFIG, (16, 16))
    monkeypatch.setattr(ops, "_num_sms", lambda device: 132)
    launches = []
    launch = ops._look_back_launch
    monkeypatch.setattr(ops, "_look_back_launch", lambda *a: launches.append(a) or launch(*a))
    return launches


@pytest.mark.usefixtures("nan_filled_nondeterministic")
@pytest.mark.parametrize("reverse", [False, True])
def test_look_back_default(monkeypatch, reverse):
    """The default config chains long rows by look-back when there are fewer rows than SMs (16-step
    tiles, 132 SMs assumed), forward and backward, with initial and broadcast coeffs."""
    launches = _small_look_back(monkeypatch)
    _check(_make((3, 37)), _coeffs((3, 37)), _make((3,), seed=3), -1, reverse)
    _check(_make((2, 3, 50)), _coeffs((50,)), None, -1, reverse)
    assert len(launches) == 4  # two forwards, two backwards


@pytest.mark.skipif(DEVICE != "cuda", reason="thousands of programs: too slow for the interpreter")
@pytest.mark.usefixtures("nan_filled_nondeterministic")
@pytest.mark.parametrize("hops", [0, 2, 64])
def test_look_back_long_chain(monkeypatch, hops):
    """Rows of thousands of 16-step tiles on the GPU, where look-backs run while their predecessors
    are in flight and reach across windows: forward and backward against the float64 chunked
    reference (with an initial state, both directions)."""
    ops = torch_linrec.linrec.triton.ops
    monkeypatch.setitem(ops.CONFIGS, "triton.t4096.lookback", (16, 16, True))
    monkeypatch.setattr(ops, "_LOOK_BACK_HOPS", hops)
    for (rows, length), reverse in (((1, 16 * 5000 + 3), False), ((3, 16 * 2000), True)):
        x, c, h0 = _make((rows, length)), _coeffs((rows, length)), _make((rows,), seed=3)
        y = torch.ops.linrec.scan_triton(x, c, h0, -1, reverse, "triton.t4096.lookback", None)
        y_ref = torch_linrec.chunked_scan(x, c, h0, -1, reverse)
        torch.testing.assert_close(y.double().cpu(), y_ref, **TOL[x.dtype])
        gy = _make((rows, length), seed=5)
        got = torch.ops.linrec.scan_backward_triton(gy, c, y, h0, -1, reverse, "triton.t4096.lookback")
        refs = torch_linrec.scan_backward_ref(gy, c, y_ref, h0, -1, reverse, scan=torch_linrec.chunked_scan)
        for g, r in zip(got, refs):
            torch.testing.assert_close(g.double().cpu(), r, **TOL[x.dtype])


_COMPILE_SCRIPT = r"""
import importlib.util, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
spec = importlib.util.spec_from_file_location("kernels", sys.argv[1])
kernels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernels)
flags = {"HAS_INIT", "WALK_BACK", "BLOCK_N", "BLOCK_L", "BLOCK_T", "BLOCK_D", "HOPS"}
meta = {"BLOCK_N": 2, "BLOCK_L": 1024, "BLOCK_T": 16, "BLOCK_D": 64, "HOPS": 2}
names = sorted(n for n in dir(kernels) if n.startswith("linrec_") and n.endswith("_kernel"))
for name in names:
    fn = getattr(kernels, name)
    for elem, init, walk_back, hops in (("fp32", True, True, 2), ("bf16", False, False, 0)):
        consts = {n: meta[n] for n in fn.arg_names if n in meta}
        consts.update(HAS_INIT=init, WALK_BACK=walk_back)
        if "HOPS" in consts:
            consts["HOPS"] = hops
        signature = {n: "constexpr" if n in flags else "*i64" if n in ("status", "counter") else
                     "i32" if n in ("N", "L", "NI", "NO") or n.startswith("s") else f"*{elem}" for n in fn.arg_names}
        compiled = triton.compile(ASTSource(fn, signature, consts), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 4})
        assert compiled.asm["cubin"], (name, elem)
print(" ".join(names))
"""


def test_kernels_compile_for_hopper(tmp_path):
    """Every kernel compiles for sm_90 with this Triton, no GPU needed (the interpreter accepts code
    the compiler rejects): float32 with initial and reverse walks, bf16 without. In a subprocess, so
    that the kernels are decorated for the compiler whatever this process's interpreter setting."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, torch_linrec.linrec.triton.kernels.__file__],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.split()) == 6, proc.stdout


@pytest.mark.parametrize("reverse", [False, True])
def test_broadcast(reverse):
    """coeffs of shape (D,), (B, 1, D), (1,) and expanded; initial broadcast; stride-0 grad_y."""
    x = _make((2, 13, 6))
    _check(x, _coeffs((6,)), _make((6,), seed=3), 1, reverse)
    _check(x, _coeffs((2, 1, 6)), None, 1, reverse)
    _check(x, _coeffs((1,)), _make((2, 6), seed=3), -2, reverse)
    _check(x, _coeffs((2, 13, 1)).expand(2, 13, 6), None, 1, reverse)
    _check(x, _coeffs((13, 1)), _make((2, 1), seed=3), 1, reverse)
    y = torch.ops.linrec.scan_triton(x, _coeffs((6,)), None, 1, reverse)
    gx, gc, gh = torch.ops.linrec.scan_backward_triton(torch.ones(()).to(x).expand(x.shape), _coeffs((6,)), y,
                                                        None, 1, reverse)
    ref = torch_linrec.scan_backward_ref(torch.ones_like(x).double(), _coeffs((6,)).double(), y.double(), None, 1,
                                         reverse)
    for got, want in zip((gx, gc, gh), ref):
        torch.testing.assert_close(got.double(), want, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision(dtype):
    """bfloat16 / float16 in and out, float32 accumulation."""
    _check(_make((3, 29), dtype), _coeffs((3, 29), dtype), _make((3,), dtype), -1, False)
    _check(_make((2, 29, 33), dtype), _coeffs((33,), dtype), None, 1, True)


def test_empty():
    """L = 0 and an empty batch: no launch; grad_initial is zeros when L = 0."""
    x, c = _make((3, 0, 4)), _coeffs((3, 0, 4))
    assert torch.ops.linrec.scan_triton(x, c, None, 1).shape == (3, 0, 4)
    gx, gc, gh = torch.ops.linrec.scan_backward_triton(x, c, x, _make((3, 4)), 1, False)
    assert gx.shape == gc.shape == (3, 0, 4) and torch.equal(gh, torch.zeros(3, 4, device=DEVICE))
    assert torch.ops.linrec.scan_triton(_make((0, 5)), _coeffs((0, 5))).shape == (0, 5)


def test_backend_dispatch():
    """torch_linrec.scan(backend="triton") runs the Triton op."""
    x, c = _make((2, 9)), _coeffs((2, 9))
    torch.testing.assert_close(torch_linrec.scan(x, c, backend="triton"), torch_linrec.scan_ref(x, c))


def test_errors():
    """float64 is not a Triton dtype; mismatched dtypes and shapes are rejected with ValueError."""
    x, c = _make((2, 5)), _coeffs((2, 5))
    with pytest.raises(ValueError, match="float64"):
        torch.ops.linrec.scan_triton(x.double(), c.double())
    with pytest.raises(ValueError, match="coeffs"):
        torch.ops.linrec.scan_triton(x, c.half())
    with pytest.raises(ValueError, match="initial"):
        torch.ops.linrec.scan_triton(x, c, _make((3,)))
    with pytest.raises(ValueError, match="grad_y"):
        torch.ops.linrec.scan_backward_triton(_make((2, 4)), c, x, None, -1, False)


def _op_case(case):
    """(x, coeffs, initial, dim, reverse) of the op-level cases: rows, channels, broadcast coeffs."""
    if case == "seq":
        return _make((3, 7)), _coeffs((3, 7)), _make((3,)), -1, False
    if case == "seq_lb":  # three 16-step tiles per row
        return _make((3, 40)), _coeffs((3, 40)), _make((3,)), -1, True
    if case == "chan":
        return _make((2, 5, 6)), _coeffs((2, 5, 6)), None, 1, True
    return _make((2, 5, 3)), _coeffs((3,)), _make((3,)), 1, False


@pytest.mark.parametrize("case", ["seq", "chan", "broadcast"])
def test_eager_twins(case):
    """The eager twins the native ops call for a Triton "auto" entry (linrec::_scan_triton_eager,
    _scan_backward_triton_eager) give the public ops' outputs bit for bit, pass opcheck's schema, fake
    and AOT-dispatch checks (no autograd: they are called below it), and raise the public ops'
    ValueError for float64, which the native op's checks let through."""
    x, c, h0, dim, rev = _op_case(case)
    fwd, bwd = torch.ops.linrec._scan_triton_eager.default, torch.ops.linrec._scan_backward_triton_eager.default
    y = fwd(x, c, h0, dim, rev, "triton.t1024", None)
    assert torch.equal(y, torch.ops.linrec.scan_triton(x, c, h0, dim, rev, "triton.t1024"))
    gy = _make(x.shape, seed=5)
    got = bwd(gy, c, y, h0, dim, rev, "triton.t4096")
    expect = torch.ops.linrec.scan_backward_triton(gy, c, y, h0, dim, rev, "triton.t4096")
    assert all(torch.equal(a, b) for a, b in zip(got, expect))
    checks = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    for op, args in ((fwd, (x, c, h0, dim, rev, "triton.t1024", None)), (bwd, (gy, c, y, h0, dim, rev, None))):
        result = torch.library.opcheck(op, args, test_utils=checks)
        assert all(v == "SUCCESS" for v in result.values()), result
    with pytest.raises(ValueError, match="float64"):
        fwd(x.double(), c.double(), None, dim, rev, None, None)
    with pytest.raises(ValueError, match="float64"):
        bwd(gy.double(), c.double(), y.double(), None, dim, rev, None)


def test_tuner_times_the_calls_auto_makes():
    """The tuner's host-time calls (bench/tune.py _eager) run what config "auto" runs for an entry:
    the eager twins for a Triton name, the native op otherwise; each gives that config's outputs."""
    from torch_linrec.bench.tune import _eager

    x, c, _, dim, _ = _op_case("seq")
    gy = _make(x.shape, seed=5)
    y = torch.ops.linrec.scan(x, c, None, dim, False)
    for name in ("triton.t1024", "native"):
        run = torch.ops.linrec.scan_triton if name.startswith("triton") else torch.ops.linrec.scan
        back = torch.ops.linrec.scan_backward_triton if name.startswith("triton") else torch.ops.linrec.scan_backward
        assert torch.equal(_eager(name, "fwd", x, c, gy, y, dim)(), run(x, c, None, dim, False, name))
        got = _eager(name, "bwd", x, c, gy, y, dim)()
        assert all(torch.equal(a, b) for a, b in zip(got, back(gy, c, y, None, dim, False, name)))


@pytest.mark.parametrize("case,configs", [("seq", ()), ("chan", ("triton.t1024", "triton.t4096")),
                                          ("broadcast", ("triton", "native")),
                                          ("seq_lb", ("triton.t4096.lookback", "triton.t4096.lookback")),
                                          ("seq_lb", ())])
def test_opcheck(monkeypatch, case, configs):
    """torch.library.opcheck on both ops (schema, fake, autograd registration, AOT dispatch), with and
    without config arguments (a native backward_config runs the native backward op under autograd).
    ``seq_lb``: 16-step tiles chained by look-back (deterministic mode off), by name and by the
    default's rule (132 SMs assumed)."""
    if case == "seq_lb":
        torch.use_deterministic_algorithms(False)
        launches = _small_look_back(monkeypatch)
    x, c, h0, dim, rev = _op_case(case)
    args = [t.requires_grad_() if t is not None else None for t in (x, c, h0)]
    result = torch.library.opcheck(torch.ops.linrec.scan_triton, (*args, dim, rev, *configs))
    assert all(v == "SUCCESS" for v in result.values()), result
    y = torch.ops.linrec.scan_triton(x, c, h0, dim, rev).detach()
    bwd_config = configs[:1] if configs else ()
    result = torch.library.opcheck(torch.ops.linrec.scan_backward_triton, (
        _make(x.shape, seed=5), c.detach(), y, None if h0 is None else h0.detach(), dim, rev, *bwd_config))
    assert all(v == "SUCCESS" for v in result.values()), result
    if case == "seq_lb":
        assert launches
