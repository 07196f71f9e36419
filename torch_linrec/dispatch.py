"""Which backend and kernel config runs a call: the backend context, the problem buckets and the
tuned config cache.

The backend of a call is, in order: the ``backend=`` argument, the innermost :func:`use_backend`
context (a ``contextvars.ContextVar``: per thread and per asyncio task), ``$TORCH_LINREC_BACKEND``,
``"auto"``. ``"auto"`` runs, per direction, what the tuned cache (:mod:`torch_linrec.configs`)
names for the call's bucket, else the native kernels' defaults (the Triton ones where no native
kernel exists for the device). An explicit ``config=`` / ``backward_config=`` wins over the cache;
its name says its backend. The backends ``"native"`` and ``"triton"`` run their defaults unless a
config is named.

A bucket (:func:`bucket_key`) is (op, direction, dtype, layout class, length bucket, rows bucket):
layout ``innermost`` (the scanned dim has the smallest stride) or ``strided`` (channels innermost,
e.g. ``(B, L, D)`` with ``dim=1``), with ``-bcast`` when coeffs broadcast; lengths and row counts
(sequences) rounded up to even powers of two (``L<=2^12``, ``R<=2^16``).

The cache is applied by the ops, not here: ``"auto"`` calls ``linrec::scan`` with config
``"auto"``, which looks the call's bucket up in a table this module hands to the C++ side once per
device (csrc/linrec/tuned.h), and runs the Triton kernels from there when the entry names a Triton
config (through the Triton ops' eager twins, torch_linrec/linrec/triton/ops.py). So a call pays no
Python for the lookup, and under ``torch.compile`` the graph holds the
op with ``"auto"`` (no graph break, one frame across lengths) and each compiled call still gets its
own bucket's choice.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import os
from typing import NamedTuple

import torch

from ._lazy import constant_at_trace_time, load_linrec_triton
from ._library import HAS_CUDA_KERNELS, _C
from .linrec.ops import AUTO, NATIVE, TRITON, is_triton_config

__all__ = ["BACKENDS", "ENV_VAR", "use_backend", "get_backend", "available_backends", "bucket_key", "layout_class",
           "Choice", "choose", "tuned_configs", "triton_runs_on", "clear_memo"]

BACKENDS = ("auto", "native", "triton", "reference")
ENV_VAR = "TORCH_LINREC_BACKEND"
_backend: contextvars.ContextVar[str | None] = contextvars.ContextVar("torch_linrec_backend", default=None)

HAS_TRITON = importlib.util.find_spec("triton") is not None


def _validate(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    return name


def get_backend() -> str:
    """The backend in force: innermost :func:`use_backend`, else ``$TORCH_LINREC_BACKEND``, else ``"auto"``.

    Under ``torch.compile`` it is read once, at trace time: a compiled function keeps the backend in
    force when it was compiled (pass ``backend=`` to choose per call).
    """
    return _get_backend()


@constant_at_trace_time
def _get_backend() -> str:
    name = _backend.get()
    return name if name is not None else _validate(os.environ.get(ENV_VAR, "auto"))


@contextlib.contextmanager
def use_backend(name: str):
    """Context manager selecting the backend of :func:`torch_linrec.scan` calls inside it.

    Safe across threads and asyncio tasks (each sees its own context).

    Raises:
        ValueError: if ``name`` is not one of :data:`BACKENDS`.
    """
    token = _backend.set(_validate(name))
    try:
        yield
    finally:
        _backend.reset(token)


def triton_runs_on(device: torch.device) -> bool:
    """Whether the Triton kernels can run on ``device`` (CUDA; the CPU under ``TRITON_INTERPRET=1``)."""
    return HAS_TRITON and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """The concrete backends that can run on ``device`` in this process."""
    device = torch.device(device)
    out = []
    if device.type == "cpu" or (device.type == "cuda" and HAS_CUDA_KERNELS):
        out.append("native")
    if triton_runs_on(device):
        out.append("triton")
    out.append("reference")
    return out


def bucket_key(op: str, direction: str, dtype: torch.dtype, layout: str, length: int, rows: int) -> str:
    """The cache key of a problem, e.g. ``"scan/fwd/float32/strided/L<=2^12/R<=2^16"`` (defined in
    csrc/linrec/tuned.h, where the ops look it up)."""
    return _C.scan_bucket_key(op, direction, str(dtype).removeprefix("torch."), layout, int(length), int(rows))


def layout_class(x: torch.Tensor, coeffs: torch.Tensor, dim: int) -> str:
    """``innermost`` or ``strided`` (see the module docs), with ``-bcast`` for broadcast coeffs."""
    return _C.scan_layout_class(tuple(x.shape), x.stride(), dim, coeffs.shape != x.shape)


class Choice(NamedTuple):
    """What a call runs: the forward's backend (``"native"``, ``"triton"`` or ``"reference"``) and the
    configs of both directions (None: the backend's default)."""

    backend: str
    config: str | None
    backward_config: str | None


_NATIVE_DEFAULTS = Choice(NATIVE, None, None)
_NATIVE_AUTO = Choice(NATIVE, AUTO, AUTO)


def _backend_of(config: str) -> str:
    return TRITON if is_triton_config(config) else NATIVE


def _tuned_table(index: int) -> dict[str, str]:
    """The tuned cache's entries for CUDA device ``index`` that can run in this process."""
    from .configs import load
    entries = load(index).entries
    return {k: v for k, v in entries.items() if not is_triton_config(v) or HAS_TRITON}


_ready: set[int] = set()


@constant_at_trace_time
def _ensure_tuned(index: int) -> bool:
    """Hands device ``index``'s tuned table to the ops (once; at trace time under ``torch.compile``)."""
    if index not in _ready:
        table = _tuned_table(index)
        if any(is_triton_config(name) for name in table.values()):
            load_linrec_triton()
        _C.set_scan_tuned(index, table)
        _ready.add(index)
    return True


def tuned_configs(x: torch.Tensor, coeffs: torch.Tensor, dim: int,
                  reverse: bool = False) -> tuple[str | None, str | None]:
    """The ``(forward, backward)`` config names that config ``"auto"`` runs for this call (None: the
    default), as the ops resolve it (for reports and tests; a call does not need it). A tuned Triton
    choice applies to ``reverse=False`` calls only (csrc/linrec/tuned.h)."""
    if x.device.type != "cuda" or not HAS_CUDA_KERNELS:
        return None, None
    _ensure_tuned(x.device.index)
    length = x.shape[dim]
    rows = x.numel() // length if length else 0
    layout = layout_class(x, coeffs, dim)
    return tuple(_C.scan_tuned_config(x.device.index, bucket_key("scan", d, x.dtype, layout, length, rows), length,
                                      reverse) for d in ("fwd", "bwd"))


def choose(x: torch.Tensor, coeffs: torch.Tensor, dim: int, backend: str | None = None, config: str | None = None,
           backward_config: str | None = None) -> Choice:
    """The backend and configs for a scan call (see the module docs).

    Args:
        x, coeffs: the call's tensors. dim: the scanned dim, wrapped.
        backend: as :func:`torch_linrec.scan`'s argument. config, backward_config: explicit names.

    Raises:
        ValueError: an unknown backend; a backend that cannot run on x's device; a config whose
            backend contradicts ``backend``.
    """
    name = _validate(backend) if backend is not None else _get_backend()
    device = x.device
    if name == "auto" and config is None and backward_config is None:  # the common call, kept short
        if device.type == "cpu":
            return _NATIVE_DEFAULTS
        if device.type == "cuda" and HAS_CUDA_KERNELS and _ensure_tuned(device.index):
            return _NATIVE_AUTO
    if name == "reference":
        if config is not None or backward_config is not None:
            raise ValueError("config and backward_config name kernel configs; the reference backend has none")
        return Choice("reference", None, None)
    if name != "auto" and name not in available_backends(device):
        raise ValueError(f"backend {name!r} cannot run on {device}; available: {available_backends(device)}")
    for what, cfg in (("config", config), ("backward_config", backward_config)):
        if cfg is not None and name != "auto" and _backend_of(cfg) != name:
            raise ValueError(f"{what} {cfg!r} is a {_backend_of(cfg)} config, but backend {name!r} was asked for")
    native_ok = device.type == "cpu" or HAS_CUDA_KERNELS
    configs = [config, backward_config]
    if name == "auto" and device.type == "cuda" and native_ok:
        configs = [AUTO if c is None else c for c in configs]  # resolved by the ops, at run time
    if AUTO in configs and device.type == "cuda":
        _ensure_tuned(device.index)
    fwd_cfg, bwd_cfg = configs
    default = name if name in (NATIVE, TRITON) else (NATIVE if native_ok else TRITON)
    fwd_backend = _backend_of(fwd_cfg) if fwd_cfg is not None else default
    if bwd_cfg is None and fwd_backend != default:
        bwd_cfg = default  # "native" / "triton": that backend's default config
    bwd_backend = _backend_of(bwd_cfg) if bwd_cfg is not None else fwd_backend
    if TRITON in (fwd_backend, bwd_backend) and not triton_runs_on(device):
        raise ValueError(f"a Triton config was asked for, but Triton cannot run on {device}")
    if NATIVE in (fwd_backend, bwd_backend) and not native_ok:
        raise ValueError(f"a native config was asked for, but torch_linrec was built without kernels for {device}")
    if TRITON in (fwd_backend, bwd_backend):
        load_linrec_triton()
    return Choice(fwd_backend, fwd_cfg, bwd_cfg)


def clear_memo() -> None:
    """Forgets loaded tuned tables (after the tuner wrote a file): the next call reloads them."""
    _ready.clear()
    _C.clear_scan_tuned()
    from .configs import clear_memo as clear_files
    clear_files()
