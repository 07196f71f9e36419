"""``python -m torch_linrec selective``: the selective-scan benchmark (Mamba's selective SSM).

For each case: the fused op (:func:`torch_linrec.selective_scan`), and the unfused path a user writes
with ``torch_linrec.scan`` over ``(B, D, L, N)`` tensors, eager and under ``torch.compile`` (with
and without the selective-scan fusion pass of :mod:`torch_linrec.compile` when it is available).
Reports ms forward, ms forward+backward, peak memory above the inputs, and the ratio to the fewest
bytes the problem must move (read u, delta, z, B, C; write out; and for the backward read them and
the output gradient, write their gradients) at the speed of ``torch.add`` measured on the same
device and dtype in the same process.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import torch_linrec

from .report import align_table
from .timing import device_name, device_slug, free_memory, make_timer, measure_peak

__all__ = ["main", "CASES", "QUICK", "TINY", "COLUMNS", "default_cases", "implementations", "run_section",
           "format_table", "write_csv", "unfused_selective_scan"]


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    dim: int
    length: int
    nstate: int
    dtype: torch.dtype
    layout: str  # "BDL" or "BLD" (u, delta, z as (B, L, D)-contiguous views)


CASES = [
    Case("mamba-370m-bf16", 8, 2048, 2048, 16, torch.bfloat16, "BDL"),
    Case("mamba-370m-bf16-BLD", 8, 2048, 2048, 16, torch.bfloat16, "BLD"),
    Case("mamba-370m-fp32", 8, 2048, 2048, 16, torch.float32, "BDL"),
    Case("long-N64-fp32", 1, 2048, 8192, 64, torch.float32, "BDL"),
]
# The CPU's scaled-down case (and CUDA's --quick case); TINY is the CPU's --quick case.
QUICK = [Case("small-bf16", 2, 256, 512, 16, torch.bfloat16, "BDL")]
TINY = [Case("tiny-bf16", 1, 32, 64, 16, torch.bfloat16, "BDL")]


def make_inputs(case: Case, device, seed: int = 0) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)

    def seq(scale=1.0):
        shape = (case.batch, case.length, case.dim) if case.layout == "BLD" else (case.batch, case.dim, case.length)
        t = (torch.randn(shape, generator=g) * scale).to(device, case.dtype)
        return t.transpose(1, 2) if case.layout == "BLD" else t

    return dict(
        u=seq(), delta=seq(0.5), z=seq(),
        A=-torch.rand(case.dim, case.nstate, generator=g).to(device) * 4 - 0.5,
        B=torch.randn(case.batch, case.nstate, case.length, generator=g).to(device, case.dtype),
        C=torch.randn(case.batch, case.nstate, case.length, generator=g).to(device, case.dtype),
        D=torch.randn(case.dim, generator=g).to(device), delta_bias=torch.randn(case.dim, generator=g).to(device) * 0.5)


def fused(u, delta, A, B, C, D, z, delta_bias):
    return torch_linrec.selective_scan(u, delta, A, B, C, D, z, delta_bias, True)


def unfused_selective_scan(u, delta, A, B, C, D, z, delta_bias):
    """The selective scan as a user writes it with torch_linrec.scan: (B, D, L, N) tensors."""
    dt = F.softplus(delta + delta_bias[:, None].to(delta.dtype))
    dA = torch.exp(dt.unsqueeze(-1) * A[:, None, :].to(dt.dtype))
    dBu = (dt * u).unsqueeze(-1) * B.transpose(1, 2).unsqueeze(1)
    h = torch_linrec.scan(dBu, dA, dim=2)
    y = (h * C.transpose(1, 2).unsqueeze(1)).sum(-1) + D[:, None].to(u.dtype) * u
    return y * F.silu(z)


def _min_bytes(case: Case, backward: bool) -> int:
    e = torch.finfo(case.dtype).bits // 8
    seq = case.batch * case.dim * case.length * e
    bc = 2 * case.batch * case.nstate * case.length * e
    fwd = 4 * seq + bc  # read u, delta, z, B, C; write out
    return fwd + (7 * seq + 2 * bc if backward else 0)  # + read u, delta, z, dout, B, C; write du, ddelta, dz, dB, dC


def _add_bandwidth(case: Case, device, timer) -> float:
    a = torch.empty(case.batch * case.dim * case.length, device=device, dtype=case.dtype).normal_()
    b = torch.empty_like(a).normal_()
    ms = timer(lambda: torch.add(a, b))
    return 3 * a.numel() * a.element_size() / (ms * 1e-3)


def implementations() -> dict:
    """``{name: (fn, with_pass)}``: the fused op; the unfused path eager and compiled; and, when
    :mod:`torch_linrec.compile` has the fusion pass, compiled with the pass (``with_pass=True``)."""
    impls = {"fused": (fused, False), "unfused-eager": (unfused_selective_scan, False),
             "unfused-compiled": (torch.compile(unfused_selective_scan, fullgraph=True), False)}
    try:
        from .. import compile as _compile
    except ImportError:
        return impls
    if hasattr(_compile, "selective_scan_fusion"):
        impls["unfused-compiled+pass"] = (torch.compile(unfused_selective_scan, fullgraph=True), True)
    return impls


def default_cases(device: torch.device, quick: bool = False) -> tuple[list[Case], str]:
    """The cases of a run and their size label (the CSV's ``size`` column).

    CUDA: :data:`CASES` (``"full"``), with ``quick`` :data:`QUICK` (``"quick"``). CPU:
    :data:`QUICK`, a scaled-down Mamba shape (``"scaled"``), with ``quick`` :data:`TINY` (``"quick"``).
    """
    if device.type == "cuda":
        return (QUICK, "quick") if quick else (CASES, "full")
    return (TINY, "quick") if quick else (QUICK, "scaled")


def _sig3(v: float) -> float:
    """Three significant digits (a CPU's ratios are far below 0.001)."""
    return float(f"{v:.3g}")


def run_case(case: Case, name: str, fn, device, timer, add_bw: float) -> dict:
    inputs = make_inputs(case, device)
    grad_names = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
    args = [inputs[k] for k in grad_names]
    leaves = [t.detach().requires_grad_() for t in args]
    row = {"case": case.name, "impl": name, "shape": f"{case.batch}x{case.dim}x{case.length} N={case.nstate}",
           "dtype": str(case.dtype).removeprefix("torch."), "layout": case.layout}
    try:
        with torch.no_grad():
            fn(*args)
            ms_f = timer(lambda: fn(*args))
            _, peak_f = measure_peak(lambda: fn(*args), device)
        out = fn(*leaves)
        gout = torch.randn_like(out)
        del out

        def fwd_bwd():
            return torch.autograd.grad(fn(*leaves), leaves, gout)
        fwd_bwd()
        ms_fb = timer(fwd_bwd)
        _, peak_fb = measure_peak(fwd_bwd, device)
        # Host and device apart: eager forward+backward measures whichever is slower, and at the
        # Mamba-370m shape the two are close (bench/NOTES.md items 34, 35).
        row["host_ms_fwd_bwd"] = round(timer.host_ms(fwd_bwd), 4)
        status = "ok"
        try:
            graph = timer.graph_ms(fwd_bwd)
            row["graph_ms_fwd_bwd"] = None if math.isnan(graph) else round(graph, 4)
        except Exception as exc:  # noqa: BLE001 -- not capturable: the eager numbers stand, the status says why
            status = f"ok (no CUDA graph: {type(exc).__name__}: {str(exc)[:80]})"
        row.update(ms_fwd=round(ms_f, 4), ms_fwd_bwd=round(ms_fb, 4),
                   peak_fwd_gib=round(peak_f / 2**30, 3) if peak_f is not None else None,
                   peak_fwd_bwd_gib=round(peak_fb / 2**30, 3) if peak_fb is not None else None,
                   ratio_fwd=_sig3(_min_bytes(case, False) / add_bw / (ms_f * 1e-3)),
                   ratio_fwd_bwd=_sig3(_min_bytes(case, True) / add_bw / (ms_fb * 1e-3)), status=status)
    except torch.OutOfMemoryError:
        row["status"] = "out of memory"
    except Exception as exc:  # reported in the row; the other implementations still run
        row["status"] = f"error: {type(exc).__name__}: {str(exc)[:120]}"
    finally:
        del leaves, args, inputs
        free_memory(device)
    return row


# host_ms_fwd_bwd: the host's time per eager forward+backward call (Timer.host_ms); graph_ms_fwd_bwd:
# the device's time of it (Timer.graph_ms, CUDA graph replay; empty off CUDA). Appended last, so that
# readers of older CSV files by position still work.
COLUMNS = ["case", "impl", "shape", "dtype", "layout", "ms_fwd", "ms_fwd_bwd", "peak_fwd_gib", "peak_fwd_bwd_gib",
           "ratio_fwd", "ratio_fwd_bwd", "rewrites", "status", "size", "host_ms_fwd_bwd", "graph_ms_fwd_bwd"]


def run_section(cases: list[Case], size: str, device: torch.device, timer, impls: dict | None = None,
                log=None) -> list[dict]:
    """Runs every implementation on every case; returns one row (``{column: value}``) per pair.

    Args:
        cases: the cases (see :func:`default_cases`); ``size`` their label, ``"full"``, ``"scaled"``
            or ``"quick"``.
        device: where to run; ``timer``: ``timer(fn) -> ms`` (:func:`~torch_linrec.bench.timing.make_timer`).
        impls: ``{name: (fn, with_pass)}`` (default :func:`implementations`).
        log: called with each row's ``key=value`` line as it finishes (None: silent).

    A failing implementation gives a row whose ``status`` holds the error; nothing is raised.
    """
    impls = implementations() if impls is None else impls
    rows = []
    for case in cases:
        add_bw = _add_bandwidth(case, device, timer)
        for name, (fn, with_pass) in impls.items():
            torch._dynamo.reset()
            if with_pass:
                from ..compile import fusion_stats, selective_scan_fusion
                before = fusion_stats().get("selective_scan_fusion", 0)
                with selective_scan_fusion():
                    row = run_case(case, name, fn, device, timer, add_bw)
                row["rewrites"] = fusion_stats().get("selective_scan_fusion", 0) - before
            else:
                row = run_case(case, name, fn, device, timer, add_bw)
            row["size"] = size
            rows.append(row)
            if log is not None:
                log("  ".join(f"{k}={row.get(k)}" for k in COLUMNS if row.get(k) is not None))
    return rows


def format_table(rows: list[dict]) -> str:
    """The rows as an aligned text table; the case name carries ``(scaled)`` / ``(quick)`` off the full size,
    ``-`` marks a value not measured (peak memory off CUDA, a failed run)."""
    def cell(v):
        return "-" if v is None or v == "" else str(v)

    header = ("implementation", "case", "shape", "dtype", "layout", "ms fwd", "ms fwd+bwd", "peak GiB fwd",
              "peak GiB fwd+bwd", "ratio fwd", "ratio fwd+bwd", "rewrites", "host ms fwd+bwd", "graph ms fwd+bwd",
              "status")
    body = [(r["impl"], r["case"] if r.get("size", "full") == "full" else f"{r['case']} ({r['size']})", r["shape"],
             r["dtype"], r["layout"], *(cell(r.get(k)) for k in COLUMNS[5:12]),
             *(cell(r.get(k)) for k in COLUMNS[14:16]), r["status"]) for r in rows]
    return align_table(header, body, left={0, 1, 2, 3, 4, 14}, groups=[r["case"] for r in rows])


def write_csv(rows: list[dict], path: Path) -> Path:
    """Writes the rows with the :data:`COLUMNS` header to ``path`` (parents created); empty where not measured."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in COLUMNS})
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m torch_linrec selective [--quick] [--out DIR] [--impls a,b] [--cases a,b]``; returns 0."""
    p = argparse.ArgumentParser(prog="python -m torch_linrec selective", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one small case, short timing (a smoke test)")
    p.add_argument("--out", type=Path, default=None, help="folder for the CSV (default: none written)")
    p.add_argument("--impls", default=None, help="comma-separated subset of the implementations")
    p.add_argument("--cases", default=None, help="comma-separated subset of the cases")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timer = make_timer(device, quick=args.quick)
    impls = implementations()
    if args.impls:
        impls = {k: v for k, v in impls.items() if k in args.impls.split(",")}
    cases, size = default_cases(device, args.quick)
    if args.cases:
        cases = [c for c in cases if c.name in args.cases.split(",")]
    print(f"selective scan on {device_name(device)}; ratio = the fewest bytes at torch.add speed / time")
    rows = run_section(cases, size, device, timer, impls, log=lambda line: print(line, flush=True))
    if args.out:
        print(f"wrote {write_csv(rows, args.out / f'selective-{device_slug(device)}.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
