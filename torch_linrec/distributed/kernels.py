"""Triton kernels of the chunk summary: the affine map ``h -> A h + b`` of a whole chunk of the scan.

For a chunk of the recurrence ``y[l] = c[l] * y[l-1] + x[l]`` the state leaving the chunk is
``A * h + b`` for the state ``h`` entering it, with ``A = prod(c)`` and ``b`` the chunk's last
output from a zero state. It is a reduction of the pairs ``(c[l], x[l])`` under the (associative,
non-commutative) composition of affine maps, so it reads x and c once and writes one state per
sequence: the first pass of the context-parallel scan (torch_linrec/distributed/ops.py).

``SCALE_X`` reduces the pairs ``(c[l], c[l] * x[l])`` instead (the map ``h -> c (h + x)``): the
summary of the backward, whose carry enters through ``c`` (``d_initial = c[0] * dx[0]``).
``WALK_BACK`` reduces from the last position to the first (a reverse scan, or the backward of a
forward one).

Layouts and helpers are those of the scan kernels (torch_linrec/linrec/triton/kernels.py): each
operand is a strided ``(outer, L, inner)`` view; ``*_seq_kernel`` walks rows along a contiguous L,
``*_chan_kernel`` walks blocks of contiguous channels. A second grid axis splits L into ``n_seg``
segments of ``SEG`` positions (a multiple of the tile), so that a few long rows still fill the
GPU; each program writes its segment's ``(A, b)`` to ``a``/``b`` at ``[i_seg, row]`` (``s_seg``
apart), and the launcher combines the segments in walk order. Arithmetic is float32 (stores cast to
the element type of the output pointer, float32 or float64).
"""
import triton
import triton.language as tl

from ..linrec.triton.kernels import _chan_block, _combine, _last, _seq_rows, _tile, _walk


@triton.jit
def chunk_summary_seq_kernel(
    x, c, a, b,
    N, L, NI, SEG, s_seg,
    sx_o, sx_l, sx_i, sc_o, sc_l, sc_i, so_o, so_i,
    SCALE_X: tl.constexpr, WALK_BACK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
):
    """Summary, sequence layout. Grid: ``(cdiv(N, BLOCK_N), n_seg)``."""
    i_n = tl.program_id(0)
    i_s = tl.program_id(1).to(tl.int64)
    i_o, i_i, m_n = _seq_rows(i_n, N, NI, BLOCK_N)
    p_x = x + (i_o * sx_o + i_i * sx_i)[:, None]
    p_c = c + (i_o * sc_o + i_i * sc_i)[:, None]
    b_a = tl.full([BLOCK_N], 1., tl.float32)
    b_h = tl.full([BLOCK_N], 0., tl.float32)
    n_t = SEG // BLOCK_L
    for i_t in range(0, n_t):
        o_l = (i_s * SEG + _tile(i_t, n_t, BLOCK_L, WALK_BACK))[None, :]
        m = m_n[:, None] & (o_l < L)
        b_c = tl.load(p_c + o_l * sc_l, mask=m, other=1.).to(tl.float32)
        b_x = tl.load(p_x + o_l * sx_l, mask=m, other=0.).to(tl.float32)
        if SCALE_X:
            b_x = b_x * b_c
        t_a, t_b = tl.associative_scan((b_c, b_x), axis=1, combine_fn=_combine, reverse=WALK_BACK)
        t_a = _last(t_a, 1, BLOCK_L, WALK_BACK)
        b_h = t_a * b_h + _last(t_b, 1, BLOCK_L, WALK_BACK)
        b_a = b_a * t_a
    o_out = i_s * s_seg + i_o * so_o + i_i * so_i
    tl.store(a + o_out, b_a.to(a.dtype.element_ty), mask=m_n)
    tl.store(b + o_out, b_h.to(b.dtype.element_ty), mask=m_n)


@triton.jit
def chunk_summary_chan_kernel(
    x, c, a, b,
    NO, L, NI, SEG, s_seg,
    sx_o, sx_l, sx_i, sc_o, sc_l, sc_i, so_o, so_i,
    SCALE_X: tl.constexpr, WALK_BACK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Summary, channel layout. Grid: ``(NO * cdiv(NI, BLOCK_D), n_seg)``."""
    i_p = tl.program_id(0)
    i_s = tl.program_id(1).to(tl.int64)
    i_o, o_d, m_d = _chan_block(i_p, NI, BLOCK_D)
    p_x = x + (i_o * sx_o + o_d * sx_i)[None, :]
    p_c = c + (i_o * sc_o + o_d * sc_i)[None, :]
    b_a = tl.full([BLOCK_D], 1., tl.float32)
    b_h = tl.full([BLOCK_D], 0., tl.float32)
    n_t = SEG // BLOCK_T
    for i_t in range(0, n_t):
        o_l = (i_s * SEG + _walk(i_t, n_t, BLOCK_T, WALK_BACK))[:, None]
        m = (o_l < L) & m_d[None, :]
        b_c = tl.load(p_c + o_l * sc_l, mask=m, other=1.).to(tl.float32)
        b_x = tl.load(p_x + o_l * sx_l, mask=m, other=0.).to(tl.float32)
        if SCALE_X:
            b_x = b_x * b_c
        t_a, t_b = tl.associative_scan((b_c, b_x), axis=0, combine_fn=_combine)
        t_a = _last(t_a, 0, BLOCK_T, False)
        b_h = t_a * b_h + _last(t_b, 0, BLOCK_T, False)
        b_a = b_a * t_a
    o_out = i_s * s_seg + i_o * so_o + o_d * so_i
    tl.store(a + o_out, b_a.to(a.dtype.element_ty), mask=m_d)
    tl.store(b + o_out, b_h.to(b.dtype.element_ty), mask=m_d)
