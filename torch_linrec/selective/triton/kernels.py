"""Triton kernels of the selective scan (Mamba's selective SSM) and its backward.

A program owns ``BLOCK_D`` channels of one batch element and walks L in chunks of ``CHUNK`` steps,
with the states of its channels, ``(BLOCK_D, BLOCK_N)`` float32, carried from chunk to chunk in
registers. A chunk builds the ``(BLOCK_D, BLOCK_N, CHUNK)`` tiles ``dA = exp2(dt * A log2(e))`` and
``dBu = dt * u * B``, folds the carried state into the first step (``dBu[0] += dA[0] h``) and scans
them along the chunk with ``tl.associative_scan`` over affine maps, ``(a1, b1) . (a2, b2) = (a1 a2,
b1 a2 + b2)``; the contraction with C (a sum over the state axis), D, and the gate ``silu(z)`` follow
in registers. No ``(B, D, L, N)`` tensor is ever written.

Steps past L load ``dt = 0``, so ``dA = 1`` and ``dBu = 0``: the state passes through unchanged and
the last step of a chunk holds the state leaving it.

Backward (``selective_scan_bwd_kernel``), per program from the last chunk to the first, with the
chunk-boundary states written by the forward kernel in checkpoint mode (``STORE_CKPT``):

* the chunk's states ``h`` are rescanned from its checkpoint;
* ``gh[l] = dLoss/dh[l]`` is a reverse scan, ``gh[l] = C[l] gy[l] + dA[l+1] gh[l+1]``, with
  ``dA[l+1]`` built from ``dt`` loaded one step ahead (no shift within registers), and the
  gradient carried in from the next chunk folded into the chunk's last step;
* ``dA[l] h[l-1] = h[l] - dBu[l]``, so the gradients through ``dA`` need no shifted states:
  ``ddt += sum_n gh A (h - dBu)`` and ``dA_param += sum_l gh dt (h - dBu)``; and
  ``d initial_state = dA[0] gh[0]``.

Gradients summed over channels (input-dependent B and C) are added with ``tl.atomic_add`` into
float32 buffers, one ``(CHUNK, BLOCK_N)`` tile per chunk and program; those summed over the batch
and L (A, D, delta_bias, time-invariant B and C) are accumulated in registers and added once.
"""
import triton
import triton.language as tl

@triton.jit
def _combine(a1, b1, a2, b2):
    """Composition of the affine maps ``h -> a1 h + b1`` then ``h -> a2 h + b2``."""
    return a1 * a2, b1 * a2 + b2


