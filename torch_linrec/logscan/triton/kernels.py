"""Triton kernels of the log-space scan ``log_h[l] = logaddexp(log_c[l] + log_h[l-1], log_x[l])``.

The structure is the linear scan's forward (torch_linrec/linrec/triton/kernels.py, whose tile
helpers these kernels use): operands as strided ``(outer, L, inner)`` views, a sequence kernel (L
contiguous, ``[BLOCK_N, BLOCK_L]`` tiles scanned along axis 1) and a channel kernel (channels
contiguous, ``[BLOCK_T, BLOCK_D]`` tiles scanned along axis 0), the state carried from tile to tile.

A step is the map ``h -> logaddexp(a + h, b)`` with ``(a, b) = (log_c, log_x)``; composing two
steps gives ``(a1 + a2, logaddexp(b1 + a2, b2))``, the linear scan's ``(a1 a2, b1 a2 + b2)`` in
log space, with identity ``(0, -inf)`` (what masked lanes load). Arithmetic is float32.
"""
import triton
import triton.language as tl

from ...linrec.triton.kernels import _chan_block, _last, _seq_rows, _tile, _walk


@triton.jit
def _logaddexp(a, b):
    """``log(exp(a) + exp(b))``, exact for infinities: ``(-inf, -inf) -> -inf``, never ``inf - inf``."""
    b_hi = tl.maximum(a, b)
    b_lo = tl.minimum(a, b)
    m_eq = b_hi == b_lo  # equal infinities: subtract zeros, not inf - inf
    b_d = tl.where(m_eq, 0., b_lo) - tl.where(m_eq, 0., b_hi)
    return b_hi + tl.log(1. + tl.exp(b_d))


@triton.jit
def _log_combine(a1, b1, a2, b2):
    """Composition of the steps ``h -> logaddexp(a1 + h, b1)`` then ``h -> logaddexp(a2 + h, b2)``."""
    return a1 + a2, _logaddexp(b1 + a2, b2)


@triton.jit
def log_scan_fwd_seq_kernel(
    x, c, h0, y,
    N, L, NI,
    sx_o, sx_l, sx_i, sc_o, sc_l, sc_i, sh_o, sh_i, sy_o, sy_l, sy_i,
    HAS_INIT: tl.constexpr, WALK_BACK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
):
    """Log-space scan, sequence layout; ``WALK_BACK`` is ``reverse``. Grid: ``(cdiv(N, BLOCK_N),)``."""
    i_n = tl.program_id(0)
    i_o, i_i, m_n = _seq_rows(i_n, N, NI, BLOCK_N)
    p_x = x + (i_o * sx_o + i_i * sx_i)[:, None]
    p_c = c + (i_o * sc_o + i_i * sc_i)[:, None]
    p_y = y + (i_o * sy_o + i_i * sy_i)[:, None]
    if HAS_INIT:
        b_h = tl.load(h0 + i_o * sh_o + i_i * sh_i, mask=m_n, other=float("-inf")).to(tl.float32)
    else:
        b_h = tl.full([BLOCK_N], float("-inf"), tl.float32)
    n_t = (L + BLOCK_L - 1) // BLOCK_L
    for i_t in range(0, n_t):
        o_l = _tile(i_t, n_t, BLOCK_L, WALK_BACK)[None, :]
        m = m_n[:, None] & (o_l < L)
        b_c = tl.load(p_c + o_l * sc_l, mask=m, other=0.).to(tl.float32)
        b_x = tl.load(p_x + o_l * sx_l, mask=m, other=float("-inf")).to(tl.float32)
        b_a, b_b = tl.associative_scan((b_c, b_x), axis=1, combine_fn=_log_combine, reverse=WALK_BACK)
        b_y = _logaddexp(b_a + b_h[:, None], b_b)
        tl.store(p_y + o_l * sy_l, b_y.to(y.dtype.element_ty), mask=m)
        b_h = _last(b_y, 1, BLOCK_L, WALK_BACK)


@triton.jit
def log_scan_fwd_chan_kernel(
    x, c, h0, y,
    NO, L, NI,
    sx_o, sx_l, sx_i, sc_o, sc_l, sc_i, sh_o, sh_i, sy_o, sy_l, sy_i,
    HAS_INIT: tl.constexpr, WALK_BACK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Log-space scan, channel layout; ``WALK_BACK`` is ``reverse``. Grid: ``(NO * cdiv(NI, BLOCK_D),)``."""
    i_p = tl.program_id(0)
    i_o, o_d, m_d = _chan_block(i_p, NI, BLOCK_D)
    p_x = x + (i_o * sx_o + o_d * sx_i)[None, :]
    p_c = c + (i_o * sc_o + o_d * sc_i)[None, :]
    p_y = y + (i_o * sy_o + o_d * sy_i)[None, :]
    if HAS_INIT:
        b_h = tl.load(h0 + i_o * sh_o + o_d * sh_i, mask=m_d, other=float("-inf")).to(tl.float32)
    else:
        b_h = tl.full([BLOCK_D], float("-inf"), tl.float32)
    n_t = (L + BLOCK_T - 1) // BLOCK_T
    for i_t in range(0, n_t):
        o_l = _walk(i_t, n_t, BLOCK_T, WALK_BACK)[:, None]
        m = (o_l < L) & m_d[None, :]
        b_c = tl.load(p_c + o_l * sc_l, mask=m, other=0.).to(tl.float32)
        b_x = tl.load(p_x + o_l * sx_l, mask=m, other=float("-inf")).to(tl.float32)
        b_a, b_b = tl.associative_scan((b_c, b_x), axis=0, combine_fn=_log_combine)
        b_y = _logaddexp(b_a + b_h[None, :], b_b)
        tl.store(p_y + o_l * sy_l, b_y.to(y.dtype.element_ty), mask=m)
        b_h = _last(b_y, 0, BLOCK_T, False)
