"""Runs one case's native forward a few times (for ncu): python scripts/profile_case.py few-long [fwd|bwd|add]
(add: torch.add on the same shape, the memory-bound reference)."""
import sys

import torch

import torch_linrec  # noqa: F401
from quick_perf import CASES  # noqa: E402

name, what = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "fwd")
shape, dim, dt = next((s, d, t) for n, s, d, t in CASES if n == name)
x = torch.randn(shape, device="cuda", dtype=dt)
c = torch.rand(shape, device="cuda", dtype=dt) * 0.5 + 0.5
y = torch.ops.linrec.scan(x, c, None, dim, False)
for _ in range(3):
    if what == "add":
        torch.add(x, c)
    elif what == "fwd":
        torch.ops.linrec.scan(x, c, None, dim, False)
    else:
        torch.ops.linrec.scan_backward(x, c, y, None, dim, False)
torch.cuda.synchronize()
