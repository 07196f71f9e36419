"""Backend and config selection (torch_linrec/dispatch.py, torch_linrec.scan's ``config`` /
``backward_config``), runnable on the CPU.

The backend context is a ContextVar: per thread and per asyncio task, nested contexts restore the
outer one. Configs: the CPU kernel takes ``None``, ``"native"`` and ``"cpu.g16"``; Triton configs
``triton.t1024`` / ``t2048`` / ``t4096`` run the Triton ops, in either direction, mixed with native
ones (on the CPU under ``TRITON_INTERPRET=1``, set here before any kernel is launched as
tests/test_triton.py does; small shapes, the interpreter is slow).
"""
from __future__ import annotations

import asyncio
import importlib.util
import os
import threading

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch_linrec  # noqa: E402
from torch_linrec import dispatch  # noqa: E402
from torch_linrec._library import HAS_CUDA_KERNELS, scan_cuda_configs  # noqa: E402
from torch_linrec.dispatch import Choice, bucket_key, choose, layout_class  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_triton = pytest.mark.skipif(
    not HAS_TRITON or not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
    reason="needs triton, and CUDA or TRITON_INTERPRET=1")

CPU_CONFIG_ERROR = r"unknown config '{}' for the CPU kernel; valid: native, cpu\.g16"


def _inputs(shape=(2, 37, 5), dim=1, device="cpu", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    c = torch.rand(shape, generator=g, dtype=torch.float64) * 0.5 + 0.5
    batch = [s for i, s in enumerate(shape) if i != dim % len(shape)]
    h0 = torch.randn(batch, generator=g, dtype=torch.float64)
    return tuple(t.to(device, dtype) for t in (x, c, h0))


@pytest.fixture(autouse=True)
def _no_backend_env(monkeypatch, no_tuned_configs):
    """No $TORCH_LINREC_BACKEND from the caller's shell: the default is "auto"; and no tuned cache
    entries."""
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)


# ----------------------------------------------------------------------------------------------- use_backend


