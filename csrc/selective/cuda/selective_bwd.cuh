// The selective scan's backward kernel (selective_common.cuh has the design).
#pragma once
#include "selective_common.cuh"

namespace linrec {
namespace selective {

// The backward's per-step tiles in shared memory, (CPB, TS + 1) floats each (padded: conflict-free
// when a warp's channels read one step). Filled per tile from u, delta, z and the output gradient;
// the slots of dt, u and dzf take ddelta, du and dz once their step is done.
struct BackwardTiles {
  float *dt, *u, *dy, *dzf, *dscale;  // dzf = dout silu'(z) (dz = y dzf); dscale = d dt / d delta
};

// Fills the per-step tiles of the tile at t0 from `in` = (u, delta, dout, z): its window staged in
// `raw` (`staged`: how, staged_loads) or, when it could not be staged, from global memory.
// One loader per softplus setting and staging mode (compile-time switches: no per-element tests); a
// thread's staged vectors are unrolled for 4-byte types (float32 backward 1.84 -> 1.70 ms) and at 16
// channels per block or fewer, else rolled: the code shape that keeps each kernel's sub-chunk loop out
// of spills at 128 registers (bench/NOTES.md item 34).
template <typename T, int CPB, int TS>
__device__ __forceinline__ void load_backward_tiles(const SelectiveParams& p, const Strided3 (&in)[4], const Channel& c,
                                                    int64_t t0, int nvalid, int staged, const uint4* raw,
                                                    const float* sbias, const BackwardTiles& tl) {
  const bool has_z = p.z.p != nullptr;
  // Steps past len (u, dout = 0) get dt = 0 and d dt / d delta = 0: exp(dt A) = 1 keeps the states
  // and the adjoint, and their gradients are zero, so the kernel walks whole sub-chunks unguarded.
  auto fill = [&](auto sp) {
    return [&, sp](int ch, int s, const float(&v)[4]) {
      const int at = ch * (TS + 1) + s;
      const float u = v[0], delta = v[1], dout = v[2], z = v[3];
      const float raw = delta + sbias[ch], keep = s < nvalid ? 1.f : 0.f;
      tl.dt[at] = (sp ? softplus(raw) : raw) * keep;
      tl.dscale[at] = (sp ? sigmoid(raw) : 1.f) * keep;
      tl.u[at] = u;
      if (has_z) {
        const float sz = sigmoid(z);
        tl.dy[at] = dout * z * sz;
        tl.dzf[at] = dout * sz * (1.f + z * (1.f - sz));
      } else {
        tl.dy[at] = dout;
      }
    };
  };
  auto load = [&](auto sp) {
    if (staged) for_staged<T, CPB, TS, 4, sizeof(T) == 4 || CPB <= 16>(raw, in, staged, fill(sp));
    else for_tile<T, CPB, TS, 4>(in, c.b, c.first_d, c.count, t0, p.len, fill(sp));
  };
  if (p.softplus) load(std::true_type{});
  else load(std::false_type{});
}

// Writes the tile's du, ddelta and dz from the tiles u, dt and dzf: consecutive threads along the
// contiguous dim (steps or channels), each thread's elements a fixed stride apart, so its three
// pointers advance by one add per element (a stride of channels or of steps).
template <typename T, int CPB, int TS>
__device__ __forceinline__ void store_backward_tiles(const SelectiveParams& p, const Channel& c, int64_t t0,
                                                     int nvalid, const BackwardTiles& tl) {
  constexpr int kPer = (CPB * TS + kThreads - 1) / kThreads;
  const bool steps_fast = p.u.sl == 1;
  int ch = steps_fast ? threadIdx.x / TS : threadIdx.x % CPB, s = steps_fast ? threadIdx.x % TS : threadIdx.x / CPB;
  const int dch = steps_fast ? kThreads / TS : 0, ds = steps_fast ? 0 : kThreads / CPB;
  const int64_t d = c.first_d + ch, l = t0 + s;
  T* du = row<T>(p.du, c.b, d) + l * p.du.sl;
  T* dd = row<T>(p.ddelta, c.b, d) + l * p.ddelta.sl;
  T* dz = p.dz.p ? row<T>(p.dz, c.b, d) + l * p.dz.sl : nullptr;
  const int64_t inc_u = dch * p.du.sd + ds * p.du.sl, inc_d = dch * p.ddelta.sd + ds * p.ddelta.sl;
  const int64_t inc_z = dch * p.dz.sd + ds * p.dz.sl;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    if (ch < c.count && s < nvalid) {
      const int at = ch * (TS + 1) + s;
      *du = from_float<T>(tl.u[at]);
      *dd = from_float<T>(tl.dt[at]);
      if (dz) *dz = from_float<T>(tl.dzf[at]);
    }
    ch += dch, s += ds;
    du += inc_u, dd += inc_d;
    if (dz) dz += inc_z;
  }
}

// Shared memory layout of the backward kernel, in floats: 2 buffers of (B, C) tiles, one of the raw
// per-step window, the five per-step tiles, the states entering every kEvery-th sub-chunk, the dB/dC
// sums of a sub-chunk: one (S, 2 NP) slice per warp (plain stores, then added to global memory; shared
// atomics into one slice were 8 per thread-step at N_pad >= 128), then the block's delta_bias.
// kBlocks blocks per SM: 4 where their shared memory fits (16 warps: one wave of the Mamba-370m
// shape's 512 blocks, where 3 per SM left a second wave of 116 blocks), else 3 (1 at N_pad = 256).
// kEvery = 2 where only that fits 4 blocks (float32's raw window is twice bfloat16's): the odd
// sub-chunks then recompute their entry state from the one before (S more steps).
template <typename T, int SPT, int TPC>
struct BackwardSmem {
  static constexpr int NP = SPT * TPC, TS = static_cast<int>(selective_tile_steps(NP)), CPB = kThreads / TPC;
  static constexpr int S = 4, kMaxSub = TS / S, kWarps = kThreads / 32;
  // One buffer of the raw (u, delta, dout, z) window: the next tile's copy starts once its per-step
  // tiles are filled (two buffers would leave the float32 kernel 2 blocks per SM).
  static constexpr int kRawVectors = 4 * StagedWindow<T, CPB, TS>::NV;
  static constexpr int kRaw = 4 * TS * NP, kRows = kRaw + 4 * kRawVectors, kTile = CPB * (TS + 1);
  static constexpr int kSub = kRows + 5 * kTile;  // sub-chunk entry states
  // Offset of the dB/dC slices (16-byte aligned) and size of the layout with entry states every `every`
  // sub-chunks.
  static constexpr int red_at(int every) { return ((kSub + kMaxSub / every * SPT * kThreads + 3) / 4) * 4; }
  static constexpr int floats(int every) { return red_at(every) + kWarps * S * 2 * NP + CPB; }
  // sm_90: 228 KB of shared memory per SM, 1 KB of it reserved per resident block.
  static constexpr bool fits4(int every) { return 4 * (floats(every) * 4 + 1024) <= 228 * 1024; }
  static constexpr int kEvery = fits4(1) || !fits4(2) ? 1 : 2;
  static constexpr int kBlocks = NP == 256 ? 1 : fits4(kEvery) ? 4 : 3;
  static constexpr int kRed = red_at(kEvery);
  static constexpr int kBias = kRed + kWarps * S * 2 * NP;  // the block's delta_bias
  static constexpr int kFloats = floats(kEvery);
};

// Registers: 128 at 4 blocks per SM, 168 at 3 (unbounded, the compiler takes ~230; bench/NOTES.md).
// kZ: z is given (dz and the gated dy; a compile-time switch keeps the per-step loop branch-free).
template <typename T, int SPT, int TPC, bool kZ>
__global__ void __launch_bounds__(kThreads, BackwardSmem<T, SPT, TPC>::kBlocks)
    backward_kernel(const SelectiveParams p, const Groups grp, const int loads) {
  using L = BackwardSmem<T, SPT, TPC>;
  constexpr int S = L::S, NP = L::NP, TS = L::TS, CPB = L::CPB, kEvery = L::kEvery;
  constexpr int CPW = 32 / TPC, NV = 2 * SPT, NR = NV / CPW;
  static_assert(NV >= CPW, "the reduce-scatter leaves at least one value per lane");
  extern __shared__ __align__(16) float smem[];
  const BackwardTiles tl{smem + L::kRows, smem + L::kRows + L::kTile, smem + L::kRows + 2 * L::kTile,
                         smem + L::kRows + 3 * L::kTile, smem + L::kRows + 4 * L::kTile};
  const Channel c = channel_of<CPB>(p, grp);
  const int lane = threadIdx.x % 32, n0 = (threadIdx.x % TPC) * SPT, cl = threadIdx.x / TPC;
  // The dB/dC columns this lane's reduce-scatter sums land in (dB state n0 + j, or dC state n0 + j - SPT),
  // in its warp's slice.
  float* red = smem + L::kRed + (threadIdx.x / 32) * S * 2 * NP;
  int red_col[NR];
  {
    const int off = reduce_scatter_offset<NV, 16, TPC>(lane);
#pragma unroll
    for (int i = 0; i < NR; ++i) red_col[i] = off + i < SPT ? n0 + off + i : NP + n0 + off + i - SPT;
  }
  const int64_t len = p.len;
  float A2[SPT], g[SPT], a_next[SPT], dA[SPT];
  load_a2<SPT>(p, c.d, n0, A2);
#pragma unroll
  for (int n = 0; n < SPT; ++n) {
    g[n] = p.dlast && n0 + n < p.nstate ? p.dlast[c.row * p.nstate + n0 + n] : 0.f;
    a_next[n] = 1.f;
    dA[n] = 0.f;
  }
  const float Dd = p.D ? p.D[c.d] : 0.f;
  const int64_t bc_b = (c.b * grp.b + c.gb) * len * NP, bc_c = (c.b * grp.c + c.gc) * len * NP;
  const float* Bg = p.B + bc_b;
  const float* Cg = p.C + bc_c;
  const int64_t ntiles = (len + TS - 1) / TS;
  const int row = cl * (TS + 1);  // the thread's channel row in the per-step tiles
  float dD = 0.f, dbias = 0.f;

  float* sbias = smem + L::kBias;  // read after the first tile's barrier
  for (int i = threadIdx.x; i < CPB; i += kThreads)
    sbias[i] = p.delta_bias && i < c.count ? p.delta_bias[c.first_d + i] : 0.f;

  // Tile k - 1's raw window and B, C are copied (cp.async) while the block works on tile k.
  const Strided3 in[4] = {p.u, p.delta, p.dout, p.z};
  const int staged = staged_loads<T, CPB>(loads, c.count, c.first_d);
  uint4* raw = reinterpret_cast<uint4*>(smem + L::kRaw);
  if (ntiles > 0) {
    const int64_t t0 = (ntiles - 1) * TS;
    if (staged) WindowStager<T, CPB, TS, 4>(in, staged, c.b, c.first_d, c.count, t0, len).copy(raw, in, t0);
    stage_bc<NP, TS>(smem + ((ntiles - 1) % 2) * 2 * TS * NP, Bg, Cg, (ntiles - 1) * TS, len);
  }
  for (int64_t k = ntiles - 1; k >= 0; --k) {
    const int64_t t0 = k * TS;
    const int nvalid = static_cast<int>(min(len - t0, static_cast<int64_t>(TS)));
    const int nsub = (nvalid + S - 1) / S;  // the last one's steps past len are identity steps
    cp_async_wait<0>();
    __syncthreads();  // tile k's copies are in
    load_backward_tiles<T, CPB, TS>(p, in, c, t0, nvalid, staged, raw, sbias, tl);
    __syncthreads();  // the per-step tiles are filled: the raw buffer is free
    if (k > 0) {
      if (staged) WindowStager<T, CPB, TS, 4>(in, staged, c.b, c.first_d, c.count, t0 - TS, len).copy(raw, in, t0 - TS);
      stage_bc<NP, TS>(smem + ((k - 1) % 2) * 2 * TS * NP, Bg, Cg, t0 - TS, len);
    }
    const float* sB = smem + (k % 2) * 2 * TS * NP + n0;
    const float* sC = sB + TS * NP;

    // One step forward of the states a thread owns (s: step within the tile).
    // (a: the step's decays exp(dt A), kept for the adjoint.)
    auto advance = [&](int s, float(&h)[SPT], float(&a)[SPT]) {
      const float dt = tl.dt[row + s], dtu = dt * tl.u[row + s];
      float Bv[SPT];
      states_at<SPT>(sB + s * NP, Bv);
#pragma unroll
      for (int n = 0; n < SPT; ++n) {
        a[n] = exp2f(dt * A2[n]);
        h[n] = fmaf(a[n], h[n], dtu * Bv[n]);
      }
    };

    // Pass 1: the states entering every kEvery-th sub-chunk, into shared memory (thread-major:
    // conflict-free).
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
        if (j % kEvery == 0)
#pragma unroll
          for (int n = 0; n < SPT; ++n) sub[(j / kEvery * SPT + n) * kThreads] = h[n];
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
        for (int n = 0; n < SPT; ++n) h[n] = sub[(j / kEvery * SPT + n) * kThreads];
        if (kEvery > 1 && j % kEvery)  // from the stored entry of sub-chunk j - 1 (kEvery = 2)
#pragma unroll
          for (int t = 0; t < S; ++t) advance(s0 - S + t, h, as[t]);
#pragma unroll
        for (int n = 0; n < SPT; ++n) h0s[n] = h[n];
#pragma unroll
        for (int t = 0; t < S; ++t) {
          advance(s0 + t, h, as[t]);
          if constexpr (kZ) {  // dz = y silu'(z) dout, with y recomputed from the states
            float Cv[SPT], y = 0.f;
            states_at<SPT>(sC + (s0 + t) * NP, Cv);
#pragma unroll
            for (int n = 0; n < SPT; ++n) y = fmaf(Cv[n], h[n], y);
            y = fmaf(Dd, tl.u[row + s0 + t], channel_sum<TPC>(y));
            if (n0 == 0) tl.dzf[row + s0 + t] *= y;
          }
#pragma unroll
          for (int n = 0; n < SPT; ++n) hs[t][n] = h[n];
        }
      }
#pragma unroll
      for (int t = S - 1; t >= 0; --t) {
        const int s = s0 + t;
        const float u = tl.u[row + s], dt = tl.dt[row + s], dtu = dt * u, dy = tl.dy[row + s];
        float Bv[SPT], Cv[SPT];
        states_at<SPT>(sB + s * NP, Bv);
        states_at<SPT>(sC + s * NP, Cv);
        float v[NV], ddt_a = 0.f, dub = 0.f;
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
          v[n] = g[n] * dtu;  // zero for the padding channels of a block: their u and dy are 0
          v[SPT + n] = dy * hs[t][n];
        }
        const float sa = channel_sum<TPC>(ddt_a), sb = channel_sum<TPC>(dub);
        const float ddelta = fmaf(sa, kLn2, sb * u) * tl.dscale[row + s];
        dD = fmaf(dy, u, dD);
        dbias += ddelta;
        __syncwarp();
        if (n0 == 0) {  // the step's slots take its gradients
          tl.u[row + s] = fmaf(sb, dt, dy * Dd);
          tl.dt[row + s] = ddelta;
        }
        reduce_scatter<NV, 16, TPC>(v);  // over the warp's channels
#pragma unroll
        for (int i = 0; i < NR; ++i) red[t * 2 * NP + red_col[i]] = v[i];
      }
      // The sub-chunk's dB/dC sums to global memory with vector atomics: at N_pad <= 64 each warp adds
      // its own slice (no block barrier: the barriers of a block-wide sum were 9% of the stall
      // samples); above, the block sums the warps' slices first (per-warp atomics contended: N_pad =
      // 128 backward 2.36 -> 2.62 ms).
      constexpr bool kWarpFlush = NP <= 64;
      constexpr int kVecs = S * 2 * NP / 4;  // float4 of one slice
      auto flush = [&](int i, float4 val) {
        const int t = (4 * i) / (2 * NP), col = (4 * i) % (2 * NP);
        if (s0 + t >= nvalid) return;
        const int64_t l = t0 + s0 + t;
        float* dst = col < NP ? p.dB + bc_b + l * NP + col : p.dC + bc_c + l * NP + col - NP;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float4*>(dst), val);
#else
        atomicAdd(dst, val.x);
        atomicAdd(dst + 1, val.y);
        atomicAdd(dst + 2, val.z);
        atomicAdd(dst + 3, val.w);
#endif
      };
      if constexpr (kWarpFlush) {
        __syncwarp();  // the warp's slice is written
        for (int i = lane; i < kVecs; i += 32) flush(i, reinterpret_cast<const float4*>(red)[i]);
        __syncwarp();  // the slice is read before the next sub-chunk rewrites it
      } else {
        __syncthreads();  // every warp's slice is written
        const float4* red0 = reinterpret_cast<const float4*>(smem + L::kRed);
        for (int i = threadIdx.x; i < kVecs; i += kThreads) {
          float4 val = red0[i];
#pragma unroll
          for (int w = 1; w < L::kWarps; ++w) {
            const float4 o = red0[w * kVecs + i];
            val.x += o.x, val.y += o.y, val.z += o.z, val.w += o.w;
          }
          flush(i, val);
        }
        __syncthreads();  // the slices are read before the next sub-chunk rewrites them
      }
    }
    __syncthreads();  // every channel's du, ddelta and dz slots are written
    store_backward_tiles<T, CPB, TS>(p, c, t0, nvalid, tl);
    __syncthreads();  // the tiles and this tile's (B, C) buffer are refilled next iteration
  }
  if (!c.valid) return;
#pragma unroll
  for (int n = 0; n < SPT; ++n) {
    if (n0 + n >= p.nstate) continue;
    if (p.dh0) p.dh0[c.row * p.nstate + n0 + n] = a_next[n] * g[n];
    atomicAdd(&p.dA[c.d * p.nstate + n0 + n], dA[n]);
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
