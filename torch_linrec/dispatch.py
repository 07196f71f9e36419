"""Which backend and kernel config runs a call: the backend context, the problem buckets and the
tuned config cache.

The backend of a call is, in order: the ``backend=`` argument, the innermost :func:`use_backend`
context (a ``contextvars.ContextVar``: per thread and per asyncio task), ``$TORCH_LINREC_BACKEND``,
``"auto"``. ``"auto"`` runs, per direction, what the tuned cache (:mod:`torch_linrec.configs`)
names for the call's bucket, else the native kernels' defaults (the Triton ones where no native
kernel exists for the device). An explicit ``config=`` / ``backward_config=`` wins over the cache;
its name says its backend.

A bucket (:func:`bucket_key`) is (op, direction, dtype, layout class, length bucket, rows bucket):
layout ``innermost`` (the scanned dim has the smallest stride) or ``strided`` (channels innermost,
e.g. ``(B, L, D)`` with ``dim=1``), with ``-bcast`` when coeffs broadcast; lengths and row counts
(sequences) rounded up to even powers of two (``L<=2^12``, ``R<=2^16``).

Under ``torch.compile`` the choice is made at trace time, so the graph holds the chosen op and
config (no graph break, one frame across lengths). There the cache's per-size choice is not applied
and each backend's defaults run: Dynamo does not tell a traced function whether a size is static or
symbolic, and choosing by size bucket would guard on the bucket (a recompile per bucket) or, for
static sizes, on the exact size. An explicit ``config=`` / ``backward_config=`` applies under
``torch.compile`` too.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import os
from typing import NamedTuple

import torch

from ._library import HAS_CUDA_KERNELS
from .linrec.ops import NATIVE, TRITON, is_triton_config

__all__ = ["BACKENDS", "ENV_VAR", "use_backend", "get_backend", "available_backends", "bucket_key", "Choice",
           "choose", "triton_runs_on"]

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


@torch.compiler.assume_constant_result
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


def _pow4_bucket(n: int, floor: int) -> int:
    """The even exponent k >= floor with 2^(k-2) < n <= 2^k."""
    k = max(floor, (max(int(n), 1) - 1).bit_length())
    return k + (k % 2)


def bucket_key(op: str, direction: str, dtype: torch.dtype, layout: str, length: int, rows: int) -> str:
    """The cache key of a problem, e.g. ``"scan/fwd/float32/strided/L<=2^12/R<=2^16"``."""
    dt = str(dtype).removeprefix("torch.")
    return f"{op}/{direction}/{dt}/{layout}/L<=2^{_pow4_bucket(length, 8)}/R<=2^{_pow4_bucket(rows, 0)}"


def layout_class(x: torch.Tensor, coeffs: torch.Tensor, dim: int) -> str:
    """``innermost`` or ``strided`` (see the module docs), with ``-bcast`` for broadcast coeffs."""
    others = [abs(x.stride(i)) for i in range(x.dim()) if i != dim and x.shape[i] != 1]
    strided = bool(others) and abs(x.stride(dim)) > min(others)
    return ("strided" if strided else "innermost") + ("-bcast" if coeffs.shape != x.shape else "")


class Choice(NamedTuple):
    """What a call runs: the forward's backend (``"native"``, ``"triton"`` or ``"reference"``) and the
    configs of both directions (None: the backend's default)."""

    backend: str
    config: str | None
    backward_config: str | None


def _backend_of(config: str) -> str:
    return TRITON if is_triton_config(config) else NATIVE


@functools.lru_cache(maxsize=4096)
def _tuned(index: int, dtype: torch.dtype, layout: str, length: int, rows: int) -> tuple:
    """The cache's ``(forward, backward)`` config names for a bucket (None where it has none)."""
    from .configs import load
    table = load(index)
    return tuple(table.lookup(bucket_key("scan", direction, dtype, layout, length, rows)) for direction in ("fwd", "bwd"))


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
    name = _validate(backend) if backend is not None else get_backend()
    device = x.device
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
    tuned_ok = device.type == "cuda" and name in ("auto", NATIVE, TRITON)
    configs = [config, backward_config]
    if tuned_ok and None in configs:
        if not torch.compiler.is_compiling():
            length = x.shape[dim]
            rows = x.numel() // length if length else 0
            layout = layout_class(x, coeffs, dim)
            index = device.index if device.index is not None else torch.cuda.current_device()
            for i, tuned in enumerate(_tuned(index, x.dtype, layout, length, rows)):
                if configs[i] is None:
                    usable = tuned is not None and (name == "auto" or _backend_of(tuned) == name) and \
                        (_backend_of(tuned) != TRITON or triton_runs_on(device))
                    if usable:
                        configs[i] = "prefer:" + tuned  # per bucket: the default where a call's layout differs
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
    return Choice(fwd_backend, fwd_cfg, bwd_cfg)


def clear_memo() -> None:
    """Forgets memoized cache lookups (after the tuner wrote a file)."""
    _tuned.cache_clear()
    from .configs import clear_memo as clear_files
    clear_files()
