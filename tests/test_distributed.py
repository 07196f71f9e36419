"""Tests of :mod:`torch_linrec.distributed`: the context-parallel scan over gloo on the CPU.

One ``torch.multiprocessing`` start (forkserver) per world size (2 and 4 processes) runs every case of that
size (:data:`CASES`) and writes each rank's results to a file; the tests read them, one test per
case. A case splits a sequence drawn on every rank from the same seed into chunks (``lens``: odd,
unequal and empty ones), runs :func:`context_parallel_scan` and its backward on each rank's chunk,
and compares the chunk's output and gradients with the float64 single-process ``scan_ref`` of the
whole sequence (coefficient gradients of coefficients shared by all ranks summed over the ranks).
The 2-process run also covers torch.compile (fullgraph, dynamic), opcheck and argument errors.
The chunk summary's Triton kernels run in-process (interpreted on the CPU).
"""
from __future__ import annotations

import datetime
import importlib.util
import json
import multiprocessing
import os
import tempfile
import traceback
import zlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_linrec
from torch_linrec.distributed import chunk_summary, chunk_summary_ref, context_parallel_scan, group_name

TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 2e-2}
F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16


def _case(name, world, lens, shape, dim, dtype=F64, reverse=False, initial=None, coeffs="full", layout="dense",
          mesh=None):
    """``shape``: the whole sequence's shape, whose ``dim`` entry is ignored (``sum(lens)``).
    ``initial``: None, ``"all"`` (every rank passes it) or ``"start"`` (only the walk's first rank).
    ``coeffs``: ``"full"`` or the broadcast shape (with ``None`` at the scanned dim for ``sum(lens)``).
    ``layout``: ``"dense"`` or ``"strided"`` (chunks as permuted views). ``mesh``: a 2-D mesh shape
    whose dim 1 holds the sequence (each dim-0 slice scans its own sequence)."""
    return dict(name=name, world=world, lens=lens, shape=shape, dim=dim, dtype=dtype, reverse=reverse,
                initial=initial, coeffs=coeffs, layout=layout, mesh=mesh)


CASES = [
    _case("f64-odd", 2, [5, 6], (2, 0, 3), 1, initial="all"),
    _case("f64-odd-reverse", 2, [5, 6], (2, 0, 3), 1, reverse=True, initial="all"),
    _case("f32-dim-last", 2, [7, 4], (3, 0), -1),
    _case("f32-strided-reverse", 2, [4, 9], (2, 0, 3), 1, F32, reverse=True, initial="start", layout="strided"),
    _case("coeffs-per-channel", 2, [6, 5], (2, 0, 4), 1, initial="start", coeffs=(4,)),
    _case("coeffs-per-channel-reverse", 2, [6, 5], (2, 0, 4), 1, reverse=True, initial="all", coeffs=(4,)),
    _case("coeffs-bcast-batch", 2, [3, 8], (2, 0, 4), 1, F32, initial="all", coeffs=(1, None, 4)),
    _case("bf16", 2, [9, 8], (2, 0, 4), 1, BF16, initial="all"),
    _case("empty-first-chunk", 2, [0, 9], (2, 0, 3), 1, initial="all"),
    _case("empty-first-chunk-reverse", 2, [9, 0], (2, 0, 3), 1, reverse=True, initial="start"),
    _case("1d", 2, [6, 5], (0,), 0, initial="all"),
    _case("f64-unequal", 4, [3, 0, 5, 4], (2, 0, 3), 1, initial="all"),
    _case("f64-unequal-reverse", 4, [1, 6, 0, 2], (2, 0, 3), 1, reverse=True, initial="start"),
    _case("f32-coeffs-per-channel", 4, [2, 3, 5, 7], (3, 0, 2), 1, F32, initial="all", coeffs=(2,)),
    _case("bf16-reverse", 4, [4, 3, 5, 4], (2, 4, 0), -1, BF16, reverse=True, initial="all"),
    _case("mesh-2x2", 4, [5, 4], (2, 0, 3), 1, initial="all", mesh=(2, 2)),
    _case("mesh-2x2-reverse", 4, [3, 7], (2, 3, 0), 2, reverse=True, initial="start", mesh=(2, 2)),
]


