"""Minimal timing of the native CUDA scan vs torch.add on the issue's case suite (tuning aid)."""
import sys

import torch
from triton.testing import do_bench

import torch_linrec  # noqa: F401

CASES = [("many-short", (131072, 1024), -1, torch.float32), ("few-long", (128, 2**20), -1, torch.float32),
         ("very-few-long", (16, 2**22), -1, torch.float32), ("mamba-BLD", (8, 4096, 4096), 1, torch.float32),
         ("bf16-many-short", (131072, 1024), -1, torch.bfloat16), ("bf16-mamba-BLD", (8, 4096, 4096), 1, torch.bfloat16),
         ("small-call", (1, 1024, 2048), 1, torch.float32)]
# Named on the command line only: probes of the many-short cases with 4x longer rows (4x fewer blocks);
# few-long with 100 or 132 rows (a block per row: per-SM or global limit).
EXTRA = [("probe-4096", (32768, 4096), -1, torch.float32), ("bf16-probe-4096", (32768, 4096), -1, torch.bfloat16),
         ("few-long-pad256", (128, 2**20), -1, torch.float32), ("few-long-pad32", (128, 2**20), -1, torch.float32),
         ("few-long-pad4096", (128, 2**20), -1, torch.float32),
         ("few-long-r100", (100, 2**20), -1, torch.float32), ("few-long-r132", (132, 2**20), -1, torch.float32)]
# Probes whose rows are sliced from wider storage (row stride L + pad): DRAM placement of the rows.
PAD = {"few-long-pad256": 256, "few-long-pad32": 32, "few-long-pad4096": 4096}


def make(shape, dt, pad, fill):
    full = fill((*shape[:-1], shape[-1] + pad), device="cuda", dtype=dt)
    return full[..., :shape[-1]] if pad else full


def main():
    sel = sys.argv[1:]
    for name, shape, dim, dt in CASES + EXTRA:
        if (sel and name not in sel) or (not sel and (name, shape, dim, dt) in EXTRA):
            continue
        pad = PAD.get(name, 0)
        x = make(shape, dt, pad, torch.randn)
        c = make(shape, dt, pad, torch.rand).mul_(0.5).add_(0.5)
        g = make(shape, dt, pad, torch.randn)
        t_add = do_bench(lambda: torch.add(x, c), warmup=25, rep=100, return_mode="median")
        t_f = do_bench(lambda: torch.ops.linrec.scan(x, c, None, dim, False), warmup=25, rep=100, return_mode="median")
        y = torch.ops.linrec.scan(x, c, None, dim, False)
        t_b = do_bench(lambda: torch.ops.linrec.scan_backward(g, c, y, None, dim, False), warmup=25, rep=100,
                       return_mode="median")
        nb = x.numel() * x.element_size()
        print(f"{name:16s} add {t_add:.4f}ms  fwd {t_f:.4f}ms ({3*nb/t_f/1e6:.0f} GB/s, ratio {t_add/t_f:.2f})  "
              f"bwd {t_b:.4f}ms ({5*nb/t_b/1e6:.0f} GB/s)  fwd+bwd ratio {8/3*t_add/(t_f+t_b):.2f}", flush=True)
        del x, c, g, y
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