def test_use_backend_is_per_thread(monkeypatch):
    """Two threads inside different use_backend contexts at once, entered and left interleaved (a
    barrier orders the steps): each sees its own backend throughout, and runs with it."""
    barrier = threading.Barrier(2, timeout=60)
    x, c, h0 = _inputs()
    seen: dict[str, list] = {"reference": [], "native": []}
    errors: list[BaseException] = []
    reference_runs: list[str] = []
    real_ref = torch_linrec.api.scan_ref
    monkeypatch.setattr(torch_linrec.api, "scan_ref",
                        lambda *a, **k: reference_runs.append(threading.current_thread().name) or real_ref(*a, **k))

    def observe(name):
        y = torch_linrec.scan(x, c, h0, 1)
        seen[name].append((torch_linrec.get_backend(), choose(x, c, 1).backend, y))

    def worker(name, enter_step, exit_step):
        ctx = torch_linrec.use_backend(name)
        try:
            for step in range(5):
                if step == enter_step:
                    ctx.__enter__()
                if step == exit_step:
                    ctx.__exit__(None, None, None)
                barrier.wait()
                observe(name)
                barrier.wait()
        except BaseException as e:  # surfaces in the main thread
            errors.append(e)
            barrier.abort()

    # step: 0       1         2         3         4
    # ref:  enter   .         .         exit      .
    # nat:  .       enter     .         .         exit
    threads = [threading.Thread(target=worker, args=("reference", 0, 3), name="reference"),
               threading.Thread(target=worker, args=("native", 1, 4), name="native")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert [s[:2] for s in seen["reference"]] == [("reference", "reference")] * 3 + [("auto", "native")] * 2
    assert [s[:2] for s in seen["native"]] == [("auto", "native")] + [("native", "native")] * 3 + \
        [("auto", "native")]
    assert reference_runs == ["reference"] * 3, "the reference ran in the wrong thread or steps"
    expect = torch.ops.linrec.scan(x, c, h0, 1)
    for name, rows in seen.items():
        for backend, _, y in rows:
            torch.testing.assert_close(y, expect, rtol=1e-5, atol=1e-5)
    assert torch_linrec.get_backend() == "auto", "a thread's context leaked into the main thread"


def test_use_backend_is_per_asyncio_task():
    """Two tasks, each inside its own context, both read while both contexts are open."""
    async def task(name, mine, theirs):
        with torch_linrec.use_backend(name):
            mine["entered"].set()
            await theirs["entered"].wait()
            await asyncio.sleep(0)
            seen = torch_linrec.get_backend()
            mine["read"].set()
            await theirs["read"].wait()  # the other task's context is still open while this one reads
        return seen

    async def main():
        a = {"entered": asyncio.Event(), "read": asyncio.Event()}
        b = {"entered": asyncio.Event(), "read": asyncio.Event()}
        return await asyncio.gather(task("reference", a, b), task("native", b, a))

    assert asyncio.run(main()) == ["reference", "native"]
    assert torch_linrec.get_backend() == "auto"


def test_nested_use_backend_restores(monkeypatch):
    assert torch_linrec.get_backend() == "auto"
    with torch_linrec.use_backend("reference"):
        with torch_linrec.use_backend("native"):
            assert torch_linrec.get_backend() == "native"
            with torch_linrec.use_backend("auto"):
                assert torch_linrec.get_backend() == "auto"
            assert torch_linrec.get_backend() == "native"
        assert torch_linrec.get_backend() == "reference"
        with pytest.raises(KeyError):
            with torch_linrec.use_backend("native"):
                raise KeyError("inside")
        assert torch_linrec.get_backend() == "reference", "an exception inside the inner context leaked it"
    assert torch_linrec.get_backend() == "auto"
    monkeypatch.setenv(dispatch.ENV_VAR, "reference")  # the variable is below any context
    assert torch_linrec.get_backend() == "reference"
    with torch_linrec.use_backend("native"):
        assert torch_linrec.get_backend() == "native"
    assert torch_linrec.get_backend() == "reference"


# ----------------------------------------------------------------------------------------------- configs on the CPU


def test_config_prefixes():
    """"prefer:" and "tuned:" (how "auto" passes a native choice on) mark preferences; both keep a
    Triton name a Triton config (csrc/linrec/ops.cpp's is_triton_config has the same rule)."""
    from torch_linrec.linrec.ops import is_triton_config
    assert [is_triton_config(c) for c in ("triton", "triton.t1024", "prefer:triton.t1024", "tuned:triton",
                                          "cpu.g16", "tuned:cpu.g16", "prefer:tuned:triton", None)] == \
        [True, True, True, True, False, False, False, False]


def test_config_names():
    """The names are stable (the tuned cache stores them): CPU, Triton and every CUDA table."""
    triton = ["triton.t2048", "triton.t1024", "triton.t4096", "triton.t8192", "triton.t4096.lookback"] if HAS_TRITON else []
    assert torch_linrec.config_names("cpu") == ["cpu.g16"] + triton
    assert torch_linrec.config_names("cpu", torch.bfloat16, backend="native") == ["cpu.g16"]
    assert torch_linrec.config_names("cpu", backend="triton") == triton
    assert scan_cuda_configs(4) == [
        "tile.e8t32", "tile.e8t128", "tile.e16t256", "tile.e16t128", "tile.e16t64", "tile.e8t64",
        "stream.e16t256s4", "stream.e16t256s3", "stream.e8t256s6", "stream.e8t256s4", "stream.e8t512s4",
        "stream.e8t512s4.direct", "stream.e8t128s2", "ring.e8t512s6", "ring.e16t256s6", "ring.e8t256s12",
        "channel.s16r8b2", "channel.s16r4b5", "channel.s32r4b3", "channel.s32r2b6", "channel.s8r16b1p2",
        "channel.s16r8b2p2", "channel.s8r8b2c4", "channel.s4r8b3c4", "channel.s16r4b2c4",
        "channel.s8r16b1p2.pipe", "channel.s4r8b2c4.pipe", "channel.s8r16b1p2l8.pipe", "channel.s4r8b2c4l8.pipe"]
    assert scan_cuda_configs(2) == [
        "tile.e16t16", "tile.e32t32", "tile.e32t128", "tile.e32t64", "tile.e16t64", "tile.e16t32",
        "stream.e32t256s4", "stream.e32t256s3", "stream.e16t256s6", "stream.e16t256s4", "stream.e16t512s4",
        "stream.e16t512s4.direct", "stream.e16t128s2", "ring.e16t512s6", "ring.e16t256s12", "ring.e16t256s5",
        "channel.s16r8b2", "channel.s16r4b5", "channel.s32r4b3", "channel.s32r2b6", "channel.s8r16b1p2",
        "channel.s16r8b2c4", "channel.s8r8b2c4", "channel.s16r4b3c4", "channel.s8r8b2c8",
        "channel.s8r8b2c4.pipe", "channel.s4r8b3c4.pipe", "channel.s8r8b2c4l8.pipe", "channel.s4r8b3c4l8.pipe"]
    with pytest.raises(ValueError, match="elem_size must be 2 or 4"):
        scan_cuda_configs(8)
    for dtype, size in ((torch.float32, 4), (torch.float16, 2), (torch.bfloat16, 2)):
        native = torch_linrec.config_names("cuda", dtype, backend="native")
        assert native == (scan_cuda_configs(size) if HAS_CUDA_KERNELS else [])


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_explicit_cpu_configs_match_default(reverse):
    """Every name the CPU kernel takes runs that kernel: outputs and gradients equal the default's."""
    x, c, h0 = _inputs()
    leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
    y = torch_linrec.scan(*leaves, 1, reverse, backend="native")
    gy = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, gy)
    # a preference that does not apply; "tuned:" is how "auto" passes a native choice on (a preference)
    names = ["cpu.g16", "native", "prefer:cpu.g16", "prefer:tile.e16t256", "tuned:cpu.g16", "tuned:tile.e16t256"]
    for fwd in names:
        for bwd in [None] + names:
            leaves2 = [t.clone().requires_grad_() for t in (x, c, h0)]
            y2 = torch_linrec.scan(*leaves2, 1, reverse, config=fwd, backward_config=bwd)
            assert torch.equal(y2, y), (fwd, bwd)
            for a, b in zip(torch.autograd.grad(y2, leaves2, gy), grads):
                assert torch.equal(a, b), (fwd, bwd)
        assert torch.equal(torch.ops.linrec.scan(x, c, h0, 1, reverse, fwd), y.detach())
        got = torch.ops.linrec.scan_backward(gy, c, y.detach(), h0, 1, reverse, fwd)
        for a, b in zip(got, grads):
            assert torch.equal(a, b), fwd


