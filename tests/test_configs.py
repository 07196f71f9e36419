"""The tuned config cache (torch_linrec/configs): round trip, bad files (corrupt, another GPU,
another version, unknown config names) falling back with one warning, two writers at once, and the
shipped files' validity. CPU tests use a stand-in device identity; the CUDA test checks that
``backend="auto"`` follows the shipped file on the GPU it was tuned for."""
from __future__ import annotations

import json
import threading
import warnings

import pytest
import torch

import torch_linrec
from torch_linrec.configs import cache
from torch_linrec.dispatch import Choice, bucket_key, choose, clear_memo, tuned_configs

IDENTITY = {"name": "Test GPU 80GB", "capability": "9.0", "sms": 132}
KEY = "scan/fwd/float32/strided/L<=2^12/R<=2^16"


@pytest.fixture()
def dirs(tmp_path, monkeypatch):
    """A user cache dir and a shipped dir of our own, for a device with IDENTITY."""
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    user.mkdir()
    shipped.mkdir()
    monkeypatch.setenv(cache.ENV_DIR, str(user))
    monkeypatch.setattr(cache, "shipped_dir", lambda: shipped)
    monkeypatch.setattr(cache, "device_identity", lambda device: dict(IDENTITY))
    cache.clear_memo()
    yield user, shipped
    cache.clear_memo()


def _write(folder, entries, **meta):
    path = folder / cache.cache_file_name(IDENTITY)
    cache.write({k: {"config": v} for k, v in entries.items()}, IDENTITY, {"test": True}, path=path, merge=False)
    if meta:
        data = json.loads(path.read_text())
        data["_metadata"].update(meta)
        path.write_text(json.dumps(data))
    return path


def test_file_name():
    assert cache.cache_file_name({"name": "NVIDIA H100 80GB HBM3"}) == "nvidia-h100-80gb-hbm3.json"


