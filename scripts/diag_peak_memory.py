"""Peak CUDA memory of forward + backward, op by op (diagnosis aid for tests/test_cuda.py)."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torch_linrec


class MemTrace(TorchDispatchMode):
    def __init__(self, unit):
        super().__init__()
        self.unit = unit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        torch.cuda.synchronize()
        before = torch.cuda.max_memory_allocated()
        out = func(*args, **(kwargs or {}))
        torch.cuda.synchronize()
        print(f"{str(func):40s} alloc {torch.cuda.memory_allocated() / self.unit:6.3f}T  "
              f"peak {before / self.unit:6.3f}T -> {torch.cuda.max_memory_allocated() / self.unit:6.3f}T")
        return out


for coeffs_shape in [None, (512,)]:
    x = torch.randn(8, 4096, 512, device="cuda", requires_grad=True)
    c = torch.rand(coeffs_shape or x.shape, device="cuda").requires_grad_()
    gy = torch.randn_like(x)
    T = x.numel() * 4
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    print(f"coeffs {coeffs_shape}: base {base / T:.3f}T")
    with MemTrace(T):
        y = torch_linrec.scan(x, c, dim=1, backend="native")
        y.backward(gy)
    print(f"peak over base {(torch.cuda.max_memory_allocated() - base) / T:.3f}T")
    del x, c, gy, y

# Which reduction of a full-size float32 gradient to a (512,) shape allocates what.
g = torch.randn(8, 4096, 512, device="cuda")
T = g.numel() * 4
reductions = {
    "sum_to_size": lambda: g.sum_to_size(512),
    "sum(dims)": lambda: g.sum((0, 1)),
    "view.sum(0)": lambda: g.view(-1, 512).sum(0),
    "mv": lambda: torch.mv(g.view(-1, 512).t(), torch.ones(g.numel() // 512, device="cuda")),
}
for name, fn in reductions.items():
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    r = fn()
    torch.cuda.synchronize()
    print(f"{name:12s} peak over base {(torch.cuda.max_memory_allocated() - base) / T:.3f}T")
    del r
