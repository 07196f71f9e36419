"""Checks and benchmarks of torch_linrec: the main job behind ``python -m torch_linrec``.

Modules: :mod:`.cases` (the case suite), :mod:`.impls` (the implementations under test),
:mod:`.reference` (a fast float64 reference), :mod:`.check` (correctness stage), :mod:`.timing`,
:mod:`.runner` (benchmark stage), :mod:`.report` (table, CSV, plot), :mod:`.cli` (``main``).
See bench/README.md in the repository.
"""
from .cases import SUITE, Case
from .check import CHECK_CONFIGS, run_checks
from .cli import main
from .impls import Impl, implementations, register_impls
from .runner import Row, run_benchmark

__all__ = ["main", "SUITE", "Case", "Impl", "implementations", "register_impls", "run_checks", "CHECK_CONFIGS",
           "run_benchmark", "Row"]
