"""CUDA-only checks of every named config of csrc/linrec/cuda/configs.h against the CPU kernel, each
requested explicitly through the ops' ``config`` argument (forward: ``torch.ops.linrec.scan(x, c,
h0, dim, reverse, config)``, backward: ``torch.ops.linrec.scan_backward(gy, c, y, h0, dim, reverse,
config)``): the stream kernel (a block per sequence fed by bulk copies) at the edges of its tiles and
halos, the register-held look-back for fewer sequences than SMs, the channel kernel with one or two
channels per lane, the tile kernel; and, over several layouts, every name against the planner's
rules: a name that applies runs correctly, one that does not raises ValueError listing the names
valid for the call ("valid here: ..."), and the two agree. Skipped without a GPU and the CUDA kernels.
"""
from __future__ import annotations

import functools
import zlib

import pytest
import torch

from conftest import HAS_CUDA
from samples import assert_close_scaled, check_against_cpu_kernel, poison_allocator
from torch_linrec._library import scan_cuda_configs

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and torch_linrec's CUDA kernels")]

DTYPES = [pytest.param(torch.float32, id="f32"), pytest.param(torch.float16, id="f16"),
          pytest.param(torch.bfloat16, id="bf16")]
REVERSE = [pytest.param(False, id="fwd"), pytest.param(True, id="rev")]


def _names(kind: str, elem_size: int) -> list[str]:
    """The config names of one template ("tile", "stream", "ring", "channel") in table order."""
    return [n for n in scan_cuda_configs(elem_size) if n.startswith(kind + ".")]


def _elem_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _by_index(kind: str) -> list:
    """One param per table index of ``kind``; the test resolves the name for its dtype."""
    return [pytest.param(i, id=f"{a}|{b}") for i, (a, b) in enumerate(zip(_names(kind, 4), _names(kind, 2)))]


def _stream_capable() -> bool:
    """Whether the stream kernel can run on device 0 (Hopper's bulk copies, the largest config's
    ~212 KiB of shared memory): then every stream config applies to aligned rows."""
    if not HAS_CUDA:
        return False
    props = torch.cuda.get_device_properties(0)
    optin = getattr(props, "shared_memory_per_block_optin", None)
    if optin is None:  # older torch: every Hopper GPU lets a block opt into 227 KiB
        return props.major == 9
    return props.major >= 9 and optin >= 227 * 1024


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if HAS_CUDA else 1


def _valid_here(message: str) -> list[str]:
    assert "valid here:" in message, message
    return [n.strip() for n in message.split("valid here:", 1)[1].splitlines()[0].split(",") if n.strip()]


def _run(call, name: str):
    """``call()``, or None when it raises the ValueError of a config that does not apply (the message
    lists the applicable names, which must not include ``name``)."""
    try:
        return call()
    except ValueError as e:
        msg = str(e)
        assert f"config '{name}' does not apply" in msg, msg
        valid = _valid_here(msg)
        assert name not in valid, msg
        return None


