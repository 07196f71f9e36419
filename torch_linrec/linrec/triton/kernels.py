"""Triton kernels of the linear recurrence ``y[l] = c[l] * y[l-1] + x[l]`` and its backward.

Every tensor is addressed as a strided 3-D view ``(outer, L, inner)`` (batch-shaped tensors as
``(outer, inner)``), with one element stride per axis passed as an integer (any value: 0 for
broadcast operands; indices are widened to int64 before they are multiplied, so offsets never
overflow). ``N = outer * inner`` independent sequences.

Two layouts:

* ``*_seq_kernel`` ("sequence"): L is the contiguous axis, e.g. ``(N, L)`` with ``dim=-1``. A
  program owns ``BLOCK_N`` sequences and walks L in ``[BLOCK_N, BLOCK_L]`` tiles; each tile is
  scanned with ``tl.associative_scan`` along axis 1 and the state carried to the next tile.
* ``*_chan_kernel`` ("channel"): the inner batch axis is contiguous, e.g. ``(B, L, D)`` with
  ``dim=1``. A program owns ``BLOCK_D`` consecutive channels of one outer index and walks L
  sequentially in ``[BLOCK_T, BLOCK_D]`` tiles (rows coalesced across channels), scanned along
  axis 0 with the state vector carried from tile to tile.

A scan over pairs ``(a, b)`` with ``(a1, b1) . (a2, b2) = (a1 a2, b1 a2 + b2)`` turns a tile into
``y = A * h + B`` for the state ``h`` entering it; masked lanes load the identity ``(1, 0)``, so
the last lane the walk visits holds the state leaving the tile. Tiles are aligned to multiples of
the block along L, and ``WALK_BACK`` (a reverse scan, or the backward of a forward one) visits
them from the last to the first, by index arithmetic (no flipped copies). Within a tile, the
sequence kernels keep addresses ascending (vector loads along L) and scan with ``reverse=True``;
the channel kernels, whose rows are contiguous anyway, put the rows in walk order and scan
forward (on an H100 a reverse scan along axis 0 was up to 1.7x slower; reversed addresses
along L were up to 8x slower for short rows). Arithmetic is float32; stores cast to the element
type of the output pointer.

Backward (``*_bwd_*``) walks against the forward scan. With ``u`` the walk step and ``l(u)`` its
position::

    g_u = c[l(u-1)] * g_{u-1} + dy[l(u)]   (g_{-1} = 0)
    dx[l(u)] = g_u,  dc[l(u)] = g_u * y[l(u+1)]   (y past the end of the walk = initial, or 0)
    d_initial = c[l(L-1)] * g_{L-1}

which is ``linrec::scan_backward`` (torch_linrec/reference.py: scan_backward_ref).

The kernels use only ``triton.language`` builtins and this module's own jit functions (no
``tl.sum``/``tl.zeros``/``tl.cdiv``, which triton.language defines as jit functions): that way
torch_linrec.triton.ops can re-decorate them for ``TRITON_INTERPRET=1`` after triton was imported
without it (triton reads the flag when it decorates).
"""
import triton
import triton.language as tl