def test_round_trip_and_user_file_first(dirs):
    user, shipped = dirs
    _write(shipped, {KEY: "triton.t1024"})
    _write(user, {KEY: "channel.s16r8b2"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = cache.load(0)
    assert table.lookup(KEY) == "channel.s16r8b2"
    assert table.source == user / cache.cache_file_name(IDENTITY)
    assert table.lookup("scan/bwd/float32/strided/L<=2^12/R<=2^16") is None
    meta = json.loads(table.source.read_text())["_metadata"]
    for field in ("format", "library", "torch", "triton", "cuda", "date", "device", "tuner"):
        assert field in meta, field


@pytest.mark.parametrize("problem", ["corrupt", "other-gpu", "other-version", "other-format", "unknown-config"])
def test_bad_user_file_warns_once_and_falls_back_to_shipped(dirs, problem):
    user, shipped = dirs
    _write(shipped, {KEY: "triton.t1024"})
    if problem == "corrupt":
        (user / cache.cache_file_name(IDENTITY)).write_text('{"_metadata": {"format": 1,')
    elif problem == "other-gpu":
        _write(user, {KEY: "channel.s16r8b2"}, device={**IDENTITY, "sms": 114})
    elif problem == "other-version":
        _write(user, {KEY: "channel.s16r8b2"}, library="9.9.0")
    elif problem == "other-format":
        _write(user, {KEY: "channel.s16r8b2"}, format=99)
    else:
        _write(user, {KEY: "channel.s99r1b1"})
    with pytest.warns(UserWarning, match="ignoring tuned config file") as record:
        table = cache.load(0)
    assert len(record) == 1
    assert table.lookup(KEY) == "triton.t1024"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # memoized: no second warning
        assert cache.load(0).lookup(KEY) == "triton.t1024"


def test_no_valid_file_means_defaults(dirs):
    user, shipped = dirs
    (shipped / cache.cache_file_name(IDENTITY)).write_text("not json")
    with pytest.warns(UserWarning):
        table = cache.load(0)
    assert table.entries == {} and table.source is None and len(table.skipped) == 1


def test_two_writers_at_once_keep_every_entry(dirs):
    """Writers merge under a file lock: entries of both survive, and the file stays valid JSON."""
    user, _ = dirs
    path = user / cache.cache_file_name(IDENTITY)
    barrier = threading.Barrier(2)
    errors = []

    def writer(tag):
        try:
            barrier.wait()
            for i in range(15):
                cache.write({f"scan/fwd/float32/innermost/L<=2^{8 + 2 * (i % 5)}/R<=2^{tag}{i}": {"config": "native"}},
                            IDENTITY, {"writer": tag}, path=path)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    data = json.loads(path.read_text())
    assert cache.validate(data, IDENTITY) is None
    assert len(data["entries"]) == 30
    assert not list(user.glob("*.tmp"))
    runs = data["_metadata"]["tuner_runs"]
    assert sorted(r["writer"] for r in runs) == [1] * 15 + [2] * 15 and all("date" in r for r in runs)
    assert data["_metadata"]["tuner"] == {k: v for k, v in runs[-1].items() if k != "date"}


def test_tuner_runs_keep_the_edits(dirs):
    """A merged write keeps the file's hand-edit record (the shipped files list theirs in edits)."""
    user, _ = dirs
    path = user / cache.cache_file_name(IDENTITY)
    cache.write({KEY: {"config": "native"}}, IDENTITY, {"run": 1}, path=path)
    data = json.loads(path.read_text())
    data["_metadata"]["edits"] = ["set back by hand"]
    path.write_text(json.dumps(data))
    cache.write({KEY: {"config": "native"}}, IDENTITY, {"run": 2}, path=path)
    assert json.loads(path.read_text())["_metadata"]["edits"] == ["set back by hand"]
    cache.write({KEY: {"config": "native"}}, IDENTITY, {"run": 3}, path=path, merge=False)
    assert "edits" not in json.loads(path.read_text())["_metadata"]


def test_tuner_runs_recorded(dirs):
    """Each write records its tuner settings in tuner_runs (appended on merge, the last also as
    tuner); a file from before tuner_runs counts its tuner as the first run; merge=False starts over."""
    user, _ = dirs
    path = user / cache.cache_file_name(IDENTITY)
    cache.write({KEY: {"config": "native"}}, IDENTITY, {"run": 1}, path=path)
    data = json.loads(path.read_text())
    del data["_metadata"]["tuner_runs"]  # as written by an older version
    path.write_text(json.dumps(data))
    cache.write({KEY: {"config": "native"}}, IDENTITY, {"run": 2}, path=path)
    meta = json.loads(path.read_text())["_metadata"]
    assert [r["run"] for r in meta["tuner_runs"]] == [1, 2] and meta["tuner"] == {"run": 2}
    cache.write({KEY: {"config": "native"}}, IDENTITY, {"run": 3}, path=path, merge=False)
    assert [r["run"] for r in json.loads(path.read_text())["_metadata"]["tuner_runs"]] == [3]


@pytest.mark.parametrize("name", ["nvidia-h100-80gb-hbm3.json", "nvidia-h200.json"])
def test_shipped_files_are_valid(name):
    """Every shipped file names only configs this build knows, for the GPU in its metadata."""
    path = cache.shipped_dir() / name
    data = json.loads(path.read_text())
    assert cache.validate(data, data["_metadata"]["device"]) is None
    assert data["_metadata"]["tuner"]["quick"] is False
    for key in data["entries"]:
        op, direction, dtype, layout, length, rows = key.split("/")
        assert (op, direction in ("fwd", "bwd"), dtype in ("float32", "bfloat16", "float16")) == ("scan", True, True)
        assert layout in ("innermost", "strided", "innermost-bcast", "strided-bcast"), key


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_follows_the_shipped_file_on_its_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path))  # no user file
    clear_memo()
    identity = cache.device_identity(0)
    path = cache.shipped_dir() / cache.cache_file_name(identity)
    if not path.is_file():
        pytest.skip(f"no shipped file for {identity['name']}")
    entries = json.loads(path.read_text())["entries"]
    x = torch.randn(8, 4096, 4096, device="cuda")
    c = torch.rand(8, 4096, 4096, device="cuda")
    assert choose(x, c, 1, "auto") == Choice("native", "auto", "auto")  # resolved by the op
    tuned = tuned_configs(x, c, 1)
    for cfg, direction in zip(tuned, ("fwd", "bwd")):
        assert cfg == entries[bucket_key("scan", direction, torch.float32, "strided", 4096, 8 * 4096)]["config"]
    leaves = [t.clone().requires_grad_() for t in (x, c)]
    y = torch_linrec.scan(*leaves, dim=1)
    grads = torch.autograd.grad(y, leaves, x)
    fwd_cfg, bwd_cfg = ("prefer:" + t for t in tuned)
    fwd = torch.ops.linrec.scan_triton if fwd_cfg.startswith("prefer:triton") else torch.ops.linrec.scan
    bwd = torch.ops.linrec.scan_backward_triton if bwd_cfg.startswith("prefer:triton") else torch.ops.linrec.scan_backward
    assert torch.equal(y, fwd(x, c, None, 1, False, fwd_cfg))
    grad_x, grad_c, _ = bwd(x, c, y.detach(), None, 1, False, bwd_cfg)
    assert torch.equal(grads[0], grad_x) and torch.equal(grads[1], grad_c)
    clear_memo()


