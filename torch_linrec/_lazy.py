"""Lazy loading: what ``import torch_linrec`` leaves for first use, and how.

``import torch_linrec`` loads torch and the compiled library only (goal: <= 0.3 s over ``import
torch``). Triton (~0.2 s) and everything that imports ``torch._dynamo`` (~1.5 s, which itself loads
triton and ``torch._inductor``) load on first use. The pattern, for every op family with Triton
kernels (``linrec``, ``selective``, and the next one):

1. The package never imports its ``triton`` subpackage at import time; ``tests/test_import.py``
   asserts that ``triton``, ``torch._dynamo`` and ``torch._inductor`` are not in ``sys.modules``
   after ``import torch_linrec``.
2. Python code about to call a Triton op first calls a loader such as :func:`load_linrec_triton`,
   marked with :func:`constant_at_trace_time` so that ``torch.compile`` runs it once while tracing
   (no graph break) instead of tracing into the import.
3. A C++ op that needs a Triton op imports its module on first use (``import_triton_ops`` in
   csrc/linrec/ops.cpp), so direct ``torch.ops.linrec.*`` calls naming a Triton config work too.
4. Decorators that would import ``torch._dynamo`` at import time (``torch.compiler.
   assume_constant_result``) are replaced by :func:`constant_at_trace_time`.
"""
from __future__ import annotations

import importlib
import sys

__all__ = ["constant_at_trace_time", "load_linrec_triton"]


def constant_at_trace_time(fn):
    """What ``torch.compiler.assume_constant_result`` does (Dynamo calls ``fn`` while tracing and
    puts its result in the graph as a constant), without importing ``torch._dynamo`` to do it: the
    decorator only sets ``fn._dynamo_marked_constant`` (torch/_dynamo/decorators.py; tests/
    test_import.py checks that the two still agree)."""
    fn._dynamo_marked_constant = True
    return fn


@constant_at_trace_time
def load_linrec_triton() -> bool:
    """Imports :mod:`torch_linrec.linrec.triton` (registers ``linrec::scan_triton`` and
    ``linrec::scan_backward_triton``) once; True. Raises ImportError where triton is not installed."""
    if "torch_linrec.linrec.triton.ops" not in sys.modules:
        importlib.import_module("torch_linrec.linrec.triton")
    return True