@triton.jit
def _combine(a1, b1, a2, b2):
    """Composition of the affine maps ``h -> a1 h + b1`` then ``h -> a2 h + b2``."""
    return a1 * a2, b1 * a2 + b2


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _tile(i_t, n_t, BLOCK: tl.constexpr, WALK_BACK: tl.constexpr):
    """int64 positions along L, ascending, of the tile the walk visits at step ``i_t`` of ``n_t``."""
    if WALK_BACK:
        i_t = n_t - 1 - i_t
    return tl.cast(i_t, tl.int64) * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def _walk(i_t, n_t, BLOCK: tl.constexpr, WALK_BACK: tl.constexpr):
    """int64 positions along L of the tile the walk visits at step ``i_t`` of ``n_t``, in walk order."""
    o_l = tl.cast(i_t, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if WALK_BACK:
        o_l = n_t * BLOCK - 1 - o_l
    return o_l


@triton.jit
def _last(b, AXIS: tl.constexpr, BLOCK: tl.constexpr, FIRST: tl.constexpr):
    """The slice of tile ``b`` at index 0 (``FIRST``) or ``BLOCK - 1`` along ``AXIS``."""
    if FIRST:
        o_sel = tl.arange(0, BLOCK) == 0
    else:
        o_sel = tl.arange(0, BLOCK) == BLOCK - 1
    if AXIS == 0:
        o_sel = o_sel[:, None]
    else:
        o_sel = o_sel[None, :]
    return tl.reduce(tl.where(o_sel, b, 0.), AXIS, _add)


@triton.jit
def _seq_rows(i_n, N, NI, BLOCK_N: tl.constexpr):
    """Sequence layout: the BLOCK_N rows of program ``i_n`` among N = outer x NI rows, as
    ``(outer index, inner index, mask)``."""
    o_n = i_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    return o_n // NI, o_n % NI, o_n < N


@triton.jit
def _chan_block(i_p, NI, BLOCK_D: tl.constexpr):
    """Channel layout: program ``i_p``'s outer index and its BLOCK_D channels of NI, as
    ``(outer index, channel offsets, mask)``."""
    n_db = (NI + BLOCK_D - 1) // BLOCK_D
    o_d = (i_p % n_db).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    return (i_p // n_db).to(tl.int64), o_d, o_d < NI


@triton.jit
def linrec_fwd_seq_kernel(
    x, c, h0, y,
    N, L, NI,
    sx_o, sx_l, sx_i, sc_o, sc_l, sc_i, sh_o, sh_i, sy_o, sy_l, sy_i,
    HAS_INIT: tl.constexpr, WALK_BACK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
):
    """Forward scan, sequence layout; ``WALK_BACK`` is ``reverse``. Grid: ``(cdiv(N, BLOCK_N),)``."""
    i_n = tl.program_id(0)
    i_o, i_i, m_n = _seq_rows(i_n, N, NI, BLOCK_N)
    p_x = x + (i_o * sx_o + i_i * sx_i)[:, None]
    p_c = c + (i_o * sc_o + i_i * sc_i)[:, None]
    p_y = y + (i_o * sy_o + i_i * sy_i)[:, None]
    if HAS_INIT:
        b_h = tl.load(h0 + i_o * sh_o + i_i * sh_i, mask=m_n, other=0.).to(tl.float32)
    else:
        b_h = tl.full([BLOCK_N], 0., tl.float32)
    n_t = (L - 1) // BLOCK_L + 1  # (L >= 1; no overflow near 2^31)
    for i_t in range(0, n_t):
        o_l = _tile(i_t, n_t, BLOCK_L, WALK_BACK)[None, :]
        m = m_n[:, None] & (o_l < L)
        b_c = tl.load(p_c + o_l * sc_l, mask=m, other=1.).to(tl.float32)
        b_x = tl.load(p_x + o_l * sx_l, mask=m, other=0.).to(tl.float32)
        b_a, b_b = tl.associative_scan((b_c, b_x), axis=1, combine_fn=_combine, reverse=WALK_BACK)
        b_y = b_a * b_h[:, None] + b_b
        tl.store(p_y + o_l * sy_l, b_y.to(y.dtype.element_ty), mask=m)
        b_h = _last(b_y, 1, BLOCK_L, WALK_BACK)


@triton.jit
def linrec_fwd_chan_kernel(
    x, c, h0, y,
    NO, L, NI,
    sx_o, sx_l, sx_i, sc_o, sc_l, sc_i, sh_o, sh_i, sy_o, sy_l, sy_i,
    HAS_INIT: tl.constexpr, WALK_BACK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Forward scan, channel layout; ``WALK_BACK`` is ``reverse``. Grid: ``(NO * cdiv(NI, BLOCK_D),)``."""
    i_p = tl.program_id(0)
    i_o, o_d, m_d = _chan_block(i_p, NI, BLOCK_D)
    p_x = x + (i_o * sx_o + o_d * sx_i)[None, :]
    p_c = c + (i_o * sc_o + o_d * sc_i)[None, :]
    p_y = y + (i_o * sy_o + o_d * sy_i)[None, :]
    if HAS_INIT:
        b_h = tl.load(h0 + i_o * sh_o + o_d * sh_i, mask=m_d, other=0.).to(tl.float32)
    else:
        b_h = tl.full([BLOCK_D], 0., tl.float32)
    n_t = (L - 1) // BLOCK_T + 1  # (L >= 1; no overflow near 2^31)
    for i_t in range(0, n_t):
        o_l = _walk(i_t, n_t, BLOCK_T, WALK_BACK)[:, None]
        m = (o_l < L) & m_d[None, :]
        b_c = tl.load(p_c + o_l * sc_l, mask=m, other=1.).to(tl.float32)
        b_x = tl.load(p_x + o_l * sx_l, mask=m, other=0.).to(tl.float32)
        b_a, b_b = tl.associative_scan((b_c, b_x), axis=0, combine_fn=_combine)
        b_y = b_a * b_h[None, :] + b_b
        tl.store(p_y + o_l * sy_l, b_y.to(y.dtype.element_ty), mask=m)
        b_h = _last(b_y, 0, BLOCK_T, False)


@triton.jit
def _bwd_scan(p_dy, p_c, p_y, b_h0, o_l, m, L, sdy_l, sc_l, sy_l, AXIS: tl.constexpr, HAS_INIT: tl.constexpr,
              WALK_BACK: tl.constexpr, REV_SCAN: tl.constexpr):
    """One backward tile's loads and scan at positions ``o_l`` (mask ``m``): ``(A, B, y after each
    step)``, with ``dx = A * carry + B`` for the carry entering the tile.

    ``REV_SCAN``: the positions ascend against the walk (sequence layout), so scan in reverse.
    """
    if WALK_BACK:
        o_prev, o_next = o_l + 1, o_l - 1
    else:
        o_prev, o_next = o_l - 1, o_l + 1
    m_next = (o_next >= 0) & (o_next < L)
    b_a = tl.load(p_c + o_prev * sc_l, mask=m & (o_prev >= 0) & (o_prev < L), other=1.).to(tl.float32)
    b_b = tl.load(p_dy + o_l * sdy_l, mask=m, other=0.).to(tl.float32)
    b_yn = tl.load(p_y + o_next * sy_l, mask=m & m_next, other=0.).to(tl.float32)
    if HAS_INIT:
        b_yn = tl.where(m_next, b_yn, b_h0)
    b_a, b_b = tl.associative_scan((b_a, b_b), axis=AXIS, combine_fn=_combine, reverse=REV_SCAN)
    return b_a, b_b, b_yn


@triton.jit
def _bwd_tile(p_dy, p_c, p_y, p_dx, p_dc, b_h0, b_g, o_l, m, L, sdy_l, sc_l, sy_l, sdx_l, sdc_l,
              AXIS: tl.constexpr, BLOCK: tl.constexpr, HAS_INIT: tl.constexpr, WALK_BACK: tl.constexpr,
              REV_SCAN: tl.constexpr):
    """One backward tile at positions ``o_l`` (mask ``m``): stores dx and dc, returns the new carry."""
    b_a, b_b, b_yn = _bwd_scan(p_dy, p_c, p_y, b_h0, o_l, m, L, sdy_l, sc_l, sy_l, AXIS, HAS_INIT, WALK_BACK,
                               REV_SCAN)
    if AXIS == 0:
        b_dx = b_a * b_g[None, :] + b_b
    else:
        b_dx = b_a * b_g[:, None] + b_b
    tl.store(p_dx + o_l * sdx_l, b_dx.to(p_dx.dtype.element_ty), mask=m)
    tl.store(p_dc + o_l * sdc_l, (b_dx * b_yn).to(p_dc.dtype.element_ty), mask=m)
    return _last(b_dx, AXIS, BLOCK, REV_SCAN)


@triton.jit
def linrec_bwd_seq_kernel(
    dy, c, y, h0, dx, dc, dh0,
    N, L, NI,
    sdy_o, sdy_l, sdy_i, sc_o, sc_l, sc_i, sy_o, sy_l, sy_i, sh_o, sh_i,
    sdx_o, sdx_l, sdx_i, sdc_o, sdc_l, sdc_i, sdh_o, sdh_i,
    HAS_INIT: tl.constexpr, WALK_BACK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
):
    """Fused backward, sequence layout: ``dx``, full-size ``dc`` and ``dh0`` in one pass.

    ``WALK_BACK`` is ``not reverse`` (the walk runs against the forward scan); grid as forward.
    """
    i_n = tl.program_id(0)
    i_o, i_i, m_n = _seq_rows(i_n, N, NI, BLOCK_N)
    p_dy = dy + (i_o * sdy_o + i_i * sdy_i)[:, None]
    p_c = c + (i_o * sc_o + i_i * sc_i)[:, None]
    p_y = y + (i_o * sy_o + i_i * sy_i)[:, None]
    p_dx = dx + (i_o * sdx_o + i_i * sdx_i)[:, None]
    p_dc = dc + (i_o * sdc_o + i_i * sdc_i)[:, None]
    b_h0 = tl.full([BLOCK_N, 1], 0., tl.float32)
    if HAS_INIT:
        b_h0 = tl.load(h0 + i_o * sh_o + i_i * sh_i, mask=m_n, other=0.).to(tl.float32)[:, None]
    b_g = tl.full([BLOCK_N], 0., tl.float32)
    n_t = (L - 1) // BLOCK_L + 1  # (L >= 1; no overflow near 2^31)
    for i_t in range(0, n_t):
        o_l = _tile(i_t, n_t, BLOCK_L, WALK_BACK)[None, :]
        b_g = _bwd_tile(p_dy, p_c, p_y, p_dx, p_dc, b_h0, b_g, o_l, m_n[:, None] & (o_l < L), L,
                        sdy_l, sc_l, sy_l, sdx_l, sdc_l, 1, BLOCK_L, HAS_INIT, WALK_BACK, WALK_BACK)
    if WALK_BACK:
        o_first = 0
    else:
        o_first = tl.cast(L - 1, tl.int64)
    b_c0 = tl.load(c + i_o * sc_o + i_i * sc_i + o_first * sc_l, mask=m_n, other=0.).to(tl.float32)
    tl.store(dh0 + i_o * sdh_o + i_i * sdh_i, (b_c0 * b_g).to(dh0.dtype.element_ty), mask=m_n)


@triton.jit
def linrec_bwd_chan_kernel(
    dy, c, y, h0, dx, dc, dh0,
    NO, L, NI,
    sdy_o, sdy_l, sdy_i, sc_o, sc_l, sc_i, sy_o, sy_l, sy_i, sh_o, sh_i,
    sdx_o, sdx_l, sdx_i, sdc_o, sdc_l, sdc_i, sdh_o, sdh_i,
    HAS_INIT: tl.constexpr, WALK_BACK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Fused backward, channel layout: ``dx``, full-size ``dc`` and ``dh0`` in one pass.

    ``WALK_BACK`` is ``not reverse`` (the walk runs against the forward scan); grid as forward.
    """
    i_p = tl.program_id(0)
    i_o, o_d, m_d = _chan_block(i_p, NI, BLOCK_D)
    p_dy = dy + (i_o * sdy_o + o_d * sdy_i)[None, :]
    p_c = c + (i_o * sc_o + o_d * sc_i)[None, :]
    p_y = y + (i_o * sy_o + o_d * sy_i)[None, :]
    p_dx = dx + (i_o * sdx_o + o_d * sdx_i)[None, :]
    p_dc = dc + (i_o * sdc_o + o_d * sdc_i)[None, :]
    b_h0 = tl.full([1, BLOCK_D], 0., tl.float32)
    if HAS_INIT:
        b_h0 = tl.load(h0 + i_o * sh_o + o_d * sh_i, mask=m_d, other=0.).to(tl.float32)[None, :]
    b_g = tl.full([BLOCK_D], 0., tl.float32)
    n_t = (L - 1) // BLOCK_T + 1  # (L >= 1; no overflow near 2^31)
    for i_t in range(0, n_t):
        o_l = _walk(i_t, n_t, BLOCK_T, WALK_BACK)[:, None]
        b_g = _bwd_tile(p_dy, p_c, p_y, p_dx, p_dc, b_h0, b_g, o_l, (o_l < L) & m_d[None, :], L,
                        sdy_l, sc_l, sy_l, sdx_l, sdc_l, 0, BLOCK_T, HAS_INIT, WALK_BACK, False)
    if WALK_BACK:
        o_first = 0
    else:
        o_first = tl.cast(L - 1, tl.int64)
    b_c0 = tl.load(c + i_o * sc_o + o_d * sc_i + o_first * sc_l, mask=m_d, other=0.).to(tl.float32)
    tl.store(dh0 + i_o * sdh_o + o_d * sdh_i, (b_c0 * b_g).to(dh0.dtype.element_ty), mask=m_d)


# Few long sequences (sequence layout): one program per tile, the tiles of a sequence chained by a
# decoupled look-back (the CUDA tile kernel's, scan_common.cuh). A program takes its tile from a
# ticket counter in the order programs start, tile-major (every sequence's tile k before any tile
# k + 1), so the predecessors it waits for have started. Status of (tile, sequence) entry e: two
# int64 words ``status[2e], status[2e + 1]``, each a flag in the high half and a float32 in the low
# half: flag 1 in both, the tile's aggregate map ``(a, b)``; flag 2 in the second, the state after
# the tile. A word is read whole, so a flag always comes with its own value (no fences needed).
# The look-back reads up to HOPS predecessors one word at a time (with several sequences the state
# after the predecessor is mostly out), then WINDOW per round trip (one at a time all the way, one
# sequence of 2^26 float32 steps ran at 0.26 of torch.add on the H200; bench/NOTES.md item 87).
_WINDOW = tl.constexpr(32)


@triton.jit
def _last1(b, BLOCK: tl.constexpr, FIRST: tl.constexpr):
    """Element 0 (``FIRST``) or ``BLOCK - 1`` of the 1-D tile ``b``, as a scalar."""
    if FIRST:
        o_sel = tl.arange(0, BLOCK) == 0
    else:
        o_sel = tl.arange(0, BLOCK) == BLOCK - 1
    return tl.reduce(tl.where(o_sel, b, 0.), 0, _add)


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _ticket(counter, N):
    """This program's ``(tile in walk order, sequence)``, tile-major in the order programs start."""
    t = tl.atomic_add(counter, 1)
    return t // N, t % N


@triton.jit
def _word(FLAG: tl.constexpr, v):
    """A status word: ``FLAG`` in the high 32 bits, the float32 ``v``'s bits in the low 32."""
    return (v.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | (FLAG << 32)


@triton.jit
def _waiting(w0, w1):
    """Whether any entry of a window is unpublished (a flag 0, or a second word's flag 1 whose first
    word is not yet seen), as an int32 scalar."""
    f0, f1 = w0 >> 32, w1 >> 32
    return tl.reduce(((f1 == 0) | ((f1 == 1) & (f0 == 0))).to(tl.int32), 0, _max)


@triton.jit
def _poll(p):
    """The status word at ``p`` once its flag is set (its tile has started, so it will be)."""
    w = tl.load(p, volatile=True)
    while (w >> 32) == 0:
        w = tl.load(p, volatile=True)
    return w


@triton.jit
def _poll_window(p_w, m):
    """The status words ``(first, second)`` of a window's entries once every entry is published
    (masked entries read as a state 0)."""
    v0 = tl.load(p_w, mask=m, other=0, volatile=True)
    v1 = tl.load(p_w + 1, mask=m, other=2 << 32, volatile=True)
    while _waiting(v0, v1) > 0:
        v0 = tl.load(p_w, mask=m, other=0, volatile=True)
        v1 = tl.load(p_w + 1, mask=m, other=2 << 32, volatile=True)
    return v0, v1


@triton.jit
def _value(w):
    """The float32 in the low half of status words ``w``."""
    return (w & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _chain(status, i_t, i_n, N, a_t, b_t, h_first, HOPS: tl.constexpr):
    """The state entering tile ``i_t`` of sequence ``i_n`` (``h_first`` for the first), given the
    tile's own map ``h -> a_t h + b_t``; publishes the tile's aggregate, then its state after.
    ``HOPS``: predecessors read one at a time before the window. Words are published by relaxed
    atomic exchanges (plain stores against the volatile polls would be a data race under the PTX
    memory model); each carries its flag, so readers need no order between the two. Every thread
    polls for itself, so warps may enter with states that differ by rounding (agreeing through a
    block reduction cost more than it is worth: bench/NOTES.md item 88)."""
    e = i_t * N + i_n
    h = h_first
    if i_t > 0:
        tl.atomic_xchg(status + 2 * e, _word(1, a_t), sem="relaxed")
        tl.atomic_xchg(status + 2 * e + 1, _word(1, b_t), sem="relaxed")
        # state entering the tile = p * (state after tile k) + q, composed from the tile's
        # predecessors (not from its own values: a non-finite coefficient must not reach the steps
        # before it): first one word per predecessor, up to HOPS of them (with several sequences
        # the state after the predecessor is mostly known), then WINDOW per round trip
        p = tl.full([], 1., tl.float32)
        q = tl.full([], 0., tl.float32)
        k = e - N
        hops = 0
        done = 0
        while (done == 0) & (hops < HOPS):
            w1 = _poll(status + 2 * k + 1)
            q = p * _value(w1) + q  # tile k's state after (flag 2), else its aggregate's b
            if (w1 >> 32) == 2:
                done = 1
            else:
                p = p * _value(_poll(status + 2 * k))
                k -= N
                hops += 1
        if done == 0:
            o_w = tl.arange(0, _WINDOW)
            hi = i_t - 1 - hops  # the window's last (most recent) tile
            while done == 0:
                j = hi - (_WINDOW - 1) + o_w  # ascending tiles (before the first: masked)
                m = j >= 0
                v0, v1 = _poll_window(status + 2 * (j * N + i_n), m)
                # the latest tile whose state after is known: that state, then the aggregates after it
                top = tl.reduce(tl.where((v1 >> 32) == 2, o_w, -1), 0, _max)
                b_a = tl.where(o_w > top, _value(v0), tl.where(o_w == top, 0., 1.))
                b_b = tl.where(o_w >= top, _value(v1), 0.)
                b_a, b_b = tl.associative_scan((b_a, b_b), axis=0, combine_fn=_combine)
                q = p * _last1(b_b, _WINDOW, False) + q
                p = p * _last1(b_a, _WINDOW, False)
                if top >= 0:
                    done = 1
                hi -= _WINDOW
        h = q
    tl.atomic_xchg(status + 2 * e + 1, _word(2, a_t * h + b_t), sem="relaxed")
    return h


@triton.jit
def linrec_fwd_seq_lb_kernel(
    x, c, h0, y, status, counter,
    N, L, NI,
    sx_o, sx_l, sx_i, sc_o, sc_l, sc_i, sh_o, sh_i, sy_o, sy_l, sy_i,
    HAS_INIT: tl.constexpr, WALK_BACK: tl.constexpr, BLOCK_L: tl.constexpr, HOPS: tl.constexpr,
):
    """Forward scan, sequence layout, one tile per program chained by look-back.

    Grid: ``(N * cdiv(L, BLOCK_L),)``; ``status`` and ``counter`` zeroed.
    """
    i_t, i_n = _ticket(counter, N)
    i_o, i_i = i_n // NI, i_n % NI
    n_t = (L - 1) // BLOCK_L + 1  # (L >= 1; no overflow near 2^31)
    o_l = _tile(i_t, n_t, BLOCK_L, WALK_BACK)
    m = o_l < L
    b_c = tl.load(c + i_o * sc_o + i_i * sc_i + o_l * sc_l, mask=m, other=1.).to(tl.float32)
    b_x = tl.load(x + i_o * sx_o + i_i * sx_i + o_l * sx_l, mask=m, other=0.).to(tl.float32)
    b_a, b_b = tl.associative_scan((b_c, b_x), axis=0, combine_fn=_combine, reverse=WALK_BACK)
    a_t = _last1(b_a, BLOCK_L, WALK_BACK)
    h_first = tl.full([], 0., tl.float32)
    if HAS_INIT:
        h_first += tl.load(h0 + i_o * sh_o + i_i * sh_i).to(tl.float32)
    b_h = _chain(status, i_t, i_n, N, a_t, _last1(b_b, BLOCK_L, WALK_BACK), h_first, HOPS)
    tl.store(y + i_o * sy_o + i_i * sy_i + o_l * sy_l, (b_a * b_h + b_b).to(y.dtype.element_ty), mask=m)


@triton.jit
def linrec_bwd_seq_lb_kernel(
    dy, c, y, h0, dx, dc, dh0, status, counter,
    N, L, NI,
    sdy_o, sdy_l, sdy_i, sc_o, sc_l, sc_i, sy_o, sy_l, sy_i, sh_o, sh_i,
    sdx_o, sdx_l, sdx_i, sdc_o, sdc_l, sdc_i, sdh_o, sdh_i,
    HAS_INIT: tl.constexpr, WALK_BACK: tl.constexpr, BLOCK_L: tl.constexpr, HOPS: tl.constexpr,
):
    """Fused backward, sequence layout, one tile per program chained by look-back (``WALK_BACK`` is
    ``not reverse``); grid and workspace as the forward's."""
    i_t, i_n = _ticket(counter, N)
    i_o, i_i = i_n // NI, i_n % NI
    n_t = (L - 1) // BLOCK_L + 1  # (L >= 1; no overflow near 2^31)
    o_l = _tile(i_t, n_t, BLOCK_L, WALK_BACK)
    b_h0 = 0.
    if HAS_INIT:
        b_h0 = tl.load(h0 + i_o * sh_o + i_i * sh_i).to(tl.float32)
    b_a, b_b, b_yn = _bwd_scan(dy + i_o * sdy_o + i_i * sdy_i, c + i_o * sc_o + i_i * sc_i,
                               y + i_o * sy_o + i_i * sy_i, b_h0, o_l, o_l < L, L, sdy_l, sc_l, sy_l, 0, HAS_INIT,
                               WALK_BACK, WALK_BACK)
    a_t = _last1(b_a, BLOCK_L, WALK_BACK)
    b_g = _chain(status, i_t, i_n, N, a_t, _last1(b_b, BLOCK_L, WALK_BACK), tl.full([], 0., tl.float32), HOPS)
    b_dx = b_a * b_g + b_b
    m = o_l < L
    tl.store(dx + i_o * sdx_o + i_i * sdx_i + o_l * sdx_l, b_dx.to(dx.dtype.element_ty), mask=m)
    tl.store(dc + i_o * sdc_o + i_i * sdc_i + o_l * sdc_l, (b_dx * b_yn).to(dc.dtype.element_ty), mask=m)
    if i_t == n_t - 1:  # the walk's last tile: grad_initial
        if WALK_BACK:
            o_first = 0
        else:
            o_first = tl.cast(L - 1, tl.int64)
        b_c0 = tl.load(c + i_o * sc_o + i_i * sc_i + o_first * sc_l).to(tl.float32)
        tl.store(dh0 + i_o * sdh_o + i_i * sdh_i, (b_c0 * _last1(b_dx, BLOCK_L, WALK_BACK)).to(dh0.dtype.element_ty))
