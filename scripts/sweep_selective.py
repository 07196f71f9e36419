"""Tile sweep of the Triton selective-scan kernels on the mamba-370m shape (a maintainer's probe)."""
import itertools
import sys

import torch
from triton.testing import do_bench

import torch_linrec
from torch_linrec.bench.selective import CASES, make_inputs
from torch_linrec.selective.triton import ops as tops

case = next(c for c in CASES if c.name == (sys.argv[1] if len(sys.argv) > 1 else "mamba-370m-bf16"))
x = make_inputs(case, "cuda")
args = [x[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
leaves = [t.detach().requires_grad_() for t in args]
out = torch_linrec.selective_scan(*leaves, True)
gout = torch.randn_like(out)
real = tops.tiles
print("default fwd", real(case.dim, case.nstate, case.dim, case.layout == "BLD", False),
      "bwd", real(case.dim, case.nstate, case.dim, case.layout == "BLD", True))
for backward in (False, True):
    results = []
    for bd, ch, nw in itertools.product((1, 2, 4, 8, 16, 32), (8, 16, 32, 64, 128), (4, 8)):
        elems = bd * 16 * ch
        if elems > (8192 if not backward else 4096) or elems < 512:
            continue
        tops.tiles = lambda *a, **k: {"BLOCK_D": bd, "BLOCK_N": 16, "CHUNK": ch, "num_warps": nw}
        try:
            if backward:
                ms = do_bench(lambda: torch.autograd.grad(torch_linrec.selective_scan(*leaves, True), leaves, gout))
            else:
                ms = do_bench(lambda: torch_linrec.selective_scan(*args, True))
        except Exception as exc:
            print(bd, ch, nw, "error", str(exc)[:80])
            continue
        results.append((ms, bd, ch, nw))
    tops.tiles = real
    results.sort()
    print("backward (fwd+bwd)" if backward else "forward", [(round(m, 3), bd, ch, nw) for m, bd, ch, nw in results[:8]])