def test_tuner_pick_over_a_bucket():
    """The tuner's choice for a bucket: the best geometric mean of a config's time over the native
    default's across the bucket's problems, among the configs at most MAX_LOSS slower than the
    default on every problem (a config that wins at one row count and loses more at another does not
    win), the default kept within KEEP_DEFAULT of the best, and a config that did not run on every
    problem out."""
    from torch_linrec.bench.tune import KEEP_DEFAULT, MAX_LOSS, _pick

    assert _pick([{"native": 1.0, "a": 0.9, "b": 0.95}]) == "a"
    assert _pick([{"native": 1.0, "a": 0.9}, {"native": 1.0, "a": 1.15}]) == "native"
    # not the last problem alone, nor the arithmetic mean: the geometric mean (0.97 against 0.985)
    assert _pick([{"native": 1.0, "a": 0.94, "b": 0.97}, {"native": 1.0, "a": 1.0, "b": 1.0}]) == "a"
    # a geometric mean of 0.975 that costs one problem 90% does not win; within MAX_LOSS it may
    assert _pick([{"native": 1.0, "a": 0.5}, {"native": 1.0, "a": 1.9}]) == "native"
    assert _pick([{"native": 1.0, "a": 0.5}, {"native": 1.0, "a": 1 + MAX_LOSS * 0.9}]) == "a"
    assert _pick([{"native": 1.0, "a": 0.5}, {"native": 1.0, "a": 1 + MAX_LOSS * 1.1}]) == "native"
    assert _pick([{"native": 1.0, "a": 0.9, "b": 0.96}, {"native": 1.0, "a": 1.15, "b": 0.96}]) == "b"
    assert _pick([{"native": 1.0, "a": 1 - KEEP_DEFAULT / 2}]) == "native"
    assert _pick([{"native": 1.0, "a": 0.5}, {"native": 1.0}]) == "native"