def _grad_y(y: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator(device=y.device).manual_seed(seed)
    return torch.randn(y.shape, generator=g, device=y.device, dtype=torch.float32).to(y.dtype)


def _is_channel_layout(y: torch.Tensor, dim: int) -> bool:
    """The planner's split (plan.h): the scanned dim of the output is not its innermost batch dim."""
    dim = dim % y.dim()
    others = [abs(y.stride(i)) for i in range(y.dim()) if i != dim and y.shape[i] != 1]
    return bool(others) and abs(y.stride(dim)) > min(others)


def check_configs(x, c, h0, dim, reverse, dtype, names) -> dict:
    """Runs forward and backward with each of ``names`` and compares with the CPU kernel.

    Returns ``{name: (forward applied, backward applied)}``. A name that does not apply must raise
    the ValueError of :func:`_run`; the names that ran must be exactly those of ``names`` that the op
    lists as valid for the call (asked with a name that applies to no layout of this kind).
    """
    scan, scan_backward = torch.ops.linrec.scan, torch.ops.linrec.scan_backward
    h0_cpu = None if h0 is None else h0.cpu()
    y_cpu = scan(x.cpu(), c.cpu(), h0_cpu, dim, reverse)
    y = torch.empty_like(x).copy_(y_cpu)  # every backward reads this y, allocated as the op allocates it
    gy = _grad_y(y, zlib.crc32(repr((tuple(x.shape), dim, reverse)).encode()))
    grads_cpu = scan_backward(gy.cpu(), c.cpu(), y.cpu(), h0_cpu, dim, reverse)
    applied = {}
    for name in names:
        poison_allocator(x, copies=6)
        out = _run(lambda: scan(x, c, h0, dim, reverse, name), name)
        if out is not None:
            assert bool(torch.isfinite(out).all()), f"{name}: forward left elements unwritten (NaN)"
            assert_close_scaled(out, y_cpu, dtype, f"{name}: forward vs CPU kernel")
        poison_allocator(x, copies=6)
        grads = _run(lambda: scan_backward(gy, c, y, h0, dim, reverse, name), name)
        if grads is not None:
            for what, g, gc in zip(("grad_x", "grad_coeffs", "grad_initial"), grads, grads_cpu):
                assert bool(torch.isfinite(g).all()), f"{name}: {what} left elements unwritten (NaN)"
                assert_close_scaled(g, gc, dtype, f"{name}: {what} vs CPU kernel")
        applied[name] = (out is not None, grads is not None)
    # What ran agrees with the op's own list of the names that apply.
    probe = _names("tile", _elem_size(dtype))[0] if _is_channel_layout(y, dim) else "channel.s16r8b2"
    for i, call in enumerate((lambda: scan(x, c, h0, dim, reverse, probe),
                              lambda: scan_backward(gy, c, y, h0, dim, reverse, probe))):
        with pytest.raises(ValueError, match="valid here:") as info:
            call()
        listed = set(_valid_here(str(info.value)))
        ran = {n for n, ok in applied.items() if ok[i]}
        assert ran == listed & set(names), f"{('forward', 'backward')[i]}: ran {sorted(ran)}, the op lists {sorted(listed)}"
    return applied


# ----------------------------------------------------------------------------------------------- every config

# (name, x shape, dim, layout, stream): layout "contig", "pad" (rows of an 8-aligned wider buffer),
# "stride2" (every other element along the scan), "sliced" (channels shifted by one: pairs
# misaligned), "transposed" (a transposed buffer: the scan innermost, rows 37 apart). stream:
# whether the stream configs apply on Hopper, (forward, backward) as a function of reverse: the rows
# of x, coeffs and (backward) y must be 16-byte aligned, and a walk backwards in memory needs the
# length to be a multiple of the vector; y is allocated contiguous (rows of length L).
_LAYOUTS = [
    ("rows-odd", (5, 1037), -1, "contig", lambda rev: (False, False)),
    ("rows-aligned", (3, 4104), -1, "contig", lambda rev: (True, True)),
    ("rows-padded", (4, 1001), -1, "pad", lambda rev: (not rev, False)),
    ("rows-stride2", (3, 777), -1, "stride2", lambda rev: (False, False)),
    ("LN-transposed", (37, 129), 0, "transposed", lambda rev: (False, False)),
    ("BLD-even", (2, 333, 66), 1, "contig", lambda rev: (False, False)),
    ("BLD-sliced", (2, 333, 65), 1, "sliced", lambda rev: (False, False)),
    ("BHLD", (2, 3, 129, 5), 2, "contig", lambda rev: (False, False)),
]


def _random(g, dtype, shape, lo=None):
    """Normal values, or uniform in [lo, 1) (coefficients), drawn in float32 and cast to dtype."""
    t = torch.empty(shape, device="cuda")
    t.normal_(generator=g) if lo is None else t.uniform_(lo, 1.0, generator=g)
    return t.to(dtype)


def _layout_inputs(shape, dim, layout, dtype, seed):
    new = functools.partial(_random, torch.Generator(device="cuda").manual_seed(seed), dtype)
    if layout == "pad":
        width = (shape[-1] + 7) // 8 * 8 + 8
        x, c = (new((*shape[:-1], width), lo)[..., :shape[-1]] for lo in (None, 0.9))
    elif layout == "stride2":
        x, c = (new((*shape[:-1], 2 * shape[-1]), lo)[..., ::2] for lo in (None, 0.9))
    elif layout == "sliced":
        x, c = (new((*shape[:-1], shape[-1] + 1), lo)[..., 1:] for lo in (None, 0.9))
    elif layout == "transposed":
        x, c = (new(shape[::-1], lo).t() for lo in (None, 0.9))
    else:
        x, c = new(shape), new(shape, 0.9)
    assert tuple(x.shape) == shape
    h0 = new([s for i, s in enumerate(shape) if i != dim % len(shape)])
    return x, c, h0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", REVERSE)
@pytest.mark.parametrize("case", _LAYOUTS, ids=lambda c: c[0])
def test_every_config_on_layouts(case, reverse, dtype):
    """Every compiled name for the element size, forward and backward, with initial: correct where it
    applies, ValueError 'valid here: ...' where not. Tile configs apply to every layout with the
    scanned dim innermost, the one-channel-per-lane channel configs to every other, the pair config
    to even, unit-stride, aligned channels; the stream configs (on Hopper) to aligned rows."""
    name, shape, dim, layout, stream = case
    x, c, h0 = _layout_inputs(shape, dim, layout, dtype, seed=zlib.crc32(repr((name, reverse)).encode()))
    applied = check_configs(x, c, h0, dim, reverse, dtype, scan_cuda_configs(_elem_size(dtype)))
    channel_layout = _is_channel_layout(torch.empty_like(x), dim)
    assert channel_layout == name.startswith(("BLD", "BHLD"))
    for n, got in applied.items():
        if n.startswith("tile."):
            expect = (not channel_layout,) * 2
        elif n.startswith(("stream.", "ring.")):  # the same staged inputs, walked one way
            expect = stream(reverse) if _stream_capable() else (False, False)
        elif _channel_group(n) > 1:  # BLD-even has 66 channels: pairs only
            expect = (name == "BLD-even" and _channel_group(n) == 2,) * 2
        else:
            expect = (channel_layout,) * 2
        assert got == expect, f"{n}: applied (forward, backward) {got}, expected {expect}"


# ----------------------------------------------------------------------------------------------- stream kernel

# Stream tiles are 4096 float32 / 8192 16-bit steps (e16t256, e8t512 / e32t256, e16t512) or half
# that (e8t256 / e16t256); the halo is one 16-byte vector (4 or 8 steps). Lengths: whole tiles, a
# partial last tile, a last tile shorter than the halo (the backward reads y after the tile from
# global memory), one step past a tile.
_T = 8192
_LENGTHS = [2 * _T, 2 * _T + 8, _T + 2, _T + 4100]
# "off": an explicit tile config instead, which takes the look-back for these few rows.
_OFF = {4: "tile.e16t256", 2: "tile.e32t128"}


def _rows(n, length, dtype, seed, width=None):
    """(n, length) rows of a (n, width) buffer: aligned rows of any length (width rounded up to 8)."""
    width = width or (length + 7) // 8 * 8
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, width, generator=g, device="cuda").to(dtype)[:, :length]
    c = torch.empty(n, width, device="cuda").uniform_(0.9, 1.0, generator=g).to(dtype)[:, :length]
    h0 = torch.randn(n, generator=g, device="cuda").to(dtype)
    return x, c, h0