@pytest.mark.parametrize("name", ["bogus", "tile.e16t256", "cpu.g32", "Native"])
def test_unknown_cpu_config_raises_listing_valid_names(name):
    x, c, h0 = _inputs()
    match = CPU_CONFIG_ERROR.format(name)
    with pytest.raises(ValueError, match=match):
        torch_linrec.scan(x, c, h0, 1, config=name)
    with pytest.raises(ValueError, match=match):
        torch.ops.linrec.scan(x, c, h0, 1, False, name)
    with pytest.raises(ValueError, match=match):
        torch.ops.linrec.scan_backward(x, c, x, h0, 1, False, name)
    # backward_config reaches the backward op through autograd: the forward runs, the backward raises.
    xr = x.clone().requires_grad_()
    y = torch_linrec.scan(xr, c, h0, 1, backward_config=name)
    with pytest.raises(ValueError, match=match):
        y.sum().backward()


def test_config_of_another_backend_raises():
    x, c, _ = _inputs()
    with pytest.raises(ValueError, match=r"config 'triton\.t2048' is a triton config, but backend 'native' was"):
        torch_linrec.scan(x, c, dim=1, backend="native", config="triton.t2048")
    with pytest.raises(ValueError, match=r"backward_config 'triton\.t1024' is a triton config, but backend 'native'"):
        torch_linrec.scan(x, c, dim=1, backend="native", backward_config="triton.t1024")
    with pytest.raises(ValueError, match=r"the reference backend has none"):
        torch_linrec.scan(x, c, dim=1, backend="reference", config="cpu.g16")
    # The native ops refuse Triton names whoever calls them.
    for name in ("triton.t2048", "triton", "prefer:triton.t1024"):
        with pytest.raises(ValueError, match=r"names a Triton config"):
            torch.ops.linrec.scan(x, c, None, 1, False, name)
        with pytest.raises(ValueError, match=r"names a Triton config"):
            torch.ops.linrec.scan_backward(x, c, x, None, 1, False, name)


