"""Tests of the main job, ``python -m torch_linrec``, in ``--quick`` mode on the CPU."""
from __future__ import annotations

import csv
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import CUDA_MARKS

from torch_linrec.bench import SUITE, Impl, Row, implementations, main, run_benchmark, run_checks, selective
from torch_linrec.bench.cli import _sections, build_parser
from torch_linrec.bench.cases import make_inputs, parse_shape
from torch_linrec.bench.check import CHECK_CONFIGS, TOLERANCE
from torch_linrec.bench.reference import rel_err
from torch_linrec.bench.report import format_notes
from torch_linrec.bench.timing import device_slug, make_timer
from torch_linrec.linrec.reference import chunked_scan, scan_backward_ref, scan_ref

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
# The columns of the committed selective results (bench/results/selective-h100.csv), in order.
_SELECTIVE_COMMITTED = ["case", "impl", "shape", "dtype", "layout", "ms_fwd", "ms_fwd_bwd", "peak_fwd_gib",
                        "peak_fwd_bwd_gib", "ratio_fwd", "ratio_fwd_bwd", "rewrites", "status"]


def _impl(name: str) -> Impl:
    return next(i for i in implementations(CPU) if i.name == name)


def _read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_quick_job_writes_csv_and_plot_and_native_passes(tmp_path):
    """The job as users run it: exit status 0, native PASS, one CSV row per implementation x case;
    then the selective section: its table and one CSV row per selective implementation."""
    proc = subprocess.run([sys.executable, "-m", "torch_linrec", "--quick", "--device", "cpu", "--out", str(tmp_path),
                           "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert any(line.split()[:2] == ["native", "PASS"] for line in proc.stdout.splitlines()), proc.stdout
    csvs, pngs = sorted(tmp_path.glob("*.csv")), list(tmp_path.glob("*.png"))
    assert len(csvs) == 2 and len(pngs) == 1, csvs
    selective_csv, scan_csv = sorted(csvs, key=lambda p: not p.name.startswith("selective-"))
    assert scan_csv.name.endswith("-quick.csv") and selective_csv.name == "selective-" + scan_csv.name
    _check_selective_csv(selective_csv, selective.implementations(), selective.TINY, "quick")
    assert "selective scan (Mamba)" in proc.stdout and "tiny-bf16 (quick)" in proc.stdout
    assert pngs[0].stat().st_size > 10_000
    header, rows = _read_csv(scan_csv)
    assert header == Row.columns()
    # skipped runs (the Python-loop reference on non-tiny cases, interpreted Triton) are notes, not rows
    impls = [i.name for i in implementations(CPU) if i.timed]
    expect = {(i, c.name) for i in impls for c in SUITE} - {("reference", "very-few-long")}
    assert {(r["impl"], r["case"]) for r in rows} == expect and len(rows) == len(expect)
    for r in rows:
        case = next(c for c in SUITE if c.name == r["case"])
        assert r["size"] == "quick" and r["shape"] == "x".join(map(str, case.quick))
        assert r["status"] == "ok", r
        if r["impl"] != "native":
            continue
        for col in ("ms_fwd", "ms_fwdbwd", "gbps_fwd", "gbps_fwdbwd", "ms_add", "ratio_fwd", "ratio_fwdbwd",
                    "host_ms_fwdbwd"):
            assert float(r[col]) > 0, (col, r)
        assert float(r["max_err"]) <= TOLERANCE[getattr(torch, r["dtype"])]
        assert math.isnan(float(r["peak_mem_mb"])) and math.isnan(float(r["graph_ms_fwdbwd"]))
    table = proc.stdout[proc.stdout.index("implementation  case"):]
    assert "skipped" not in table.split("notes:")[0] and "peak mem" not in table  # CPU: no memory column
    assert "host ms fwd+bwd" in table and "graph ms" not in table.splitlines()[0]  # nor a CUDA-graph column
    assert "skipped: reference on very-few-long (quick)" in proc.stdout
    assert "on a CPU expect ratios around 1" in proc.stdout
    assert header[-2:] == ["host_ms_fwdbwd", "graph_ms_fwdbwd"]  # appended: older columns keep their places


def _check_selective_csv(path: Path, impls, cases, size: str) -> None:
    """The selective section's CSV: the committed results' columns, one ok row per implementation x case."""
    header, rows = _read_csv(path)
    assert header == selective.COLUMNS and header[:13] == _SELECTIVE_COMMITTED
    assert [(r["case"], r["impl"]) for r in rows] == [(c.name, i) for c in cases for i in impls]
    for r in rows:
        assert r["status"] == "ok" and r["size"] == size, r
        assert float(r["ms_fwd"]) > 0 and float(r["ms_fwd_bwd"]) > 0 and float(r["ratio_fwd"]) > 0
        assert r["peak_fwd_gib"] == "" and r["graph_ms_fwd_bwd"] == ""  # CPU: not measured
        assert float(r["host_ms_fwd_bwd"]) > 0
        # the pass's rewrite count (0 when Inductor's warm cache on torch >= 2.13 serves the compile)
        assert (r["rewrites"] != "") == r["impl"].endswith("+pass")
        assert r["rewrites"] == "" or int(r["rewrites"]) >= 0


def test_selective_subcommand_writes_its_csv(tmp_path, capsys):
    """`python -m torch_linrec selective` as before: a line per row, the CSV named selective-<device>.csv."""
    assert selective.main(["--quick", "--impls", "fused,unfused-eager", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "impl=fused" in out and "impl=unfused-eager" in out
    (path,) = tmp_path.glob("*.csv")
    assert path.name == f"selective-{device_slug(CPU)}.csv"
    _check_selective_csv(path, ["fused", "unfused-eager"], selective.TINY, "quick")


def test_selective_cases_per_device():
    """CPU: one scaled-down case, a tinier one with --quick; CUDA: the full cases (the quick case with --quick)."""
    assert selective.default_cases(CPU) == (selective.QUICK, "scaled")
    assert selective.default_cases(CPU, quick=True) == (selective.TINY, "quick")
    assert selective.default_cases(torch.device("cuda"), quick=False) == (selective.CASES, "full")
    (tiny,), (small,) = selective.TINY, selective.QUICK
    assert tiny.batch * tiny.dim * tiny.length < small.batch * small.dim * small.length


@pytest.mark.parametrize("argv,expect", [([], ["scan", "selective"]), (["--cases", "small-call"], ["scan"]),
                                         (["--sections", "selective"], ["selective"]),
                                         (["--sections", "selective,scan"], ["scan", "selective"]),
                                         (["--cases", "small-call", "--sections", "scan", "selective"],
                                          ["scan", "selective"])])
def test_sections_default_and_choice(argv, expect):
    parser = build_parser()
    assert _sections(parser, parser.parse_args(argv)) == expect


def test_results_go_to_the_user_data_dir_and_help_lists_impls():
    from torch_linrec.bench.cli import build_parser, default_out_dir
    assert ROOT not in default_out_dir().parents
    text = build_parser().format_help()
    for name in ("auto", "native", "triton", "reference"):
        assert f"  {name} " in text


def test_full_size_case_is_not_labelled_scaled():
    """small-call's scaled shape is its full shape: its rows say full, not scaled."""
    case = next(c for c in SUITE if c.name == "small-call")
    assert case.scaled == case.full
    rows = run_benchmark([_impl("native")], [case], CPU, "scaled", make_timer(CPU, quick=True), progress=False)
    assert rows[0].size == "full" and rows[0].status == "ok"


def test_check_stage_passes_for_native():
    """Every check configuration is within tolerance for the native CPU kernel."""
    (res,) = run_checks([_impl("native")], CPU, log=lambda _: None)
    assert res.status == "PASS", res.problems
    assert res.configs == len(CHECK_CONFIGS)
    assert res.max_err["float32"] < 1e-5


def _raises(x, coeffs, initial=None, dim=-1, reverse=False):
    raise RuntimeError("no kernel for this device")


def _off_by_one_percent(x, coeffs, initial=None, dim=-1, reverse=False):
    return 1.01 * torch.ops.linrec.scan(x, coeffs, initial, dim, reverse)


def test_failing_implementations_are_reported_not_raised():
    """A raising implementation gives ERROR / error rows, a wrong one FAIL / inaccurate rows."""
    impls = [_impl("native"), Impl("raises", _raises), Impl("wrong", _off_by_one_percent)]
    checks = {r.impl: r for r in run_checks(impls, CPU, CHECK_CONFIGS[:3], log=lambda _: None)}
    assert [checks[n].status for n in ("native", "raises", "wrong")] == ["PASS", "ERROR", "FAIL"]
    assert "no kernel for this device" in checks["raises"].problems[0]
    cases = [c for c in SUITE if c.name in ("small-call", "bf16-many-short")]
    rows = run_benchmark(impls, cases, CPU, "quick", make_timer(CPU, quick=True), progress=False)
    status = {(r.impl, r.case): r for r in rows}
    for case in cases:
        assert status[("native", case.name)].status == "ok"
        bad = status[("raises", case.name)]
        assert bad.status == "error" and "no kernel for this device" in bad.error and math.isnan(bad.ms_fwd)
        assert status[("wrong", case.name)].status == ("ok" if case.dtype == torch.bfloat16 else "inaccurate")


def test_subset_and_options(tmp_path, capsys):
    """--cases / --impls pick rows; --no-check skips the checks; --no-plot writes no PNG."""
    assert main(["--quick", "--device", "cpu", "--cases", "small-call,mamba-BLD", "--impls", "native",
                 "--no-check", "--no-plot", "--no-progress", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "PASS" not in out and "small-call (quick)" in out
    assert not list(tmp_path.glob("*.png"))
    _, rows = _read_csv(next(tmp_path.glob("*.csv")))
    assert [(r["impl"], r["case"]) for r in rows] == [("native", "mamba-BLD"), ("native", "small-call")]


@pytest.mark.parametrize("argv", [["--cases", "no-such-case"], ["--impls", "no-such-impl"],
                                  ["--sections", "no-such-section"]])
def test_unknown_names_are_rejected(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--quick", "--device", "cpu", *argv])
    assert exc.value.code == 2
    assert "no-such" in capsys.readouterr().err


@pytest.mark.parametrize("shape,dim,reverse,coeffs,initial,chunk", [
    ((3, 37), -1, False, None, None, 8),
    ((2, 100), -1, True, None, (2,), None),
    ((2, 33, 5), 1, True, (5,), (2, 5), 4),
    ((4, 1), -1, False, (4, 1), (4,), None),
    ((2, 17, 3), 1, False, (2, 1, 3), None, 16),
])
def test_chunked_reference_matches_scan_ref(shape, dim, reverse, coeffs, initial, chunk):
    """The fast float64 reference (torch_linrec.linrec.reference.chunked_scan, which the benchmark's
    checks use) agrees with the step-by-step loop, forward and backward (scan_backward_ref on either)."""
    x, c, gy = make_inputs(shape, torch.float64, CPU, seed=1, coeff_shape=coeffs)
    h0 = torch.randn(initial, dtype=torch.float64) if initial else None
    y = scan_ref(x, c, h0, dim, reverse)
    assert rel_err(chunked_scan(x, c, h0, dim, reverse, chunk=chunk), y) < 1e-13
    grads = zip(scan_backward_ref(gy, c, y, h0, dim, reverse, scan=chunked_scan),
                scan_backward_ref(gy, c, y, h0, dim, reverse))
    for got, want in grads:
        assert got.shape == want.shape and rel_err(got, want) < 1e-13


@pytest.mark.parametrize("spec,shape,dtype,dim,reverse,coeffs,name", [
    ("16x4194304:fp32", (16, 4194304), torch.float32, -1, False, None, "16x4194304:fp32"),
    ("8x4096x4096:bf16:dim=1", (8, 4096, 4096), torch.bfloat16, 1, False, None, "8x4096x4096:bf16:dim=1"),
    ("1000x3001:fp16:reverse", (1000, 3001), torch.float16, -1, True, None, "1000x3001:fp16:reverse"),
    (" 7x5 ", (7, 5), torch.float32, -1, False, None, "7x5:fp32"),
    ("4x9:bcast", (4, 9), torch.float32, -1, False, (4, 1), "4x9:fp32:coeffs=4x1"),
    ("2x9x3:reverse:dim=-2:bcast:float16", (2, 9, 3), torch.float16, -2, True, (2, 1, 3),
     "2x9x3:fp16:dim=-2:reverse:coeffs=2x1x3"),
    ("2x9x3:dim=1:coeffs=3", (2, 9, 3), torch.float32, 1, False, (3,), "2x9x3:fp32:dim=1:coeffs=3"),
    ("2x9x3:coeffs=2x9x3", (2, 9, 3), torch.float32, -1, False, None, "2x9x3:fp32"),
])
def test_parse_shape(spec, shape, dtype, dim, reverse, coeffs, name):
    case = parse_shape(spec)
    assert (case.full, case.scaled, case.quick) == (shape, shape, shape)
    assert (case.dtype, case.dim, case.reverse, case.coeffs, case.name) == (dtype, dim, reverse, coeffs, name)
    assert parse_shape(case.name) == case  # the name is the canonical spec


@pytest.mark.parametrize("spec,message", [
    ("", "the shape must be positive sizes"), ("16xx4", "the shape"), ("0x3:fp32", "the shape"),
    ("4x-5", "the shape"), ("16x4:fp64", "unknown option 'fp64'"), ("16x4:dtype=bf16", "unknown option"),
    ("16x4:reverse=1", "unknown option"), ("16x4:dim=2", "dim must be an integer in [-2, 1]"),
    ("16x4:dim=x", "dim must be an integer"), ("16x4:bcast:coeffs=4", "contradicts"),
    ("16x4:fp32:bf16", "repeats"), ("4x5:coeffs=3", "does not broadcast"),
    ("4x5:coeffs=2x4x5", "does not broadcast"), ("4x5:coeffs=4x", "coeffs must be positive sizes"),
])
def test_bad_shapes_are_rejected_naming_the_entry(spec, message, capsys):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_shape(spec)
    with pytest.raises(SystemExit) as exc:
        main(["--quick", "--device", "cpu", "--shapes", "8x16", spec])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --shapes" in err and repr(spec) in err and message in err


def test_repeated_shape_is_rejected(capsys):
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--shapes", "8x16", "8x16:fp32"])
    assert "8x16:fp32" in capsys.readouterr().err


def test_shapes_run_alone_unless_cases_given(tmp_path, capsys):
    """--shapes alone: only those shapes, scan section only; the CSV rows carry the canonical names."""
    assert main(["--quick", "--device", "cpu", "--shapes", "2x33x5:bf16:dim=1:reverse", "3x40:bcast",
                 "--impls", "native", "--no-check", "--no-plot", "--no-progress", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.csv")  # no selective CSV: --shapes picks the scan section alone
    _, rows = _read_csv(path)
    assert [(r["case"], r["shape"], r["dim"], r["dtype"], r["size"]) for r in rows] == [
        ("2x33x5:bf16:dim=1:reverse", "2x33x5", "1", "bfloat16", "full"),
        ("3x40:fp32:coeffs=3x1", "3x40", "-1", "float32", "full")]
    for r in rows:
        assert r["status"] == "ok" and float(r["err_grad_coeffs"]) <= TOLERANCE[getattr(torch, r["dtype"])], r
    assert "broadcast coeffs count as their fraction" in capsys.readouterr().out
    assert main(["--quick", "--device", "cpu", "--cases", "small-call", "--shapes", "3x40", "--impls", "native",
                 "--no-check", "--no-plot", "--no-progress", "--out", str(tmp_path)]) == 0
    _, rows = _read_csv(path)
    assert [r["case"] for r in rows] == ["small-call", "3x40:fp32"]


def _ignores_reverse(x, coeffs, initial=None, dim=-1, reverse=False):
    return torch.ops.linrec.scan(x, coeffs, initial, dim, False)


def test_shape_options_reach_the_scan_and_the_reference():
    """reverse is passed on (an implementation that ignores it is inaccurate); coeffs broadcast along the
    reference's slice leave grad_coeffs unchecked (NaN) but y and grad_x checked."""
    impls = [_impl("native"), Impl("ignores-reverse", _ignores_reverse)]
    cases = [parse_shape("3x40:reverse"), parse_shape("5x16x4:dim=1:coeffs=4")]
    rows = {(r.impl, r.case): r for r in run_benchmark(impls, cases, CPU, "quick", make_timer(CPU, quick=True),
                                                       progress=False)}
    assert rows[("native", "3x40:fp32:reverse")].status == "ok"
    assert rows[("ignores-reverse", "3x40:fp32:reverse")].status == "inaccurate"
    bcast = rows[("native", "5x16x4:fp32:dim=1:coeffs=4")]
    assert bcast.status == "ok" and math.isnan(bcast.err_grad_coeffs)
    assert bcast.max_err == max(bcast.err_y, bcast.err_grad_x) and bcast.ratio_fwdbwd > 0
    # ratio_fwdbwd counts 5 + 3f tensors against torch.add's 2 + f (f = 4 / 320)
    f = 4 / 320
    assert bcast.ratio_fwdbwd == pytest.approx((5 + 3 * f) / (2 + f) * bcast.ms_add / bcast.ms_fwdbwd)


def test_host_time_is_per_call_and_device_time_needs_cuda():
    """host_ms divides a batch's wall time by its calls (each call sleeps 2 ms); graph_ms is NaN on the CPU."""
    timer = make_timer(CPU, quick=True)
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)
    assert timer.host_ms(fn) >= 2.0 and len(calls) >= 3
    assert math.isnan(timer.graph_ms(fn))
    (row,) = run_benchmark([_impl("native")], [parse_shape("2x64x8:dim=1")], CPU, "quick", timer, progress=False)
    assert row.host_ms_fwdbwd > 0 and math.isnan(row.graph_ms_fwdbwd) and row.error == ""


def test_cpu_timer_flushes_the_cache_before_each_timed_call(monkeypatch):
    """On the CPU every timed call follows a pass over the flush buffer (as do_bench flushes the L2 on
    CUDA); the warmup call does not, nor does quick mode."""
    from torch_linrec.bench import timing
    buf = torch.ones(4)
    monkeypatch.setattr(timing, "_cache_flush_buffer", lambda: buf)
    seen = []
    timing.make_timer(CPU)(lambda: seen.append(buf[0].item()))
    assert len(seen) >= 4 and seen[0] == 1.0
    assert seen[1:] == [(-1.0) ** k for k in range(1, len(seen))]
    seen.clear()
    timing.make_timer(CPU, quick=True)(lambda: seen.append(buf[0].item()))
    assert len(set(seen)) == 1
    assert timing._last_level_cache_bytes() >= 0


def test_cpu_interleaved_timer_goes_round_robin_after_flushes(monkeypatch):
    """Timer.interleaved on the CPU times its calls in turn, a, b, a, b, ..., each after a pass over
    the flush buffer (after one untimed warmup call each), and returns one median per call."""
    from torch_linrec.bench import timing
    buf = torch.ones(4)
    monkeypatch.setattr(timing, "_cache_flush_buffer", lambda: buf)
    seen = []

    def a():
        seen.append(("a", buf[0].item()))

    def b():
        seen.append(("b", buf[0].item()))
        time.sleep(0.003)
    ms_a, ms_b = timing.make_timer(CPU).interleaved([a, b])
    assert seen[:2] == [("a", 1.0), ("b", 1.0)] and len(seen) >= 8 and len(seen) % 2 == 0
    assert [name for name, _ in seen[2:]] == ["a", "b"] * (len(seen) // 2 - 1)
    assert [sign for _, sign in seen[2:]] == [(-1.0) ** k for k in range(1, len(seen) - 1)]
    assert ms_b >= 3.0 > ms_a


def test_cpu_ratios_use_the_interleaved_add(monkeypatch):
    """On the CPU a row's ms_add is the torch.add timed with its own calls, and both ratios use it."""
    timer = make_timer(CPU, quick=True)
    monkeypatch.setattr(type(timer), "interleaved", lambda self, fns: [2.0, 4.0, 16.0])
    (row,) = run_benchmark([_impl("native")], [parse_shape("2x64x8:dim=1")], CPU, "quick", timer, progress=False)
    assert (row.ms_add, row.ms_fwd, row.ms_fwdbwd) == (2.0, 4.0, 16.0)
    assert row.ratio_fwd == 0.5 and row.ratio_fwdbwd == pytest.approx(8 / 3 * 2.0 / 16.0)


def test_uncapturable_call_is_a_note_not_an_error():
    row = Row(impl="x", case="small-call", size="full", shape="1x2", dim=1, dtype="float32",
              error="CUDA graph: RuntimeError: operation not permitted when stream is capturing")
    assert format_notes([row]) == f"  note: x on small-call: {row.error}"


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA_MARKS)])
def test_cuda_graph_replays_the_captured_call(device):
    """graph_ms captures the call once and times replays: a counter the call bumps moves on past the
    3 warmup calls (capture itself runs nothing)."""
    timer = make_timer(torch.device(device), quick=True)
    counter = torch.zeros((), device=device)
    ms = timer.graph_ms(lambda: counter.add_(1))
    assert ms > 0 and counter.item() > 3


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA_MARKS)])
def test_small_call_host_and_device_time_on_cuda(device):
    """Every timed implementation's forward+backward is captured in a CUDA graph on small-call (full size)."""
    dev = torch.device(device)
    impls = [i for i in implementations(dev) if i.timed and not i.slow]
    case = next(c for c in SUITE if c.name == "small-call")
    rows = run_benchmark(impls, [case], dev, "full", make_timer(dev, quick=True), progress=False)
    for row in rows:
        assert row.status == "ok" and row.error == "", (row.impl, row.error)
        assert row.host_ms_fwdbwd > 0 and row.graph_ms_fwdbwd > 0, row
