"""Optional ``torch.compile`` graph rewrites of torch_linrec, off by default.

The selective-scan fusion finds Mamba's selective SSM written with plain torch and
:func:`torch_linrec.scan` (``exp(dt * A)`` coefficients, a ``dt * B * u`` input, the scan over L
and the ``sum`` over N with C, optionally ``softplus(delta + delta_bias)``, ``+ D * u`` and
``* silu(z)``) and replaces it with ``torch.ops.linrec.selective_scan``, which does not materialize
the ``(B, D, L, N)`` tensors. :mod:`.fusion` says exactly what matches. The rewrite runs on the
Dynamo graph before autograd, so training runs the fused op's backward too::

    import torch_linrec.compile

    torch_linrec.compile.enable_selective_scan_fusion()
    model = torch.compile(model)                # Inductor, the default backend
    ...
    torch_linrec.compile.fusion_stats()         # {"selective_scan_fusion": 1, ...}

It is an Inductor pre-grad pass (:mod:`._inductor` says why that hook): it runs when Inductor
compiles a graph, and not with other backends, which can call :func:`fuse_selective_scan` on the
Dynamo graph themselves. It applies to graphs compiled while enabled: enable it before the first
call of a compiled model, or call ``torch._dynamo.reset()``. A compile served from Inductor's cache
on torch >= 2.13 skips the pass (the cached code has the rewrite), so it adds nothing to the counts.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
from collections.abc import Iterator

import torch
from torch import fx

from . import _inductor
from .fusion import SCANS, Match, NoMatch

__all__ = ["enable_selective_scan_fusion", "disable_selective_scan_fusion", "is_selective_scan_fusion_enabled",
           "selective_scan_fusion", "fuse_selective_scan", "fusion_stats", "reset_fusion_stats",
           "fused_op_available", "FUSION_COUNTER", "SKIPPED_COUNTER"]

log = logging.getLogger(__name__)

FUSION_COUNTER, SKIPPED_COUNTER = "selective_scan_fusion", "selective_scan_fusion_skipped"
_stats: collections.Counter = collections.Counter()
_pass = None
_tangent_strides_before: bool | None = None  # the AOT setting enable_selective_scan_fusion changed


def fused_op_available() -> bool:
    """Whether ``torch.ops.linrec.selective_scan``, the target of the rewrite, is registered."""
    return hasattr(torch.ops.linrec, "selective_scan")


def fuse_selective_scan(graph: fx.Graph | fx.GraphModule) -> int:
    """Rewrites every unfused selective scan of a torch-level FX graph (a Dynamo graph, whose nodes
    carry ``example_value`` fake tensors) into ``torch.ops.linrec.selective_scan``: the pass itself,
    for backends other than Inductor. :mod:`.fusion` says what matches; the rest stays unchanged.

    Args:
        graph: the graph, or a GraphModule (recompiled when something was rewritten).

    Returns:
        The number of rewrites; 0 when the fused op is not registered. It is also added to
        :func:`fusion_stats` and to ``torch._dynamo.utils.counters["torch_linrec"]``.
    """
    module = graph if isinstance(graph, fx.GraphModule) else None
    graph = graph.graph if module is not None else graph
    scans = [n for n in graph.nodes if n.op == "call_function" and _inductor.op_name(n.target) in SCANS]
    if scans and not fused_op_available():
        log.warning("selective scan fusion: torch.ops.linrec.selective_scan is not registered, nothing rewritten")
        return 0
    done = 0
    for scan in scans:
        try:  # matching only reads the graph: whatever it raises leaves the graph as it was
            match = Match(graph, scan)
        except NoMatch as reason:
            log.debug("selective scan fusion: %s left unchanged: %s", scan.name, reason)
            continue
        except Exception:  # noqa: BLE001  (a bug of the matcher must not fail the compile)
            log.warning("selective scan fusion: %s left unchanged after an error", scan.name, exc_info=True)
            continue
        match.rewrite()
        done += 1
    _stats.update({FUSION_COUNTER: done, SKIPPED_COUNTER: len(scans) - done})
    _inductor.record(FUSION_COUNTER, done)
    if done and module is not None:
        module.recompile()
    return done


def _fusion_pass():
    global _pass
    if _pass is None:
        here = os.path.dirname(os.path.abspath(__file__))
        files = tuple(os.path.join(here, name) for name in ("__init__.py", "fusion.py", "_inductor.py"))
        _pass = _inductor.make_pass(fuse_selective_scan, files, _pass_state)
    return _pass


def _pass_state() -> str:
    """What besides the source decides the rewrite (part of the pass's cache key)."""
    return f"fused_op={fused_op_available()}"


def fusion_stats() -> dict[str, int]:
    """Counts since the last :func:`reset_fusion_stats`: ``"selective_scan_fusion"``, the rewrites
    made, and ``"selective_scan_fusion_skipped"``, the scans examined and left unchanged."""
    return {FUSION_COUNTER: _stats[FUSION_COUNTER], SKIPPED_COUNTER: _stats[SKIPPED_COUNTER]}


def reset_fusion_stats() -> None:
    """Sets the counts of :func:`fusion_stats` to zero."""
    _stats.clear()


def enable_selective_scan_fusion() -> None:
    """Turns the selective-scan fusion on for the graphs Inductor compiles from now on.

    Other pre-grad custom passes already set stay, and run before this one. Calling it again has no
    effect. The rewrite only happens once ``torch.ops.linrec.selective_scan`` is registered.

    It also has AOT autograd expect output gradients in the outputs' layout (torch 2.13's default,
    off in torch 2.11): else the gradient of the fused op's ``(B, L, D)``-strided ``out`` is copied
    to a contiguous layout first (:mod:`._inductor` says more). :func:`disable_selective_scan_fusion`
    restores the setting.

    Raises:
        RuntimeError: this torch moved the Inductor hook the pass needs (the message names it).
    """
    global _tangent_strides_before
    _inductor.install(_fusion_pass())
    if _tangent_strides_before is None:
        _tangent_strides_before = _inductor.match_tangent_strides(True)


def disable_selective_scan_fusion() -> None:
    """Turns the selective-scan fusion off (graphs compiled before keep their rewrite) and restores
    the AOT autograd setting :func:`enable_selective_scan_fusion` changed."""
    global _tangent_strides_before
    if _pass is not None:
        _inductor.uninstall(_pass)
    if _tangent_strides_before is not None:
        _inductor.match_tangent_strides(_tangent_strides_before)
        _tangent_strides_before = None


def is_selective_scan_fusion_enabled() -> bool:
    """Whether Inductor runs the selective-scan fusion on the graphs it compiles."""
    return _pass is not None and _inductor.is_installed(_pass)


@contextlib.contextmanager
def selective_scan_fusion(enabled: bool = True) -> Iterator[None]:
    """Context manager: the selective-scan fusion on (or off, ``enabled=False``) inside the block,
    then as before.

    Raises:
        RuntimeError: as :func:`enable_selective_scan_fusion`.
    """
    before = is_selective_scan_fusion_enabled()
    if enabled:
        enable_selective_scan_fusion()
    else:
        disable_selective_scan_fusion()
    try:
        yield
    finally:
        if before:
            enable_selective_scan_fusion()
        else:
            disable_selective_scan_fusion()