@pytest.mark.parametrize("config", _by_index("stream") + [pytest.param(-1, id="off")])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", REVERSE)
@pytest.mark.parametrize("length", _LENGTHS)
def test_stream_kernel_configs(length, reverse, dtype, config):
    """As many aligned rows as SMs, each stream config by name ("off": a tile config, the register-held
    look-back). The forward reads x and coeffs from 16-byte aligned rows, so a forward walking forward
    in memory streams at any length; a walk backwards in memory (reverse forward, or the backward of a
    forward scan) needs the length to be a multiple of the 16-byte vector, and the backward reads y,
    allocated contiguous by the op, so it streams only then. Elsewhere the name raises ValueError."""
    size = _elem_size(dtype)
    name = _OFF[size] if config < 0 else _names("stream", size)[config]
    seed = zlib.crc32(repr((length, reverse, str(dtype))).encode())
    x, c, h0 = _rows(_sms(), length, dtype, seed=seed)
    (fwd, bwd), = check_configs(x, c, h0, -1, reverse, dtype, [name]).values()
    if config < 0:
        assert fwd and bwd, "a tile config applies to every row layout"
    elif _stream_capable():
        vec = 16 // size
        assert fwd == (not reverse or length % vec == 0), (name, fwd)
        assert bwd == (length % vec == 0), (name, bwd)
    else:
        assert not fwd and not bwd, "the stream kernel needs compute capability 9.0"


