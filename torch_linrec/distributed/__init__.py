"""Context parallelism for the scan: a sequence split along its length over the ranks of a
``torch.distributed`` process group (NCCL on GPUs, gloo on CPUs).

Imported explicitly (``import torch_linrec.distributed``; ``import torch_linrec`` does not load it).

:func:`context_parallel_scan` is the entry point; :mod:`.ops` holds the custom ops
``linrec::context_parallel_scan`` / ``linrec::context_parallel_scan_backward`` and the math;
:mod:`.summary` and :mod:`.kernels` the chunk summary (a Triton reduction on CUDA);
``python -m torch_linrec.distributed.bench`` (under ``torchrun``) the benchmark.
"""
from .api import context_parallel_scan, group_name
from .summary import chunk_summary, chunk_summary_ref

__all__ = ["context_parallel_scan", "group_name", "chunk_summary", "chunk_summary_ref"]
