"""The main job, ``python -m torch_linrec``: correctness checks, the scan benchmark suite, then the
selective-scan benchmark.

Sections (``--sections``, default both): ``scan``: (1) every scan implementation against float64
``scan_ref`` on small shapes, PASS/FAIL per implementation; (2) every implementation on every case
of the suite (and the ``--shapes`` the user gives); (3) a table on stdout, a CSV file and a PNG chart
in the output folder. ``selective``: the cases and implementations of ``python -m torch_linrec
selective`` (:mod:`torch_linrec.bench.selective`; on a CPU one scaled-down case), a table and a CSV
file ``selective-<device>.csv`` in the same folder. The exit status is 1 when some implementation
did not PASS the checks, else 0; benchmark errors are reported in the rows and do not change it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from .. import __version__
from .._library import build_info
from .cases import SHAPE_SYNTAX, SUITE, format_shape, parse_shape, select_cases
from .check import run_checks
from .impls import IMPL_HELP, implementations, select_impls
from .report import format_notes, format_table, plot_ratios, write_csv
from .runner import run_benchmark
from .timing import device_name, device_slug, make_timer

__all__ = ["main", "build_parser", "default_out_dir", "SECTIONS"]

SECTIONS = ("scan", "selective")


# What to expect from a CPU run (printed with its results), measured on the 2-core dev machine:
# ratios 0.3-3.9 forward at the scaled sizes (torch.add is slow there too: a few cores, one pass),
# 0.1-0.4 at --quick sizes, where per-call host time dominates.
CPU_EXPECTATION = ("on a CPU expect ratios around 1 (0.3-4 at the scaled sizes on 2 cores; 0.1-0.4 with "
                   "--quick, where per-call overhead dominates): few cores bound both the scan and torch.add; "
                   "the GPU suite is the benchmark (README, Results)")


def default_out_dir() -> Path:
    """The per-user data folder's ``results`` (``platformdirs``), never the source checkout."""
    import platformdirs
    return platformdirs.user_data_path("torch_linrec") / "results"


