// The selective scan's forward kernel (selective_common.cuh has the design).
#pragma once
#include "selective_common.cuh"

namespace linrec {
namespace selective {

template <typename T, int SPT, int TPC>
__global__ void __launch_bounds__(kThreads) forward_kernel(const SelectiveParams p, const Groups grp, const bool vec) {
  constexpr int V = Steps<T>::V, NP = SPT * TPC, TS = selective_tile_steps(NP), CPB = kThreads / TPC;
  extern __shared__ __align__(16) float smem[];  // 2 buffers of (B, C) tiles
  const Channel c = channel_of<CPB>(p, grp);
  const int n0 = (threadIdx.x % TPC) * SPT;
  const int64_t len = p.len;
  float A2[SPT], h[SPT];
#pragma unroll
  for (int n = 0; n < SPT; ++n) {
    A2[n] = p.A2[c.d * NP + n0 + n];
    h[n] = p.h0 && n0 + n < p.nstate ? p.h0[c.row * p.nstate + n0 + n] : 0.f;
  }
  const float bias = p.delta_bias ? p.delta_bias[c.d] : 0.f, Dd = p.D ? p.D[c.d] : 0.f;
  const T* ur = row<const T>(p.u, c.b, c.d);
  const T* dr = row<const T>(p.delta, c.b, c.d);
  const T* zr = p.z.p ? row<const T>(p.z, c.b, c.d) : nullptr;
  T* outr = p.out.p ? row<T>(p.out, c.b, c.d) : nullptr;
  const float* Bg = p.B + (c.b * grp.b + c.gb) * len * NP;
  const float* Cg = p.C + (c.b * grp.c + c.gc) * len * NP;
  const int64_t ntiles = (len + TS - 1) / TS;
  Steps<T> su, sd, sz;
  su.load(ur, p.u.sl, 0, len, vec);
  sd.load(dr, p.delta.sl, 0, len, vec);
  if (zr) sz.load(zr, p.z.sl, 0, len, vec);
  if (ntiles > 0) stage_bc<NP, TS>(smem, Bg, Cg, 0, len);
  for (int64_t k = 0; k < ntiles; ++k) {
    const int64_t t0 = k * TS, t1 = min(len, t0 + TS);
    if (k + 1 < ntiles) {
      stage_bc<NP, TS>(smem + ((k + 1) % 2) * 2 * TS * NP, Bg, Cg, t0 + TS, len);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* sB = smem + (k % 2) * 2 * TS * NP + n0;
    const float* sC = sB + TS * NP;
    for (int64_t l0 = t0; l0 < t1; l0 += V) {
      Steps<T> nu, nd, nz;
      if (l0 + V < len) {
        nu.load(ur, p.u.sl, l0 + V, len, vec);
        nd.load(dr, p.delta.sl, l0 + V, len, vec);
        if (zr) nz.load(zr, p.z.sl, l0 + V, len, vec);
      }
      float yv[V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        yv[i] = 0.f;
        if (l0 + i < len) {
          const float u = su[i], dt = step_dt(sd[i], bias, p.softplus), dtu = dt * u;
          float Bv[SPT], Cv[SPT];
          states_at<SPT>(sB + (l0 - t0 + i) * NP, Bv);
          states_at<SPT>(sC + (l0 - t0 + i) * NP, Cv);
          float y = 0.f;
#pragma unroll
          for (int n = 0; n < SPT; ++n) {
            h[n] = fmaf(exp2f(dt * A2[n]), h[n], dtu * Bv[n]);
            y = fmaf(Cv[n], h[n], y);
          }
          y = fmaf(Dd, u, channel_sum<TPC>(y));
          if (zr) {
            const float zv = sz[i];
            y *= zv * sigmoid(zv);
          }
          yv[i] = y;
        }
      }
      if (outr && c.valid && n0 == 0) store_steps<T, V>(outr, p.out.sl, l0, len, vec, yv);
      su = nu, sd = nd, sz = nz;
    }
    if (p.ckpt && t1 < len && c.valid) {
      float* ck = p.ckpt + (c.row * ntiles + k) * NP + n0;
#pragma unroll
      for (int n = 0; n < SPT; ++n) ck[n] = h[n];
    }
    __syncthreads();  // the tile's buffer is refilled next iteration
  }
  if (p.last && c.valid)
#pragma unroll
    for (int n = 0; n < SPT; ++n)
      if (n0 + n < p.nstate) p.last[c.row * p.nstate + n0 + n] = h[n];
}

// Dynamic shared memory of the forward kernel, bytes: 2 buffers of (B, C) tiles.
template <int SPT, int TPC>
constexpr int forward_smem() {
  return 4 * static_cast<int>(selective_tile_steps(SPT * TPC)) * SPT * TPC * 4;
}

}  // namespace selective
}  // namespace linrec
