"""The implementations under test: named callables ``fn(x, coeffs, initial=None, dim=-1, reverse=False) -> y``.

:func:`implementations` builds the list from :func:`torch_linrec.available_backends`, then adds
the entries of every factory passed to :func:`register_impls` (e.g. one entry per template
configuration of a native kernel). An implementation that cannot run (an op not registered yet,
a kernel that raises) stays in the list: the checks and the benchmark record its error and go on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .._lazy import load_linrec_triton
from ..api import scan as _scan
from ..dispatch import available_backends, tuned_configs

__all__ = ["Impl", "implementations", "register_impls", "select_impls", "IMPL_HELP"]

# The implementations of the main job, for --help.
IMPL_HELP = {
    "auto": "torch_linrec.scan with the tuned config cache (CUDA)",
    "native": "torch.ops.linrec.scan: the C++ kernels (CPU; CUDA when built with CUDA)",
    "triton": "torch.ops.linrec.scan_triton: Triton kernels (CUDA; checked, not timed, under TRITON_INTERPRET=1)",
    "reference": "the float64-capable Python loop scan_ref (checked; timed on tiny cases only)",
}

ScanFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Impl:
    """A named scan implementation.

    Attributes:
        name: the label in tables, CSV files and plots; unique.
        fn: ``fn(x, coeffs, initial=None, dim=-1, reverse=False) -> y``, differentiable in
            ``x``, ``coeffs`` and ``initial``.
        slow: a python loop: timed only on tiny cases, else reported n/a.
        timed: False for an interpreter (Triton under ``TRITON_INTERPRET=1``): checked, never timed.
        describe: ``describe(x, coeffs, dim, reverse) -> str``: the backend and configs the call runs with
            (the table's ``config`` column), or None.
    """

    name: str
    fn: ScanFn
    slow: bool = False
    timed: bool = True
    describe: Callable[..., str] | None = None


_FACTORIES: list[Callable[[torch.device], list[Impl]]] = []


def register_impls(factory: Callable[[torch.device], list[Impl]]) -> Callable[[torch.device], list[Impl]]:
    """Adds ``factory(device) -> [Impl, ...]`` to the implementations of every later run.

    Usable as a decorator; returns ``factory``.
    """
    _FACTORIES.append(factory)
    return factory


def _native(x, coeffs, initial=None, dim=-1, reverse=False):
    return torch.ops.linrec.scan(x, coeffs, initial, dim, reverse)


def _triton(x, coeffs, initial=None, dim=-1, reverse=False):
    load_linrec_triton()
    return torch.ops.linrec.scan_triton(x, coeffs, initial, dim, reverse)


def _reference(x, coeffs, initial=None, dim=-1, reverse=False):
    return _scan(x, coeffs, initial, dim, reverse, backend="reference")


def _auto(x, coeffs, initial=None, dim=-1, reverse=False):
    return _scan(x, coeffs, initial, dim, reverse, backend="auto")


def describe_auto(x: torch.Tensor, coeffs: torch.Tensor, dim: int, reverse: bool) -> str:
    """``"<fwd backend>:<config> / <bwd backend>:<config>"`` that ``backend="auto"`` runs on this call."""
    def name(cfg):
        if cfg is None:
            return "native:default"
        return cfg if cfg.startswith(("triton", "native")) else f"native:{cfg}"
    fwd, bwd = tuned_configs(x, coeffs, dim % x.dim(), reverse)
    return f"{name(fwd)} / {name(bwd)}"


def _backend_impls(device: torch.device) -> list[Impl]:
    table = {
        "native": Impl("native", _native, describe=lambda x, c, d, r: "native (defaults)"),
        "triton": Impl("triton", _triton, timed=device.type == "cuda", describe=lambda x, c, d, r: "triton (defaults)"),
        "reference": Impl("reference", _reference, slow=True),
    }
    impls = [table[name] for name in available_backends(device) if name in table]
    if device.type == "cuda":  # the tuned cache applies on CUDA only
        impls.insert(0, Impl("auto", _auto, describe=describe_auto))
    return impls


def implementations(device: torch.device | str) -> list[Impl]:
    """Every implementation that claims to run on ``device``: the backends, then registered extras.

    Raises:
        ValueError: if two entries share a name.
    """
    device = torch.device(device)
    impls = _backend_impls(device)
    for factory in _FACTORIES:
        impls.extend(factory(device))
    names = [impl.name for impl in impls]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"implementation names must be unique, got duplicates {dupes}")
    return impls


def select_impls(impls: list[Impl], names: list[str] | None) -> list[Impl]:
    """The entries of ``impls`` named in ``names`` (all when None).

    Raises:
        ValueError: for a name that is not among ``impls``.
    """
    if not names:
        return list(impls)
    known = [impl.name for impl in impls]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown or unavailable implementation(s) {unknown}; available here: {known}")
    return [impl for impl in impls if impl.name in names]