@triton.jit
def _dt(delta_ptrs, mask, bias, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """``(dt, raw)``: softplus(delta + bias) (as asked) and its argument; 0 where masked."""
    raw = tl.load(delta_ptrs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        raw = raw + bias[:, None]
    dt = raw
    if SOFTPLUS:
        dt = tl.where(raw <= 20.0, tl.log(1.0 + tl.exp(raw)), raw)
    return tl.where(mask, dt, 0.0), raw


@triton.jit
def selective_scan_fwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, h0_ptr, out_ptr, last_ptr, ckpt_ptr,
    dim, length, nstate, dpg_B, dpg_C, n_chunks,
    s_ub, s_ud, s_ul, s_db, s_dd, s_dl, s_zb, s_zd, s_zl, s_ob, s_od, s_ol,
    s_Bb, s_Bg, s_Bn, s_Bl, s_Cb, s_Cg, s_Cn, s_Cl, s_hb, s_hd, s_hn,
    B_VAR: tl.constexpr, C_VAR: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_H0: tl.constexpr, STORE_OUT: tl.constexpr,
    STORE_CKPT: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
):
    pid_d = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    o_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    o_n = tl.arange(0, BLOCK_N)
    o_c = tl.arange(0, CHUNK)
    m_d = o_d < dim
    m_dn = m_d[:, None] & (o_n[None, :] < nstate)
    o_d64 = o_d.to(tl.int64)
    b_A = tl.load(A_ptr + o_d64[:, None] * nstate + o_n[None, :], mask=m_dn, other=0.0) * 1.4426950408889634
    b_bias = tl.load(bias_ptr + o_d, mask=m_d, other=0.0) if HAS_BIAS else tl.zeros([BLOCK_D], tl.float32)
    if HAS_H0:
        b_h = tl.load(h0_ptr + i_b * s_hb + o_d64[:, None] * s_hd + o_n[None, :] * s_hn, mask=m_dn, other=0.0)
    else:
        b_h = tl.zeros([BLOCK_D, BLOCK_N], tl.float32)
    i_gB = (pid_d * BLOCK_D // dpg_B).to(tl.int64)  # the groups of the whole block (BLOCK_D divides
    i_gC = (pid_d * BLOCK_D // dpg_C).to(tl.int64)  # the channels per group of B and of C)
    if not B_VAR:
        b_Bt = tl.load(B_ptr + o_d64[:, None] * s_Bg + o_n[None, :] * s_Bn, mask=m_dn, other=0.0).to(tl.float32)
    if not C_VAR:
        b_Ct = tl.load(C_ptr + o_d64[:, None] * s_Cg + o_n[None, :] * s_Cn, mask=m_dn, other=0.0).to(tl.float32)
    if HAS_D:
        b_D = tl.load(D_ptr + o_d, mask=m_d, other=0.0)
    first = (o_c == 0)[None, None, :]
    last = (o_c == CHUNK - 1)[None, None, :]
    for i_c in range(n_chunks):
        if STORE_CKPT:
            p_ck = ckpt_ptr + ((i_b * n_chunks + i_c) * dim + o_d64[:, None]) * BLOCK_N + o_n[None, :]
            tl.store(p_ck, b_h, mask=m_d[:, None])
        o_l = (i_c * CHUNK + o_c).to(tl.int64)
        m_dl = m_d[:, None] & (o_l[None, :] < length)
        b_u = tl.load(u_ptr + i_b * s_ub + o_d64[:, None] * s_ud + o_l[None, :] * s_ul, mask=m_dl, other=0.0)
        b_u = b_u.to(tl.float32)
        b_dt, _ = _dt(delta_ptr + i_b * s_db + o_d64[:, None] * s_dd + o_l[None, :] * s_dl, m_dl, b_bias,
                      HAS_BIAS, SOFTPLUS)
        b_dA = tl.exp2(b_dt[:, None, :] * b_A[:, :, None])
        if B_VAR:
            m_nl = (o_n[:, None] < nstate) & (o_l[None, :] < length)
            b_B = tl.load(B_ptr + i_b * s_Bb + i_gB * s_Bg + o_n[:, None] * s_Bn + o_l[None, :] * s_Bl,
                          mask=m_nl, other=0.0).to(tl.float32)
            b_dBu = (b_dt * b_u)[:, None, :] * b_B[None, :, :]
        else:
            b_dBu = (b_dt * b_u)[:, None, :] * b_Bt[:, :, None]
        b_dBu = b_dBu + tl.where(first, b_dA * b_h[:, :, None], 0.0)
        _, b_hs = tl.associative_scan((b_dA, b_dBu), axis=2, combine_fn=_combine)
        b_h = tl.sum(tl.where(last, b_hs, 0.0), axis=2)
        if STORE_OUT:
            if C_VAR:
                m_nl = (o_n[:, None] < nstate) & (o_l[None, :] < length)
                b_C = tl.load(C_ptr + i_b * s_Cb + i_gC * s_Cg + o_n[:, None] * s_Cn + o_l[None, :] * s_Cl,
                              mask=m_nl, other=0.0).to(tl.float32)
                b_y = tl.sum(b_hs * b_C[None, :, :], axis=1)
            else:
                b_y = tl.sum(b_hs * b_Ct[:, :, None], axis=1)
            if HAS_D:
                b_y += b_D[:, None] * b_u
            if HAS_Z:
                b_z = tl.load(z_ptr + i_b * s_zb + o_d64[:, None] * s_zd + o_l[None, :] * s_zl, mask=m_dl,
                              other=0.0).to(tl.float32)
                b_y = b_y * b_z * tl.sigmoid(b_z)
            p_out = out_ptr + i_b * s_ob + o_d64[:, None] * s_od + o_l[None, :] * s_ol
            tl.store(p_out, b_y.to(out_ptr.dtype.element_ty), mask=m_dl)
    p_last = last_ptr + (i_b * dim + o_d64[:, None]) * nstate + o_n[None, :]
    tl.store(p_last, b_h, mask=m_dn)


@triton.jit
def selective_scan_bwd_kernel(
    g_ptr, glast_ptr, u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, ckpt_ptr,
    du_ptr, ddelta_ptr, dz_ptr, dA_ptr, dB_ptr, dC_ptr, dD_ptr, dbias_ptr, dh0_ptr,
    dim, length, nstate, dpg_B, dpg_C, n_chunks,
    s_gb, s_gd, s_gl, s_ub, s_ud, s_ul, s_db, s_dd, s_dl, s_zb, s_zd, s_zl,
    s_Bb, s_Bg, s_Bn, s_Bl, s_Cb, s_Cg, s_Cn, s_Cl,
    s_dBb, s_dBg, s_dBn, s_dBl, s_dCb, s_dCg, s_dCn, s_dCl,
    B_VAR: tl.constexpr, C_VAR: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_GLAST: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
):
    """Gradients of one program's channels; du, ddelta, dz stored in the input dtype, dh0 (B, D, N)
    float32 stored, the other gradients added into float32 buffers (dB, dC with their strides:
    0 on the axes they are summed over)."""
    pid_d = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    o_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    o_n = tl.arange(0, BLOCK_N)
    o_c = tl.arange(0, CHUNK)
    m_d = o_d < dim
    m_n = o_n < nstate
    m_dn = m_d[:, None] & m_n[None, :]
    o_d64 = o_d.to(tl.int64)
    b_An = tl.load(A_ptr + o_d64[:, None] * nstate + o_n[None, :], mask=m_dn, other=0.0)
    b_A = b_An * 1.4426950408889634
    b_bias = tl.load(bias_ptr + o_d, mask=m_d, other=0.0) if HAS_BIAS else tl.zeros([BLOCK_D], tl.float32)
    i_gB = (pid_d * BLOCK_D // dpg_B).to(tl.int64)  # the groups of the whole block (BLOCK_D divides
    i_gC = (pid_d * BLOCK_D // dpg_C).to(tl.int64)  # the channels per group of B and of C)
    if not B_VAR:
        b_Bt = tl.load(B_ptr + o_d64[:, None] * s_Bg + o_n[None, :] * s_Bn, mask=m_dn, other=0.0).to(tl.float32)
        b_dBt = tl.zeros([BLOCK_D, BLOCK_N], tl.float32)
    if not C_VAR:
        b_Ct = tl.load(C_ptr + o_d64[:, None] * s_Cg + o_n[None, :] * s_Cn, mask=m_dn, other=0.0).to(tl.float32)
        b_dCt = tl.zeros([BLOCK_D, BLOCK_N], tl.float32)
    if HAS_D:
        b_D = tl.load(D_ptr + o_d, mask=m_d, other=0.0)
    if HAS_GLAST:
        b_gh = tl.load(glast_ptr + (i_b * dim + o_d64[:, None]) * nstate + o_n[None, :], mask=m_dn, other=0.0)
    else:
        b_gh = tl.zeros([BLOCK_D, BLOCK_N], tl.float32)
    b_dA_acc = tl.zeros([BLOCK_D, BLOCK_N], tl.float32)
    b_dD_acc = tl.zeros([BLOCK_D], tl.float32)
    b_dbias_acc = tl.zeros([BLOCK_D], tl.float32)
    b_dh0 = tl.zeros([BLOCK_D, BLOCK_N], tl.float32)
    first = (o_c == 0)[None, None, :]
    last = (o_c == CHUNK - 1)[None, None, :]
    for i_r in range(n_chunks):
        i_c = n_chunks - 1 - i_r
        p_ck = ckpt_ptr + ((i_b * n_chunks + i_c) * dim + o_d64[:, None]) * BLOCK_N + o_n[None, :]
        b_h0 = tl.load(p_ck, mask=m_d[:, None], other=0.0)
        o_l = (i_c * CHUNK + o_c).to(tl.int64)
        m_l = o_l < length
        m_dl = m_d[:, None] & m_l[None, :]
        m_dl1 = m_d[:, None] & (o_l[None, :] + 1 < length)
        m_nl = m_n[:, None] & m_l[None, :]
        b_u = tl.load(u_ptr + i_b * s_ub + o_d64[:, None] * s_ud + o_l[None, :] * s_ul, mask=m_dl, other=0.0)
        b_u = b_u.to(tl.float32)
        p_delta = delta_ptr + i_b * s_db + o_d64[:, None] * s_dd + o_l[None, :] * s_dl
        b_dt, b_raw = _dt(p_delta, m_dl, b_bias, HAS_BIAS, SOFTPLUS)
        b_dt1, _ = _dt(p_delta + s_dl, m_dl1, b_bias, HAS_BIAS, SOFTPLUS)
        b_dA = tl.exp2(b_dt[:, None, :] * b_A[:, :, None])
        b_dA1 = tl.exp2(b_dt1[:, None, :] * b_A[:, :, None])
        b_dtu = b_dt * b_u
        if B_VAR:
            b_B = tl.load(B_ptr + i_b * s_Bb + i_gB * s_Bg + o_n[:, None] * s_Bn + o_l[None, :] * s_Bl,
                          mask=m_nl, other=0.0).to(tl.float32)
            b_B3 = b_B[None, :, :]
        else:
            b_B3 = b_Bt[:, :, None]
        if C_VAR:
            b_C = tl.load(C_ptr + i_b * s_Cb + i_gC * s_Cg + o_n[:, None] * s_Cn + o_l[None, :] * s_Cl,
                          mask=m_nl, other=0.0).to(tl.float32)
            b_C3 = b_C[None, :, :]
        else:
            b_C3 = b_Ct[:, :, None]
        b_dBu = b_dtu[:, None, :] * b_B3
        _, b_hs = tl.associative_scan((b_dA, b_dBu + tl.where(first, b_dA * b_h0[:, :, None], 0.0)), axis=2,
                                      combine_fn=_combine)
        b_g = tl.load(g_ptr + i_b * s_gb + o_d64[:, None] * s_gd + o_l[None, :] * s_gl, mask=m_dl, other=0.0)
        b_g = b_g.to(tl.float32)
        if HAS_Z:
            b_y = tl.sum(b_hs * b_C3, axis=1)
            if HAS_D:
                b_y += b_D[:, None] * b_u
            b_z = tl.load(z_ptr + i_b * s_zb + o_d64[:, None] * s_zd + o_l[None, :] * s_zl, mask=m_dl,
                          other=0.0).to(tl.float32)
            b_sz = tl.sigmoid(b_z)
            b_dz = b_g * b_y * b_sz * (1.0 + b_z * (1.0 - b_sz))
            tl.store(dz_ptr + i_b * s_zb + o_d64[:, None] * s_zd + o_l[None, :] * s_zl,
                     b_dz.to(dz_ptr.dtype.element_ty), mask=m_dl)
            b_gy = b_g * b_z * b_sz
        else:
            b_gy = b_g
        b_Cgy = b_C3 * b_gy[:, None, :] + tl.where(last, b_dA1 * b_gh[:, :, None], 0.0)
        _, b_ghs = tl.associative_scan((b_dA1, b_Cgy), axis=2, combine_fn=_combine, reverse=True)
        b_hdA = b_hs - b_dBu  # dA[l] * h[l-1]
        b_ddt = tl.sum(b_ghs * (b_An[:, :, None] * b_hdA + b_u[:, None, :] * b_B3), axis=1)
        b_gB = tl.sum(b_ghs * b_B3, axis=1)
        b_du = b_dt * b_gB
        if HAS_D:
            b_du += b_D[:, None] * b_gy
            b_dD_acc += tl.sum(tl.where(m_dl, b_gy * b_u, 0.0), axis=1)
        b_ddelta = b_ddt * tl.sigmoid(b_raw) if SOFTPLUS else b_ddt
        b_ddelta = tl.where(m_dl, b_ddelta, 0.0)
        b_dbias_acc += tl.sum(b_ddelta, axis=1)
        tl.store(du_ptr + i_b * s_ub + o_d64[:, None] * s_ud + o_l[None, :] * s_ul,
                 b_du.to(du_ptr.dtype.element_ty), mask=m_dl)
        tl.store(ddelta_ptr + i_b * s_db + o_d64[:, None] * s_dd + o_l[None, :] * s_dl,
                 b_ddelta.to(ddelta_ptr.dtype.element_ty), mask=m_dl)
        b_dA_acc += tl.sum(b_ghs * b_hdA * b_dt[:, None, :], axis=2)
        b_gdBu = b_ghs * b_dtu[:, None, :]
        b_gC = b_hs * b_gy[:, None, :]
        if B_VAR:
            p_dB = dB_ptr + i_b * s_dBb + i_gB * s_dBg + o_n[:, None] * s_dBn + o_l[None, :] * s_dBl
            tl.atomic_add(p_dB, tl.sum(b_gdBu, axis=0), mask=m_nl)
        else:
            b_dBt += tl.sum(b_gdBu, axis=2)
        if C_VAR:
            p_dC = dC_ptr + i_b * s_dCb + i_gC * s_dCg + o_n[:, None] * s_dCn + o_l[None, :] * s_dCl
            tl.atomic_add(p_dC, tl.sum(b_gC, axis=0), mask=m_nl)
        else:
            b_dCt += tl.sum(b_gC, axis=2)
        b_gh = tl.sum(tl.where(first, b_ghs, 0.0), axis=2)
        b_dh0 = tl.sum(tl.where(first, b_ghs * b_dA, 0.0), axis=2)
    tl.store(dh0_ptr + (i_b * dim + o_d64[:, None]) * nstate + o_n[None, :], b_dh0, mask=m_dn)
    tl.atomic_add(dA_ptr + o_d64[:, None] * nstate + o_n[None, :], b_dA_acc, mask=m_dn)
    if HAS_D:
        tl.atomic_add(dD_ptr + o_d, b_dD_acc, mask=m_d)
    if HAS_BIAS:
        tl.atomic_add(dbias_ptr + o_d, b_dbias_acc, mask=m_d)
    if not B_VAR:
        tl.atomic_add(dB_ptr + o_d64[:, None] * s_dBg + o_n[None, :] * s_dBn, b_dBt, mask=m_dn)
    if not C_VAR:
        tl.atomic_add(dC_ptr + o_d64[:, None] * s_dCg + o_n[None, :] * s_dCn, b_dCt, mask=m_dn)
