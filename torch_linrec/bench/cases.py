"""The benchmark case suite and its random inputs.

Every case has three sizes: ``full`` (the GPU suite), ``scaled`` (a CPU machine: leading/batch
dims divided so that the whole job runs in minutes on a few cores) and ``quick`` (tiny, for
tests). A scaled tensor holds 16 MiB (but small-call's 8 MiB), so that ``torch.add``'s three
tensors (48 MiB) outgrow a server's last-level cache as the scan's forward+backward (eight) does:
both then stream from memory, as on the GPU. At 4 MiB the add ran from a 32 MiB L3 while the
forward+backward could not, and the ratio measured the cache (bench/NOTES.md, item 65).

``NL`` cases scan the last dim of an ``(N, L)`` tensor; ``BLD`` cases scan dim 1 of a
``(B, L, D)`` tensor, the Mamba layout. :func:`parse_shape` makes a case of any shape from the main
job's ``--shapes`` syntax (``16x4194304:fp32``, ``8x4096x4096:bf16:dim=1``, ``1000x3001:fp16:reverse``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Case", "SUITE", "SIZES", "select_cases", "make_inputs", "is_tiny", "format_shape", "parse_shape",
           "SHAPE_SYNTAX"]

SIZES = ("full", "scaled", "quick")
COEFF_RANGE = (0.5, 1.0)

# The python-loop implementations are timed only on cases at most this large.
TINY_LEN = 1024
TINY_NUMEL = 1 << 17


@dataclass(frozen=True)
class Case:
    """One benchmark case: a shape per size, a layout and a dtype.

    ``scan_dim`` (default: from the layout), ``reverse`` and ``coeffs`` (the coefficients' shape,
    broadcast to the input's; default the input's) are set by :func:`parse_shape`.
    """

    name: str
    layout: str
    dtype: torch.dtype
    full: tuple[int, ...]
    scaled: tuple[int, ...]
    quick: tuple[int, ...]
    scan_dim: int | None = None
    reverse: bool = False
    coeffs: tuple[int, ...] | None = None

    @property
    def dim(self) -> int:
        """The scanned dim: ``scan_dim`` if set, else -1 for ``NL``, 1 for ``BLD``."""
        if self.scan_dim is not None:
            return self.scan_dim
        return -1 if self.layout == "NL" else 1

    def shape(self, size: str) -> tuple[int, ...]:
        """The shape of this case at ``size`` (one of :data:`SIZES`)."""
        if size not in SIZES:
            raise ValueError(f"size must be one of {SIZES}, got {size!r}")
        return getattr(self, size)


_F32, _BF16 = torch.float32, torch.bfloat16

SUITE: tuple[Case, ...] = (
    Case("many-short", "NL", _F32, (131072, 1024), (4096, 1024), (256, 64)),
    Case("few-long", "NL", _F32, (128, 1 << 20), (4, 1 << 20), (4, 1024)),
    Case("very-few-long", "NL", _F32, (16, 1 << 22), (1, 1 << 22), (2, 4096)),
    Case("mamba-BLD", "BLD", _F32, (8, 4096, 4096), (1, 4096, 1024), (2, 128, 32)),
    Case("bf16-many-short", "NL", _BF16, (131072, 1024), (8192, 1024), (256, 64)),
    Case("bf16-mamba-BLD", "BLD", _BF16, (8, 4096, 4096), (2, 4096, 1024), (2, 128, 32)),
    Case("small-call", "BLD", _F32, (1, 1024, 2048), (1, 1024, 2048), (1, 64, 32)),
)


def select_cases(names: list[str] | None) -> list[Case]:
    """The cases of :data:`SUITE` named in ``names`` (all when None), in suite order.

    Raises:
        ValueError: for a name not in the suite.
    """
    if not names:
        return list(SUITE)
    known = {case.name: case for case in SUITE}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown case(s) {unknown}; the suite has {list(known)}")
    return [case for case in SUITE if case.name in names]


SHAPE_SYNTAX = ("SHAPE[:DTYPE][:dim=K][:reverse][:bcast | :coeffs=SHAPE], e.g. 16x4194304:fp32, "
                "8x4096x4096:bf16:dim=1, 1000x3001:fp16:reverse, 8x4096x4096:dim=1:coeffs=4096. SHAPE: sizes "
                "joined by x; DTYPE: fp32 (default), bf16, fp16; dim: the scanned dim (default -1); reverse: "
                "scan backwards; bcast: coeffs of size 1 along the scanned dim; coeffs=SHAPE: the coefficients' "
                "shape, broadcastable to SHAPE")

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "f32": torch.float32,
           "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16, "f16": torch.float16, "half": torch.float16}
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _parse_sizes(text: str, what: str, spec: str) -> tuple[int, ...]:
    parts = text.split("x")
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"shape entry {spec!r}: {what} must be positive sizes joined by 'x' (e.g. 8x4096), "
                         f"got {text!r}")
    return tuple(int(p) for p in parts)


def parse_shape(spec: str) -> Case:
    """A :class:`Case` of one ``--shapes`` entry, in the syntax of :data:`SHAPE_SYNTAX`.

    Args:
        spec: ``SHAPE[:DTYPE][:dim=K][:reverse][:bcast | :coeffs=SHAPE]``; the options after the
            shape in any order, each at most once.

    Returns:
        A case of that shape at every size (``full == scaled == quick``: a user's shape is never
        scaled), named by the canonical form of ``spec`` (``bcast`` spelled as ``coeffs=...``).

    Raises:
        ValueError: naming ``spec`` and the part that is wrong: a size that is not a positive
            integer, an unknown dtype or option, a repeated option, ``dim`` out of range, or a
            coefficient shape that does not broadcast to the shape.
    """
    shape_text, *options = spec.strip().split(":")
    shape = _parse_sizes(shape_text, "the shape", spec)
    ndim = len(shape)
    seen: dict[str, str] = {}
    for opt in options:
        key = opt.split("=", 1)[0] if "=" in opt else ("dtype" if opt in _DTYPES else opt)
        if key not in (("dim", "coeffs") if "=" in opt else ("dtype", "reverse", "bcast")):
            raise ValueError(f"shape entry {spec!r}: unknown option {opt!r}; expected a dtype "
                             f"({', '.join(_DTYPES)}), dim=K, reverse, bcast or coeffs=SHAPE")
        if key in seen or (key in ("bcast", "coeffs") and {"bcast", "coeffs"} & seen.keys()):
            raise ValueError(f"shape entry {spec!r}: {opt!r} repeats or contradicts an earlier option")
        seen[key] = opt
    dtype = _DTYPES[seen.get("dtype", "fp32")]
    dim = -1
    if "dim" in seen:
        text = seen["dim"].split("=", 1)[1]
        if not text.lstrip("-").isdigit() or not -ndim <= int(text) < ndim:
            raise ValueError(f"shape entry {spec!r}: dim must be an integer in [{-ndim}, {ndim - 1}], got {text!r}")
        dim = int(text)
    coeffs = None
    if "bcast" in seen:
        coeffs = tuple(1 if d == dim % ndim else n for d, n in enumerate(shape))
    elif "coeffs" in seen:
        coeffs = _parse_sizes(seen["coeffs"].split("=", 1)[1], "coeffs", spec)
        if len(coeffs) > ndim or any(c not in (1, n) for c, n in zip(reversed(coeffs), reversed(shape))):
            raise ValueError(f"shape entry {spec!r}: coeffs {format_shape(coeffs)} does not broadcast to "
                             f"the shape {format_shape(shape)}")
    coeffs = None if coeffs == shape else coeffs
    reverse = "reverse" in seen
    name = ":".join([format_shape(shape), _DTYPE_NAMES[dtype]] + ([f"dim={dim}"] if dim != -1 else [])
                    + (["reverse"] if reverse else []) + ([f"coeffs={format_shape(coeffs)}"] if coeffs else []))
    layout = "NL" if dim % ndim == ndim - 1 else "BLD" if (ndim, dim % ndim) == (3, 1) else f"d{dim % ndim}"
    return Case(name, layout, dtype, shape, shape, shape, scan_dim=dim, reverse=reverse, coeffs=coeffs)


def make_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str, seed: int = 0,
                coeff_shape: tuple[int, ...] | None = None):
    """Random ``(x, coeffs, grad_y)``: ``x, grad_y ~ randn``, ``coeffs ~ uniform(0.5, 1.0)``.

    The coefficients stay below one, so long sequences remain bounded. ``coeff_shape`` (default:
    ``shape``) gives broadcast coefficients.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    c = torch.empty(coeff_shape or shape, device=device, dtype=dtype).uniform_(*COEFF_RANGE, generator=gen)
    gy = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    return x, c, gy


def is_tiny(shape: tuple[int, ...], dim: int) -> bool:
    """Whether a python-loop implementation is quick enough to time on this shape."""
    return shape[dim] <= TINY_LEN and math.prod(shape) <= TINY_NUMEL


def format_shape(shape: tuple[int, ...]) -> str:
    """``(131072, 1024)`` -> ``"131072x1024"``."""
    return "x".join(str(s) for s in shape)