@pytest.mark.parametrize("reverse", REVERSE)
def test_stream_kernel_broadcast_and_batch_dims(reverse):
    """Coefficients shared by all rows (batch stride 0), two batch dims, initial state absent or broadcast."""
    if not _stream_capable():
        pytest.skip("the stream kernel needs compute capability 9.0")
    L, n = 2 * _T + 16, _sms()
    g = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(2, n, L, generator=g, device="cuda")
    c = torch.empty(L, device="cuda").uniform_(0.9, 1.0, generator=g)
    h0 = torch.randn(n, generator=g, device="cuda")
    for name in _names("stream", 4):
        check_against_cpu_kernel(x, c, None, -1, reverse, torch.float32, name, name)
        check_against_cpu_kernel(x, c, h0, -1, reverse, torch.float32, name, name)


@pytest.mark.parametrize("config", [None, "tile.e8t128", "tile.e16t256"])
@pytest.mark.parametrize("rows", [1, 3])
def test_look_back_few_rows(rows, config):
    """Fewer rows than SMs: tiles on different blocks, chained by look-back over many tiles (the
    default, and small and large tiles by name)."""
    x, c, h0 = _rows(rows, 2 ** 21 + 12, torch.float32, seed=5)
    check_against_cpu_kernel(x, c, h0, -1, False, torch.float32, config, config)
    check_against_cpu_kernel(x, c, h0, -1, True, torch.float32, config, config)


# ----------------------------------------------------------------------------------------------- ring kernel

@pytest.mark.parametrize("config", _by_index("ring"))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", REVERSE)
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("tail", [16, 0])
def test_ring_kernel_configs(tail, rows, reverse, dtype, config):
    """Few long aligned rows, each ring config by name: every block takes more tiles than its ring has
    slots (each slot reused, tiles of different rows in turn), the last tile partial (read from global
    memory; `tail` 16) or whole (every tile's outputs stored through its slot, the gradient of the
    initial state from the last tile's last thread; `tail` 0), and the backward's halos across
    tiles, forward and backward, with initial."""
    if not _stream_capable():
        pytest.skip("the ring kernel needs compute capability 9.0 and ~220 KiB of shared memory")
    size = _elem_size(dtype)
    name = _names("ring", size)[config]
    # > 12 tiles per block for the largest tile (8192 steps, a multiple of every ring tile): 13 * SMs
    # tiles over the rows, plus `tail` steps (a multiple of the 16-byte vector: the backward walks
    # down y).
    length = -(-13 * _sms() // rows) * _T + tail
    x, c, h0 = _rows(rows, length, dtype, seed=zlib.crc32(repr((tail, rows, reverse, str(dtype), config)).encode()))
    (fwd, bwd), = check_configs(x, c, h0, -1, reverse, dtype, [name]).values()
    assert fwd and bwd, name


@pytest.mark.parametrize("reverse", REVERSE)
def test_ring_kernel_broadcast_and_batch_dims(reverse):
    """Coefficients shared by all rows (batch stride 0: the backward adds their gradient into one
    buffer), two batch dims, initial state absent or broadcast; and under deterministic algorithms
    the ring (look-back between blocks) does not apply."""
    if not _stream_capable():
        pytest.skip("the ring kernel needs compute capability 9.0")
    L = 40 * _T + 16
    g = torch.Generator(device="cuda").manual_seed(12)
    x = torch.randn(2, 3, L, generator=g, device="cuda")
    c = torch.empty(L, device="cuda").uniform_(0.9, 1.0, generator=g)
    h0 = torch.randn(3, generator=g, device="cuda")
    for name in _names("ring", 4):
        check_against_cpu_kernel(x, c, None, -1, reverse, torch.float32, name, name)
        check_against_cpu_kernel(x, c, h0, -1, reverse, torch.float32, name, name)
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(ValueError, match="does not apply"):
            torch.ops.linrec.scan(x, c, h0, -1, reverse, _names("ring", 4)[0])
    finally:
        torch.use_deterministic_algorithms(False)


# ----------------------------------------------------------------------------------------------- channel kernel

# (B, L, D) with dim=1 and the channels sliced from a wider buffer at an offset (0: contiguous).
# A config with groups of CPL channels per lane (names ending p2, c4, c8, before any l8) needs D, the buffer's
# width and the offset to be multiples of CPL (unit channel stride, group-aligned rows).
_BLD = [((2, 1000, 64), 0), ((3, 4100, 130), 0), ((2, 333, 2), 0), ((2, 1000, 65), 1), ((2, 777, 72), 4),
        ((1, 300, 264), 0)]


def _channel_group(name: str) -> int:
    fields = name.split(".")[1].split("l")[0]  # e.g. "s8r8b2c4" of "channel.s8r8b2c4l8.pipe"
    return 2 if fields.endswith("p2") else int(fields[-1]) if fields[-2] == "c" else 1


def _groups_apply(name: str, D: int, offset: int) -> bool:
    cpl = _channel_group(name)
    return D % cpl == 0 and offset % cpl == 0


@pytest.mark.parametrize("config", _by_index("channel"))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", REVERSE)
@pytest.mark.parametrize("case", _BLD, ids=lambda c: f"{'x'.join(map(str, c[0]))}-at{c[1]}")
def test_channel_kernel_configs(case, reverse, dtype, config):
    (B, L, D), offset = case
    name = _names("channel", _elem_size(dtype))[config]
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(repr((case, reverse, str(dtype))).encode()))
    x = torch.randn(B, L, D + offset, generator=g, device="cuda").to(dtype)[..., offset:]
    c = torch.empty(B, L, D + offset, device="cuda").uniform_(0.9, 1.0, generator=g).to(dtype)[..., offset:]
    h0 = torch.randn(B, D + offset, generator=g, device="cuda").to(dtype)[..., offset:]
    (fwd, bwd), = check_configs(x, c, h0, 1, reverse, dtype, [name]).values()
    expect = _groups_apply(name, D, offset)
    assert (fwd, bwd) == (expect, expect), (name, offset, fwd, bwd)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", REVERSE)