def _err(got: torch.Tensor, ref: torch.Tensor) -> float:
    if ref.numel() == 0:
        return 0.0
    return ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1.0)).item()


def _run_case(c: dict, rank: int) -> None:
    """Runs one case on this rank; raises AssertionError with the errors when a comparison fails."""
    mesh_kw, seq, pos, n = {}, 0, rank, c["world"]
    if c["mesh"] is not None:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", c["mesh"])
        mesh_kw = dict(mesh=mesh, mesh_dim=1)
        seq, pos, n = mesh.get_coordinate()[0], mesh.get_coordinate()[1], c["mesh"][1]
    lens, dim, dt = c["lens"], c["dim"] % len(c["shape"]), c["dtype"]
    shape = list(c["shape"])
    shape[dim] = sum(lens)
    gen = torch.Generator().manual_seed(zlib.crc32(c["name"].encode()) + seq)
    cshape = shape if c["coeffs"] == "full" else [sum(lens) if s is None else s for s in c["coeffs"]]
    xs = torch.randn(shape, generator=gen, dtype=F64)
    cs = 0.5 + 0.5 * torch.rand(cshape, generator=gen, dtype=F64)
    hs = torch.randn([s for i, s in enumerate(shape) if i != dim], generator=gen, dtype=F64)
    gys = torch.randn(shape, generator=gen, dtype=F64)
    xs, cs, hs, gys = (t.to(dt).double() for t in (xs, cs, hs, gys))  # values exact in dt
    leaves = [t.clone().requires_grad_() for t in (xs, cs, hs)]
    y_ref = torch_linrec.scan_ref(leaves[0], leaves[1], leaves[2] if c["initial"] else None, dim, c["reverse"])
    y_ref.backward(gys)

    start = sum(lens[:pos])
    c_dim = dim - (len(shape) - cs.dim())  # the scanned dim of coeffs (aligned from the right)
    c_split = c_dim >= 0 and cs.shape[c_dim] > 1

    def chunk(t, split=True):
        if split:
            t = t.narrow(dim - (len(shape) - t.dim()), start, lens[pos])
        t = t.to(dt)
        if c["layout"] == "strided":
            t = t.movedim(0, -1).contiguous().movedim(-1, 0)
        return t.detach().requires_grad_()
    first = (pos == n - 1) if c["reverse"] else (pos == 0)
    x, co = chunk(xs), chunk(cs, c_split)
    h = chunk(hs, False) if c["initial"] == "all" or (c["initial"] == "start" and first) else None
    y = context_parallel_scan(x, co, c["dim"], None, h, c["reverse"], **mesh_kw)
    y.backward(chunk(gys).detach())
    grad_c = co.grad.double()
    if not c_split:
        dist.all_reduce(grad_c, group=mesh_kw["mesh"].get_group(1) if mesh_kw else None)
    assert y.shape == x.shape and y.dtype == dt and not y.isnan().any()  # after the last collective
    tol = TOL[dt]
    errs = {"y": _err(y, chunk(y_ref.detach())), "grad_x": _err(x.grad, chunk(leaves[0].grad)),
            "grad_coeffs": _err(grad_c, chunk(leaves[1].grad, c_split))}
    if h is not None:
        errs["grad_initial"] = _err(h.grad, leaves[2].grad if first else torch.zeros_like(leaves[2].grad))
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"rank {rank}: scaled errors above {tol}: {bad}"


def _check_compile(rank: int) -> None:
    """fullgraph + dynamic compile of a small model around the op: one frame for two lengths, no
    graph break, the same output and gradients as eager."""
    import torch._dynamo.testing
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    w = torch.randn(3, 3, generator=torch.Generator().manual_seed(0), dtype=F64)

    def model(x, c, h):
        y = context_parallel_scan(torch.tanh(x @ w), torch.sigmoid(c), 1, dist.group.WORLD, h)
        return (y * y).sum() + y.sum()
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    for length in (5 + rank, 7 + 2 * rank):
        g = torch.Generator().manual_seed(length)
        args = [torch.randn(2, length, 3, generator=g, dtype=F64), torch.randn(2, length, 3, generator=g, dtype=F64),
                torch.randn(2, 3, generator=g, dtype=F64)]
        outs = []
        for fn in (model, compiled):
            leaves = [a.clone().requires_grad_() for a in args]
            out = fn(*leaves)
            out.backward()
            outs.append([out.detach()] + [t.grad for t in leaves])
        for got, ref in zip(outs[1], outs[0]):
            torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    assert counter.frame_count == 1, f"rank {rank}: {counter.frame_count} frames compiled, expected 1"


