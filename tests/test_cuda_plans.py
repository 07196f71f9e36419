"""CUDA-only checks of each launch plan of csrc/cuda/scan_plan.h against the CPU kernel, config by
config through the TORCH_LINREC_CUDA_*_CONFIG overrides: the stream kernel (a block per sequence fed
by bulk copies) at the edges of its tiles and halos, the register-held look-back for fewer sequences
than SMs, the channel kernel with one or two channels per lane, the tile kernel. Skipped without a
GPU and the CUDA kernels."""
from __future__ import annotations

import zlib

import pytest
import torch

from conftest import HAS_CUDA
from samples import check_against_cpu_kernel

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and torch_linrec's CUDA kernels")]

# Stream tiles are 4096 float32 / 8192 16-bit steps (configs 0, 1, 4) or half that (2, 3); the halo
# is one 16-byte vector (4 or 8 steps). Lengths: whole tiles, a partial last tile, a last tile shorter
# than the halo (the backward reads y after the tile from global memory), one step past a tile.
_T = 8192
_LENGTHS = [2 * _T, 2 * _T + 8, _T + 2, _T + 4100]


def _stream_rows():
    """As many rows as SMs: the planner's threshold for the stream kernel."""
    return torch.cuda.get_device_properties(0).multi_processor_count if HAS_CUDA else 1


def _rows(n, length, dtype, seed, width=None):
    """(n, length) rows of a (n, width) buffer: aligned rows of any length (width rounded up to 8)."""
    width = width or (length + 7) // 8 * 8
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, width, generator=g, device="cuda").to(dtype)[:, :length]
    c = torch.empty(n, width, device="cuda").uniform_(0.9, 1.0, generator=g).to(dtype)[:, :length]
    h0 = torch.randn(n, generator=g, device="cuda").to(dtype)
    return x, c, h0


@pytest.mark.parametrize("config", ["0", "1", "2", "3", "4", "off"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("length", _LENGTHS)
def test_stream_kernel_configs(length, reverse, dtype, config, monkeypatch):
    """As many aligned rows as SMs take the stream kernel (with "off": the register-held look-back).
    A scan walking backwards in memory (reverse forward, or the backward of a forward scan) streams
    only when the row length is a multiple of the 16-byte vector; else it takes the look-back."""
    monkeypatch.setenv("TORCH_LINREC_CUDA_STREAM_CONFIG", config)
    seed = zlib.crc32(repr((length, reverse, str(dtype))).encode())
    x, c, h0 = _rows(_stream_rows(), length, dtype, seed=seed)
    check_against_cpu_kernel(x, c, h0, -1, reverse, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("length", _LENGTHS)
def test_stream_kernel_direct_stores(length, reverse, dtype, monkeypatch):
    """The stream kernel's outputs stored from registers instead of bulk stores from shared memory."""
    monkeypatch.setenv("TORCH_LINREC_CUDA_STREAM_STORE", "direct")
    x, c, h0 = _rows(_stream_rows(), length, dtype, seed=length)
    check_against_cpu_kernel(x, c, h0, -1, reverse, dtype)


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_stream_kernel_broadcast_and_batch_dims(reverse):
    """Coefficients shared by all rows (batch stride 0), two batch dims, initial state absent or broadcast."""
    L, n = 2 * _T + 16, _stream_rows()
    g = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(2, n, L, generator=g, device="cuda")
    c = torch.empty(L, device="cuda").uniform_(0.9, 1.0, generator=g)
    check_against_cpu_kernel(x, c, None, -1, reverse, torch.float32)
    h0 = torch.randn(n, generator=g, device="cuda")
    check_against_cpu_kernel(x, c, h0, -1, reverse, torch.float32)


@pytest.mark.parametrize("rows", [1, 3])
def test_look_back_few_rows(rows):
    """Fewer rows than SMs: tiles on different blocks, chained by look-back over many tiles."""
    x, c, h0 = _rows(rows, 2 ** 21 + 12, torch.float32, seed=5)
    check_against_cpu_kernel(x, c, h0, -1, False, torch.float32)
    check_against_cpu_kernel(x, c, h0, -1, True, torch.float32)


# Channel kernel: (B, L, D) with dim=1. Pairs of channels per lane need even D, unit channel stride
# and pair-aligned rows; "sliced" shifts the rows by one element (pairs misaligned: one per lane).
_BLD = [((2, 1000, 64), "plain"), ((3, 4100, 130), "plain"), ((2, 333, 2), "plain"), ((2, 1000, 65), "sliced")]


@pytest.mark.parametrize("config", ["0", "1", "2", "3", "4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("case", _BLD, ids=lambda c: f"{'x'.join(map(str, c[0]))}-{c[1]}")
def test_channel_kernel_configs(case, reverse, dtype, config, monkeypatch):
    monkeypatch.setenv("TORCH_LINREC_CUDA_CHANNEL_CONFIG", config)
    (B, L, D), layout = case
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(repr((case, reverse, str(dtype))).encode()))
    x = torch.randn(B, L, D, generator=g, device="cuda").to(dtype)
    c = torch.empty(B, L, D, device="cuda").uniform_(0.9, 1.0, generator=g).to(dtype)
    h0 = torch.randn(B, D, generator=g, device="cuda").to(dtype)
    if layout == "sliced":
        x, c, h0 = x[..., 1:], c[..., 1:], h0[..., 1:]
    check_against_cpu_kernel(x, c, h0, 1, reverse, dtype)


@pytest.mark.parametrize("coeffs_shape", [(64,), (2, 1, 64), (1, 1000, 1)], ids=["D", "B1D", "1L1"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_channel_kernel_broadcast_coeffs(coeffs_shape, reverse):
    """Broadcast coefficients: read in place, their gradient added into a buffer of their shape."""
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2, 1000, 64, generator=g, device="cuda")
    c = torch.empty(coeffs_shape, device="cuda").uniform_(0.9, 1.0, generator=g)
    check_against_cpu_kernel(x, c, None, 1, reverse, torch.float32)


@pytest.mark.parametrize("config", ["0", "1", "2", "3", "4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("shape", [(3000, 1024), (5000, 37), (2500, 3000)], ids=lambda s: "x".join(map(str, s)))
def test_tile_kernel_configs(shape, reverse, dtype, config, monkeypatch):
    """Every tile config in place of the length-chosen one (a block walking several tiles)."""
    monkeypatch.setenv("TORCH_LINREC_CUDA_TILE_CONFIG", config)
    x, c, h0 = _rows(shape[0], shape[1], dtype, seed=zlib.crc32(repr((shape, reverse, str(dtype))).encode()))
    check_against_cpu_kernel(x, c, h0, -1, reverse, dtype)