def test_channel_kernel_pipe_prefetch(reverse, dtype):
    """The prefetching configs (".pipe") where their blocks walk L (enough channel blocks for a wave,
    and under deterministic algorithms): the next span's loads overlap the current one's scan."""
    names = [n for n in _names("channel", _elem_size(dtype)) if n.endswith(".pipe")]
    assert names
    g = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(2, 301, 17408, generator=g, device="cuda").to(dtype)  # 272 blocks of 128 channels
    c = torch.empty_like(x, dtype=torch.float32).uniform_(0.9, 1.0, generator=g).to(dtype)
    h0 = torch.randn(2, 17408, generator=g, device="cuda").to(dtype)
    for name in names:
        check_against_cpu_kernel(x, c, h0, 1, reverse, dtype, name, name)
    torch.use_deterministic_algorithms(True)
    try:
        for name in names:
            check_against_cpu_kernel(x[:, :, :640], c[:, :, :640], h0[:, :640], 1, reverse, dtype, name, name)
    finally:
        torch.use_deterministic_algorithms(False)
    if dtype == torch.float32:  # broadcast coeffs: the walking backward adds their gradient into a buffer
        for name in names:
            check_against_cpu_kernel(x, c[0, 0].contiguous(), h0, 1, reverse, dtype, name, name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", REVERSE)
def test_channel_kernel_long_lookback(reverse, dtype):
    """Every channel config where its blocks chain look-back over many chunks (too few channel blocks
    to walk L): 71-283 chunks per sequence; partial channel blocks, a last span of one step, an
    initial state; broadcast coeffs (float32: the backward adds their gradient into a buffer)."""
    g = torch.Generator(device="cuda").manual_seed(12)
    x = torch.randn(2, 9025, 320, generator=g, device="cuda").to(dtype)  # 2.5-20 blocks of 32-256 channels
    c = torch.empty_like(x, dtype=torch.float32).uniform_(0.5, 0.95, generator=g).to(dtype)
    h0 = torch.randn(2, 320, generator=g, device="cuda").to(dtype)
    applied = check_configs(x, c, h0, 1, reverse, dtype, _names("channel", _elem_size(dtype)))
    assert all(fwd and bwd for fwd, bwd in applied.values()), applied
    if dtype == torch.float32:
        applied = check_configs(x, c[0, 0].contiguous(), None, 1, reverse, dtype, _names("channel", 4))
        assert all(fwd and bwd for fwd, bwd in applied.values()), applied


@pytest.mark.parametrize("coeffs_shape", [(64,), (2, 1, 64), (1, 1000, 1)], ids=["D", "B1D", "1L1"])
@pytest.mark.parametrize("reverse", REVERSE)
def test_channel_kernel_broadcast_coeffs(coeffs_shape, reverse):
    """Broadcast coefficients: read in place, their gradient added into a buffer of their shape; every
    channel config (the grouped configs only where coeffs have unit channel stride)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2, 1000, 64, generator=g, device="cuda")
    c = torch.empty(coeffs_shape, device="cuda").uniform_(0.9, 1.0, generator=g)
    check_against_cpu_kernel(x, c, None, 1, reverse, torch.float32)
    applied = check_configs(x, c, None, 1, reverse, torch.float32, _names("channel", 4))
    for name, (fwd, bwd) in applied.items():
        # Groups need unit channel stride in coeffs too (the backward's grad_coeffs buffer is exempt).
        expect = coeffs_shape[-1] == 64 if _channel_group(name) > 1 else True
        assert (fwd, bwd) == (expect, expect), (name, fwd, bwd)


# ----------------------------------------------------------------------------------------------- tile kernel


@pytest.mark.parametrize("config", _by_index("tile"))
@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, id="f32"), pytest.param(torch.bfloat16, id="bf16")])
@pytest.mark.parametrize("reverse", REVERSE)
@pytest.mark.parametrize("shape", [(3000, 1024), (5000, 37), (2500, 3000), (600, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_tile_kernel_configs(shape, reverse, dtype, config):
    """Every tile config in place of the length-chosen one (a block walking several tiles); rows of
    3000 and 1000 steps end inside a warp's steps on a vector boundary, where that warp's accesses
    are striped over the vectors before the row's end (WarpStripe::row_vectors): in memory the
    forward's last warp, the backward's first."""
    name = _names("tile", _elem_size(dtype))[config]
    x, c, h0 = _rows(shape[0], shape[1], dtype, seed=zlib.crc32(repr((shape, reverse, str(dtype))).encode()))
    check_against_cpu_kernel(x, c, h0, -1, reverse, dtype, name, name)


# Rows off the 16-byte grid: the tile kernel shifts each row's tiles to its phase and scans the
# steps left past them across warp 0 (plan.h, tile_phase_shift). (name, rows, length, layout): "contig" rows of an odd length start at every
# phase; "sliced" is x[:, 1:] (and coeffs likewise) of a buffer one column wider; "mixed" takes
# coeffs from aligned rows, so only x and the outputs share the row's phase; "bcast" shares one
# coeffs row (its phase is fixed) and accumulates grad_coeffs. Lengths: several tiles, one step short
# of a 1024-step tile (some rows' last steps past the tile), shorter than a vector, one step.
_PHASE_CASES = [("contig", 300, 3001), ("contig", 257, 1023), ("contig", 97, 5), ("contig", 33, 1),
                ("sliced", 200, 2050), ("mixed", 150, 4099), ("bcast", 64, 777)]


def _phase_inputs(layout, rows, length, dtype, seed):
    new = functools.partial(_random, torch.Generator(device="cuda").manual_seed(seed), dtype)
    if layout == "sliced":
        x, c = new((rows, length + 1))[:, 1:], new((rows, length + 1), 0.9)[:, 1:]
    elif layout == "mixed":
        x, c = new((rows, length)), new((rows, (length + 7) // 8 * 8), 0.9)[:, :length]
    elif layout == "bcast":
        x, c = new((rows, length)), new((length,), 0.9)
    else:
        x, c = new((rows, length)), new((rows, length), 0.9)
    return x, c, new((rows,))


@pytest.mark.parametrize("config", [pytest.param(-1, id="default")] + _by_index("tile"))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", REVERSE)
def test_tile_kernel_phase_shift(reverse, dtype, config):
    """Rows off the 16-byte grid, forward and backward with and without initial, against the CPU
    kernel: every tile config by name, and the planner's default."""
    name = None if config < 0 else _names("tile", _elem_size(dtype))[config]
    for layout, rows, length in _PHASE_CASES:
        x, c, h0 = _phase_inputs(layout, rows, length, dtype, seed=zlib.crc32(repr((layout, length, reverse)).encode()))
        check_against_cpu_kernel(x, c, h0, -1, reverse, dtype, name, name)
        check_against_cpu_kernel(x, c, None, -1, reverse, dtype, name, name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", REVERSE)
def test_walk_many_rows_default(reverse, dtype):
    """Many rows (8 per SM of an H100) longer than the longest tile, which the default plan walks
    where the stream kernel cannot take them or they are at most 16 walking tiles long (plan.h,
    walk_over_lookback): off the 16-byte grid (odd rows, a sliced buffer) and aligned; 1024-step
    walking tiles where few rows share an SM, and the 2-byte forward walked from 5 rows per SM
    (plan.h, walk_tile and walk_min_rows)."""
    cases = [("contig", 1056, 4097), ("sliced", 2000, 8193), ("contig", 2000, 6000), ("contig", 800, 3001),
             ("sliced", 700, 4000)]
    for i, (layout, rows, length) in enumerate(cases):
        x, c, h0 = _phase_inputs(layout, rows, length, dtype, seed=11 + i)
        check_against_cpu_kernel(x, c, h0, -1, reverse, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", REVERSE)
def test_short_stream_rows_default(reverse, dtype):
    """Rows of one or two stream tiles, 1.5 to 8 per SM of an H100, which the default plan chains as
    1024-step look-back tiles (plan.h, short_stream_rows)."""
    for i, (layout, rows, length) in enumerate([("contig", 600, 8000), ("contig", 300, 6000)]):
        x, c, h0 = _phase_inputs(layout, rows, length, dtype, seed=21 + i)
        check_against_cpu_kernel(x, c, h0, -1, reverse, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", REVERSE)
def test_look_back_odd_rows(reverse, dtype):
    """Few long rows of an odd length: the shifted tiles of each row on different blocks, chained by
    look-back (the default) and the first and last rows' phases differing."""
    x, c, h0 = _phase_inputs("contig", 3, 2 ** 19 + 5, dtype, seed=7)
    check_against_cpu_kernel(x, c, h0, -1, reverse, dtype)


def _contiguous_rows(rows: int, length: int, dtype: torch.dtype, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, length, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    c = (0.5 + 0.5 * torch.rand(rows, length, generator=g, device="cuda")).to(dtype)
    return x, c


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", REVERSE)
def test_segmented_rows_default(reverse, dtype):
    """Many rows of at most one walking tile, which the default plan groups into sequences of
    several rows with segments (plan_segments.h's segment_rows; test_plan_host checks that these shapes are
    grouped: 8 rows of 128 steps, 40 of 37 (3 tiles, the last partial), 1024 of 1, float32's 4 of
    255, 4 of 128, 2-4 of 512 (whole tiles: masked at tile edges only), and on GPUs with fast DRAM
    the 2-byte backward's 2 of 1024; ragged, a last group of fewer rows: float32's 5 of 300, 10 of 100
    (20 in the backward and for 2-byte types), groups of 20011 rows of 104 steps, 4223 rows of whole
    tiles (512) and of tile pairs (1024, the 2-byte backward)): every output, grad_initial of each row
    included; with `initial` and a sliced view the rows are not grouped."""
    cases = [(8448, 128), (48000, 37), (1081344, 1), (4224, 255), (8000, 128), (131072, 300), (32768, 512),
             (4224, 1024), (131072, 100), (20011, 104), (4223, 512), (4223, 1024)]
    for i, (rows, length) in enumerate(cases):
        x, c = _contiguous_rows(rows, length, dtype, seed=31 + i)
        check_against_cpu_kernel(x, c, None, -1, reverse, dtype, "native", "native")
    x, c = _contiguous_rows(8448, 128, dtype, seed=41)
    h0 = torch.randn(8448, device="cuda", dtype=torch.float32).to(dtype)
    check_against_cpu_kernel(x, c, h0, -1, reverse, dtype, "native", "native")
    x, c = _contiguous_rows(8448, 130, dtype, seed=42)
    check_against_cpu_kernel(x[:, 1:-1], c[:, 1:-1], None, -1, reverse, dtype, "native", "native")
