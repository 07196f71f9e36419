"""``python -m torch_linrec layers``: tokens/s of each :mod:`torch_linrec.nn` layer, fused vs the
plain-PyTorch version of the same layer; ``--anchors``: the GPU performance anchors of the layers.

Tokens/s table: every layer type with the same weights, forward and forward+backward (eager), as
the fused layer (one torch_linrec scan / log-space scan / selective scan) and as its plain-PyTorch
counterpart (:mod:`torch_linrec.nn.reference`): a Python loop over ``step`` for minGRU, minLSTM
and the gated SSM (cuRNN's CPU baseline), mamba-mini's chunked ``selective_scan_easy`` style for
Mamba.

Anchors (cuRNN's demo; the issue's goals on an H100):
    * a minGRU layer, d_model 512, hidden 768, batch 1, over T = 65,536 and 524,288 steps:
      forward (goal < 5 ms at 65,536, linear in T) and forward+backward (goal < 15 ms);
    * decoding: ``step`` on a batch of 64 at d_model = hidden = 1024 under CUDA graphs
      (``torch.compile(mode="reduce-overhead")``) vs its two matmuls alone, captured the same way
      (goal: within 2x).
Without CUDA the anchors run at scaled-down sizes, eagerly (a smoke test, not the goal's numbers).

Each part prints a table and writes a CSV to ``--out`` (``layers-<device>.csv``, ``anchors-<device>.csv``).
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

from ..nn import GatedSSM, Mamba, MinGRU, MinLSTM
from ..nn.reference import plain_mamba, step_loop
from .cli import default_out_dir
from .timing import device_name, device_slug, make_timer

__all__ = ["main", "layer_rows", "anchor_rows"]


def _layers(d_model: int) -> dict:
    return {
        "mingru-linear": (MinGRU(d_model, mode="linear"), "python-loop"),
        "mingru-log": (MinGRU(d_model, mode="log"), "python-loop"),
        "minlstm-linear": (MinLSTM(d_model, mode="linear"), "python-loop"),
        "minlstm-log": (MinLSTM(d_model, mode="log"), "python-loop"),
        "gatedssm": (GatedSSM(d_model), "python-loop"),
        "mamba": (Mamba(d_model), "chunked-easy"),
    }


def _fwd_bwd(fn, x):
    def run():
        x.grad = None
        fn(x).float().square().mean().backward()
    return run


def layer_rows(device: torch.device, batch: int, length: int, d_model: int, dtype: torch.dtype, quick: bool) -> list:
    """One row per layer and implementation: ms and tokens/s forward and forward+backward."""
    timer = make_timer(device, quick)
    rows = []
    torch.manual_seed(0)
    x = torch.randn(batch, length, d_model, device=device, dtype=dtype, requires_grad=True)
    tokens = batch * length
    for name, (layer, plain_kind) in _layers(d_model).items():
        layer = layer.to(device, dtype)
        plain = plain_mamba(layer) if plain_kind == "chunked-easy" else (lambda t, m=layer: step_loop(m, t))
        fused_ms = None
        for impl, fn in (("fused", layer), (plain_kind, plain)):
            with torch.no_grad():
                fwd = timer(lambda: fn(x))
            fwd_bwd = timer(_fwd_bwd(fn, x))
            fused_ms = fused_ms or (fwd, fwd_bwd)
            rows.append({"layer": name, "impl": impl, "batch": batch, "length": length, "d_model": d_model,
                         "dtype": str(dtype).removeprefix("torch."), "fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd,
                         "fwd_tokens_per_s": tokens / fwd * 1e3, "fwd_bwd_tokens_per_s": tokens / fwd_bwd * 1e3,
                         "fused_speedup_fwd": fwd / fused_ms[0], "fused_speedup_fwd_bwd": fwd_bwd / fused_ms[1]})
    return rows


def anchor_rows(device: torch.device, dtypes: list, quick: bool) -> list:
    """The cuRNN-shape minGRU timings and the decode step vs its matmuls (module docs)."""
    cuda = device.type == "cuda"
    timer = make_timer(device, quick)
    lengths = (512, 2_048) if quick else (65_536, 524_288) if cuda else (4_096, 16_384)
    rows = []
    for dtype in dtypes:
        for mode in ("linear", "log"):
            torch.manual_seed(0)
            layer = MinGRU(512, 768, mode=mode).to(device, dtype)
            for length in lengths:
                x = torch.randn(1, length, 512, device=device, dtype=dtype, requires_grad=True)
                with torch.no_grad():
                    fwd = timer(lambda: layer(x))
                fwd_bwd = timer(_fwd_bwd(layer, x))
                rows.append({"anchor": f"minGRU 512->768 {mode}", "dtype": str(dtype).removeprefix("torch."),
                             "T": length, "batch": 1, "fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd,
                             "goal": "fwd < 5 ms @65536, fwd+bwd < 15 ms, linear in T" if cuda else "smoke (CPU)"})
                del x
        torch.manual_seed(0)
        batch, width = (8, 64) if quick else (64, 1024) if cuda else (8, 256)
        layer = MinGRU(width, width, mode="linear").to(device, dtype)
        x_t = torch.randn(batch, width, device=device, dtype=dtype)
        h = layer.allocate_state(batch)
        w_in, w_out, b_in = layer.in_proj.weight, layer.out_proj.weight, layer.in_proj.bias

        def matmuls(x_t, h):
            return torch.addmm(b_in, x_t, w_in.t()), h @ w_out.t()
        compile_kw = {"mode": "reduce-overhead", "fullgraph": True} if cuda else {"fullgraph": True}
        with torch.no_grad():
            step = torch.compile(layer.step, **compile_kw)
            mm = torch.compile(matmuls, **compile_kw)
            for _ in range(3):
                step(x_t, h), mm(x_t, h)
            t_step, t_mm = timer(lambda: step(x_t, h)), timer(lambda: mm(x_t, h))
        rows.append({"anchor": f"decode step batch {batch} d {width}" + (" (CUDA graphs)" if cuda else ""),
                     "dtype": str(dtype).removeprefix("torch."), "T": 1, "batch": batch, "fwd_ms": t_step,
                     "fwd_bwd_ms": float("nan"), "matmuls_ms": t_mm, "step_over_matmuls": t_step / t_mm,
                     "goal": "step within 2x of its matmuls" if cuda else "smoke (CPU)"})
    return rows


def _write(rows: list, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    return path


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    return str(v)


def _print(rows: list, cols: list) -> None:
    widths = [max(len(c), *(len(_fmt(r.get(c, ""))) for r in rows)) for c in cols]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c, "")).rjust(w) for c, w in zip(cols, widths)))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_linrec layers", description=__doc__.split("\n\n")[0])
    p.add_argument("--anchors", action="store_true", help="run the GPU anchors instead of the tokens/s table")
    p.add_argument("--device", help="default: cuda when available, else cpu")
    p.add_argument("--batch", type=int, help="tokens/s table: batch (default 16 on CUDA, 4 on the CPU)")
    p.add_argument("--length", type=int, help="tokens/s table: sequence length (default 2048 / 256)")
    p.add_argument("--d-model", type=int, help="tokens/s table: width (default 512 / 128)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="default bfloat16 on CUDA (anchors: both), float32 on the CPU")
    p.add_argument("--quick", action="store_true", help="tiny sizes and short timings (smoke test)")
    p.add_argument("--out", type=Path, help=f"folder of the CSV (default {default_out_dir()})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    out = args.out or default_out_dir()
    print(f"torch {torch.__version__}, device: {device_name(device)}")
    if args.anchors:
        dtypes = [getattr(torch, args.dtype)] if args.dtype else ([torch.float32, torch.bfloat16] if cuda
                                                                 else [torch.float32])
        rows = anchor_rows(device, dtypes, args.quick)
        _print(rows, ["anchor", "dtype", "T", "batch", "fwd_ms", "fwd_bwd_ms", "matmuls_ms", "step_over_matmuls",
                      "goal"])
        print(f"wrote {_write(rows, out / f'anchors-{device_slug(device)}.csv')}")
        return 0
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    batch = args.batch or (2 if args.quick else 16 if cuda else 4)
    length = args.length or (32 if args.quick else 2048 if cuda else 256)
    d_model = args.d_model or (16 if args.quick else 512 if cuda else 128)
    rows = layer_rows(device, batch, length, d_model, dtype, args.quick)
    print(f"tokens/s of each layer (batch {batch}, length {length}, d_model {d_model}, {dtype}), eager; "
          f"speedup = plain time / fused time")
    _print(rows, ["layer", "impl", "fwd_ms", "fwd_tokens_per_s", "fwd_bwd_ms", "fwd_bwd_tokens_per_s",
                  "fused_speedup_fwd", "fused_speedup_fwd_bwd"])
    print(f"wrote {_write(rows, out / f'layers-{device_slug(device)}.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
