"""Host time per call of the small-call case, native op vs torch_linrec.scan(backend="auto"), eager.

Each variant runs N calls back to back (forward, or forward+backward with torch.autograd.grad) and
the wall time per call is reported, with and without a device sync per call; the kernels of this
size take ~20 us, so a per-call time above that is host time.
"""
import time

import torch

import torch_linrec

x = torch.randn(1, 1024, 2048, device="cuda")
c = torch.rand(1, 1024, 2048, device="cuda")
xl, cl = x.clone().requires_grad_(), c.clone().requires_grad_()
g = torch.randn_like(x)
variants = {
    "native": lambda a, b: torch.ops.linrec.scan(a, b, None, 1, False),
    "auto": lambda a, b: torch_linrec.scan(a, b, dim=1),
}
for rnd in range(3):
    for name, f in variants.items():
        for what, call in (("fwd", lambda: f(x, c)), ("fwd+bwd", lambda: torch.autograd.grad(f(xl, cl), (xl, cl), g))):
            for _ in range(50):
                call()
            torch.cuda.synchronize()
            n = 2000
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / n * 1e6
            print(f"round {rnd} {name:6s} {what:8s} {us:7.1f} us/call")
