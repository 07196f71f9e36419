"""Reports of the benchmark stage: a text table, a CSV file and a bar chart (PNG)."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from .check import TOLERANCE
from .runner import Row

__all__ = ["format_table", "format_notes", "write_csv", "plot_ratios", "case_label", "align_table"]

TOLERANCE_NOTE = "the check tolerance (" + ", ".join(
    f"{str(dt).removeprefix('torch.')} {tol:g}" for dt, tol in TOLERANCE.items()) + ")"
_HEADER = ("implementation", "case", "shape", "dtype", "ms fwd", "ms fwd+bwd", "host ms fwd+bwd", "graph ms fwd+bwd",
           "GB/s fwd", "GB/s fwd+bwd", "ratio fwd", "ratio fwd+bwd", "peak mem", "max err", "status",
           "config (fwd / bwd)")
_LEFT = ("implementation", "case", "shape", "dtype", "status", "config (fwd / bwd)")


def case_label(row: Row) -> str:
    """The case name, with a ``(scaled)`` / ``(quick)`` note when the shape is not the full one."""
    return row.case if row.size == "full" else f"{row.case} ({row.size})"


def _ms(v: float) -> str:
    return format(v, ".0f" if v >= 100 else ".1f" if v >= 10 else ".3f")


def _cells(row: Row) -> tuple[str, ...]:
    missing = "n/a" if row.status == "skipped" else "-"

    def num(v: float, spec) -> str:
        if math.isnan(v):
            return missing
        return spec(v) if callable(spec) else format(v, spec)

    if math.isnan(row.peak_mem_mb):
        mem = "n/a" if row.status in ("ok", "inaccurate") else missing
    else:
        mem = f"{row.peak_mem_mb:{'.0f' if row.peak_mem_mb >= 10 else '.2f'}} MB ({row.peak_mem_tensors:.2f}x)"
    return (row.impl, case_label(row), row.shape, row.dtype, num(row.ms_fwd, _ms), num(row.ms_fwdbwd, _ms),
            num(row.host_ms_fwdbwd, _ms), num(row.graph_ms_fwdbwd, _ms),
            num(row.gbps_fwd, ".1f"), num(row.gbps_fwdbwd, ".1f"), num(row.ratio_fwd, ".3g"),
            num(row.ratio_fwdbwd, ".3g"), mem, num(row.max_err, ".1e"), row.status, row.config)


def format_table(rows: list[Row]) -> str:
    """The rows as an aligned text table (text columns left-aligned, numbers right-aligned).

    ``host ms fwd+bwd`` / ``graph ms fwd+bwd`` split the eager forward+backward into the host's
    time per call and the device's (CUDA-graph replay; the column is left out when no row measured
    it: the CPU). ``peak mem`` is the CUDA peak over one forward+backward call beyond the inputs, in
    MB and in units of one input tensor (left out likewise);
    ``max err`` the largest relative error of ``y``, ``grad_x`` and ``grad_coeffs`` against the
    float64 reference; ``n/a`` marks a skipped run, ``-`` a value not measured because the
    implementation raised.
    """
    cuda_only = {"peak mem": "peak_mem_mb", "graph ms fwd+bwd": "graph_ms_fwdbwd"}
    keep = [i for i, name in enumerate(_HEADER)
            if name not in cuda_only or any(not math.isnan(getattr(row, cuda_only[name])) for row in rows)]
    table = [tuple(r[i] for i in keep) for r in [_HEADER] + [_cells(row) for row in rows]]
    left = {j for j, i in enumerate(keep) if _HEADER[i] in _LEFT}
    return align_table(table[0], table[1:], left, groups=[row.case for row in rows])


def align_table(header: tuple[str, ...], body: list[tuple[str, ...]], left: set[int],
                groups: list[str] | None = None) -> str:
    """Text cells as an aligned table: columns in ``left`` left-aligned, the others right-aligned, a
    dashed rule under ``header``; a blank line wherever ``groups`` (one key per body row) changes."""
    widths = [max(len(r[i]) for r in (header, *body)) for i in range(len(header))]

    def fmt(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    lines = [fmt(header), "  ".join("-" * w for w in widths).rstrip()]
    for i, cells in enumerate(body):
        if groups is not None and i > 0 and groups[i] != groups[i - 1]:
            lines.append("")
        lines.append(fmt(cells))
    return "\n".join(lines)


def format_notes(rows: list[Row]) -> str:
    """One line per distinct error, skip or accuracy problem, or note of an ``ok`` row (a forward+backward
    that could not be captured in a CUDA graph), with the cases it hit; empty when none."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for row in rows:
        if row.status == "inaccurate":
            groups.setdefault((row.status, row.impl, f"max err above {TOLERANCE_NOTE}"), []).append(
                f"{case_label(row)} ({row.max_err:.1e})")
        elif row.status != "ok" or row.error:
            groups.setdefault((row.status if row.status != "ok" else "note", row.impl, row.error), []).append(
                case_label(row))
    return "\n".join(f"  {status}: {impl} on {', '.join(cases)}: {error}"
                     for (status, impl, error), cases in groups.items())