def _check_opcheck(rank: int) -> None:
    g = torch.Generator().manual_seed(rank)
    x, c = torch.randn(2, 4, 3, generator=g, dtype=F64), 0.5 + 0.5 * torch.rand(2, 4, 3, generator=g, dtype=F64)
    h = torch.randn(2, 3, generator=g, dtype=F64)
    name = group_name()
    x.requires_grad_(), c.requires_grad_(), h.requires_grad_()
    torch.library.opcheck(torch.ops.linrec.context_parallel_scan.default, (x, c, h, 1, False, name))
    y, carry = torch.ops.linrec.context_parallel_scan(x, c, h, 1, True, name)
    gy = torch.randn(2, 4, 3, generator=g, dtype=F64)
    torch.library.opcheck(torch.ops.linrec.context_parallel_scan_backward.default,
                          (gy, c.detach(), y.detach(), carry.detach(), 1, True, name))


def _check_errors(rank: int) -> None:
    x = torch.randn(2, 4, 3, dtype=F64)
    for kwargs, match in [(dict(coeffs=torch.rand(5, dtype=F64)), "coeffs of shape"),
                          (dict(coeffs=torch.rand(3)), "coeffs must have the dtype"),
                          (dict(coeffs=x, group="world"), "group must be a ProcessGroup"),
                          (dict(coeffs=x, mesh_dim=0), "mesh_dim=0 needs a DeviceMesh"),
                          (dict(coeffs=x, group=dist.group.WORLD, mesh=dist.group.WORLD), "either group or mesh"),
                          (dict(coeffs=x, mesh=dist.group.WORLD), "mesh must be a torch.distributed.DeviceMesh")]:
        with pytest.raises(ValueError, match=match):
            context_parallel_scan(x, kwargs.pop("coeffs"), 1, **kwargs)
    y = context_parallel_scan(x.requires_grad_(), x.detach(), 1)
    grad_x, = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        grad_x.sum().backward()


def _check_bench(rank: int) -> None:
    """The torchrun benchmark's stages end to end, tiny, on gloo: a PASSing check and a full CSV."""
    from torch_linrec.distributed import bench
    with tempfile.TemporaryDirectory() as tmp:
        args = bench.build_parser().parse_args(["--device", "cpu", "--channels", "2", "--log2-length", "10",
                                                "--reps", "1", "--out", tmp])
        assert bench.run(args, torch.device("cpu")) == 0
        if rank == 0:
            (path,) = [os.path.join(tmp, f) for f in os.listdir(tmp)]
            with open(path) as f:
                stages = [line.split(",")[0] for line in f.read().splitlines()[1:]]
            assert stages == ["1gpu"] * 2 + ["cp"] * 2 + ["cp-part"] * 3 + ["baseline"], stages


EXTRA = {2: {"compile": _check_compile, "opcheck": _check_opcheck, "errors": _check_errors, "bench": _check_bench}}


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    results = {}
    checks = [(c["name"], lambda r, c=c: _run_case(c, r)) for c in CASES if c["world"] == world]
    for name, fn in checks + list(EXTRA.get(world, {}).items()):
        try:
            fn(rank)
            results[name] = "ok"
        except Exception:  # recorded per case; the test of that case fails with it
            results[name] = traceback.format_exc()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.barrier()
    dist.destroy_process_group()


_RESULTS: dict = {}
# The workers fork from one server that imported torch_linrec once (spawning imports torch, dynamo
# and triton again in every process: about 6 CPU-seconds each).
multiprocessing.set_forkserver_preload(["torch_linrec.distributed", __name__])


def _check_names(world: int) -> list:
    return [c["name"] for c in CASES if c["world"] == world] + list(EXTRA.get(world, {}))


