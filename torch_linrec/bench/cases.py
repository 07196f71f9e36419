"""The benchmark case suite and its random inputs.

Every case has three sizes: ``full`` (the GPU suite), ``scaled`` (a CPU machine: leading/batch
dims divided so that the whole job runs in minutes on a few cores) and ``quick`` (tiny, for
tests). ``NL`` cases scan the last dim of an ``(N, L)`` tensor; ``BLD`` cases scan dim 1 of a
``(B, L, D)`` tensor, the Mamba layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Case", "SUITE", "SIZES", "select_cases", "make_inputs", "is_tiny", "format_shape"]

SIZES = ("full", "scaled", "quick")
COEFF_RANGE = (0.5, 1.0)

# The python-loop implementations are timed only on cases at most this large.
TINY_LEN = 1024
TINY_NUMEL = 1 << 17


@dataclass(frozen=True)
class Case:
    """One benchmark case: a shape per size, a layout and a dtype."""

    name: str
    layout: str
    dtype: torch.dtype
    full: tuple[int, ...]
    scaled: tuple[int, ...]
    quick: tuple[int, ...]

    @property
    def dim(self) -> int:
        """The scanned dim: -1 for ``NL``, 1 for ``BLD``."""
        return -1 if self.layout == "NL" else 1

    def shape(self, size: str) -> tuple[int, ...]:
        """The shape of this case at ``size`` (one of :data:`SIZES`)."""
        if size not in SIZES:
            raise ValueError(f"size must be one of {SIZES}, got {size!r}")
        return getattr(self, size)


_F32, _BF16 = torch.float32, torch.bfloat16

SUITE: tuple[Case, ...] = (
    Case("many-short", "NL", _F32, (131072, 1024), (1024, 1024), (256, 64)),
    Case("few-long", "NL", _F32, (128, 1 << 20), (2, 1 << 20), (4, 1024)),
    Case("very-few-long", "NL", _F32, (16, 1 << 22), (1, 1 << 22), (2, 4096)),
    Case("mamba-BLD", "BLD", _F32, (8, 4096, 4096), (1, 4096, 1024), (2, 128, 32)),
    Case("bf16-many-short", "NL", _BF16, (131072, 1024), (1024, 1024), (256, 64)),
    Case("bf16-mamba-BLD", "BLD", _BF16, (8, 4096, 4096), (1, 4096, 1024), (2, 128, 32)),
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
