"""Builds torch_linrec._C: the CPU kernels always, the CUDA kernels when torch has CUDA and nvcc is found.

Set TORCH_LINREC_FORCE_CPU=1 to skip the CUDA kernels, TORCH_CUDA_ARCH_LIST to choose GPU targets
(default: the visible GPUs), MAX_JOBS for build parallelism. Sources: csrc/module.cpp (every
schema), csrc/common (shared host code), one folder per op family (csrc/linrec) with its CPU
sources and a cuda/ folder.
"""
import glob
import os
import sys

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension


def with_cuda() -> bool:
    if os.environ.get("TORCH_LINREC_FORCE_CPU", "0") == "1":
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None


def sources(*patterns: str) -> list:
    return sorted({f for p in patterns for f in glob.glob(p, recursive=True)})  # a file two patterns match once


def openmp_flags() -> list:
    """-fopenmp where torch runs at::parallel_for on OpenMP (Linux wheels): the header-only
    at::parallel_for runs its body serially unless the calling code is itself compiled with OpenMP
    (ATen/Parallel-inl.h tests _OPENMP); libgomp.so.1, which torch loads, serves the calls."""
    if sys.platform.startswith("linux") and torch.backends.openmp.is_available():
        return ["-fopenmp"]
    return []


def extension():
    cpp = sources("csrc/*.cpp", "csrc/common/*.cpp", "csrc/*/*.cpp", "csrc/*/cpu/*.cpp")
    omp = openmp_flags()
    cxx = ["-O3", *omp]  # the C++ standard is torch's own choice: headers must match its build
    if not with_cuda():
        print("torch_linrec: building the CPU kernels only (no CUDA torch or nvcc found)")
        return CppExtension("torch_linrec._C", cpp, extra_compile_args={"cxx": cxx}, extra_link_args=omp,
                            py_limited_api=True)
    print("torch_linrec: building the CPU and CUDA kernels")
    cuda = sources("csrc/*/cuda/*.cu", "csrc/*/cuda/*.cpp")
    nvcc = ["-O3", "--use_fast_math", "-lineinfo", "-Xptxas=-warn-spills", "--expt-relaxed-constexpr"]
    return CUDAExtension("torch_linrec._C", cpp + cuda, define_macros=[("LINREC_WITH_CUDA", "1")],
                         extra_compile_args={"cxx": cxx, "nvcc": nvcc}, extra_link_args=omp, py_limited_api=True)


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