def test_tuner_counts_host_time_where_triton_runs():
    """Where a Triton config was timed, each Triton config counts max(kernel, host) with the host time
    of the fastest Triton config (measured once, and the native default's for the log): a Triton
    launch slower than a native kernel does not win, and at a check where the Triton kernel is about
    as fast as the default's its launch still counts (a bucket's choice must hold at eager pace on
    every problem). Native configs keep their kernel times: a host-bound problem still ranks them
    (flooring them at the native launch tied them all, and the tuner kept the default)."""
    from torch_linrec.bench.tune import MAX_LOSS, _host_bound, _pick

    asked = []

    def host(name):
        asked.append(name)
        return {"native": 0.010, "triton.t1024": 0.030, "triton.t8192": 0.060}[name]

    times = {"native": 0.020, "tile.e16t16": 0.018, "triton.t1024": 0.012, "triton.t2048": 0.014}
    eager, note = _host_bound(times, host)
    assert asked == ["native", "triton.t1024"] and "triton.t1024" in note
    assert eager == {"native": 0.020, "tile.e16t16": 0.018, "triton.t1024": 0.030, "triton.t2048": 0.030}
    assert _pick([eager]) == "tile.e16t16" and _pick([times]) == "triton.t1024"
    # kernels shorter than the native launch: the native configs still rank by kernel
    small = _host_bound({"native": 0.004, "stream.e8t256s6": 0.003, "triton.t1024": 0.002}, host)[0]
    assert small == {"native": 0.004, "stream.e8t256s6": 0.003, "triton.t1024": 0.030}
    assert _pick([small]) == "stream.e8t256s6"
    big = {"native": 0.200, "triton.t1024": 0.150}  # kernels longer than either launch: unchanged
    assert _host_bound(big, host)[0] == big
    # the middle shape and the corner win by kernel and launch; the check's kernel is 2% slower
    mid = _host_bound({"native": 0.200, "triton.t8192": 0.100}, host)[0]
    corner = _host_bound({"native": 0.800, "triton.t8192": 0.400}, host)[0]
    check = {"native": 0.050, "triton.t8192": 0.051}
    assert _pick([mid, check, corner]) == "triton.t8192"  # kernels alone: within MAX_LOSS
    assert _host_bound(check, host)[0]["triton.t8192"] == 0.060 > (1 + MAX_LOSS) * 0.050
    assert _pick([mid, _host_bound(check, host)[0], corner]) == "native"
    asked.clear()
    assert _host_bound({"native": 0.020, "tile.e16t16": 0.01}, host) == ({"native": 0.020, "tile.e16t16": 0.01}, "")
    assert asked == []