def test_triton_config_without_triton_raises(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.is_available():
        pytest.skip("Triton runs on CUDA here")
    x, c, _ = _inputs()
    with pytest.raises(ValueError, match=r"Triton cannot run on cpu"):
        torch_linrec.scan(x, c, dim=1, config="triton.t1024")
    with pytest.raises(ValueError, match=r"Triton cannot run on cpu"):
        torch_linrec.scan(x, c, dim=1, config="native", backward_config="triton.t1024")


def test_api_passes_configs_to_the_op(monkeypatch):
    """torch_linrec.scan calls the op with all seven arguments, the configs as chosen."""
    calls = []
    real = torch.ops.linrec.scan.default

    def recording_op(x, coeffs, initial=None, dim=-1, reverse=False, config=None, backward_config=None):
        calls.append((initial, dim, reverse, config, backward_config))
        return real(x, coeffs, initial, dim, reverse, config, backward_config)

    monkeypatch.setattr(torch_linrec.api, "_NATIVE_SCAN", recording_op)
    x, c, h0 = _inputs()
    torch_linrec.scan(x, c, h0, 1, True)
    torch_linrec.scan(x, c, dim=-2, config="cpu.g16", backward_config="native", backend="native")
    with torch_linrec.use_backend("reference"):
        torch_linrec.scan(x, c, h0, 1)  # not the op
    assert len(calls) == 2
    assert calls[0][0] is h0 and calls[0][1:] == (1, True, None, None)
    assert calls[1] == (None, -2, False, "cpu.g16", "native")


def test_choose_on_cpu(monkeypatch):
    x, c, _ = _inputs()
    assert choose(x, c, 1) == Choice("native", None, None)
    assert choose(x, c, 1, "native", "cpu.g16", "native") == Choice("native", "cpu.g16", "native")
    assert choose(x, c, 1, "reference") == Choice("reference", None, None)
    with torch_linrec.use_backend("reference"):
        assert choose(x, c, 1).backend == "reference"
        assert choose(x, c, 1, "native").backend == "native"  # the argument wins over the context
    with pytest.raises(ValueError, match=r"backend must be one of"):
        choose(x, c, 1, "cuda")
    if HAS_TRITON:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        # A forward on the other backend than the default: the backward stays on the default's.
        assert choose(x, c, 1, None, "triton.t1024") == Choice("triton", "triton.t1024", "native")
        assert choose(x, c, 1, None, "native", "triton.t4096") == Choice("native", "native", "triton.t4096")
        assert choose(x, c, 1, "triton") == Choice("triton", None, None)
        assert choose(x, c, 1, "triton", "triton.t4096") == Choice("triton", "triton.t4096", None)


# ----------------------------------------------------------------------------------------------- buckets


@pytest.mark.parametrize("args,key", [
    (("scan", "fwd", torch.float32, "innermost", 1024, 131072), "scan/fwd/float32/innermost/L<=2^10/R<=2^18"),
    (("scan", "bwd", torch.bfloat16, "strided-bcast", 4096, 65536), "scan/bwd/bfloat16/strided-bcast/L<=2^12/R<=2^16"),
    (("scan", "fwd", torch.float16, "strided", 4097, 65537), "scan/fwd/float16/strided/L<=2^14/R<=2^18"),
    (("scan", "fwd", torch.float32, "innermost", 1, 1), "scan/fwd/float32/innermost/L<=2^8/R<=2^0"),
    (("scan", "fwd", torch.float32, "innermost", 256, 2), "scan/fwd/float32/innermost/L<=2^8/R<=2^2"),
    (("scan", "fwd", torch.float32, "innermost", 257, 5), "scan/fwd/float32/innermost/L<=2^10/R<=2^4"),
    (("scan", "fwd", torch.float32, "innermost", 0, 0), "scan/fwd/float32/innermost/L<=2^8/R<=2^0"),
])
def test_bucket_key(args, key):
    assert bucket_key(*args) == key


def test_bucket_key_rounds_up_to_even_powers_of_two():
    """Every length falls in the bucket 2^k with k even, 2^(k-2) < L <= 2^k (lengths at least 2^8);
    rows the same from 2^0."""
    def exponents(key):
        length, rows = key.split("/")[-2:]
        return int(length.removeprefix("L<=2^")), int(rows.removeprefix("R<=2^"))

    for n in list(range(1, 5000)) + [2 ** 20 - 1, 2 ** 20, 2 ** 20 + 1, 2 ** 31 + 1]:
        kl, kr = exponents(bucket_key("scan", "fwd", torch.float32, "innermost", n, n))
        assert kl % 2 == 0 and kr % 2 == 0, n
        assert n <= 2 ** kl and (kl == 8 or 2 ** (kl - 2) < n), (n, kl)
        assert n <= 2 ** kr and (kr == 0 or 2 ** (kr - 2) < n), (n, kr)


def test_layout_class():
    x = torch.empty(2, 33, 8)
    assert layout_class(x, x, 1) == "strided"
    assert layout_class(x, x, 2) == "innermost"
    assert layout_class(x, torch.empty(8), 1) == "strided-bcast"
    assert layout_class(x.transpose(1, 2), x.transpose(1, 2), 2) == "strided"
    assert layout_class(x.transpose(1, 2), x.transpose(1, 2), 1) == "innermost"
    assert layout_class(torch.empty(1, 50, 1), torch.empty(50, 1), 1) == "innermost-bcast"  # one sequence


# ----------------------------------------------------------------------------------------------- Triton configs


class _LaunchSpy:
    """Records the tiles of every Triton forward / backward launch (``(TILE, LONG_TILE)`` of the config)."""

    def __init__(self, monkeypatch):
        from torch_linrec.linrec.triton import ops

        self.fwd, self.bwd = [], []
        real_fwd, real_bwd = ops._launch_forward, ops._launch_backward

        def fwd(*args):
            self.fwd.append(args[-1])
            return real_fwd(*args)

        def bwd(*args):
            self.bwd.append(args[-1])
            return real_bwd(*args)

        monkeypatch.setattr(ops, "_launch_forward", fwd)
        monkeypatch.setattr(ops, "_launch_backward", bwd)


_T1024, _T2048, _T4096 = (1024, 2048), (2048, 4096), (4096, 4096)


@requires_triton
@pytest.mark.parametrize("config,backward_config,fwd_tiles,bwd_tiles", [
    pytest.param("triton.t1024", "triton.t4096", [_T1024], [_T4096], id="triton-triton"),
    pytest.param("native", "triton.t1024", [], [_T1024], id="native-triton"),
    pytest.param("triton.t4096", "native", [_T4096], [], id="triton-native"),
    pytest.param("triton.t1024", None, [_T1024], [], id="triton-default"),
    pytest.param("triton", "triton", [_T2048], [_T2048], id="triton-defaults"),
])
@pytest.mark.parametrize("shape,dim,reverse", [((2, 37), -1, False), ((2, 9, 6), 1, True)], ids=["2x37", "2x9x6-dim1"])
def test_triton_configs_gradients(shape, dim, reverse, config, backward_config, fwd_tiles, bwd_tiles, monkeypatch):
    """Each direction runs on the backend and with the config its name gives (the Triton launches are
    counted), and output and gradients match autograd through the float64 reference."""
    spy = _LaunchSpy(monkeypatch)
    x, c, h0 = _inputs(shape, dim, TRITON_DEVICE)
    leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
    y = torch_linrec.scan(*leaves, dim, reverse, config=config, backward_config=backward_config)
    gy = _inputs(shape, dim, TRITON_DEVICE, seed=1)[0]
    grads = torch.autograd.grad(y, leaves, gy)
    assert spy.fwd == fwd_tiles and spy.bwd == bwd_tiles

    ref_leaves = [t.detach().cpu().double().requires_grad_() for t in (x, c, h0)]
    y_ref = torch_linrec.scan_ref(*ref_leaves, dim, reverse)
    ref_grads = torch.autograd.grad(y_ref, ref_leaves, gy.cpu().double())
    tol = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.detach().cpu().double(), y_ref.detach(), **tol)
    for what, a, b in zip(("x", "coeffs", "initial"), grads, ref_grads):
        assert a.shape == b.shape, what
        torch.testing.assert_close(a.cpu().double(), b, **tol, msg=lambda m: f"grad {what}: {m}")


