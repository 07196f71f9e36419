"""Timers, peak-memory measurement and device naming.

On CUDA, :func:`make_timer` uses ``triton.testing.do_bench`` (median, L2 flushed between calls)
when Triton is importable, else CUDA events around each call (median). On the CPU it takes
``time.perf_counter`` medians of repeats after a warmup call, the last-level cache flushed before
each repeat as ``do_bench`` flushes the L2 (not in quick mode): otherwise an operand set that fits
the cache (``torch.add`` on 8 MiB tensors beside a 32 MiB L3) is timed from the cache while a scan's
forward+backward, which touches twice the bytes, is timed from DRAM (bench/NOTES.md item 83).
:meth:`Timer.interleaved` times several calls round-robin on the CPU, for their ratios. The timer
also splits a call's cost:
:meth:`Timer.host_ms` (the host's time to issue one call) and :meth:`Timer.graph_ms` (the device's
time: the call captured in a CUDA graph and replayed).
"""
from __future__ import annotations

import functools
import gc
import glob
import importlib.util
import math
import platform
import re
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["make_timer", "Timer", "measure_peak", "free_memory", "device_name", "device_slug"]


def _cuda_events_ms(fn: Callable[[], object], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _last_level_cache_bytes() -> int:
    """The largest CPU cache's size from Linux's sysfs (cpu0), or 0 where it cannot be read."""
    sizes = []
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(index) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=0)


@functools.lru_cache(maxsize=1)
def _cache_flush_buffer() -> torch.Tensor:
    """float32 buffer of 8x the last-level cache, 64-512 MiB: 2x did not evict the operands of an
    8 MiB ``torch.add`` on the dev VM's 32 MiB L3 (a VM's cores may see more than their own L3)."""
    size = min(max(8 * _last_level_cache_bytes(), 64 << 20), 512 << 20)
    return torch.zeros(size // 4, dtype=torch.float32)


def _cpu_interleaved_ms(fns: list[Callable[[], object]], budget_s: float, min_reps: int, max_reps: int,
                        flush: bool = False) -> list[float]:
    """Medians of ``fns`` timed round-robin, each call after a cache flush when ``flush``; the budget
    counts every timed call."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    buf = _cache_flush_buffer() if flush else None
    t_end = time.perf_counter() + budget_s
    while len(times[0]) < min_reps or (len(times[0]) < max_reps and time.perf_counter() < t_end):
        for fn, out in zip(fns, times):
            if buf is not None:
                t_flush = time.perf_counter()
                buf.neg_()
                t_end += time.perf_counter() - t_flush
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Timer:
    """``timer(fn) -> milliseconds``: the median time of one call of ``fn`` on ``device``.

    ``quick`` shortens warmup and repeats and skips the CPU's cache flush (for smoke tests; the
    numbers are noisier). Build it with :func:`make_timer`.
    """

    device: torch.device
    quick: bool = False

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.device.type == "cuda":
            warmup, rep = (5, 20) if self.quick else (25, 100)
            with torch.cuda.device(self.device):
                if importlib.util.find_spec("triton") is not None:
                    from triton.testing import do_bench
                    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
                return _cuda_events_ms(fn, warmup=max(3, warmup // 5), reps=max(10, rep // 2))
        budget, min_reps = self._budget()
        return _cpu_interleaved_ms([fn], budget, min_reps, max_reps=50, flush=not self.quick)[0]

    def interleaved(self, fns: list[Callable[[], object]]) -> list[float]:
        """The median time of one call of each of ``fns``, for ratios between them that a machine's
        slow and fast phases do not skew.

        On the CPU they are timed round-robin, call by call (each after the cache flush when not
        ``quick``): on a shared VM the medians of both the scan and ``torch.add`` moved up to ~1.8x
        between timings a few seconds apart, which turned into ratios of 0.5 to 1.5 when each was timed
        at its own moment (bench/NOTES.md item 85). On CUDA each is timed in turn as :meth:`__call__`
        times it (steady under ``do_bench``).
        """
        if self.device.type == "cuda":
            return [self(fn) for fn in fns]
        budget, min_reps = self._budget()
        return _cpu_interleaved_ms(fns, len(fns) * budget, min_reps, max_reps=50, flush=not self.quick)

    def _budget(self) -> tuple[float, int]:
        return (0.02, 2) if self.quick else (0.25, 3)

    def host_ms(self, fn: Callable[[], object]) -> float:
        """Host time of one call of ``fn``: the median over batches of the wall time to issue a batch of
        calls back to back, divided by the batch's calls.

        The device is synchronised before each batch and after it, outside the timed span, so on CUDA
        this is the time the host spends per call (Python, dispatch, allocation, launches), not the
        kernels' time; on the CPU, where calls run synchronously, it is the time of a call. A batch has
        as many calls as fit in a tenth of the time budget (1 to 100), measured on a warmup call.
        """
        budget, min_reps = self._budget()
        _sync(self.device)
        t0 = time.perf_counter()
        fn()
        _sync(self.device)
        calls = max(1, min(100, int(budget / 10 / max(time.perf_counter() - t0, 1e-9))))
        times: list[float] = []
        t_end = time.perf_counter() + budget
        while len(times) < min_reps or (len(times) < 50 and time.perf_counter() < t_end):
            _sync(self.device)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) / calls)
        _sync(self.device)
        return statistics.median(times) * 1e3

    def graph_ms(self, fn: Callable[[], object]) -> float:
        """Device time of one call of ``fn``: ``fn`` captured once in a CUDA graph (after three warmup
        calls on a side stream, as ``torch.cuda.graph`` asks), the replay timed as :meth:`__call__`
        times a call. NaN off CUDA.

        Raises:
            RuntimeError: when ``fn`` cannot be captured (it synchronises, or copies to the host).
        """
        if self.device.type != "cuda":
            return math.nan
        with torch.cuda.device(self.device):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            try:
                return self(graph.replay)
            finally:
                torch.cuda.synchronize()
                del graph


def make_timer(device: torch.device, quick: bool = False) -> Timer:
    """A :class:`Timer`, ``timer(fn) -> milliseconds``: the median time of one call of ``fn`` on ``device``.

    ``quick`` shortens warmup and repeats and skips the CPU's cache flush (for smoke tests; the
    numbers are noisier).
    """
    return Timer(torch.device(device), quick)


def measure_peak(fn: Callable[[], object], device: torch.device):
    """Runs ``fn()`` once; returns ``(its result, peak bytes)``.

    The peak is ``torch.cuda.max_memory_allocated`` during the call minus the memory allocated
    before it (the inputs), so it counts the outputs and every temporary. None off CUDA.
    """
    if device.type != "cuda":
        return fn(), None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    return out, torch.cuda.max_memory_allocated(device) - base


def free_memory(device: torch.device) -> None:
    """Collects garbage and, on CUDA, returns cached blocks to the driver."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def device_name(device: torch.device) -> str:
    """A readable device name: the GPU's name, or the CPU model with its thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {_cpu_model()} ({torch.get_num_threads()} threads)"


def device_slug(device: torch.device) -> str:
    """A file-name-safe device name, e.g. ``nvidia-h100-80gb-hbm3`` or ``cpu-intel-r-xeon-r-...``."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu {_cpu_model()}"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or device.type
