"""Runs one suite case a few times, for ncu:
    python scripts/profile_case.py CASE [fwd|bwd|add] [CONFIG]
(add: torch.add on the same shape, the memory-bound reference; CONFIG: a kernel config name, as
torch_linrec.config_names lists; default the device's default)."""
import sys

import torch

import torch_linrec  # noqa: F401
from torch_linrec.bench.cases import make_inputs, select_cases

name, what = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "fwd")
config = sys.argv[3] if len(sys.argv) > 3 else None
case = select_cases([name])[0]
x, c, gy = make_inputs(case.shape("full"), case.dtype, "cuda")
y = torch.ops.linrec.scan(x, c, None, case.dim, False)
for _ in range(3):
    if what == "add":
        torch.add(x, c)
    elif what == "fwd":
        torch.ops.linrec.scan(x, c, None, case.dim, False, config)
    else:
        torch.ops.linrec.scan_backward(gy, c, y, None, case.dim, False, config)
torch.cuda.synchronize()
