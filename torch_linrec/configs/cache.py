"""Reading and writing the tuned config cache.

A cache file is JSON for one GPU model::

    {"_metadata": {"format": 1, "library": "0.1.0", "torch": ..., "triton": ..., "cuda": ..., "date": ...,
                   "device": {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "sms": 132},
                   "tuner": {...settings...}, "tuner_runs": [{"date": ..., ...settings...}, ...]},
     "entries": {"scan/fwd/float32/strided/L<=2^12/R<=2^16": {"config": "channel.s8r16b1p2", "backend": "native",
                                                               "ratio": 0.97}, ...}}

(``tuner``: the last run's settings; ``tuner_runs``: every run merged into the file, oldest first;
the shipped files also list hand edits in ``edits``),
mapping a problem bucket (:func:`torch_linrec.dispatch.bucket_key`) to the config to run (its name
says its backend: ``"triton..."`` or a native one). Lookup order per device: the user's file
(``$TORCH_LINREC_CACHE_DIR`` or the per-user cache directory of ``platformdirs``), then the file
shipped in this package. A file that is corrupt, for another GPU, or from an incompatible version
is skipped with one warning, and the next one (at last the planner's defaults) applies. Writes are
atomic (``os.replace``) and serialized by a file lock.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["FORMAT", "TunedConfigs", "device_identity", "cache_file_name", "user_cache_dir", "shipped_dir", "load",
           "write", "clear_memo", "validate"]

FORMAT = 1
ENV_DIR = "TORCH_LINREC_CACHE_DIR"


def _library_version() -> str:
    from .. import __version__
    return __version__


def _compatible_version(version: str) -> bool:
    """Config names are stable within a minor version of the library."""
    return str(version).split(".")[:2] == _library_version().split(".")[:2]


def device_identity(device: torch.device | str | int) -> dict:
    """``{"name", "capability", "sms"}`` of a CUDA device: the key a cache file is for."""
    props = torch.cuda.get_device_properties(torch.device("cuda", torch.device(device).index)
                                             if not isinstance(device, int) else device)
    return {"name": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count}


def cache_file_name(identity: dict) -> str:
    """``nvidia-h100-80gb-hbm3.json`` for ``{"name": "NVIDIA H100 80GB HBM3", ...}``."""
    return re.sub(r"[^a-z0-9]+", "-", identity["name"].lower()).strip("-") + ".json"


def user_cache_dir() -> Path:
    """Where user-tuned files live: ``$TORCH_LINREC_CACHE_DIR``, else the platform's per-user cache directory."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    import platformdirs
    return Path(platformdirs.user_cache_dir("torch_linrec", appauthor=False))


def shipped_dir() -> Path:
    """The folder of the files shipped with the package (this one)."""
    return Path(__file__).resolve().parent


@dataclass
class TunedConfigs:
    """The entries in force for one device, and where they came from.

    Attributes:
        entries: bucket key -> config name.
        source: the file they were read from, or None (no valid file: the planner's defaults).
        skipped: ``[(path, reason)]`` for files found but not used.
    """

    entries: dict = field(default_factory=dict)
    source: Path | None = None
    skipped: list = field(default_factory=list)

    def lookup(self, key: str) -> str | None:
        """The config name for bucket ``key``, or None when the bucket has no entry."""
        return self.entries.get(key)


def _known_configs() -> set:
    from .._library import scan_cuda_configs
    names = {"native", "triton"} | set(scan_cuda_configs(4)) | set(scan_cuda_configs(2))
    try:
        from ..linrec.triton.ops import CONFIGS
        names |= set(CONFIGS)
    except ImportError:  # no triton: Triton names stay unknown
        pass
    return names