def write_csv(rows: list[Row], path: Path) -> Path:
    """Writes the rows with the :meth:`Row.columns` header to ``path`` (parents created); floats with
    6 significant digits, ``nan`` where not measured."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=Row.columns())
        writer.writeheader()
        for row in rows:
            writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.as_dict().items()})
    return path


def plot_ratios(rows: list[Row], path: Path, title: str) -> Path:
    """Grouped bar chart of the ratios to ``torch.add``: per case, one solid (forward) and one
    hatched (forward+backward) bar per implementation; 1.0 means ``torch.add`` speed. Only
    implementations with a measured bar get bars and legend entries; the colour says the
    implementation, the hatch the direction (two legend entries); a run that raised says ``n/a``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from matplotlib.patches import Patch

    cases = list(dict.fromkeys(row.case for row in rows))
    impls = list(dict.fromkeys(row.impl for row in rows if row.ratio_fwd > 0 or row.ratio_fwdbwd > 0))
    by_key = {(row.case, row.impl): row for row in rows}
    n_bars = 2 * len(impls)
    width = 0.8 / n_bars
    fig, ax = plt.subplots(figsize=(max(9.0, 2.5 + 0.35 * len(cases) * n_bars), 5.5))
    colors = plt.get_cmap("tab10")
    values = [v for row in rows for v in (row.ratio_fwd, row.ratio_fwdbwd) if v > 0]
    log = bool(values) and max(values) / min(values) > 30
    missing = []
    for j, impl in enumerate(impls):
        for k, (attr, hatch, label) in enumerate((("ratio_fwd", None, "fwd"), ("ratio_fwdbwd", "//", "fwd+bwd"))):
            xs = [i - 0.4 + (2 * j + k + 0.5) * width for i in range(len(cases))]
            ys = [getattr(by_key[(c, impl)], attr) if (c, impl) in by_key else math.nan for c in cases]
            ax.bar(xs, ys, width, color=colors(j % 10),
                   alpha=1.0 if k == 0 else 0.6, hatch=hatch, edgecolor="black", linewidth=0.4)
            missing.extend(x for x, y, c in zip(xs, ys, cases) if math.isnan(y) and (c, impl) in by_key)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    bottom = ax.get_ylim()[0]
    for x in missing:
        ax.text(x, bottom, "n/a", ha="center", va="bottom", fontsize=6, rotation=90)
    labels = []
    for c in cases:
        row = next(r for r in rows if r.case == c)
        labels.append(f"{case_label(row)}\n{row.shape}\n{row.dtype}")
    ax.set_xticks(range(len(cases)), labels, fontsize=7)
    ax.set_ylabel("speed relative to torch.add (same bytes moved)")
    ax.set_title(title, fontsize=10)
    handles = [Patch(facecolor=colors(j % 10), edgecolor="black", label=impl) for j, impl in enumerate(impls)]
    handles += [Patch(facecolor="white", edgecolor="black", label="forward"),
                Patch(facecolor="white", edgecolor="black", hatch="//", label="forward+backward"),
                plt.Line2D([], [], color="black", linestyle="--", label="torch.add speed")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
