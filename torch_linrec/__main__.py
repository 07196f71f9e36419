"""``python -m torch_linrec``: check every implementation, then benchmark the case suite.

See :mod:`torch_linrec.bench.cli` and ``python -m torch_linrec --help``.
"""
import sys

from .bench import main

if __name__ == "__main__":
    sys.exit(main())
