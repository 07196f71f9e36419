"""The tuner, ``python -m torch_linrec tune``: measures every applicable kernel config of each
backend per problem bucket on this GPU and writes the tuned config cache.

For each tuning problem (a shape, layout and dtype; its bucket is
:func:`torch_linrec.dispatch.bucket_key`) and each direction, every config name of
:func:`torch_linrec.config_names` runs (``"native"``, the native defaults, among them); names that
do not apply to the layout raise ValueError and are skipped. The fastest wins, except that the
native default stays where it is within :data:`KEEP_DEFAULT` of the fastest (no churn from noise).
Where several problems share a bucket, "fastest" is the best geometric mean of each config's time
over the native default's, across them (one bucket spans row counts that fill different fractions
of a wave), among the configs no more than :data:`MAX_LOSS` slower than the default on any of them.
Times are medians (``triton.testing.do_bench``), compared with ``torch.add`` on the same shape in
the same process: forward ratio ``t_add / t`` (3 tensors moved), backward ``(5/3) t_add / t`` (5).
Where a Triton config's kernel beats every native one, the host's time to issue each contender
(:meth:`~torch_linrec.bench.timing.Timer.host_ms`, through the path config ``"auto"`` runs) is
measured too and a config counts ``max(kernel, host)``: eager calls run back to back at that pace,
and a Triton launch costs tens of microseconds of Python, more than the kernels of a mid-size call.
Tuning never runs implicitly: only this command writes cache files.

The problems are :data:`SUITE` (named shapes, one or two per bucket: the main job's cases and the
shapes whose buckets they are) and :data:`GRID` (one shape per bucket at the middle of the bucket
in both length and rows, over the buckets of 2^22 to 2^28 elements: where held-out shapes fall
outside the suite's buckets).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..configs import device_identity, write
from ..dispatch import bucket_key, clear_memo, layout_class
from ..linrec.configs import config_names
from ..linrec.ops import is_triton_config
from .cases import make_inputs
from .timing import make_timer

__all__ = ["KEEP_DEFAULT", "MAX_LOSS", "TuneProblem", "SUITE", "GRID", "CHECKS", "PROBLEMS", "GROUPS", "QUICK",
           "main", "select_problems", "tune"]

KEEP_DEFAULT = 0.02
MAX_LOSS = 0.05
_F32, _BF16, _F16 = torch.float32, torch.bfloat16, torch.float16
_DTYPES = {"float32": _F32, "bfloat16": _BF16, "float16": _F16}


@dataclass(frozen=True)
class TuneProblem:
    """A tuning shape: ``x`` of ``shape`` scanned along ``dim``; ``coeffs`` of ``coeff_shape`` (None: full)."""

    name: str
    shape: tuple
    dim: int
    coeff_shape: tuple | None = None


# One problem per bucket (one bucket two): innermost rows from many short to few very long, (B, L, D)
# channels from a decoding-size call to a large layer, and broadcast (time-invariant) coeffs.
SUITE: tuple[TuneProblem, ...] = (
    TuneProblem("NL-131072x1024", (131072, 1024), -1),
    TuneProblem("NL-8192x256", (8192, 256), -1),
    TuneProblem("NL-2048x1024", (2048, 1024), -1),
    TuneProblem("NL-32768x4096", (32768, 4096), -1),
    TuneProblem("NL-4096x16384", (4096, 16384), -1),
    # the same bucket at 12 walking tiles per row: tuned at 16384 steps alone it named stream configs
    # that run one or two tiles per row at 6000 (float32 forward 0.55 of torch.add, the default 0.89)
    TuneProblem("NL-2000x6000", (2000, 6000), -1),
    TuneProblem("NL-1024x65536", (1024, 65536), -1),
    TuneProblem("NL-128x1048576", (128, 1 << 20), -1),
    # the same bucket at a wave and a half of rows (one block per row leaves SMs idle there)
    TuneProblem("NL-200x1048576", (200, 1 << 20), -1),
    TuneProblem("NL-16x4194304", (16, 1 << 22), -1),
    TuneProblem("NL-4x16777216", (4, 1 << 24), -1),
    TuneProblem("BLD-8x4096x4096", (8, 4096, 4096), 1),
    TuneProblem("BLD-1x1024x2048", (1, 1024, 2048), 1),
    TuneProblem("BLD-4x2048x1536", (4, 2048, 1536), 1),
    TuneProblem("BLD-2x16384x1024", (2, 16384, 1024), 1),
    TuneProblem("BLD-32x512x768", (32, 512, 768), 1),
    TuneProblem("BLD-8x4096x4096-bcast", (8, 4096, 4096), 1, (4096,)),
    TuneProblem("NL-131072x1024-bcast", (131072, 1024), -1, (131072, 1)),
)


def _grid() -> tuple[tuple[TuneProblem, tuple[TuneProblem, ...]], ...]:
    """``(problem, checks)`` per bucket of 2^22 to 2^28 elements (bucket tops) that :data:`SUITE`
    leaves out. For the bucket ``L<=2^a/R<=2^b`` the problem has length 2^(a-1) and rows 2^(b-1)
    (one row for b = 0), the middle of both ranges (a bucket spans a factor of 4 in each but the
    edges: ``L<=2^8`` holds every length up to 256, ``R<=2^0`` one row); the checks are length
    3 x 2^(a-3) with rows 3 x 2^(b-2) (more rows per SM, shorter; one row for b = 0) and the
    bucket's top corner, 2^b rows of 2^a steps. The default plans change with rows per SM and
    length inside a bucket: a choice made at the middle lost 15-40% elsewhere (H200, bfloat16
    L<=2^14/R<=2^10: the backward that won by 16% at 512 x 8192 lost at 600 x 6000-8000; H100,
    L<=2^12/R<=2^10: the forward and backward that won at 512 x 2048 and 768 x 1536 lost 17% at
    1000 x 4096; bench/NOTES.md item 76). Innermost rows with lengths from 2^8 to 2^26; (B, L, D)
    with D = min(rows, 1024) for lengths 2^8 to 2^16."""
    suite = {_bucket(p) for p in SUITE}
    out = []
    for layout, lengths in (("NL", range(8, 27, 2)), ("BLD", range(8, 17, 2))):
        for a in lengths:
            for b in range(0 if layout == "NL" else 8, 19, 2):
                mid = _problem(layout, 1 << (a - 1), 1 << max(b - 1, 0))
                if not 22 <= a + b <= 28 or _bucket(mid) in suite:
                    continue
                out.append((mid, (_problem(layout, 3 << (a - 3), 3 << (b - 2) if b >= 2 else 1),
                                  _problem(layout, 1 << a, 1 << b))))
    return tuple(out)


def _problem(layout: str, length: int, rows: int) -> TuneProblem:
    if layout == "NL":
        return TuneProblem(f"NL-{rows}x{length}", (rows, length), -1)
    d = min(rows, 1024)
    return TuneProblem(f"BLD-{rows // d}x{length}x{d}", (rows // d, length, d), 1)


def _bucket(p: TuneProblem) -> str:
    """The forward float32 bucket key of a problem's layout and sizes (contiguous inputs)."""
    length = p.shape[p.dim]
    layout = ("innermost" if p.dim in (-1, len(p.shape) - 1) else "strided") + ("-bcast" if p.coeff_shape else "")
    return bucket_key("scan", "fwd", torch.float32, layout, length, math.prod(p.shape) // length)


GRID: tuple[TuneProblem, ...] = tuple(p for p, _ in _grid())
# The checks of each GRID problem: run with the problem's winner and the native default only.
CHECKS: dict[str, tuple[TuneProblem, ...]] = {p.name: checks for p, checks in _grid()}
PROBLEMS: tuple[TuneProblem, ...] = SUITE + GRID
# Names that stand for a group of problems in --cases.
GROUPS = {"suite": tuple(p.name for p in SUITE), "grid": tuple(p.name for p in GRID)}
# --quick: the buckets of the main job's suite.
QUICK = ("NL-131072x1024", "NL-128x1048576", "NL-16x4194304", "BLD-8x4096x4096", "BLD-1x1024x2048")


def _run_fwd(cfg, x, c, dim):
    if is_triton_config(cfg):
        return lambda: torch.ops.linrec.scan_triton(x, c, None, dim, False, cfg)
    return lambda: torch.ops.linrec.scan(x, c, None, dim, False, cfg)


def _run_bwd(cfg, gy, c, y, dim):
    if is_triton_config(cfg):
        return lambda: torch.ops.linrec.scan_backward_triton(gy, c, y, None, dim, False, cfg)
    return lambda: torch.ops.linrec.scan_backward(gy, c, y, None, dim, False, cfg)


def _eager(cfg, direction, x, c, gy, y, dim):
    """The call that config ``"auto"`` makes for a cache entry naming ``cfg``, below the op: the
    native op, or the Triton ops' eager twins (which the native op calls for a Triton entry,
    csrc/linrec/ops.cpp; the few microseconds of that outer call are not counted)."""
    if not is_triton_config(cfg):
        return _run_fwd(cfg, x, c, dim) if direction == "fwd" else _run_bwd(cfg, gy, c, y, dim)
    if direction == "fwd":
        return lambda: torch.ops.linrec._scan_triton_eager(x, c, None, dim, False, cfg, None)
    return lambda: torch.ops.linrec._scan_backward_triton_eager(gy, c, y, None, dim, False, cfg)


def _host_bound(times: dict, host_ms) -> tuple[dict, str]:
    """``times`` (ms by config name) with each Triton config counted at its eager pace,
    ``max(kernel, host)``: the host time of the fastest Triton config (``host_ms(name) -> ms``,
    measured once) stands for every Triton config's launch, so a Triton launch slower than a native
    kernel does not win, and at a check where the Triton kernel is about as fast as the default's its
    launch still counts. Native configs keep their kernel times: they share the native op's launch,
    shorter than any Triton one (measured beside it, for the log), so flooring them at it would tie
    every native config of a host-bound problem and lose the kernel ranking that CUDA graphs and
    compiled code see. Returns the times and a note for the log (empty without a Triton config)."""
    triton = sorted((t, n) for n, t in times.items() if is_triton_config(n))
    if not triton or "native" not in times:
        return times, ""
    host = {False: host_ms("native"), True: host_ms(triton[0][1])}
    out = {n: max(t, host[True]) if is_triton_config(n) else t for n, t in times.items()}
    return out, f"host ms native {host[False]:.4f}, {triton[0][1]} {host[True]:.4f}"


def _pick(runs: list[dict]) -> str:
    """The winning config name over one bucket's problems: ``runs`` holds each problem's times (ms) by
    config name, ``"native"`` among them; configs missing from any problem are out, and so are those
    more than :data:`MAX_LOSS` slower than the native default on any problem (a bucket's choice
    applies to every shape in it: it must not cost a shape of the bucket much to gain elsewhere)."""
    names = set.intersection(*(set(t) for t in runs))
    names = {n for n in names if all(t[n] <= (1 + MAX_LOSS) * t["native"] for t in runs)}
    score = {n: statistics.geometric_mean(t[n] / t["native"] for t in runs) for n in names}
    best = min(sorted(score), key=score.get)
    if score["native"] <= (1 + KEEP_DEFAULT) * score[best]:
        return "native"
    return best


def _measure(prob: TuneProblem, dtype, names, device, timer, log) -> list:
    """Times configs on one problem: ``names`` is a list of config names, or a dict of them per
    direction. Returns ``[(bucket key, times by config, torch.add's time, tensors moved), ...]`` per
    direction (times as eager calls run them, :func:`_host_bound`)."""
    x, c, gy = make_inputs(prob.shape, dtype, device, coeff_shape=prob.coeff_shape)
    dim = prob.dim % x.dim()
    t_add = timer(lambda: torch.add(x, c))
    layout = layout_class(x, c, dim)
    rows = x.numel() // x.shape[dim]
    y = torch.ops.linrec.scan(x, c, None, dim, False)
    out = []
    for direction, make, moved in (("fwd", lambda n: _run_fwd(n, x, c, dim), 3),
                                   ("bwd", lambda n: _run_bwd(n, gy, c, y, dim), 5)):
        times = {}
        for name in names.get(direction, ()) if isinstance(names, dict) else names:
            fn = make(name)
            try:
                fn()
            except ValueError:  # the config does not apply to this layout
                continue
            except Exception as e:  # noqa: BLE001 -- e.g. out of memory, Triton out of resources
                log(f"  {prob.name:<24} {str(dtype).removeprefix('torch.'):<9} {direction}  {name} failed, "
                    f"skipped: {type(e).__name__}: {str(e)[:160]}")
                torch.cuda.empty_cache()
                continue
            times[name] = timer(fn)
        if "native" not in times:  # no direction asked, or the default itself failed
            continue
        times, note = _host_bound(times, lambda n: timer.host_ms(_eager(n, direction, x, c, gy, y, dim)))
        out.append((bucket_key("scan", direction, dtype, layout, x.shape[dim], rows), times, t_add, moved))
        win = _pick([times])
        log(f"  {prob.name:<24} {str(dtype).removeprefix('torch.'):<9} {direction}  {win:<24} "
            f"ratio {moved / 3 * t_add / times[win]:.3f}  (native default "
            f"{moved / 3 * t_add / times['native']:.3f}; {len(times)} configs{'; ' + note if note else ''})")
    del x, c, gy, y
    torch.cuda.empty_cache()
    return out


def tune(problems, dtypes, device: torch.device, quick: bool = False, progress: bool = True, log=print) -> dict:
    """Measures every config on every problem and dtype; returns the cache entries (bucket -> entry).
    ``quick``: short timings (:func:`~torch_linrec.bench.timing.make_timer`). A problem with
    checks (:data:`CHECKS`) whose winner is not the native default runs them too, with that winner
    and the default only: the bucket's choice is then picked over all of them (:func:`_pick`)."""
    timer = make_timer(device, quick=quick)
    runs: dict = {}  # bucket key -> [(problem name, times by config, torch.add's time, tensors moved)]
    todo = [(p, dt) for p in problems for dt in dtypes]
    with tqdm(total=len(todo), desc="tune", unit="problem", disable=True if not progress else None,
              dynamic_ncols=True, leave=False) as bar:
        for prob, dtype in todo:
            bar.set_postfix_str(f"{prob.name} {str(dtype).removeprefix('torch.')}")
            names = ["native"] + [n for n in config_names(device, dtype) if n != "native"]
            measured = _measure(prob, dtype, names, device, timer, log)
            for key, times, t_add, moved in measured:
                runs.setdefault(key, []).append((prob.name, times, t_add, moved))
            wins = {key.split("/")[1]: _pick([times]) for key, times, _, _ in measured}
            if set(wins.values()) - {"native"}:
                pair = {d: sorted({"native", w}) for d, w in wins.items() if w != "native"}
                for check in CHECKS.get(prob.name, ()):
                    for key, times, t_add, moved in _measure(check, dtype, pair, device, timer, log):
                        runs.setdefault(key, []).append((check.name, times, t_add, moved))
            bar.update(1)
    entries: dict = {}
    for key, bucket in runs.items():
        win = _pick([times for _, times, _, _ in bucket])
        ratios = [moved / 3 * t_add / times[win] for _, times, t_add, moved in bucket]
        first = bucket[0][1]
        entries[key] = {"config": win, "backend": "triton" if is_triton_config(win) else "native",
                        "ratio": round(statistics.geometric_mean(ratios), 4),
                        "ms": round(first[win], 5), "ms_native_default": round(first["native"], 5),
                        "problem": "+".join(name for name, _, _, _ in bucket)}
        if len(bucket) > 1:
            log(f"  bucket {key}: {win} over {entries[key]['problem']} (ratios "
                + ", ".join(f"{r:.3f}" for r in ratios) + ")")
    return entries


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_linrec tune",
                                description="Tune the kernel configs of every backend on this GPU and write the "
                                            "tuned config cache (see torch_linrec.configs).")
    p.add_argument("--quick", action="store_true", help="only the main job's buckets, short timings (< 2 min)")
    p.add_argument("--short-timings", action="store_true",
                   help="time each config over 5 + 20 ms (warmup + repeats) instead of 25 + 100: ~5x faster, "
                        "noisier")
    p.add_argument("--cases", nargs="+", metavar="NAME",
                   help="tuning problems (space or comma separated), or the groups suite (the named shapes) and "
                        "grid (one shape per bucket the suite leaves out); default all: "
                        + ", ".join(q.name for q in PROBLEMS))
    p.add_argument("--dtypes", nargs="+", metavar="DTYPE", help="float32, bfloat16, float16 (default: all; "
                                                                 "--quick: float32, bfloat16)")
    p.add_argument("--out", type=Path, metavar="FILE", help="the cache file to write (default: the user cache "
                                                            "directory's file for this GPU)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--device", default="cuda", help="the CUDA device to tune (default: cuda)")
    return p


