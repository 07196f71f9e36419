"""Quick CUDA-vs-CPU(float64) check of the native kernels over layouts; prints one line per case."""
import sys
import time

import torch

import torch_linrec as tl

torch.manual_seed(0)
dev = "cuda"
fails = 0


def check(name, x, c, h0, dim, rev):
    global fails
    xd, cd = x.double().cpu(), c.double().cpu()
    hd = None if h0 is None else h0.double().cpu()
    ref = torch.ops.linrec.scan(xd, cd, hd, dim, rev)
    y = torch.ops.linrec.scan(x, c, h0, dim, rev)
    torch.cuda.synchronize()
    err = ((y.double().cpu() - ref).abs().max() / ref.abs().max().clamp_min(1)).item()
    g = torch.randn_like(y)
    gx, gc, gh = torch.ops.linrec.scan_backward(g, c, y, h0, dim, rev)
    rgx, rgc, rgh = torch.ops.linrec.scan_backward(g.double().cpu(), cd, y.double().cpu(), hd, dim, rev)
    e2 = max(((a.double().cpu() - b).abs().max() / b.abs().max().clamp_min(1)).item() if b.numel() else 0.0
             for a, b in [(gx, rgx), (gc, rgc), (gh, rgh)])
    tol = 1e-4 if x.dtype == torch.float32 else 3e-2
    ok = err < tol and e2 < tol and not torch.isnan(y).any()
    fails += not ok
    print(f"{'ok ' if ok else 'BAD'} {name:40s} {str(x.dtype):15s} dim={dim} rev={rev:d} fwd={err:.2e} bwd={e2:.2e}")


for dt in [torch.float32, torch.bfloat16]:
    for rev in [False, True]:
        for (n, L) in [(3, 1), (5, 7), (4, 100), (7, 1024), (3, 1000), (2, 5000), (3, 70001), (2, 2**20 + 3)]:
            x = torch.randn(n, L, device=dev, dtype=dt)
            c = torch.rand(n, L, device=dev, dtype=dt) * 0.5 + 0.5
            h0 = torch.randn(n, device=dev, dtype=dt)
            check(f"NL {n}x{L}", x, c, h0, -1, rev)
        for (B, L, D) in [(2, 33, 5), (2, 100, 64), (3, 1000, 130), (2, 4097, 256)]:
            x = torch.randn(B, L, D, device=dev, dtype=dt)
            c = torch.rand(B, L, D, device=dev, dtype=dt) * 0.5 + 0.5
            h0 = torch.randn(B, D, device=dev, dtype=dt)
            check(f"BLD {B}x{L}x{D}", x, c, h0, 1, rev)
            check(f"BLD c=(D,) {B}x{L}x{D}", x, c[0, 0], None, 1, rev)
            check(f"BLD transposed {B}x{L}x{D}", x.transpose(1, 2), c.transpose(1, 2), h0, -1, rev)
            check(f"BLD sliced {B}x{L}x{D}", x[:, :, ::2], c[:, :, ::2], h0[:, ::2], 1, rev)
        x = torch.randn(6, 3000, device=dev, dtype=dt)
        c = torch.rand(6, 3000, device=dev, dtype=dt)
        check("NL sliced x[:, 1::2]", x[:, 1::2], c[:, 1::2], None, -1, rev)
        check("NL offset x[1:, 3:]", x[1:, 3:], c[1:, 3:], None, -1, rev)
        check("NL c broadcast (N,1)", x, c[:, :1], None, -1, rev)
print("FAILS", fails)
sys.exit(1 if fails else 0)
