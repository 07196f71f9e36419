// The selective scan's backward kernel (selective_common.cuh has the design).
#pragma once
#include "selective_common.cuh"

namespace linrec {
namespace selective {

// Element i of a block's (CPB, TS) tile of rows: consecutive threads walk the contiguous dim.
template <int CPB, int TS>
__device__ __forceinline__ void tile_pos(int i, bool steps_fast, int* ch, int* s) {
  *ch = steps_fast ? i / TS : i % CPB;
  *s = steps_fast ? i % TS : i / CPB;
}

// The backward's per-step tiles in shared memory, (CPB, TS + 1) floats each (padded: conflict-free
// when a warp's channels read one step). Filled per tile from u, delta, z and the output gradient;
// the slots of dt, u and dzf take ddelta, du and dz once their step is done.
struct BackwardTiles {
  float *dt, *u, *dy, *dzf, *dscale;  // dzf = dout silu'(z) (dz = y dzf); dscale = d dt / d delta
};

// The backward's per-step inputs, in the order its tiles are filled from.
__device__ __forceinline__ void backward_inputs(const SelectiveParams& p, Strided3 (&in)[4]) {
  in[0] = p.u, in[1] = p.delta, in[2] = p.dout, in[3] = p.z;
}

// Fills the per-step tiles of the tile at t0 from its window staged in `raw` (`staged`: how,
// staged_loads) or, when it could not be staged, from global memory.
template <typename T, int CPB, int TS>
__device__ __forceinline__ void load_backward_tiles(const SelectiveParams& p, const Channel& c, int64_t t0, int staged,
                                                    const uint4* raw, const BackwardTiles& tl) {
  Strided3 in[4];
  backward_inputs(p, in);
  const bool has_z = p.z.p != nullptr;
  auto fill = [&](int ch, int s, const float(&v)[4]) {
    const int at = ch * (TS + 1) + s;
    const float u = v[0], delta = v[1], dout = v[2], z = v[3];
    const float raw = delta + (p.delta_bias && ch < c.count ? p.delta_bias[c.first_d + ch] : 0.f);
    tl.dt[at] = p.softplus ? softplus(raw) : raw;
    tl.dscale[at] = p.softplus ? sigmoid(raw) : 1.f;
    tl.u[at] = u;
    if (has_z) {
      const float sz = sigmoid(z);
      tl.dy[at] = dout * z * sz;
      tl.dzf[at] = dout * sz * (1.f + z * (1.f - sz));
    } else {
      tl.dy[at] = dout;
    }
  };
  if (staged) for_staged<T, CPB, TS, 4>(raw, in, staged, fill);
  else for_tile<T, CPB, TS, 4>(in, c.b, c.first_d, c.count, t0, p.len, fill);
}

template <typename T, int CPB, int TS>
__device__ __forceinline__ void store_backward_tiles(const SelectiveParams& p, const Channel& c, int64_t t0,
                                                     const BackwardTiles& tl) {
  constexpr int kPer = (CPB * TS + kThreads - 1) / kThreads;
  const bool steps_fast = p.u.sl == 1;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = threadIdx.x + k * kThreads;
    int ch, s;
    tile_pos<CPB, TS>(i, steps_fast, &ch, &s);
    if (i >= CPB * TS || ch >= c.count || t0 + s >= p.len) continue;
    const int64_t d = c.first_d + ch, l = t0 + s;
    const int at = ch * (TS + 1) + s;
    row<T>(p.du, c.b, d)[l * p.du.sl] = from_float<T>(tl.u[at]);
    row<T>(p.ddelta, c.b, d)[l * p.ddelta.sl] = from_float<T>(tl.dt[at]);
    if (p.dz.p) row<T>(p.dz, c.b, d)[l * p.dz.sl] = from_float<T>(tl.dzf[at]);
  }
}

// Shared memory layout of the backward kernel, in floats: 2 buffers of (B, C) tiles, the five
// per-step tiles, the sub-chunk entry states, then one region used in turn by the raw per-step
// window of a tile (stage_window, until the tiles are filled) and by the dB/dC values of a sub-chunk: per kind (dB, dC; the kinds kKind apart,
// 16 floats off a multiple of 32 so that the flush reads both conflict-free), warp and step, each
// lane's SPT values (plain vector stores; the flush sums a warp's channels and then the warps).
template <typename T, int SPT, int TPC>
struct BackwardSmem {
  static constexpr int NP = SPT * TPC, TS = static_cast<int>(selective_tile_steps(NP)), CPB = kThreads / TPC;
  static constexpr int S = 4, kMaxSub = TS / S, kWarps = kThreads / 32;
  static constexpr int kRawFloats = 4 * 4 * StagedWindow<T, CPB, TS>::NV;  // (u, delta, dout, z) vectors
  static constexpr int kKind = kWarps * S * 32 * SPT + 16, kRedFloats = 2 * kKind;
  static constexpr int kRows = 4 * TS * NP, kTile = CPB * (TS + 1);
  static constexpr int kSub = kRows + 5 * kTile;  // sub-chunk entry states
  static constexpr int kRed = ((kSub + kMaxSub * SPT * kThreads + 3) / 4) * 4;
  static constexpr int kFloats = kRed + (kRawFloats > kRedFloats ? kRawFloats : kRedFloats);
  static_assert(kWarps * 8 == 32, "the flush reduces over warps in lane bits 8 and 16");
};

// 3 blocks (12 warps) per SM below N_pad = 256: at most 168 registers (unbounded, the compiler takes
// ~230 and 2 blocks fit; H100: 2.30 vs 2.36 ms bf16, 2.36 vs 2.33 float32, bench/NOTES.md).
template <typename T, int SPT, int TPC>
__global__ void __launch_bounds__(kThreads, SPT * TPC == 256 ? 1 : 3) backward_kernel(const SelectiveParams p, const Groups grp,
                                                            const int loads) {
  using L = BackwardSmem<T, SPT, TPC>;
  constexpr int S = L::S, NP = L::NP, TS = L::TS, CPB = L::CPB;
  constexpr int CPW = 32 / TPC;  // channels per warp
  extern __shared__ __align__(16) float smem[];
  const BackwardTiles tl{smem + L::kRows, smem + L::kRows + L::kTile, smem + L::kRows + 2 * L::kTile,
                         smem + L::kRows + 3 * L::kTile, smem + L::kRows + 4 * L::kTile};
  const Channel c = channel_of<CPB>(p, grp);
  const int lane = threadIdx.x % 32, n0 = (threadIdx.x % TPC) * SPT, cl = threadIdx.x / TPC;
  float* red = smem + L::kRed + ((threadIdx.x / 32) * S * 32 + lane) * SPT;  // this lane's dB values of step 0
  const int64_t len = p.len;
  float A2[SPT], g[SPT], a_next[SPT], dA[SPT];
#pragma unroll
  for (int n = 0; n < SPT; ++n) {
    A2[n] = p.A2[c.d * NP + n0 + n];
    g[n] = p.dlast && n0 + n < p.nstate ? p.dlast[c.row * p.nstate + n0 + n] : 0.f;
    a_next[n] = 1.f;
    dA[n] = 0.f;
  }
  const float Dd = p.D ? p.D[c.d] : 0.f;
  const bool has_z = p.z.p != nullptr;
  const int64_t bc_b = (c.b * grp.b + c.gb) * len * NP, bc_c = (c.b * grp.c + c.gc) * len * NP;
  const float* Bg = p.B + bc_b;
  const float* Cg = p.C + bc_c;
  const int64_t ntiles = (len + TS - 1) / TS;
  const float* r_dt = tl.dt + cl * (TS + 1);
  const float* r_u = tl.u + cl * (TS + 1);
  const float* r_dy = tl.dy + cl * (TS + 1);
  float dD = 0.f, dbias = 0.f;

  // B and C of tile k - 1 are copied (cp.async) while the block works on tile k; the raw window of
  // a tile is copied when the tile starts (its region holds the dB/dC values meanwhile).
  Strided3 in[4];
  backward_inputs(p, in);
  const int staged = staged_loads<T, CPB>(loads, c.count, c.first_d);
  uint4* raw = reinterpret_cast<uint4*>(smem + L::kRed);
  if (ntiles > 0) stage_bc<NP, TS>(smem + ((ntiles - 1) % 2) * 2 * TS * NP, Bg, Cg, (ntiles - 1) * TS, len);
  for (int64_t k = ntiles - 1; k >= 0; --k) {
    const int64_t t0 = k * TS, t1 = min(len, t0 + TS);
    const int nsub = static_cast<int>((t1 - t0 + S - 1) / S);
    if (staged) {
      stage_window<T, CPB, TS, 4>(raw, in, staged, c.b, c.first_d, c.count, t0, len);
      cp_async_commit();
    }
    cp_async_wait<0>();
    __syncthreads();  // tile k's copies are in
    load_backward_tiles<T, CPB, TS>(p, c, t0, staged, raw, tl);
    if (k > 0) stage_bc<NP, TS>(smem + ((k - 1) % 2) * 2 * TS * NP, Bg, Cg, t0 - TS, len);
    __syncthreads();  // the per-step tiles are filled: the raw window's region is free
    const float* sB = smem + (k % 2) * 2 * TS * NP + n0;
    const float* sC = sB + TS * NP;

    // One step forward of the states a thread owns (s: step within the tile).
    // (a: the step's decays exp(dt A), kept for the adjoint.)
    auto advance = [&](int s, float(&h)[SPT], float(&a)[SPT]) {
      const float dt = r_dt[s], dtu = dt * r_u[s];
      float Bv[SPT];
      states_at<SPT>(sB + s * NP, Bv);
#pragma unroll
      for (int n = 0; n < SPT; ++n) {
        a[n] = exp2f(dt * A2[n]);
        h[n] = fmaf(a[n], h[n], dtu * Bv[n]);
      }
    };

    // Pass 1: the states entering each sub-chunk, into shared memory (thread-major: conflict-free).
    float* sub = smem + L::kSub + threadIdx.x;
    {
      float h[SPT];
#pragma unroll
      for (int n = 0; n < SPT; ++n) {
        if (k > 0) h[n] = p.ckpt[(c.row * ntiles + k - 1) * NP + n0 + n];
        else h[n] = p.h0 && n0 + n < p.nstate ? p.h0[c.row * p.nstate + n0 + n] : 0.f;
      }
#pragma unroll 1
      for (int j = 0; j < nsub; ++j) {
#pragma unroll
        for (int n = 0; n < SPT; ++n) sub[(j * SPT + n) * kThreads] = h[n];
        if (j + 1 < nsub)
#pragma unroll
          for (int t = 0; t < S; ++t) {
            float a[SPT];
            advance(j * S + t, h, a);
          }
      }
    }
#pragma unroll 1
    for (int j = nsub - 1; j >= 0; --j) {
      const int s0 = j * S;
      float hs[S][SPT], as[S][SPT], h0s[SPT];
      {
        float h[SPT];
#pragma unroll
        for (int n = 0; n < SPT; ++n) h0s[n] = h[n] = sub[(j * SPT + n) * kThreads];
#pragma unroll
        for (int t = 0; t < S; ++t) {
          if (t0 + s0 + t < t1) {
            advance(s0 + t, h, as[t]);
            if (has_z) {  // dz = y silu'(z) dout, with y recomputed from the states
              float Cv[SPT], y = 0.f;
              states_at<SPT>(sC + (s0 + t) * NP, Cv);
#pragma unroll
              for (int n = 0; n < SPT; ++n) y = fmaf(Cv[n], h[n], y);
              y = fmaf(Dd, r_u[s0 + t], channel_sum<TPC>(y));
              if (n0 == 0) tl.dzf[cl * (TS + 1) + s0 + t] *= y;
            }
          }
#pragma unroll
          for (int n = 0; n < SPT; ++n) hs[t][n] = h[n];
        }
      }
#pragma unroll
      for (int t = S - 1; t >= 0; --t) {
        const int s = s0 + t;
        if (t0 + s >= t1) continue;  // the flush skips these steps
        const float u = r_u[s], dt = r_dt[s], dtu = dt * u, dy = r_dy[s];
        float Bv[SPT], Cv[SPT];
        states_at<SPT>(sB + s * NP, Bv);
        states_at<SPT>(sC + s * NP, Cv);
        float vb[SPT], vc[SPT], ddt_a = 0.f, dub = 0.f;
#pragma unroll
        for (int n = 0; n < SPT; ++n) {
          const float hp = t > 0 ? hs[t > 0 ? t - 1 : 0][n] : h0s[n];
          const float a = as[t][n];
          g[n] = fmaf(a_next[n], g[n], dy * Cv[n]);
          a_next[n] = a;
          const float gah = g[n] * a * hp;
          ddt_a = fmaf(gah, A2[n], ddt_a);  // times ln 2 below: A = A2 ln 2
          dub = fmaf(g[n], Bv[n], dub);
          dA[n] = fmaf(gah, dt, dA[n]);
          vb[n] = g[n] * dtu;  // zero for the padding channels of a block: their u and dy are 0
          vc[n] = dy * hs[t][n];
        }
        const float sa = channel_sum<TPC>(ddt_a), sb = channel_sum<TPC>(dub);
        const float ddelta = fmaf(sa, kLn2, sb * u) * tl.dscale[cl * (TS + 1) + s];
        dD = fmaf(dy, u, dD);
        dbias += ddelta;
        __syncwarp();
        if (n0 == 0) {  // the step's slots take its gradients
          tl.u[cl * (TS + 1) + s] = fmaf(sb, dt, dy * Dd);
          tl.dt[cl * (TS + 1) + s] = ddelta;
        }
#pragma unroll
        for (int q = 0; q < SPT / 4; ++q) {
          reinterpret_cast<float4*>(red + t * 32 * SPT)[q] = make_float4(vb[4 * q], vb[4 * q + 1], vb[4 * q + 2], vb[4 * q + 3]);
          reinterpret_cast<float4*>(red + L::kKind + t * 32 * SPT)[q] =
              make_float4(vc[4 * q], vc[4 * q + 1], vc[4 * q + 2], vc[4 * q + 3]);
        }
      }
      __syncthreads();
      // The flush: float4 output o (step t, kind, states n .. n + 3) of each warp w sums the warp's
      // channels (lanes i % 8 of lane group w); the 4 lane groups then add up by shuffles.
      constexpr int kOut = S * 2 * NP / 4;
      for (int i = threadIdx.x; i < kOut * L::kWarps; i += kThreads) {
        const int w = (i / 8) % L::kWarps, o = (i / (8 * L::kWarps)) * 8 + i % 8;
        const int t = o / (NP / 2), kind = (o / (NP / 4)) % 2, n = (o % (NP / 4)) * 4;
        const float* src = smem + L::kRed + kind * L::kKind + (w * S + t) * 32 * SPT + n;
        float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int cw = 0; cw < CPW; ++cw) {
          const float4 x = *reinterpret_cast<const float4*>(src + cw * NP);
          val.x += x.x, val.y += x.y, val.z += x.z, val.w += x.w;
        }
#pragma unroll
        for (int m = 8; m < 32; m *= 2) {
          val.x += __shfl_xor_sync(0xffffffffu, val.x, m);
          val.y += __shfl_xor_sync(0xffffffffu, val.y, m);
          val.z += __shfl_xor_sync(0xffffffffu, val.z, m);
          val.w += __shfl_xor_sync(0xffffffffu, val.w, m);
        }
        const int64_t l = t0 + s0 + t;
        if (w != 0 || l >= t1) continue;
        float* dst = (kind == 0 ? p.dB + bc_b : p.dC + bc_c) + l * NP + n;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float4*>(dst), val);
#else
        atomicAdd(dst, val.x);
        atomicAdd(dst + 1, val.y);
        atomicAdd(dst + 2, val.z);
        atomicAdd(dst + 3, val.w);
#endif
      }
      __syncthreads();  // the dB/dC slices are rewritten by the next sub-chunk
    }
    store_backward_tiles<T, CPB, TS>(p, c, t0, tl);
    __syncthreads();  // the tiles and this tile's (B, C) buffer are refilled next iteration
  }
  if (!c.valid) return;
#pragma unroll
  for (int n = 0; n < SPT; ++n) {
    if (n0 + n >= p.nstate) continue;
    if (p.dh0) p.dh0[c.row * p.nstate + n0 + n] = a_next[n] * g[n];
    atomicAdd(&p.dA[c.d * NP + n0 + n], dA[n]);
  }
  if (n0 == 0) {
    if (p.dD) atomicAdd(&p.dD[c.d], dD);
    if (p.ddelta_bias) atomicAdd(&p.ddelta_bias[c.d], dbias);
  }
}

// Dynamic shared memory of the backward kernel, bytes.
template <typename T, int SPT, int TPC>
constexpr int backward_smem() {
  return BackwardSmem<T, SPT, TPC>::kFloats * 4;
}

}  // namespace selective
}  // namespace linrec