def _names(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [n for v in values for n in v.split(",") if n]


def _shape_arg(text: str):
    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface of the main job."""
    p = argparse.ArgumentParser(
        prog="python -m torch_linrec",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Check every torch_linrec implementation against a float64 reference, then benchmark "
                    "the case suite against torch.add and write a table, a CSV file and a PNG chart (section "
                    "scan); then benchmark the selective scan (Mamba) as `python -m torch_linrec selective` "
                    "does and write its table and CSV (section selective; one scaled-down case on a CPU).\n"
                    "`python -m torch_linrec tune --help`: the tuner of the per-GPU config cache; "
                    "`python -m torch_linrec selective --help`: the selective-scan benchmark alone.",
        epilog="implementations (--impls):\n" + "\n".join(f"  {name:<10} {text}" for name, text in IMPL_HELP.items()))
    p.add_argument("--cases", nargs="+", metavar="NAME",
                   help=f"cases to run (space or comma separated); default all: {', '.join(c.name for c in SUITE)}")
    p.add_argument("--shapes", nargs="+", metavar="SPEC", type=_shape_arg,
                   help=f"scan shapes to benchmark besides the suite (alone unless --cases is given; never scaled): "
                        f"{SHAPE_SYNTAX}")
    p.add_argument("--impls", nargs="+", metavar="NAME",
                   help="scan implementations to run (space or comma separated); default all available on the "
                        "device")
    p.add_argument("--sections", nargs="+", metavar="NAME",
                   help=f"sections to run (space or comma separated): {', '.join(SECTIONS)}; default both, or scan "
                        "alone when --cases or --shapes picks scan cases")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help=f"folder of the CSV and PNG files (default: {default_out_dir()})")
    p.add_argument("--quick", action="store_true", help="tiny shapes and short timings, both sections (smoke test)")
    p.add_argument("--no-check", action="store_true", help="skip the correctness stage (of the scan section)")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG chart")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--device", help="device to run on (default: cuda when available, else cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    return p


def _device(parser: argparse.ArgumentParser, name: str | None) -> torch.device:
    try:
        device = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as exc:
        parser.error(str(exc))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device must be a cpu or cuda device, got {device}")
    return device


def _sections(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    names = _names(args.sections)
    if names is None:
        return ["scan"] if args.cases or args.shapes else list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"--sections: unknown section(s) {unknown}; expected some of {list(SECTIONS)}")
    return [n for n in SECTIONS if n in names]


def _scan_section(args: argparse.Namespace, device: torch.device, cases, impls, out: Path, stem: str) -> int:
    """The checks, the case suite, its table, CSV and chart; returns 1 when a check did not PASS, else 0."""
    size = "quick" if args.quick else "full" if device.type == "cuda" else "scaled"
    dev_name = device_name(device)
    print(f"implementations: {', '.join(i.name for i in impls)}")
    if size == "scaled" and any(case.shape(size) != case.full for case in cases):
        print("no CUDA device: case sizes scaled down for the CPU (leading/batch dims divided)")
    for case in cases:
        scaled = "" if case.shape(size) == case.full else f"  (full size {format_shape(case.full)})"
        print(f"  case {case.name:<16} {case.layout:<3} {str(case.dtype).removeprefix('torch.'):<8} "
              f"{format_shape(case.shape(size))}{scaled}")
    sys.stdout.flush()

    status = 0
    if not args.no_check:
        results = run_checks(impls, device)
        status = int(any(r.status != "PASS" for r in results))
        sys.stdout.flush()

    timer = make_timer(device, quick=args.quick)
    rows = run_benchmark(impls, cases, device, size, timer, dev_name=dev_name, seed=args.seed,
                         progress=not args.no_progress)
    bcast = "; broadcast coeffs count as their fraction f of a tensor: 2+f, 5+3f" if any(c.coeffs for c in cases) else ""
    print(f"\nbenchmark on {dev_name}: ratio = speed relative to torch.add moving the same bytes "
          f"(fwd 3 tensors, fwd+bwd 8{bcast})")
    print("host ms fwd+bwd: the host's time per eager forward+backward call; graph ms fwd+bwd: the device's, "
          "replaying it as a CUDA graph" + (" (CUDA only: left out here)" if device.type == "cpu" else ""))
    if device.type == "cpu":
        print(CPU_EXPECTATION)
    shown = [row for row in rows if row.status != "skipped"]  # skips are one line of the notes
    print(format_table(shown))
    notes = format_notes(rows)
    if notes:
        print("notes:\n" + notes)
    print(f"wrote {write_csv(shown, out / f'{stem}.csv')}")
    if not args.no_plot:
        title = f"torch_linrec vs torch.add on {dev_name}" + ("" if size == "full" else f" ({size} sizes)")
        print(f"wrote {plot_ratios(shown, out / f'{stem}.png', title)}")
    return status


def _selective_section(args: argparse.Namespace, device: torch.device, out: Path, stem: str) -> None:
    """The selective-scan benchmark of :mod:`torch_linrec.bench.selective`: its table and ``selective-<stem>.csv``."""
    from . import selective

    cases, size = selective.default_cases(device, args.quick)
    print(f"\nselective scan (Mamba) on {device_name(device)}: ratio = the fewest bytes moved at torch.add speed "
          f"/ time (as `python -m torch_linrec selective`)")
    if size == "scaled":
        print("no CUDA device: the selective-scan case scaled down for the CPU "
              f"(full cases: {', '.join(c.name for c in selective.CASES)})")
    sys.stdout.flush()
    rows = selective.run_section(cases, size, device, make_timer(device, quick=args.quick))
    print(selective.format_table(rows))
    print(f"wrote {selective.write_csv(rows, out / f'selective-{stem}.csv')}")


def main(argv: list[str] | None = None) -> int:
    """Runs the main job with command-line arguments ``argv`` (default ``sys.argv[1:]``).

    Returns:
        The exit status: 1 when an implementation failed or raised in the checks, else 0.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    device = _device(parser, args.device)
    sections = _sections(parser, args)
    try:
        cases = select_cases(_names(args.cases)) if args.cases or not args.shapes else []
        impls = select_impls(implementations(device), _names(args.impls))
    except ValueError as exc:
        parser.error(str(exc))
    cases += args.shapes or []
    names = [case.name for case in cases]
    if len(set(names)) < len(names):
        parser.error(f"--shapes: an entry repeats a case: {sorted({n for n in names if names.count(n) > 1})}")
    from ..distributed.bench import launched_by_torchrun
    cp_status = 0
    if launched_by_torchrun():  # torchrun --nproc-per-node K -m torch_linrec: the multi-GPU section first
        from ..distributed.bench import run_section
        cp_status, rank0 = run_section(device.type, args.out or default_out_dir(), quick=args.quick)
        if not rank0:
            return cp_status
    print(f"torch_linrec {__version__}, torch {torch.__version__}, device: {device_name(device)}")
    print(build_info())
    out = args.out or default_out_dir()
    stem = device_slug(device) + ("-quick" if args.quick else "")
    status = 0
    if "scan" in sections:
        status = _scan_section(args, device, cases, impls, out, stem)
    if "selective" in sections:
        _selective_section(args, device, out, stem)
    return max(status, cp_status)
