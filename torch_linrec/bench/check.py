"""Correctness stage: every implementation against a float64 reference on small shapes.

Each configuration draws ``x ~ randn`` and ``coeffs ~ uniform(0.5, 1.0)`` (and ``initial``,
``grad_y ~ randn``), rounds them to the configuration's dtype, and compares the implementation's
``y`` and its gradients in ``x``, ``coeffs`` and ``initial`` (through autograd) with those of
:func:`torch_linrec.scan_ref` run in float64 on the CPU on the same rounded values. The error is
:func:`~torch_linrec.bench.reference.rel_err` (max abs error over max abs value).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..linrec.reference import scan_ref
from .cases import COEFF_RANGE
from .impls import Impl
from .reference import rel_err

__all__ = ["CheckConfig", "CheckResult", "CHECK_CONFIGS", "TOLERANCE", "run_checks", "check_impl"]

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
_DTYPE_NAMES = {dt: str(dt).removeprefix("torch.") for dt in TOLERANCE}


@dataclass(frozen=True)
class CheckConfig:
    """One small checking problem.

    Attributes:
        name: a label for failure reports.
        shape: the shape of ``x``. dim, reverse: as for :func:`torch_linrec.scan`.
        coeffs: the shape of ``coeffs`` when broadcast, None for ``shape``.
        initial: the shape of ``initial``, None for no initial state.
        transposed: pass ``x`` as the transpose of a contiguous tensor (2-D only).
    """

    name: str
    shape: tuple[int, ...]
    dim: int = -1
    reverse: bool = False
    coeffs: tuple[int, ...] | None = None
    initial: tuple[int, ...] | None = None
    dtype: torch.dtype = torch.float32
    transposed: bool = False


_BF16, _F16 = torch.bfloat16, torch.float16

CHECK_CONFIGS: tuple[CheckConfig, ...] = (
    CheckConfig("NL odd L", (3, 37)),
    CheckConfig("NL L=1", (4, 1)),
    CheckConfig("NL long L", (2, 4099)),
    CheckConfig("BLD dim=1", (2, 33, 5), dim=1),
    CheckConfig("NL reverse", (3, 64), reverse=True),
    CheckConfig("NL initial", (3, 50), initial=(3,)),
    CheckConfig("BLD reverse+initial", (2, 19, 6), dim=1, reverse=True, initial=(2, 6)),
    CheckConfig("BLD coeffs (D,)", (2, 21, 6), dim=1, coeffs=(6,)),
    CheckConfig("BLD coeffs (B,1,D)", (2, 21, 6), dim=1, coeffs=(2, 1, 6), initial=(6,)),
    CheckConfig("NL coeffs (N,1) reverse", (3, 45), coeffs=(3, 1), reverse=True),
    CheckConfig("NL transposed", (4, 37), transposed=True),
    CheckConfig("bf16 NL", (3, 129), dtype=_BF16),
    CheckConfig("bf16 BLD reverse", (2, 40, 8), dim=1, reverse=True, dtype=_BF16),
    CheckConfig("fp16 NL initial", (3, 65), initial=(3,), dtype=_F16),
)


@dataclass
class CheckResult:
    """The outcome for one implementation.

    ``status`` is ``PASS`` (every configuration within :data:`TOLERANCE`), ``FAIL`` (some result
    out of tolerance) or ``ERROR`` (no result out of tolerance, but some configuration raised).
    """

    impl: str
    status: str = "PASS"
    max_err: dict[str, float] = field(default_factory=dict)
    configs: int = 0
    problems: list[str] = field(default_factory=list)

    def note_err(self, dtype: torch.dtype, err: float) -> None:
        """Keeps the largest error per dtype (NaN sticks)."""
        key = _DTYPE_NAMES[dtype]
        old = self.max_err.get(key, 0.0)
        self.max_err[key] = err if math.isnan(err) or err > old else old

    def err_summary(self) -> str:
        """``"float32 2.1e-07, bfloat16 3.1e-03"``: the largest error per dtype."""
        return ", ".join(f"{k} {v:.2e}" for k, v in self.max_err.items()) or "-"


@dataclass
class _Problem:
    leaves64: list[torch.Tensor]
    grad_y64: torch.Tensor
    expected: list[torch.Tensor]


def _problem(cfg: CheckConfig, seed: int) -> _Problem:
    """Random float64 inputs (already rounded to ``cfg.dtype``) and the reference results."""
    gen = torch.Generator().manual_seed(seed)

    def draw(shape, low=None):
        t = torch.randn(shape, generator=gen, dtype=torch.float64) if low is None else \
            torch.empty(shape, dtype=torch.float64).uniform_(low, COEFF_RANGE[1], generator=gen)
        return t.to(cfg.dtype).double()

    leaves = [draw(cfg.shape), draw(cfg.coeffs or cfg.shape, COEFF_RANGE[0])]
    if cfg.initial is not None:
        leaves.append(draw(cfg.initial))
    grad_y = draw(cfg.shape)
    leaves = [t.requires_grad_() for t in leaves]
    y = scan_ref(leaves[0], leaves[1], leaves[2] if cfg.initial else None, cfg.dim, cfg.reverse)
    grads = torch.autograd.grad(y, leaves, grad_y)
    return _Problem([t.detach() for t in leaves], grad_y, [y.detach(), *grads])


def _run(impl: Impl, cfg: CheckConfig, prob: _Problem, device: torch.device) -> list[torch.Tensor]:
    def to_dev(t: torch.Tensor, transpose: bool = False) -> torch.Tensor:
        if transpose:
            return t.t().contiguous().to(device, cfg.dtype).t().detach().requires_grad_()
        return t.to(device, cfg.dtype).requires_grad_()

    x = to_dev(prob.leaves64[0], cfg.transposed)
    rest = [to_dev(t) for t in prob.leaves64[1:]]
    leaves = [x, *rest]
    y = impl.fn(x, rest[0], rest[1] if cfg.initial else None, dim=cfg.dim, reverse=cfg.reverse)
    grads = torch.autograd.grad(y, leaves, prob.grad_y64.to(device, cfg.dtype))
    return [y, *grads]


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text if len(text) <= 200 else text[:197] + "..."


def check_impl(impl: Impl, device: torch.device, problems: list[tuple[CheckConfig, _Problem]]) -> CheckResult:
    """Runs ``impl`` on every prepared problem and compares with the float64 reference results."""
    res = CheckResult(impl.name, configs=len(problems))
    failed = raised = False
    for cfg, prob in problems:
        try:
            got = _run(impl, cfg, prob, device)
        except Exception as exc:  # noqa: BLE001 -- any failure of an implementation is a result
            raised = True
            res.problems.append(f"{cfg.name}: {_short(exc)}")
            continue
        names = ["y", "grad_x", "grad_coeffs"] + (["grad_initial"] if cfg.initial else [])
        for name, a, e in zip(names, got, prob.expected):
            err = rel_err(a, e) if a is not None and a.shape == e.shape else math.inf
            res.note_err(cfg.dtype, err)
            if not err <= TOLERANCE[cfg.dtype]:
                failed = True
                shape_note = "" if a is not None and a.shape == e.shape else \
                    f" (shape {None if a is None else tuple(a.shape)}, expected {tuple(e.shape)})"
                res.problems.append(f"{cfg.name}: {name} rel err {err:.3g} > {TOLERANCE[cfg.dtype]:g}{shape_note}")
    res.status = "FAIL" if failed else "ERROR" if raised else "PASS"
    return res


def run_checks(impls: list[Impl], device: torch.device, configs: tuple[CheckConfig, ...] = CHECK_CONFIGS,
               log: Callable[[str], None] = print) -> list[CheckResult]:
    """Checks every implementation on every configuration; logs one PASS/FAIL/ERROR line each."""
    problems = [(cfg, _problem(cfg, seed)) for seed, cfg in enumerate(configs)]
    results = []
    log(f"check: {len(impls)} implementation(s) x {len(configs)} configurations against float64 scan_ref "
        f"(tolerance fp32 {TOLERANCE[torch.float32]:g}, bf16 {TOLERANCE[_BF16]:g}, fp16 {TOLERANCE[_F16]:g})")
    width = max([len(impl.name) for impl in impls] + [4])
    for impl in impls:
        res = check_impl(impl, device, problems)
        results.append(res)
        log(f"  {impl.name:<{width}}  {res.status:<5}  max rel err {res.err_summary()}  ({res.configs} configs)")
        for line in res.problems[:8]:
            log(f"  {'':<{width}}    {line}")
        if len(res.problems) > 8:
            log(f"  {'':<{width}}    ... {len(res.problems) - 8} more")
    return results