@requires_triton
def test_triton_config_errors(monkeypatch):
    x, c, _ = _inputs((2, 9), -1, TRITON_DEVICE)
    with pytest.raises(ValueError, match=r"unknown Triton config 'triton\.t999'; valid: triton\.t2048, triton\.t1024, "
                                         r"triton\.t4096, triton\.t8192"):
        torch_linrec.scan(x, c, config="triton.t999")
    with pytest.raises(ValueError, match=r"unknown Triton config 'triton\.t999'"):
        torch.ops.linrec.scan_backward_triton(x, c, x, None, -1, False, "triton.t999")
    with pytest.raises(ValueError, match=r"config 'cpu\.g16' is a native config, but backend 'triton' was asked for"):
        torch_linrec.scan(x, c, backend="triton", config="cpu.g16")
    # A preference the Triton ops do not know runs their default.
    spy = _LaunchSpy(monkeypatch)
    y = torch.ops.linrec.scan_triton(x, c, None, -1, False, "prefer:tile.e16t256")
    assert spy.fwd == [_T2048]
    torch.testing.assert_close(y.cpu().double(), torch_linrec.scan_ref(x.cpu().double(), c.cpu().double()))


# ----------------------------------------------------------------------------------------------- config "auto"


def _set_cpu_table(x, c, dim, fwd, bwd):
    layout = layout_class(x, c, dim)
    rows = x.numel() // x.shape[dim]
    table = {bucket_key("scan", d, x.dtype, layout, x.shape[dim], rows): cfg
             for d, cfg in (("fwd", fwd), ("bwd", bwd)) if cfg is not None}
    torch_linrec._library._C.set_scan_tuned(-1, table)  # the CPU's table (csrc/linrec/tuned.h)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_auto_config_resolves_in_the_op(compiled, monkeypatch):
    """Config "auto" makes the native op look the call's bucket up in the table the ops hold (here
    the CPU's, which no shipped file fills), run a Triton config from it through the Triton op, in
    either direction, and the default without an entry; compiled graphs hold "auto" and resolve it
    per call."""
    x, c, h0 = _inputs((2, 48), -1, "cpu")
    op = torch.ops.linrec.scan
    fn = torch.compile(op, fullgraph=True, dynamic=True) if compiled else op
    leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
    expect = torch.autograd.grad(op(*leaves, -1, False).sum(), leaves)
    try:
        if HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1":
            spy = _LaunchSpy(monkeypatch)
            _set_cpu_table(x, c, 1, "triton.t1024", "triton.t4096")
            grads = torch.autograd.grad(fn(*leaves, -1, False, "auto", "auto").sum(), leaves)
            assert spy.fwd == [_T1024] and spy.bwd == [_T4096]
            for a, b in zip(grads, expect):
                torch.testing.assert_close(a, b)
            _set_cpu_table(x, c, 1, None, "triton.t1024")  # forward: no entry, the native default
            y = fn(*leaves, -1, False, "auto", "auto")
            torch.autograd.grad(y.sum(), leaves)
            assert spy.fwd == [_T1024] and spy.bwd == [_T4096, _T1024]
            assert torch.equal(y, op(x, c, h0, -1, False))
            # A length that is not a multiple of 16: the Triton entries are not taken (csrc/linrec/ops.h).
            x37, c37, _ = _inputs((2, 37), -1, "cpu")
            leaves37 = [t.clone().requires_grad_() for t in (x37, c37, h0)]
            _set_cpu_table(x37, c37, 1, "triton.t1024", "triton.t4096")
            y = fn(*leaves37, -1, False, "auto", "auto")
            torch.autograd.grad(y.sum(), leaves37)
            assert spy.fwd == [_T1024] and spy.bwd == [_T4096, _T1024]  # no new launch
            assert torch.equal(y, op(x37, c37, h0, -1, False))
        _set_cpu_table(x, c, 1, "cpu.g16", "prefer:not-a-config")  # a preference that is unknown: default
        y = fn(*leaves, -1, False, "auto", "auto")
        assert torch.equal(y, op(x, c, h0, -1, False))
        for a, b in zip(torch.autograd.grad(y.sum(), leaves), expect):
            assert torch.equal(a, b)
    finally:
        dispatch.clear_memo()