def test_tuner_grid_covers_the_buckets_the_suite_leaves_out():
    """GRID: one problem per bucket of 2^22 to 2^28 elements (bucket tops) that no SUITE problem
    covers, at the middle of the bucket; every problem's bucket distinct from the others'; its checks
    two other shapes of the same bucket."""
    from torch_linrec.bench.tune import CHECKS, GRID, GROUPS, SUITE
    from torch_linrec.dispatch import bucket_key, layout_class

    def key(p):
        x = torch.empty(p.shape)
        d = p.dim % x.dim()
        c = torch.empty(p.coeff_shape) if p.coeff_shape else x
        return bucket_key("scan", "fwd", torch.float32, layout_class(x, c, d), x.shape[d], x.numel() // x.shape[d])

    suite, grid = {key(p) for p in SUITE}, [key(p) for p in GRID]
    assert len(set(grid)) == len(grid) and not suite & set(grid)
    assert all(len(CHECKS[p.name]) == 2 and all(key(c) == key(p) and c.shape != p.shape for c in CHECKS[p.name])
               for p in GRID)
    for layout, lengths in (("innermost", range(8, 27, 2)), ("strided", range(8, 17, 2))):
        for a in lengths:
            for b in range(0 if layout == "innermost" else 8, 19, 2):
                k = f"scan/fwd/float32/{layout}/L<=2^{a}/R<=2^{b}"
                assert (k in suite or k in grid) == (22 <= a + b <= 28 or k in suite), k
    assert "NL-512x8192" in GROUPS["grid"] and "NL-131072x1024" in GROUPS["suite"]


def test_tuner_runs_the_checks_of_a_winner(monkeypatch):
    """A grid problem whose winner is not the default runs its checks with that winner and the
    default only, and the bucket's entry is picked over all of them: a winner that loses more than
    MAX_LOSS on a check is not taken (the tuner on the CPU, with a fake timer and fake configs)."""
    from torch_linrec.bench import tune

    prob, check = tune.TuneProblem("NL-4x64", (4, 64), -1), tune.TuneProblem("NL-3x48", (3, 48), -1)
    ms = {((4, 64), "native"): 1.0, ((4, 64), "a"): 0.5, ((4, 64), "b"): 0.9,
          ((3, 48), "native"): 1.0, ((3, 48), "a"): 0.9, ((3, 48), "b"): 0.5}
    timed = []

    def run(cfg, t):
        fn = lambda: None  # noqa: E731
        fn.key = (tuple(t.shape), cfg)
        return fn

    class Timer:
        def __call__(self, fn):
            key = getattr(fn, "key", None)
            timed.append(key)
            return ms[key] if key else 1.0

    monkeypatch.setattr(tune, "make_timer", lambda device, quick=False: Timer())
    monkeypatch.setattr(tune, "config_names", lambda device, dtype: ["native", "a", "b"])
    monkeypatch.setattr(tune, "_run_fwd", lambda cfg, x, c, dim: run(cfg, x))
    monkeypatch.setattr(tune, "_run_bwd", lambda cfg, gy, c, y, dim: run(cfg, y))
    monkeypatch.setitem(tune.CHECKS, prob.name, (check,))
    entries = tune.tune([prob], [torch.float32], torch.device("cpu"), progress=False, log=lambda _: None)
    assert [k for k in timed if k and k[0] == (3, 48)] == [((3, 48), "a"), ((3, 48), "native")] * 2
    assert {e["config"] for e in entries.values()} == {"a"}  # 0.9 at the check: within MAX_LOSS
    assert all(e["problem"] == "NL-4x64+NL-3x48" for e in entries.values())
    ms[((3, 48), "a")] = 1.0 + 2 * tune.MAX_LOSS
    timed.clear()
    entries = tune.tune([prob], [torch.float32], torch.device("cpu"), progress=False, log=lambda _: None)
    assert {e["config"] for e in entries.values()} == {"native"}
    ms[((4, 64), "a")] = ms[((4, 64), "b")] = 1.0
    timed.clear()
    tune.tune([prob], [torch.float32], torch.device("cpu"), progress=False, log=lambda _: None)
    assert not [k for k in timed if k and k[0] == (3, 48)]  # the default won: no check


def test_tuner_skips_a_failing_config(monkeypatch):
    """A config that fails with anything but ValueError (out of memory, Triton out of resources) is
    logged and skipped; the run goes on. A check times only the directions whose winner is not the
    default."""
    from torch_linrec.bench import tune

    prob, check = tune.TuneProblem("NL-4x64", (4, 64), -1), tune.TuneProblem("NL-3x48", (3, 48), -1)
    timed, lines = [], []

    def run(cfg, t, direction):
        def fn():
            if cfg == "boom":
                raise RuntimeError("CUDA out of memory")
        fn.key = (tuple(t.shape), cfg, direction)
        return fn

    class Timer:
        def __call__(self, fn):
            key = getattr(fn, "key", None)
            timed.append(key)
            return 0.5 if key and key[1] == "a" and key[2] == "fwd" else 1.0

    monkeypatch.setattr(tune, "make_timer", lambda device, quick=False: Timer())
    monkeypatch.setattr(tune, "config_names", lambda device, dtype: ["native", "boom", "a"])
    monkeypatch.setattr(tune, "_run_fwd", lambda cfg, x, c, dim: run(cfg, x, "fwd"))
    monkeypatch.setattr(tune, "_run_bwd", lambda cfg, gy, c, y, dim: run(cfg, y, "bwd"))
    monkeypatch.setitem(tune.CHECKS, prob.name, (check,))
    entries = tune.tune([prob], [torch.float32], torch.device("cpu"), progress=False, log=lines.append)
    assert sum("boom failed, skipped: RuntimeError: CUDA out of memory" in line for line in lines) == 2
    assert {k.split("/")[1]: e["config"] for k, e in entries.items()} == {"fwd": "a", "bwd": "native"}
    assert [k for k in timed if k and k[0] == (3, 48)] == [((3, 48), "a", "fwd"), ((3, 48), "native", "fwd")]


def test_tuner_cases_take_groups():
    """--cases: problem names and the groups suite / grid, expanded in order, each problem once; an
    unknown name raises ValueError naming it; none: every problem (QUICK's with --quick)."""
    from torch_linrec.bench.tune import GRID, PROBLEMS, QUICK, SUITE, select_problems

    assert select_problems(None) == list(PROBLEMS) and len(PROBLEMS) == len(SUITE) + len(GRID)
    assert [p.name for p in select_problems(None, quick=True)] == list(QUICK)
    assert select_problems(["grid"]) == list(GRID)
    picked = select_problems(["NL-512x8192", "suite", "NL-131072x1024"])
    assert picked[0].name == "NL-512x8192" and picked[1:] == list(SUITE)
    with pytest.raises(ValueError, match=r"unknown tuning problem\(s\) \['NL-7x7'\]; known: suite, grid"):
        select_problems(["NL-7x7", "grid"])
