"""The per-GPU tuned config cache: which backend and kernel config runs each problem bucket.

Shipped files (this folder, one ``<gpu>.json`` per GPU model) are written by the tuner
(``python -m torch_linrec tune``); user files in :func:`~.cache.user_cache_dir` take precedence.
See :mod:`.cache`.
"""
from .cache import (FORMAT, TunedConfigs, cache_file_name, clear_memo, device_identity, load, shipped_dir,
                    user_cache_dir, write)

__all__ = ["FORMAT", "TunedConfigs", "cache_file_name", "clear_memo", "device_identity", "load", "shipped_dir",
           "user_cache_dir", "write"]