def select_problems(cases: list[str] | None, quick: bool = False) -> list[TuneProblem]:
    """The problems ``--cases`` names: problem names or the groups of :data:`GROUPS`, in order, each
    once; None: :data:`QUICK` with ``quick``, else every problem.

    Raises:
        ValueError: naming the unknown entries and the valid ones.
    """
    known = {p.name: p for p in PROBLEMS}
    asked = cases or (list(QUICK) if quick else list(known))
    names = list(dict.fromkeys(m for n in asked for m in GROUPS.get(n, (n,))))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown tuning problem(s) {unknown}; known: {', '.join(GROUPS)} or {list(known)}")
    return [known[n] for n in names]


def _split(values):
    return [n for v in values for n in v.split(",") if n] if values else None


def main(argv: list[str] | None = None) -> int:
    """Runs the tuner with command-line arguments ``argv``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("the tuner needs a CUDA GPU (the CPU has one kernel config)")
    device = torch.device(args.device)
    try:
        problems = select_problems(_split(args.cases), args.quick)
    except ValueError as e:
        parser.error(str(e))
    names = [p.name for p in problems]
    dnames = _split(args.dtypes) or (["float32", "bfloat16"] if args.quick else list(_DTYPES))
    if any(d not in _DTYPES for d in dnames):
        parser.error(f"--dtypes must be among {list(_DTYPES)}, got {dnames}")
    identity = device_identity(device)
    print(f"tuning on {identity['name']} (sm {identity['capability']}, {identity['sms']} SMs): "
          f"{len(names)} problems x {len(dnames)} dtypes x fwd/bwd")
    start = time.perf_counter()
    short = args.quick or args.short_timings
    entries = tune(problems, [_DTYPES[d] for d in dnames], device, quick=short,
                   progress=not args.no_progress)
    elapsed = time.perf_counter() - start
    settings = {"quick": args.quick, "short_timings": short, "problems": names, "dtypes": dnames,
                "keep_default": KEEP_DEFAULT, "max_loss": MAX_LOSS, "seconds": round(elapsed, 1)}
    path = write(entries, identity, settings, path=args.out)
    clear_memo()
    print(f"\nwinners ({len(entries)} buckets, {elapsed:.0f} s):")
    width = max(len(k) for k in entries)
    for key, e in sorted(entries.items()):
        print(f"  {key:<{width}}  {e['config']:<24} ratio {e['ratio']:.3f}")
    print(f"wrote {path}")
    return 0
