"""``import torch_linrec`` stays light: triton, torch._dynamo and torch._inductor load on first use
(torch_linrec/_lazy.py has the pattern); structural checks in a fresh interpreter, not timings."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import torch_linrec
from torch_linrec._lazy import constant_at_trace_time
from torch_linrec.dispatch import HAS_TRITON

HEAVY = ("triton", "torch._dynamo", "torch._inductor")


def _fresh(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_LINREC_BACKEND"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_does_not_load_triton_or_inductor():
    loaded = _fresh("import sys, torch_linrec, torch_linrec.selective; "
                    f"print([m for m in {HEAVY!r} if m in sys.modules])")
    assert loaded == "[]"


def test_cpu_scan_does_not_load_them_either():
    code = ("import sys, torch, torch_linrec; x = torch.ones(2, 5, requires_grad=True); "
            "torch_linrec.scan(x, 0.5).sum().backward(); "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    assert _fresh(code) == "[]"


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_triton_ops_load_on_first_use():
    """A direct op call naming a Triton config imports the Triton ops from C++; torch_linrec.scan with
    backend="triton" from Python."""
    code = ("import os, sys, torch, torch_linrec; os.environ['TRITON_INTERPRET'] = '1'; "
            "x = torch.ones(2, 5, requires_grad=True); "
            "torch.ops.linrec.scan(x, x, None, -1, False, None, 'triton').sum().backward(); "
            "print('torch_linrec.linrec.triton' in sys.modules, hasattr(torch.ops.linrec, 'scan_triton'))")
    assert _fresh(code) == "True True"
    code = ("import os, sys, torch, torch_linrec; os.environ['TRITON_INTERPRET'] = '1'; "
            "print(torch_linrec.scan(torch.ones(2, 5), 0.5, backend='triton')[0, -1].item())")
    assert abs(float(_fresh(code)) - (2 - 0.5 ** 4)) < 1e-6


def test_constant_at_trace_time_matches_torch():
    """The marker is what torch.compiler.assume_constant_result sets (it would import torch._dynamo)."""
    def a():
        return 1

    def b():
        return 1
    constant_at_trace_time(a)
    torch.compiler.assume_constant_result(b)
    assert vars(a) == vars(b) and vars(a)


def test_backend_constant_under_compile():
    """dispatch's trace-time constants still hold under torch.compile: no graph break."""
    import torch._dynamo.testing
    counter = torch._dynamo.testing.CompileCounter()
    f = torch.compile(lambda x: torch_linrec.scan(x, 0.5) * 2, backend=counter, fullgraph=True)
    torch.testing.assert_close(f(torch.ones(3, 4)), torch_linrec.scan(torch.ones(3, 4), 0.5) * 2)
    assert counter.frame_count == 1
