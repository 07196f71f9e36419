"""Benchmark of the context-parallel scan, launched by ``torchrun`` (one process per GPU)::

    torchrun --nproc-per-node 2 -m torch_linrec.distributed.bench --out bench/results
    torchrun --nproc-per-node 2 -m torch_linrec.distributed.bench --device cpu --log2-length 16 --channels 4

Stages (rank 0 prints; every figure is the median over repeats of the slowest rank's wall time,
ranks aligned by a barrier before each repeat):

1. check: a small odd-length problem split over the ranks against the single-process scan
   (output and gradients), and the chunk summary against its float64 reference; PASS/FAIL.
2. one GPU: ``torch_linrec.scan`` of the whole ``channels x L`` sequence on rank 0 alone (the
   other ranks wait), forward and forward+backward.
3. context parallel on all ranks (``L / world`` each): forward, forward+backward, and its parts
   alone: the chunk summary, the all-gather of the summaries (the communication), the chunk's scan.
4. gather-to-one baseline (forward): ``dist.gather`` of x and coeffs to rank 0, its scan of the
   whole sequence, ``dist.scatter`` of y back.
5. a sequence that does not fit on one GPU (CUDA only): per rank ~70% of the free memory, forward
   and forward+backward, sized from ``torch.cuda.mem_get_info``.

Bounds: the forward moves 3 tensors on one GPU and 5 per rank on ``L / k`` (summary: read x, c;
scan: read x, c, write y), so at best ``3k/5`` times faster; the forward+backward 8 on one GPU
(backward: read dy, c, y, write dx, dc) and 14 per rank (the backward adds the summary of
``(c, dy)`` and a copy of dy that takes the carry), ``8k/14``. The CSV (rank 0, ``--out``) has a
row per measurement.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..api import scan
from ..bench.timing import device_name, device_slug
from .api import context_parallel_scan
from .ops import all_gather_states
from .summary import chunk_summary, chunk_summary_ref

__all__ = ["main", "run", "run_section", "build_parser", "launched_by_torchrun", "setup"]

_FIELDS = ("stage", "impl", "world", "channels", "length", "dtype", "pass", "ms", "speedup_vs_1gpu", "bound",
           "GB/s", "note")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node K -m torch_linrec.distributed.bench",
                                description="Context-parallel scan on K ranks vs one GPU (see the module docs).")
    p.add_argument("--device", choices=("cuda", "cpu"), help="cuda (NCCL) when available, else cpu (gloo)")
    p.add_argument("--channels", type=int, default=64, help="independent sequences (default 64)")
    p.add_argument("--log2-length", type=int, default=26, help="log2 of the whole sequence's length (default 26)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--reps", type=int, default=20, help="timed repeats per measurement (default 20)")
    p.add_argument("--no-big", action="store_true", help="skip stage 5 (the sequence that does not fit on one GPU)")
    p.add_argument("--out", type=Path, help="folder of the CSV file cp-<device>-k<K><tag>.csv (default: print only)")
    p.add_argument("--tag", default="", help="suffix of the CSV file's name (default none)")
    return p


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    import gc
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


class _Bench:
    def __init__(self, args, device: torch.device):
        self.args, self.device = args, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.dtype = getattr(torch, args.dtype)
        self.rows: list[dict] = []
        self.one_gpu: dict[str, float] = {}

    def say(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)

    def _median_ms(self, fn, reps: int, barrier: bool) -> float:
        fn()
        _sync(self.device)
        times = []
        for _ in range(reps):
            if barrier:
                dist.barrier()
            _sync(self.device)
            t0 = time.perf_counter()
            fn()
            _sync(self.device)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3

    def time_ms(self, fn, reps: int | None = None, alone: bool = False) -> float:
        """Median wall time of ``fn()`` (max over ranks); ``alone``: rank 0 runs, the others wait
        (an out-of-memory error there gives NaN: no rank waits in a collective on it)."""
        ms = 0.0
        if not alone or self.rank == 0:
            try:
                ms = self._median_ms(fn, reps or self.args.reps, barrier=not alone)
            except torch.OutOfMemoryError:
                if not alone:
                    raise
                ms = float("nan")
                _free(self.device)
        dist.barrier()
        t = torch.tensor([ms], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def record(self, stage, impl, world, length, pas, ms, tensors=None, bound=None, note=""):
        one = self.one_gpu.get(pas) if world > 1 else None
        nbytes = None if tensors is None else tensors * self.args.channels * (length // world) * self.dtype.itemsize
        row = dict(stage=stage, impl=impl, world=world, channels=self.args.channels, length=length,
                   dtype=self.args.dtype, **{"pass": pas}, ms=round(ms, 4),
                   speedup_vs_1gpu="" if one is None or stage != "cp" else round(one / ms, 3),
                   bound="" if bound is None else round(bound, 3),
                   **{"GB/s": "" if nbytes is None else round(nbytes / ms / 1e6, 1)}, note=note)
        self.rows.append(row)
        self.say(f"  {stage:<9} {impl:<22} k={world} L=2^{length.bit_length() - 1} {pas:<8} {ms:10.3f} ms"
                 + (f"  {row['speedup_vs_1gpu']}x vs 1 GPU (bound {row['bound']}x)" if row["speedup_vs_1gpu"] else "")
                 + (f"  {row['GB/s']} GB/s/rank" if row["GB/s"] else "") + (f"  {note}" if note else ""))

    def inputs(self, length: int, seed: int, grad: bool = False):
        """This rank's chunk: x ~ randn, coeffs ~ U(0.9, 1) (drawn on the device)."""
        g = torch.Generator(device=self.device).manual_seed(seed)
        shape = (self.args.channels, length)
        x = torch.randn(shape, generator=g, device=self.device, dtype=self.dtype)
        c = torch.rand(shape, generator=g, device=self.device, dtype=self.dtype).mul_(0.1).add_(0.9)
        return x.requires_grad_(grad), c.requires_grad_(grad)

    def check(self) -> bool:
        """Stage 1: PASS when every rank's chunk matches the single-process scan."""
        length, chans = 1000 * self.world + 7, 4
        g = torch.Generator().manual_seed(1)
        xs = torch.randn(chans, length, generator=g).to(self.device, self.dtype)
        cs = (0.5 + 0.5 * torch.rand(chans, length, generator=g)).to(self.device, self.dtype)
        h0 = torch.randn(chans, generator=g).to(self.device, self.dtype)
        gy = torch.randn(chans, length, generator=g).to(self.device, self.dtype)
        lens = [length // self.world + (r < length % self.world) for r in range(self.world)]
        lo = sum(lens[:self.rank])
        leaves = [t.detach().double().requires_grad_() for t in (xs, cs, h0)]
        ref = scan(*leaves, dim=-1) if self.device.type == "cpu" else \
            scan(*(t.float() for t in leaves), dim=-1)  # float64 is CPU only: float32 on CUDA
        ref.backward(gy.to(ref.dtype))
        part = [t.narrow(-1, lo, lens[self.rank]).detach().requires_grad_() for t in (xs, cs)]
        h = h0.clone().requires_grad_()
        y = context_parallel_scan(part[0], part[1], -1, initial=h)
        y.backward(gy.narrow(-1, lo, lens[self.rank]))
        tol = 1e-4 if self.dtype == torch.float32 else 3e-2

        def err(a, b):
            return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1)).item()
        errs = [err(y, ref.detach().narrow(-1, lo, lens[self.rank])),
                err(part[0].grad, leaves[0].grad.narrow(-1, lo, lens[self.rank])),
                err(part[1].grad, leaves[1].grad.narrow(-1, lo, lens[self.rank])),
                err(h.grad, leaves[2].grad) if self.rank == 0 else h.grad.abs().max().item()]
        a, b = chunk_summary(part[0].detach(), part[1].detach(), 1)
        a_ref, b_ref = chunk_summary_ref(part[0], part[1], 1)
        errs += [err(a, a_ref), err(b, b_ref)]
        worst = torch.tensor([max(errs)], dtype=torch.float64, device=self.device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        ok = worst.item() <= tol
        self.say(f"check: context_parallel_scan on {self.world} ranks vs one-process scan (y, grads, chunk summary): "
                 f"{'PASS' if ok else 'FAIL'} (max scaled error {worst.item():.2e}, tolerance {tol:g})")
        return ok

    def one_vs_k(self, length: int) -> None:
        """Stages 2-4 at ``length`` (the whole sequence)."""
        k, chunk = self.world, length // self.world
        x = c = dy = None  # rank 0 alone holds the whole sequence
        if self.rank == 0:
            x, c = self.inputs(length, seed=0, grad=True)
            dy = torch.randn_like(x)
        with torch.no_grad():
            ms = self.time_ms(lambda: scan(x, c, dim=-1), alone=True)
        self.one_gpu["fwd"] = ms
        self.record("1gpu", "scan", 1, length, "fwd", ms, tensors=3)
        ms = self.time_ms(lambda: torch.autograd.grad(scan(x, c, dim=-1), (x, c), dy), alone=True)
        self.one_gpu["fwd+bwd"] = ms
        self.record("1gpu", "scan", 1, length, "fwd+bwd", ms, tensors=8)
        x = c = dy = None
        _free(self.device)

        x, c = self.inputs(chunk, seed=1 + self.rank, grad=True)
        dy = torch.randn_like(x)
        with torch.no_grad():
            cp_ms = self.time_ms(lambda: context_parallel_scan(x, c, -1))
        self.record("cp", "context_parallel_scan", k, length, "fwd", cp_ms, tensors=5, bound=3 * k / 5)
        ms = self.time_ms(lambda: torch.autograd.grad(context_parallel_scan(x, c, -1), (x, c), dy))
        self.record("cp", "context_parallel_scan", k, length, "fwd+bwd", ms, tensors=14, bound=8 * k / 14)
        dy = None
        with torch.no_grad():
            summary = torch.stack(chunk_summary(x, c, 1))
            carry = torch.zeros_like(x[:, 0])
            parts = [("chunk_summary", lambda: chunk_summary(x, c, 1), 2),
                     ("all_gather(summaries)", lambda: all_gather_states(summary, dist.group.WORLD), None),
                     ("scan(initial=carry)", lambda: scan(x, c, carry, -1), 3)]
            for name, fn, tensors in parts:
                note = f"{summary.numel() * summary.element_size()} bytes per rank" if tensors is None else ""
                self.record("cp-part", name, k, length, "fwd", self.time_ms(fn), tensors=tensors, note=note)
            ms = self.time_ms(lambda: self.gather_to_one(x, c))
        self.record("baseline", "gather-scan-scatter", k, length, "fwd", ms, tensors=None,
                    note=f"context_parallel_scan is {ms / cp_ms:.1f}x faster")

    def gather_to_one(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """What users do without context parallelism: gather to rank 0, scan, scatter back."""
        root = self.rank == 0
        gx = [torch.empty_like(x) for _ in range(self.world)] if root else None
        gc = [torch.empty_like(c) for _ in range(self.world)] if root else None
        dist.gather(x.detach(), gx, dst=0)
        dist.gather(c.detach(), gc, dst=0)
        chunks = None
        if root:
            xs, cs = torch.cat(gx, -1), torch.cat(gc, -1)
            del gx, gc
            y = scan(xs, cs, dim=-1)
            del xs, cs
            chunks = [t.contiguous() for t in y.split(x.shape[-1], -1)]
            del y
        out = torch.empty_like(x)
        dist.scatter(out, chunks, src=0)
        return out

    def too_big(self) -> None:
        """Stage 5: sequences sized so that one GPU cannot hold them."""
        _free(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        t = torch.tensor([free], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        free = t.item()
        per = self.args.channels * self.dtype.itemsize
        for pas, tensors, one_gpu_tensors in (("fwd", 3, 3), ("fwd+bwd", 7, 6)):
            chunk = int(0.7 * free / (tensors * per)) >> 20 << 20  # a multiple of 2^20
            length = chunk * self.world
            need = one_gpu_tensors * per * length
            note = f"one GPU would need {need / 2**30:.0f} GiB of its {total / 2**30:.0f} GiB"
            if need <= total:
                note += " (fits: more ranks or less free memory would be needed to show it)"
            x = c = dy = None
            try:  # every rank agrees that the inputs fit before any collective runs on them
                x, c = self.inputs(chunk, seed=7 + self.rank, grad=pas != "fwd")
                dy = None if pas == "fwd" else torch.randn_like(x)
                fits = 1.0
            except torch.OutOfMemoryError:
                fits = 0.0
            flag = torch.tensor([fits], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if flag.item() == 1.0:
                if pas == "fwd":
                    with torch.no_grad():
                        ms = self.time_ms(lambda: context_parallel_scan(x, c, -1), reps=3)
                else:
                    ms = self.time_ms(lambda: torch.autograd.grad(context_parallel_scan(x, c, -1), (x, c), dy),
                                      reps=3)
                self.record("too-big", "context_parallel_scan", self.world, length, pas, ms,
                            tensors=5 if pas == "fwd" else 14, note=note)
            else:
                self.say(f"  too-big {pas}: the inputs ({length} steps) did not fit on some rank; skipped")
            x = c = dy = None
            _free(self.device)

    def write(self, out: Path | None) -> None:
        if self.rank != 0 or out is None:
            return
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"cp-{device_slug(self.device)}-k{self.world}{self.args.tag}.csv"
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=_FIELDS)
            w.writeheader()
            w.writerows(self.rows)
        print(f"wrote {path}", flush=True)


def run(args: argparse.Namespace, device: torch.device) -> int:
    """Runs the stages on the initialized default process group; returns 1 when the check failed."""
    b = _Bench(args, device)
    b.say(f"context-parallel scan benchmark: {b.world} ranks of {device_name(device)}, torch {torch.__version__}, "
          f"backend {dist.get_backend()}, {args.channels} channels x L = 2^{args.log2_length} {args.dtype}")
    ok = b.check()
    length = 1 << args.log2_length
    if length % b.world:
        raise ValueError(f"the length 2^{args.log2_length} must divide over {b.world} ranks")
    b.say("timings: median ms of the slowest rank")
    b.one_vs_k(length)
    if device.type == "cuda" and not args.no_big:
        b.too_big()
    b.write(args.out)
    return 0 if ok else 1


def setup(device_kind: str | None) -> torch.device:
    """Initializes the default process group from torchrun's environment; returns this rank's device."""
    kind = device_kind or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        kwargs = {"device_id": device} if kind == "cuda" else {}
        dist.init_process_group("nccl" if kind == "cuda" else "gloo", timeout=datetime.timedelta(minutes=5),
                                **kwargs)
    return device


def launched_by_torchrun() -> bool:
    """Whether this process is one of several that ``torchrun`` started."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def run_section(device_kind: str, out: Path | None, quick: bool = False) -> tuple[int, bool]:
    """The multi-GPU section of the main job (``torchrun ... -m torch_linrec``): stages 1-4 at
    ``channels=64, L=2^24`` (``quick``: ``2^16``, 3 repeats, the CSV named ``...-quick.csv``), CSV to ``out``.

    Returns:
        ``(status, is_rank_0)``: status 1 when the check failed. The process group is destroyed.
    """
    args = build_parser().parse_args(["--log2-length", "16" if quick else "24", "--reps", "3" if quick else "10",
                                      "--no-big", "--tag", "-quick" if quick else ""])
    args.out = out
    device = setup(device_kind)
    rank = dist.get_rank()
    try:
        return run(args, device), rank == 0
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if "RANK" not in os.environ:
        print("launch with torchrun, e.g. torchrun --nproc-per-node 2 -m torch_linrec.distributed.bench",
              file=sys.stderr)
        return 2
    device = setup(args.device)
    try:
        return run(args, device)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
