"""Benchmark stage: times every implementation on every case against ``torch.add``.

Per case: inputs ``x, coeffs, grad_y`` (see :func:`~torch_linrec.bench.cases.make_inputs`), the
time of ``torch.add(x, coeffs)`` (reads two tensors and writes one, as the scan forward does),
then per implementation:

* one forward+backward call under peak-memory measurement, whose ``y, grad_x, grad_coeffs`` on
  the first two sequences (batch entries for ``BLD``) are compared with the chunked float64
  reference of :mod:`torch_linrec.bench.reference`;
* ``ms_fwd``: the forward alone, on inputs that do not require grad;
* ``ms_fwdbwd``: forward and backward together (``torch.autograd.grad`` in ``x`` and ``coeffs``);
* ``host_ms_fwdbwd``: the host's time per eager forward+backward call (:meth:`Timer.host_ms`: calls
  issued back to back, the device synchronised between batches outside the timed span);
* ``graph_ms_fwdbwd``: the device's time of it (:meth:`Timer.graph_ms`: the same forward+backward
  captured in a CUDA graph and replayed; NaN on the CPU, and when the capture fails, whose message
  goes to ``error`` with ``status`` still ``ok``). A small call is host-bound: ``ms_fwdbwd`` follows
  ``host_ms_fwdbwd``, ``graph_ms_fwdbwd`` is the kernels' time alone.

Bandwidth counts 3 tensors for the forward (read ``x, coeffs``, write ``y``) and 8 for forward and
backward (also read ``grad_y, coeffs, y``, write ``grad_x, grad_coeffs``). The ratios compare with
moving the same bytes at ``torch.add`` speed: ``t_add / t_fwd`` and ``(8/3 t_add) / t_fwdbwd``. On
CUDA ``t_add`` is timed once per case; on the CPU, for each implementation, round-robin with its two
calls (:meth:`Timer.interleaved`: a shared machine's speed drifts).
Broadcast coeffs (a ``--shapes`` case) count as the fraction ``f = coeffs.numel() / x.numel()`` of a
tensor, in the scan as in ``torch.add(x, coeffs)``: ``2 + f`` tensors forward, ``5 + 3f`` forward and
backward, ratio ``((5 + 3f) / (2 + f) t_add) / t_fwdbwd``.
Rows have ``status`` ``ok``; ``inaccurate`` when the error exceeds the check stage's tolerance for
the dtype; ``skipped`` for a slow implementation on a non-tiny case; ``error`` when the
implementation raised, with the message in ``error``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Callable

import torch
from tqdm.auto import tqdm

from .cases import Case, format_shape, is_tiny, make_inputs
from .check import TOLERANCE
from .impls import Impl
from ..linrec.reference import chunked_scan, scan_backward_ref
from .reference import rel_err
from .timing import Timer, free_memory, measure_peak

__all__ = ["Row", "run_benchmark", "SliceReference", "REF_SEQS"]

REF_SEQS = 2
NAN = math.nan


@dataclass
class Row:
    """One implementation on one case; also one line of the CSV file (fields in column order)."""

    impl: str
    case: str
    size: str
    shape: str
    dim: int
    dtype: str
    ms_fwd: float = NAN
    ms_fwdbwd: float = NAN
    gbps_fwd: float = NAN
    gbps_fwdbwd: float = NAN
    ms_add: float = NAN
    ratio_fwd: float = NAN
    ratio_fwdbwd: float = NAN
    peak_mem_mb: float = NAN
    peak_mem_tensors: float = NAN
    err_y: float = NAN
    err_grad_x: float = NAN
    err_grad_coeffs: float = NAN
    max_err: float = NAN
    status: str = "ok"
    error: str = ""
    config: str = ""
    device: str = ""
    torch: str = torch.__version__
    host_ms_fwdbwd: float = NAN  # last, so that readers of older CSV files by position still work
    graph_ms_fwdbwd: float = NAN

    @classmethod
    def columns(cls) -> list[str]:
        """The CSV header."""
        return [f.name for f in fields(cls)]

    def as_dict(self) -> dict:
        """The row as ``{column: value}``."""
        return asdict(self)


class SliceReference:
    """Float64 reference results on the first :data:`REF_SEQS` sequences of a case, computed once.

    The slice is taken along the first dim that is not scanned (``N`` for ``NL``, ``B`` for
    ``BLD``); the implementations' outputs are sliced the same way before comparing. Broadcast
    ``c`` is sliced where it has that dim; when it is broadcast along it and the slice is partial,
    its gradient (a sum over every sequence) is not checked: ``checked[2]`` is False and its error NaN.
    """

    def __init__(self, x: torch.Tensor, c: torch.Tensor, gy: torch.Tensor, dim: int, count: int = REF_SEQS,
                 reverse: bool = False):
        self.dim = dim % x.dim()
        self.reverse = reverse
        self.bdim = next((d for d in range(x.dim()) if d != self.dim), None)
        self.count = count
        self._c_shape = (1,) * (x.dim() - c.dim()) + tuple(c.shape)
        grad_c_ok = self.bdim is None or self._c_shape[self.bdim] > 1 or x.shape[self.bdim] <= count
        self.checked = (True, True, grad_c_ok)
        self._inputs = [self.slice(t) for t in (x, c.reshape(self._c_shape), gy)]
        self._expected: list[torch.Tensor] | None = None

    def slice(self, t: torch.Tensor) -> torch.Tensor:
        """The part of ``t`` the reference covers (all of a dim of size 1)."""
        if self.bdim is None:
            return t
        return t.narrow(self.bdim, 0, min(self.count, t.shape[self.bdim]))

    def errors(self, y: torch.Tensor, grad_x: torch.Tensor, grad_c: torch.Tensor) -> list[float]:
        """Relative errors of ``y``, ``grad_x``, ``grad_coeffs`` (full tensors) on the slice; NaN where not
        :attr:`checked`."""
        if self._expected is None:
            x, c, gy = self._inputs
            y_ref = chunked_scan(x, c, None, self.dim, self.reverse)
            grad_x_ref, grad_c_ref, _ = scan_backward_ref(gy, c, y_ref, None, self.dim, self.reverse,
                                                          scan=chunked_scan)
            self._expected = [y_ref, grad_x_ref, grad_c_ref]
        outs = (y, grad_x, grad_c.reshape(self._c_shape))
        return [rel_err(self.slice(a), e) if ok else NAN for a, e, ok in zip(outs, self._expected, self.checked)]


def _short(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:297] + "..."


def _bench_impl(impl: Impl, row: Row, inputs, ref: SliceReference, timer: Timer, device: torch.device,
                dim: int, reverse: bool = False) -> None:
    """Fills ``row`` for one implementation; an exception leaves the fields measured so far."""
    x, c, gy = inputs
    xg, cg = x.detach().requires_grad_(), c.detach().requires_grad_()

    def fwd():
        return impl.fn(x, c, dim=dim, reverse=reverse)

    def fwd_bwd():
        y = impl.fn(xg, cg, dim=dim, reverse=reverse)
        return (y, *torch.autograd.grad(y, (xg, cg), gy))

    if impl.describe is not None:
        row.config = impl.describe(x, c, dim, reverse)
    outs, peak = measure_peak(fwd_bwd, device)
    tensor_bytes = x.numel() * x.element_size()
    if peak is not None:
        row.peak_mem_mb = peak / 2**20
        row.peak_mem_tensors = peak / tensor_bytes
    errs = ref.errors(*outs)
    row.err_y, row.err_grad_x, row.err_grad_coeffs = errs
    checked = [e for e, ok in zip(errs, ref.checked) if ok]
    row.max_err = NAN if any(math.isnan(e) for e in checked) else max(checked)
    if not row.max_err <= TOLERANCE[x.dtype]:
        row.status = "inaccurate"
    del outs
    f = c.numel() / x.numel()  # broadcast coeffs: a fraction of a tensor
    n_fwd, n_fwdbwd = 2 + f, 5 + 3 * f  # 3 and 8 tensors for full-size coeffs
    if device.type == "cuda":  # steady: torch.add was timed once for the case (_bench_case)
        row.ms_fwd, row.ms_fwdbwd = timer(fwd), timer(fwd_bwd)
    else:  # a shared CPU's speed drifts: torch.add in the same rounds as the two
        row.ms_add, row.ms_fwd, row.ms_fwdbwd = timer.interleaved([lambda: torch.add(x, c), fwd, fwd_bwd])
    row.gbps_fwd = n_fwd * tensor_bytes / row.ms_fwd / 1e6
    row.ratio_fwd = row.ms_add / row.ms_fwd
    row.gbps_fwdbwd = n_fwdbwd * tensor_bytes / row.ms_fwdbwd / 1e6
    row.ratio_fwdbwd = n_fwdbwd / n_fwd * row.ms_add / row.ms_fwdbwd
    row.host_ms_fwdbwd = timer.host_ms(fwd_bwd)
    try:
        row.graph_ms_fwdbwd = timer.graph_ms(fwd_bwd)
    except Exception as exc:  # noqa: BLE001 -- not capturable: the eager numbers stand, the note says why
        row.error = f"CUDA graph: {_short(exc)}"


def _bench_case(case: Case, size: str, impls: list[Impl], timer: Timer, device: torch.device,
                dev_name: str, seed: int, tick: Callable[[], object]) -> list[Row]:
    shape = case.shape(size)
    base = dict(case=case.name, size="full" if shape == case.full else size, shape=format_shape(shape), dim=case.dim,
                dtype=str(case.dtype).removeprefix("torch."), device=dev_name)
    rows = [Row(impl=impl.name, **base) for impl in impls]
    try:
        inputs = make_inputs(shape, case.dtype, device, seed, coeff_shape=case.coeffs)
        x, c, gy = inputs
        # On the CPU each implementation times torch.add with its own calls (_bench_impl)
        ms_add = timer(lambda: torch.add(x, c)) if device.type == "cuda" else NAN
        ref = SliceReference(x, c, gy, case.dim, reverse=case.reverse)
    except Exception as exc:  # noqa: BLE001 -- e.g. out of memory: report the case, go on
        for row in rows:
            row.status, row.error = "error", f"case setup: {_short(exc)}"
            tick()
        free_memory(device)
        return rows
    for impl, row in zip(impls, rows):
        row.ms_add = ms_add
        if not impl.timed:
            row.status, row.error = "skipped", "n/a: interpreted here (checked, not timed)"
        elif impl.slow and not is_tiny(shape, case.dim):
            row.status, row.error = "skipped", "n/a: too slow at this size (timed on tiny cases only)"
        else:
            try:
                _bench_impl(impl, row, inputs, ref, timer, device, case.dim, case.reverse)
            except Exception as exc:  # noqa: BLE001 -- an implementation that raises is a result
                row.status, row.error = "error", _short(exc)
            free_memory(device)
        tick()
    del inputs, x, c, gy, ref
    free_memory(device)
    return rows


def run_benchmark(impls: list[Impl], cases: list[Case], device: torch.device, size: str, timer: Timer,
                  dev_name: str = "", seed: int = 0, progress: bool = True) -> list[Row]:
    """Benchmarks every implementation on every case; returns one :class:`Row` per pair.

    Never raises for a failing implementation or an oversized case: those rows carry
    ``status="error"`` and the message. ``size`` picks the case shapes (see
    :data:`~torch_linrec.bench.cases.SIZES`).
    """
    rows: list[Row] = []
    with tqdm(total=len(cases) * len(impls), desc="bench", unit="run", disable=True if not progress else None,
              dynamic_ncols=True, leave=False) as bar:
        for i, case in enumerate(cases):
            bar.set_postfix_str(case.name)
            rows.extend(_bench_case(case, size, impls, timer, device, dev_name, seed + i, lambda: bar.update(1)))
    return rows
