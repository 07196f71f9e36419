"""CUDA-only checks of each launch plan of csrc/cuda/scan_plan.h against the CPU kernel: the stream
kernel (bulk copies, look-back across persistent blocks) under every config and at the edges of its
tiles and halos, the tile kernel's grid-stride loop over many sequences, and the register-held
look-back fallback. Skipped without a GPU and the CUDA kernels."""
from __future__ import annotations

import zlib

import pytest
import torch

from conftest import HAS_CUDA
from samples import assert_close_scaled, poison_allocator

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and torch_linrec's CUDA kernels")]

scan_op = torch.ops.linrec.scan
scan_backward_op = torch.ops.linrec.scan_backward

# Stream tiles are 4096 float32 / 8192 16-bit steps in config 0, half that in config 1; the halo is
# one 16-byte vector (4 or 8 steps). Lengths: whole tiles, a partial last tile, a last tile shorter
# than the halo (the backward reads y after the tile from global memory), one step past a tile.
_T = 8192
_LENGTHS = [4 * _T, 3 * _T + 8, 3 * _T + 2, 2 * _T + 1, 5 * _T + 4100]


def _rows(n, length, dtype, seed, width=None):
    """(n, length) rows of a (n, width) buffer: aligned rows of any length (width rounded up to 8)."""
    width = width or (length + 7) // 8 * 8
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, width, generator=g, device="cuda").to(dtype)[:, :length]
    c = torch.empty(n, width, device="cuda").uniform_(0.9, 1.0, generator=g).to(dtype)[:, :length]
    h0 = torch.randn(n, generator=g, device="cuda").to(dtype)
    return x, c, h0


def _check_against_cpu(x, c, h0, dim, reverse, dtype):
    poison_allocator(x, copies=6)
    y = scan_op(x, c, h0, dim, reverse)
    assert bool(torch.isfinite(y).all()), "forward left elements unwritten (NaN)"
    gy = torch.randn_like(y)
    poison_allocator(x, copies=6)
    grads = scan_backward_op(gy, c, y, h0, dim, reverse)
    y_cpu = scan_op(x.cpu(), c.cpu(), None if h0 is None else h0.cpu(), dim, reverse)
    assert_close_scaled(y, y_cpu, dtype, "forward vs CPU kernel")
    grads_cpu = scan_backward_op(gy.cpu(), c.cpu(), y.cpu(), None if h0 is None else h0.cpu(), dim, reverse)
    for what, g, gc in zip(("grad_x", "grad_coeffs", "grad_initial"), grads, grads_cpu):
        assert bool(torch.isfinite(g).all()), f"{what} left elements unwritten (NaN)"
        assert_close_scaled(g, gc, dtype, f"{what} vs CPU kernel")


@pytest.mark.parametrize("config", ["0", "1", "2", "3", "off"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("length", _LENGTHS)
def test_stream_kernel_configs(length, reverse, dtype, config, monkeypatch):
    """Few long aligned rows take the stream kernel (or, with "off", the register-held look-back).
    A scan walking backwards in memory (reverse forward, or the backward of a forward scan) streams
    only when the row length is a multiple of the 16-byte vector; else it takes the fallback."""
    monkeypatch.setenv("TORCH_LINREC_CUDA_STREAM_CONFIG", config)
    x, c, h0 = _rows(3, length, dtype, seed=zlib.crc32(repr((length, reverse, str(dtype))).encode()))
    _check_against_cpu(x, c, h0, -1, reverse, dtype)


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_stream_kernel_broadcast_and_batch_dims(reverse):
    """Coefficients shared by all rows (batch stride 0), two batch dims, no initial state."""
    L = 3 * _T
    g = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(2, 3, L, generator=g, device="cuda")
    c = torch.empty(L, device="cuda").uniform_(0.9, 1.0, generator=g)
    _check_against_cpu(x, c, None, -1, reverse, torch.float32)
    h0 = torch.randn(3, generator=g, device="cuda")  # broadcast initial state
    _check_against_cpu(x, c, h0, -1, reverse, torch.float32)


def test_stream_kernel_long_look_back():
    """One long sequence: every tile's predecessors are on other blocks, look-back spans many tiles."""
    x, c, h0 = _rows(1, 2 ** 22 + 12, torch.float32, seed=5)
    _check_against_cpu(x, c, h0, -1, False, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_tile_kernel_grid_stride_many_sequences(dtype):
    """More sequences than resident blocks: each block walks several, odd length (scalar tail)."""
    x, c, h0 = _rows(300_001, 37, dtype, seed=7, width=37)
    _check_against_cpu(x, c, h0, -1, False, dtype)