def _results(world: int) -> dict:
    """``{check name: [result of rank 0, ...]}`` of the spawn of ``world`` processes (run once).

    A spawn that fails (a rank crashed, or a collective timed out) marks the checks no rank
    reported with its error."""
    if world not in _RESULTS:
        error = "no result"
        with tempfile.TemporaryDirectory() as tmp:
            try:
                mp.start_processes(_worker, args=(world, os.path.join(tmp, "init"), tmp), nprocs=world,
                                   start_method="forkserver")
            except Exception as exc:  # reported by the tests of the checks it cut short
                error = f"the spawn failed: {exc}"
            ranks = []
            for r in range(world):
                path = os.path.join(tmp, f"rank{r}.json")
                ranks.append(json.load(open(path)) if os.path.exists(path) else {})
        _RESULTS[world] = {k: [rk.get(k, error) for rk in ranks] for k in _check_names(world)}
    return _RESULTS[world]


CHECKS = [(w, name) for w in (2, 4) for name in _check_names(w)]


@pytest.mark.parametrize("world,name", CHECKS, ids=[f"w{w}-{n}" for w, n in CHECKS])
def test_context_parallel(world, name):
    results = _results(world)[name]
    failed = [f"rank {r}:\n{res}" for r, res in enumerate(results) if res != "ok"]
    assert not failed, "\n".join(failed)


def test_needs_init():
    with pytest.raises(ValueError, match="not initialized"):
        context_parallel_scan(torch.randn(4), torch.rand(4), 0)


SUMMARY_IMPLS = ["torch"]
if importlib.util.find_spec("triton") is not None and (torch.cuda.is_available()
                                                      or os.environ.get("TRITON_INTERPRET") == "1"):
    SUMMARY_IMPLS.append("triton")


SUMMARY_CASES = {  # name: (shape, dim, dtype, reverse, scale_x); "segments": L split over programs
    "seq": ((3, 37), -1, F32, False, False), "seq-rev-scaled": ((3, 37), -1, F32, True, True),
    "chan": ((2, 40, 5), 1, F32, False, False), "chan-segments-rev-scaled": ((1, 150, 3), 1, F32, True, True),
    "seq-segments": ((1, 2100), 1, F32, False, False), "4d": ((2, 3, 21, 4), 2, F32, True, False),
    "bf16-rev-scaled": ((2, 45, 3), 1, BF16, True, True), "no-rows": ((0, 5), 1, F32, False, False),
    "L0": ((2, 0), 1, F32, True, True)}


@pytest.mark.parametrize("impl", SUMMARY_IMPLS)
@pytest.mark.parametrize("case", list(SUMMARY_CASES))
def test_chunk_summary(impl, case):
    shape, dim, dt, reverse, scale_x = SUMMARY_CASES[case]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g).to(device, dt)
    c = (0.5 + 0.5 * torch.rand(shape, generator=g)).to(device, dt)
    a, b = chunk_summary(x, c, dim % x.dim(), reverse, scale_x, impl=impl)
    a_ref, b_ref = chunk_summary_ref(x, c, dim, reverse, scale_x)
    assert a.dtype == b.dtype == torch.float32 and a.shape == a_ref.shape
    assert _err(a, a_ref) < 1e-5 and _err(b, b_ref) < 1e-5


@pytest.mark.parametrize("impl", SUMMARY_IMPLS)
def test_chunk_summary_broadcast_strided(impl):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(2)
    x = torch.randn(30, 4, generator=g).to(device).t()  # (4, 30), L strided
    c = (0.5 + 0.5 * torch.rand(4, 1, generator=g)).to(device)  # constant along L
    a, b = chunk_summary(x, c, 1, impl=impl)
    a_ref, b_ref = chunk_summary_ref(x, c, 1)
    assert _err(a, a_ref) < 1e-5 and _err(b, b_ref) < 1e-5


def test_chunk_summary_errors():
    with pytest.raises(ValueError, match="impl must be one of"):
        chunk_summary(torch.randn(3), torch.rand(3), 0, impl="cuda")
    if "triton" in SUMMARY_IMPLS:
        with pytest.raises(ValueError, match="cannot run"):
            chunk_summary(torch.randn(3, dtype=F64), torch.rand(3, dtype=F64), 0, impl="triton")
