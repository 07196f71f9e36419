// The selective scan's forward kernel (selective_common.cuh has the design).
#pragma once
#include "selective_common.cuh"

namespace linrec {
namespace selective {

// Shared memory of the forward kernel, in floats: 2 buffers of (B, C) tiles; the raw (u, delta, z)
// window staged by cp.async (one buffer: the next tile's copy starts once the rows are filled, and
// lands while the block scans); the tile's per-step values, (dt, dt u) and (u, silu(z))
// float2 rows per channel (padded by 16 bytes: the channels of a warp read one step
// conflict-free); the block's delta_bias.
template <typename T, int SPT, int TPC>
struct ForwardSmem {
  static constexpr int NP = SPT * TPC, TS = static_cast<int>(selective_tile_steps(NP)), CPB = kThreads / TPC;
  // Steps per group (the y sums of a group are reduce-scattered, each lane finishing E = V / TPC of
  // them): 16, or 32 at 16 or more lanes per channel so that a lane finishes at least 2; at most a
  // tile. A longer group gives each warp a longer run of independent exp2, FMAs and shared-memory
  // loads between reductions (bench/NOTES.md item 36: 8-step groups left it latency-bound).
  static constexpr int kGroup = TPC <= 8 ? 16 : 32, V = kGroup < TS ? kGroup : TS;
  static constexpr int RS = 2 * TS + 4;          // floats per per-step row
  static constexpr int kRawVectors = 3 * StagedWindow<T, CPB, TS>::NV;
  static constexpr int kRows = 4 * TS * NP, kRaw = kRows, kDd = kRaw + 4 * kRawVectors;
  static constexpr int kUg = kDd + CPB * RS, kBias = kUg + CPB * RS;
  static constexpr int kFloats = kBias + CPB;
  static_assert(TS % V == 0, "a tile holds whole groups");
};

// Blocks (of 4 warps) per SM, as the register bound of the launch: 4 at up to 8 states per thread
// (128 registers hold a 16-step group's loads; at 96, for 5 blocks, it spills), 2 at 16;
// never more than fit in shared memory (sm_90: 228 KB per SM, 1 KB reserved per block; N_pad = 128
// fits 3, and bounding it at 4 spilled 72 bytes).
template <typename T, int SPT, int TPC>
constexpr int forward_blocks() {
  constexpr int by_registers = SPT >= 16 ? 2 : 4;
  constexpr int by_smem = 228 * 1024 / (ForwardSmem<T, SPT, TPC>::kFloats * 4 + 1024);
  return by_smem < by_registers ? (by_smem > 0 ? by_smem : 1) : by_registers;
}

// kOut = false: the backward's checkpoint pass, which needs only the states (no C, z, y or out).
template <typename T, int SPT, int TPC, bool kOut>
__global__ void __launch_bounds__(kThreads, forward_blocks<T, SPT, TPC>())
    forward_kernel(const SelectiveParams p, const Groups grp, const bool vec, const int loads) {
  using L = ForwardSmem<T, SPT, TPC>;
  constexpr int NP = L::NP, TS = L::TS, CPB = L::CPB, V = L::V, E = V / TPC, RS = L::RS;
  extern __shared__ __align__(16) float smem[];
  const Channel c = channel_of<CPB>(p, grp);
  const int j = threadIdx.x % TPC, n0 = j * SPT, cl = threadIdx.x / TPC;
  const int off = reduce_scatter_offset<V, TPC / 2, 1>(threadIdx.x % 32);  // see the group loop
  const int64_t len = p.len;
  float A2[SPT], h[SPT];
  load_a2<SPT>(p, c.d, n0, A2);
#pragma unroll
  for (int n = 0; n < SPT; ++n) {
    h[n] = p.h0 && n0 + n < p.nstate ? p.h0[c.row * p.nstate + n0 + n] : 0.f;
  }
  float* sbias = smem + L::kBias;
  for (int i = threadIdx.x; i < CPB; i += kThreads)
    sbias[i] = p.delta_bias && i < c.count ? p.delta_bias[c.first_d + i] : 0.f;
  const float Dd = p.D ? p.D[c.d] : 0.f;
  const bool has_z = kOut && p.z.p != nullptr;
  T* outr = kOut && p.out.p ? row<T>(p.out, c.b, c.d) : nullptr;
  const float* Bg = p.B + (c.b * grp.b + c.gb) * len * NP;
  const float* Cg = p.C + (c.b * grp.c + c.gc) * len * NP;
  float2* dd = reinterpret_cast<float2*>(smem + L::kDd);
  float2* ug = reinterpret_cast<float2*>(smem + L::kUg);
  const float4* rdd = reinterpret_cast<const float4*>(smem + L::kDd + cl * RS);
  const float2* rug = reinterpret_cast<const float2*>(smem + L::kUg + cl * RS);
  const Strided3 io[3] = {p.u, p.delta, kOut ? p.z : Strided3{}};
  const int64_t ntiles = (len + TS - 1) / TS;
  // The raw (u, delta, z) window of tile k + 1 is copied (cp.async, with its B and C) while the
  // block scans tile k, where whole 16-byte vectors allow it; else each tile loads its own.
  const int staged = staged_loads<T, CPB>(loads, c.count, c.first_d);
  uint4* raw = reinterpret_cast<uint4*>(smem + L::kRaw);
  WindowStager<T, CPB, TS, 3> stager(io, staged, c.b, c.first_d, c.count, 0, len);
  if (ntiles > 0) {
    if (staged) stager.copy(raw, io, 0);
    stage_bc<NP, TS, kOut>(smem, Bg, Cg, 0, len);
  }
  for (int64_t k = 0; k < ntiles; ++k) {
    const int64_t t0 = k * TS, t1 = min(len, t0 + TS);
    const int nvalid = static_cast<int>(t1 - t0);
    cp_async_wait<0>();
    __syncthreads();  // tile k's copies are in; the previous tile's rows are read; sbias is written
    // The per-step rows of (channel, step), branch-free: padding steps and channels get dt = 0 (the
    // state is kept); softplus is a compile-time switch (the loaders run once per softplus setting).
    auto rows = [&](auto kSoftplus) {
      return [&](int ch, int s, const float(&v)[3]) {
        const float keep = ch < c.count && s < nvalid ? 1.f : 0.f;
        const float raw_dt = v[1] + sbias[ch];
        const float dt = (decltype(kSoftplus)::value ? softplus(raw_dt) : raw_dt) * keep;
        dd[ch * (RS / 2) + s] = make_float2(dt, dt * v[0]);
        if (kOut) ug[ch * (RS / 2) + s] = make_float2(v[0], has_z ? v[2] * sigmoid(v[2]) : 1.f);
      };
    };
    auto fill = [&](auto kSoftplus) {
      if (staged) for_staged<T, CPB, TS, 3, false>(raw, io, staged, rows(kSoftplus));
      else for_tile<T, CPB, TS, 3>(io, c.b, c.first_d, c.count, t0, len, rows(kSoftplus));
    };
    if (p.softplus) fill(std::true_type{});
    else fill(std::false_type{});
    __syncthreads();  // the per-step rows are written; the raw buffer is free
    if (k + 1 < ntiles) {
      if (staged) {
        stager.move(io, 1);
        stager.copy(raw, io, t0 + TS);
      }
      stage_bc<NP, TS, kOut>(smem + ((k + 1) % 2) * 2 * TS * NP, Bg, Cg, t0 + TS, len);
    }
    const float* sB = smem + (k % 2) * 2 * TS * NP + n0;
    const float* sC = sB + TS * NP;
    for (int g = 0; g < t1 - t0; g += V) {
      float y[V];
#pragma unroll
      for (int i = 0; i < V; i += 2) {
        const float4 q = rdd[(g + i) / 2];
#pragma unroll
        for (int i2 = 0; i2 < 2; ++i2) {
          const float dt = i2 ? q.z : q.x, dtu = i2 ? q.w : q.y;
          float Bv[SPT];
          states_at<SPT>(sB + (g + i + i2) * NP, Bv);
#pragma unroll
          for (int n = 0; n < SPT; ++n) h[n] = fmaf(exp2f(dt * A2[n]), h[n], dtu * Bv[n]);
          if constexpr (kOut) {
            float Cv[SPT], acc = 0.f;
            states_at<SPT>(sC + (g + i + i2) * NP, Cv);
#pragma unroll
            for (int n = 0; n < SPT; ++n) acc = fmaf(Cv[n], h[n], acc);
            y[i + i2] = acc;
          }
        }
      }
      if constexpr (kOut) {
        reduce_scatter<V, TPC / 2, 1>(y);  // this lane's E steps of the group: g + off ..
        float o[E];
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const float2 r = rug[g + off + e];
          o[e] = fmaf(Dd, r.x, y[e]) * r.y;
        }
        if (outr && c.valid) store_run<T, E>(outr, p.out.sl, t0 + g + off, len, vec, o);
      }
    }
    if (p.ckpt && t1 < len && c.valid) {
      float* ck = p.ckpt + (c.row * ntiles + k) * NP + n0;
#pragma unroll
      for (int n = 0; n < SPT; ++n) ck[n] = h[n];
    }
  }
  if (p.last && c.valid)
#pragma unroll
    for (int n = 0; n < SPT; ++n)
      if (n0 + n < p.nstate) p.last[c.row * p.nstate + n0 + n] = h[n];
}

// Dynamic shared memory of the forward kernel, bytes.
template <typename T, int SPT, int TPC>
constexpr int forward_smem() {
  return ForwardSmem<T, SPT, TPC>::kFloats * 4;
}

}  // namespace selective
}  // namespace linrec
