"""Accuracy of the log-space scan against the linear scan on long sequences (L = 2^16, float32).

Both forms compute the same recurrence ``h[l] = c[l] h[l-1] + x[l]`` for positive ``x`` and ``c``:
the linear form (:func:`torch_linrec.scan`) on ``x, c`` rounded to float32, the log form
(:func:`torch_linrec.log_scan`) on ``log x, log c`` rounded to float32. The reference is the
float64 log-space scan of the exact inputs. The error is ``|log h - log h_ref|``, the relative error
of ``h`` (inf where a form returns 0 or inf for a finite positive state).

    PYTHONPATH=. python bench/log_scan_accuracy.py [--length 65536] [--device cpu] [--out FILE.csv]
"""
from __future__ import annotations

import argparse
import csv
import math

import torch

import torch_linrec

# name -> (log_x sampler, log_c sampler, what it shows); u is a U(0, 1) sample of the problem's shape
CASES = {
    "gates U(0.5,1), x U(0,1)": (lambda u, v: u.log(), lambda u, v: (0.5 + 0.5 * v).log()),
    "memory c = 1 - 1e-5": (lambda u, v: u.log(), lambda u, v: torch.full_like(v, math.log1p(-1e-5))),
    "memory c = 1 - 1e-7": (lambda u, v: u.log(), lambda u, v: torch.full_like(v, math.log1p(-1e-7))),
    "x spans 1e-80..1 (underflow)": (lambda u, v: -184 * u, lambda u, v: (0.5 + 0.5 * v).log()),
    "c = 1e-20 (state dies)": (lambda u, v: -60 * u, lambda u, v: torch.full_like(v, -46.0)),
    "growth c = 1.002 (overflow)": (lambda u, v: u.log(), lambda u, v: torch.full_like(v, math.log(1.002))),
    "large states x ~ 1e6": (lambda u, v: u.log() + math.log(1e6), lambda u, v: (0.9 + 0.1 * v).log()),
    "short memory c ~ U(0,0.1)": (lambda u, v: u.log(), lambda u, v: (0.1 * v).log()),
}


def log_error(log_h: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    err = (log_h.double() - ref).abs()
    return torch.where(torch.isfinite(log_h.double()), err, float("inf"))


def run(length: int, batch: int, device: str, seed: int) -> list[dict]:
    rows = []
    g = torch.Generator().manual_seed(seed)
    for name, (fx, fc) in CASES.items():
        u = torch.rand(batch, length, generator=g, dtype=torch.float64).clamp_min(1e-300)
        v = torch.rand(batch, length, generator=g, dtype=torch.float64)
        log_x, log_c = fx(u, v), fc(u, v)
        ref = torch_linrec.log_scan(log_x, log_c)
        lin = torch_linrec.scan(log_x.exp().float().to(device), log_c.exp().float().to(device)).cpu()
        log = torch_linrec.log_scan(log_x.float().to(device), log_c.float().to(device)).cpu()
        e_lin = log_error(lin.double().log(), ref)
        e_log = log_error(log, ref)
        row = {"case": name, "length": length}
        for form, e in (("linear", e_lin), ("log", e_log)):
            finite = e[torch.isfinite(e)]
            row[f"{form}_max"] = e.max().item()
            row[f"{form}_median"] = finite.median().item() if finite.numel() else float("inf")
            row[f"{form}_nonfinite_%"] = 100.0 * (1 - finite.numel() / e.numel())
        row["more_accurate"] = "log" if row["log_max"] < row["linear_max"] else "linear"
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=1 << 16)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="CSV file to write")
    args = p.parse_args(argv)
    rows = run(args.length, args.batch, args.device, args.seed)
    print(f"float32 scans of L = {args.length} on {args.device}, error = |log h - log h_ref| (relative error of h), "
          f"ref = float64 log-space scan")
    print(f"{'case':<30} {'linear max':>11} {'linear med':>11} {'lin bad %':>9} {'log max':>11} {'log med':>11} "
          f"{'log bad %':>9}  better")
    for r in rows:
        print(f"{r['case']:<30} {r['linear_max']:>11.3g} {r['linear_median']:>11.3g} {r['linear_nonfinite_%']:>9.3f} "
              f"{r['log_max']:>11.3g} {r['log_median']:>11.3g} {r['log_nonfinite_%']:>9.3f}  {r['more_accurate']}")
    if args.out:
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