def validate(data, identity: dict) -> str | None:
    """Why ``data`` (a parsed file) cannot serve a device of ``identity``, or None when it can."""
    if not isinstance(data, dict) or not isinstance(data.get("_metadata"), dict) or \
            not isinstance(data.get("entries"), dict):
        return "not a tuned config file (needs '_metadata' and 'entries' objects)"
    meta = data["_metadata"]
    if meta.get("format") != FORMAT:
        return f"format {meta.get('format')!r}, this library reads format {FORMAT}"
    if not _compatible_version(meta.get("library", "")):
        return f"written by torch_linrec {meta.get('library')!r}, this is {_library_version()}"
    dev = meta.get("device", {})
    mine = (identity["name"], identity["capability"], identity["sms"])
    theirs = (dev.get("name"), dev.get("capability"), dev.get("sms"))
    if theirs != mine:
        return f"tuned for {theirs}, this device is {mine}"
    known = _known_configs()
    for key, entry in data["entries"].items():
        if not isinstance(entry, dict) or entry.get("config") not in known:
            return f"entry {key!r} names an unknown config: {entry!r}"
    return None


def _read(path: Path, identity: dict) -> tuple[dict | None, str | None]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"unreadable or corrupt ({type(exc).__name__}: {exc})"
    reason = validate(data, identity)
    return (None, reason) if reason else ({k: v["config"] for k, v in data["entries"].items()}, None)


_memo: dict = {}
_lock = threading.Lock()


def load(device: torch.device | str | int = "cuda") -> TunedConfigs:
    """The tuned configs for a CUDA device (memoized per device index; :func:`clear_memo` forgets).

    Warns once (a UserWarning per skipped file) when a file is found but cannot be used; the op still
    runs, with the next file's entries or the planner's defaults.
    """
    index = device if isinstance(device, int) else torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    with _lock:
        if index in _memo:
            return _memo[index]
        identity = device_identity(index)
        result = TunedConfigs()
        name = cache_file_name(identity)
        for path in (user_cache_dir() / name, shipped_dir() / name):
            if not path.is_file():
                continue
            entries, reason = _read(path, identity)
            if entries is None:
                result.skipped.append((path, reason))
                warnings.warn(f"torch_linrec: ignoring tuned config file {path}: {reason}; "
                              "using the next file or the planner's defaults", stacklevel=2)
                continue
            result.entries, result.source = entries, path
            break
        _memo[index] = result
        return result


def clear_memo() -> None:
    """Forgets loaded files (the next lookup reads them again), e.g. after the tuner wrote one."""
    with _lock:
        _memo.clear()


def _versions() -> dict:
    out = {"library": _library_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton
        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    return out


def _runs(meta: dict) -> list:
    """The tuner runs a file's metadata records (files written before ``tuner_runs``: the last one)."""
    runs = meta.get("tuner_runs")
    if isinstance(runs, list):
        return runs
    return [{"date": meta.get("date"), **meta["tuner"]}] if isinstance(meta.get("tuner"), dict) else []


def write(entries: dict, identity: dict, tuner: dict, path: Path | None = None, merge: bool = True) -> Path:
    """Writes a cache file atomically under a file lock, and returns its path.

    Args:
        entries: bucket key -> ``{"config": name, ...measurements}``.
        identity: :func:`device_identity` of the tuned device.
        tuner: the tuner's settings, stored in ``_metadata``.
        path: the file (default: the user cache directory's file for ``identity``).
        merge: keep the entries of a valid existing file for buckets not in ``entries``, its
            ``tuner_runs`` (this run is appended) and its ``edits``.
    """
    from filelock import FileLock

    path = Path(path) if path is not None else user_cache_dir() / cache_file_name(identity)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        merged, runs, kept = {}, [], {}
        if merge and path.is_file():
            try:
                old = json.loads(path.read_text())
                if validate(old, identity) is None:
                    merged.update(old["entries"])
                    runs = _runs(old["_metadata"])
                    kept = {k: old["_metadata"][k] for k in ("edits",) if k in old["_metadata"]}
            except (OSError, ValueError):
                pass
        merged.update(entries)
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        meta = {"format": FORMAT, **_versions(), "date": date, "device": identity, "tuner": tuner,
                "tuner_runs": runs + [{"date": date, **tuner}], **kept}
        text = json.dumps({"_metadata": meta, "entries": dict(sorted(merged.items()))}, indent=1) + "\n"
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    clear_memo()
    return path