@requires_triton
def test_auto_triton_entries_run_the_eager_twins():
    """The native op runs a tuned Triton entry through the Triton ops' eager twins (plain Python
    kernels, linrec::_scan_triton_eager / _scan_backward_triton_eager), not through the public
    triton_ops and their custom-op layers (host time; bench/NOTES.md item 73)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the CPU's tuned table with the interpreted kernels")
    x, c, h0 = _inputs((2, 48), -1, "cpu")
    leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
    try:
        _set_cpu_table(x, c, 1, "triton.t1024", "triton.t4096")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            y = torch.ops.linrec.scan(*leaves, -1, False, "auto", "auto")
            grads = torch.autograd.grad(y.sum(), leaves)
        names = {event.name for event in prof.events()}
        assert {"linrec::_scan_triton_eager", "linrec::_scan_backward_triton_eager"} <= names, names
        assert not names & {"linrec::scan_triton", "linrec::scan_backward_triton"}, names
        expect = torch.autograd.grad(torch.ops.linrec.scan_triton(*leaves, -1, False, "triton.t1024",
                                                                  "triton.t4096").sum(), leaves)
        for a, b in zip(grads, expect):
            assert torch.equal(a, b)
    finally:
        dispatch.clear_memo()


@pytest.mark.parametrize("length,expect", [(48, "triton.t1024"), (37, None), (1000, None), (4096, "triton.t1024")])
def test_tuned_triton_choice_needs_a_length_multiple_of_16(length, expect):
    """A tuned Triton choice runs only at lengths that are multiples of 16 (csrc/linrec/tuned.h);
    native choices apply at any length."""
    x, c, _ = _inputs((2, length), -1, "cpu")
    key = bucket_key("scan", "fwd", x.dtype, layout_class(x, c, 1), length, 2)
    try:
        torch_linrec._library._C.set_scan_tuned(-1, {key: "triton.t1024"})
        assert torch_linrec._library._C.scan_tuned_config(-1, key, length, False) == expect
        torch_linrec._library._C.set_scan_tuned(-1, {key: "cpu.g16"})
        assert torch_linrec._library._C.scan_tuned_config(-1, key, length, False) == "cpu.g16"
    finally:
        dispatch.clear_memo()


@pytest.mark.parametrize("layout,length,applies", [
    ("innermost", 512, False), ("innermost", 384, False), ("innermost", 528, True), ("strided", 512, True),
    ("innermost-bcast", 512, True)])
def test_tuned_choice_leaves_segmented_rows_to_native(layout, length, applies):
    """On a CUDA device's table, tuned choices (Triton or native) do not apply to contiguous rows of
    at most 512 steps without `initial` (csrc/linrec/tuned.h: the native default runs them as
    segments); with `initial`, in other layouts, on longer rows and in the CPU's table they do.
    Table lookups only (no GPU needed: the tables are keyed by device index)."""
    C = torch_linrec._library._C
    key = bucket_key("scan", "fwd", torch.float32, layout, length, 1 << 17)
    try:
        for cfg in ("triton.t1024", "tile.e8t32"):
            for device in (0, -1):
                C.set_scan_tuned(device, {key: cfg})
            assert C.scan_tuned_config(0, key, length, False) == (cfg if applies else None)
            assert C.scan_tuned_config(0, key, length, False, True) == cfg  # with initial
            assert C.scan_tuned_config(-1, key, length, False) == cfg
    finally:
        dispatch.clear_memo()


def test_tuned_triton_choice_skips_reverse_calls(monkeypatch):
    """A tuned Triton choice applies to reverse=False calls only, in either pass (the tuner times
    those; Triton's speed depends on the walk's direction); native choices apply to both. Checked in
    the op: a reverse call's result matches the default's bit for bit, without a Triton launch (on
    the CPU without the interpreter, taking the entry would raise)."""
    x, c, h0 = _inputs((2, 48), -1, "cpu")
    key = bucket_key("scan", "fwd", x.dtype, layout_class(x, c, 1), 48, 2)
    spy = _LaunchSpy(monkeypatch) if HAS_TRITON else None
    try:
        _set_cpu_table(x, c, 1, "triton.t1024", "triton.t1024")
        for direction in ("fwd", "bwd"):
            k = key.replace("/fwd/", f"/{direction}/")
            assert torch_linrec._library._C.scan_tuned_config(-1, k, 48, False) == "triton.t1024"
            assert torch_linrec._library._C.scan_tuned_config(-1, k, 48, True) is None
        leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
        y = torch.ops.linrec.scan(*leaves, -1, True, "auto", "auto")
        grads = torch.autograd.grad(y, leaves, torch.ones_like(y))
        plain = [t.clone().requires_grad_() for t in (x, c, h0)]
        y0 = torch.ops.linrec.scan(*plain, -1, True)
        expect = torch.autograd.grad(y0, plain, torch.ones_like(y0))
        assert torch.equal(y, y0) and all(torch.equal(a, b) for a, b in zip(grads, expect))
        assert spy is None or spy.fwd == spy.bwd == []
        torch_linrec._library._C.set_scan_tuned(-1, {key: "cpu.g16"})
        assert torch_linrec._library._C.scan_tuned_config(-1, key, 48, True) == "cpu.g16"
    finally:
        dispatch.clear_memo()


def test_auto_is_what_auto_passes_on_cuda_only():
    """On the CPU, backend "auto" runs the default (None); "auto" is passed where a tuned table exists."""
    x, c, _ = _inputs()
    assert choose(x, c, 1, "auto") == Choice("native", None, None)
    assert choose(x, c, 1, "auto", "auto") == Choice("native", "auto", None)
