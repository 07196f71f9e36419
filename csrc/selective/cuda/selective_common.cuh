// CUDA kernels of the selective scan (linrec::selective_scan; math in
// torch_linrec/selective/reference.py, after Gu & Dao 2023, "Mamba", Algorithm 2):
//   dt[l] = softplus(delta[l] + bias),  h[n,l] = exp(dt A[n]) h[n,l-1] + dt B[n,l] u[l],
//   y[l] = sum_n C[n,l] h[n,l] + D u[l],  out[l] = y[l] silu(z[l]).
//
// One pass over L per channel: a thread owns SPT states of one (batch, channel) row and walks the
// steps in order, its states in registers; the TPC = NP / SPT threads of a channel are adjacent
// lanes. A block's channels share their B and C rows (one group of each), so B and C are staged
// per tile of TS steps in shared memory with cp.async, the next tile in flight while the block
// computes the current one. So are the raw per-step inputs of a tile (u, delta, z; the backward adds
// the output gradient), as 16-byte vectors along the contiguous dim (WindowStager; element loads by
// for_tile where the layout does not allow it), turned once per (channel, step) into shared-memory
// rows (dt, dt u, silu(z), ...).
// The forward's lanes reduce-scatter y's partial sums of a group of steps, each lane finishing and
// storing its own steps.
//
// Backward: a states-only forward first stores the state after every tile (the only (batch, dim,
// L / TS, N) buffer). The backward kernel walks tiles from the last: it stages the block's per-step
// rows, recomputes the states entering each 4-step sub-chunk, then for each sub-chunk from the
// last recomputes its states and decays exp(dt A) into registers and runs the adjoint
// g[n,l] = C[n,l] dy[l] + exp(dt[l+1] A[n]) g[n,l+1] backwards. dB and dC sum over the channels of
// a group: the lanes of a warp reduce-scatter them with shuffles into a warp-private shared slice,
// added to global memory with vector atomics after each sub-chunk (by the warp, or summed over the
// block first at large N).
#pragma once
#include <type_traits>

#include "../../linrec/cuda/scan_common.cuh"  // to_float, from_float
#include "params.h"

namespace linrec {
namespace selective {

constexpr int kThreads = 128;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

// A[d, n0 + n] log2(e) for the exp2 of the kernels, 0 for padded states (n0 + n >= nstate).
template <int SPT>
__device__ __forceinline__ void load_a2(const SelectiveParams& p, int64_t d, int n0, float (&A2)[SPT]) {
#pragma unroll
  for (int n = 0; n < SPT; ++n) A2[n] = n0 + n < p.nstate ? p.A[d * p.nstate + n0 + n] * kLog2e : 0.f;
}

// log(1 + e^x) to float32 accuracy with fast exp/log: the series below e^x < 2^-6. Branch-free
// (both forms computed, then selected): it runs once per (channel, step) in the tile loaders, where
// branches made each element a divergent region.
__device__ __forceinline__ float softplus(float x) {
  const float e = __expf(x);
  const float series = e * (1.f - e * (0.5f - e * (1.f / 3.f)));
  const float y = x > -4.f ? __logf(1.f + e) : series;
  return x > 20.f ? x : y;
}
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

template <typename T>
__device__ __forceinline__ T* row(const Strided3& t, int64_t b, int64_t d) {
  return static_cast<T*>(t.p) + b * t.sb + d * t.sd;
}

template <typename T> __device__ __forceinline__ uint32_t bits(T v);
template <> __device__ __forceinline__ uint32_t bits<float>(float v) { return __float_as_uint(v); }
template <> __device__ __forceinline__ uint32_t bits<__half>(__half v) { return __half_as_ushort(v); }
template <> __device__ __forceinline__ uint32_t bits<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }

template <typename T> __device__ __forceinline__ float from_bits(uint32_t w);
template <> __device__ __forceinline__ float from_bits<float>(uint32_t w) { return __uint_as_float(w); }
template <> __device__ __forceinline__ float from_bits<__half>(uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w)));
}
template <> __device__ __forceinline__ float from_bits<__nv_bfloat16>(uint32_t w) { return __uint_as_float(w << 16); }

// Element e of a 16-byte vector of T, as float.
template <typename T>
__device__ __forceinline__ float lane_of(const uint4& w, int e) {
  const uint32_t word = (e * sizeof(T)) / 4 == 0 ? w.x : (e * sizeof(T)) / 4 == 1 ? w.y : (e * sizeof(T)) / 4 == 2 ? w.z : w.w;
  if constexpr (sizeof(T) == 4) return from_bits<T>(word);
  else return from_bits<T>((word >> (16 * (e % 2))) & 0xffffu);
}

// The raw bits of one element, loaded as an integer: cuda_bf16.h converts with inline asm, which
// would make each load complete before the next is issued; converting later (from_bits) keeps a
// thread's loads in flight together.
template <typename T>
__device__ __forceinline__ uint32_t load_bits(const T* p) {
  if constexpr (sizeof(T) == 2) return __ldg(reinterpret_cast<const unsigned short*>(p));
  else return __ldg(reinterpret_cast<const unsigned int*>(p));
}

// Calls f(ch, s, v) for every element of a block's window of NT (batch, dim, len) tensors: channels
// d0 + ch for ch < CPB, steps t0 + s for s < TS; v[k] = tensor k's value, 0 for a null tensor and
// outside `count` channels or `len` steps. Element loads, consecutive threads along the contiguous
// dim, a thread's loads issued before any conversion: the path of windows that WindowStager cannot
// copy as 16-byte vectors.
template <typename T, int CPB, int TS, int NT, typename F>
__device__ __forceinline__ void for_tile(const Strided3 (&ts)[NT], int64_t b, int64_t d0, int count, int64_t t0,
                                         int64_t len, F&& f) {
  const bool steps_fast = ts[0].sl == 1;
  constexpr int K = (CPB * TS + kThreads - 1) / kThreads, KC = K < 8 ? K : 8;
#pragma unroll 1
  for (int k0 = 0; k0 < K; k0 += KC) {
    uint32_t w[KC][NT];
#pragma unroll
    for (int k = 0; k < KC; ++k) {
      const int i = threadIdx.x + (k0 + k) * kThreads;
      const int ch = steps_fast ? i / TS : i % CPB, s = steps_fast ? i % TS : i / CPB;
      const bool in = i < CPB * TS && ch < count && t0 + s < len;
#pragma unroll
      for (int t = 0; t < NT; ++t)
        w[k][t] = in && ts[t].p ? load_bits<T>(row<const T>(ts[t], b, d0 + ch) + (t0 + s) * ts[t].sl) : 0u;
    }
#pragma unroll
    for (int k = 0; k < KC; ++k) {
      const int i = threadIdx.x + (k0 + k) * kThreads;
      if (i >= CPB * TS) continue;
      float v[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) v[t] = from_bits<T>(w[k][t]);
      f(steps_fast ? i / TS : i % CPB, steps_fast ? i % TS : i / CPB, v);
    }
  }
}

// E consecutive steps of one row from float values: 4-, 8- or 16-byte stores where `vec` (unit step
// stride, aligned row; l a multiple of E) and the E steps are inside len, else one element at a time.
template <typename T, int E>
__device__ __forceinline__ void store_run(T* r, int64_t sl, int64_t l, int64_t len, bool vec, const float (&v)[E]) {
  constexpr int kBytes = E * static_cast<int>(sizeof(T));
  if constexpr (kBytes % 4 == 0 && kBytes <= 16) {
    if (vec && l + E <= len) {
      constexpr int W = kBytes / 4, kPerWord = 4 / sizeof(T);
      uint32_t w[W];
#pragma unroll
      for (int k = 0; k < W; ++k) {
        w[k] = 0;
#pragma unroll
        for (int j = 0; j < kPerWord; ++j) w[k] |= bits<T>(from_float<T>(v[k * kPerWord + j])) << (16 * j);
      }
      if constexpr (W == 4) *reinterpret_cast<uint4*>(r + l) = make_uint4(w[0], w[1], w[2], w[3]);
      else if constexpr (W == 2) *reinterpret_cast<uint2*>(r + l) = make_uint2(w[0], w[1]);
      else *reinterpret_cast<uint32_t*>(r + l) = w[0];
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < E; ++i)
    if (l + i < len) r[(l + i) * sl] = from_float<T>(v[i]);
}

// Reduce-scatter over lane bits M, M/2, ..., LO: each level halves the CNT values a lane holds, adding
// its partner's other half (the lane with the bit set keeps the upper half). Leaves CNT / (M / LO * 2)
// sums per lane: those of original index reduce_scatter_offset(lane) onwards.
template <int CNT, int M, int LO>
__device__ __forceinline__ void reduce_scatter(float* v) {
  if constexpr (M >= LO && LO >= 1) {
    constexpr int H = CNT / 2;
    const bool hi = threadIdx.x & M;
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const float send = hi ? v[i] : v[i + H];
      const float keep = hi ? v[i + H] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, M);
    }
    reduce_scatter<H, M / 2, LO>(v);
  }
}
template <int CNT, int M, int LO>
__device__ __forceinline__ int reduce_scatter_offset(int lane) {
  if constexpr (M >= LO && LO >= 1) return (lane & M ? CNT / 2 : 0) + reduce_scatter_offset<CNT / 2, M / 2, LO>(lane);
  else return 0;
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool full) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(full ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Starts copying steps [t0, t0 + TS) of the block's B and C rows ((len, NP) float32, contiguous)
// into `dst` (B then C, TS x NP floats each; B only when !kC); steps past len read as zero.
template <int NP, int TS, bool kC = true>
__device__ __forceinline__ void stage_bc(float* dst, const float* B, const float* C, int64_t t0, int64_t len) {
  constexpr int kVecs = TS * NP / 4, kAll = (kC ? 2 : 1) * kVecs, K = (kAll + kThreads - 1) / kThreads;
  const float* Bt = B + t0 * NP;
  const float* Ct = C + t0 * NP;
  const int steps = static_cast<int>(min(len - t0, static_cast<int64_t>(TS)));  // t0 < len
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = threadIdx.x + k * kThreads;
    if (kAll % kThreads != 0 && i >= kAll) break;
    const int j = i < kVecs ? i : i - kVecs;
    const bool full = (4 * j) / NP < steps;
    cp_async16(dst + 4 * i, full ? (i < kVecs ? Bt : Ct) + 4 * j : B, full);
  }
  cp_async_commit();
}

// Copies 16 bytes of which the first `bytes` come from `src` (the rest zero-filled; none read
// when 0).
__device__ __forceinline__ void cp_async16_partial(void* dst, const void* src, int bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(bytes));
}

// How a block's per-step window can be staged by cp.async as whole 16-byte vectors: along steps
// (kStepVectors: every row read is aligned with unit step stride) or along channels
// (kChannelVectors: a whole block of aligned channels); kScalarLoads: it cannot (for_tile loads it).
template <typename T, int CPB>
__device__ __forceinline__ int staged_loads(int loads, int count, int64_t d0) {
  constexpr int VE = 16 / sizeof(T);
  if (loads == kStepVectors) return kStepVectors;
  if (CPB >= VE && CPB % VE == 0 && loads == kChannelVectors && count == CPB && d0 % VE == 0) return kChannelVectors;
  return kScalarLoads;
}

// Vectors of a staged (CPB, TS) window of one tensor, and where vector i lies: channel ch, step s
// (its first element; the next VE - 1 follow along steps or along channels by `mode`). A thread
// holds vectors threadIdx.x + k kThreads, k < K.
template <typename T, int CPB, int TS>
struct StagedWindow {
  static constexpr int VE = 16 / sizeof(T), NV = CPB * TS / VE, K = (NV + kThreads - 1) / kThreads;
  static constexpr int RV = TS / VE, CV = CPB >= VE ? CPB / VE : 1;
  static __device__ __forceinline__ void at(int mode, int i, int* ch, int* s) {
    if (mode == kStepVectors) *ch = i / RV, *s = (i % RV) * VE;
    else *s = i / CV, *ch = (i % CV) * VE;
  }
  static __device__ __forceinline__ bool holds(int i) { return NV % kThreads == 0 || i < NV; }
};

// Copies a block's windows (channels d0 .. d0 + CPB, steps t0 .. t0 + TS) of NT tensors into `raw`
// (NT x NV vectors, tensor-major, in StagedWindow order) by cp.async, tile after tile: the 64-bit
// addresses of a thread's vectors are computed once, then move by whole tiles. What lies outside
// `count` channels or `len` steps reads as zero. `mode`: staged_loads' result, not kScalarLoads.
// copy() joins the caller's next cp.async group (no commit here).
template <typename T, int CPB, int TS, int NT>
struct WindowStager {
  using W = StagedWindow<T, CPB, TS>;
  const T* src[W::K][NT];  // the vector's first element in the current tile (null for a null tensor)
  int64_t end[W::K];       // len - the vector's step in a tile; 0 for channels outside count
  bool along_steps;

  __device__ __forceinline__ WindowStager(const Strided3 (&ts)[NT], int mode, int64_t b, int64_t d0, int count,
                                          int64_t t0, int64_t len)
      : along_steps(mode == kStepVectors) {
#pragma unroll
    for (int k = 0; k < W::K; ++k) {
      int ch, s;
      W::at(mode, threadIdx.x + k * kThreads, &ch, &s);
      end[k] = !along_steps || ch < count ? len - s : 0;
#pragma unroll
      for (int t = 0; t < NT; ++t)
        src[k][t] = ts[t].p ? row<const T>(ts[t], b, d0 + ch) + (t0 + s) * ts[t].sl : nullptr;
    }
  }
  // Starts copying the window of the tile at t0 (where the addresses are).
  __device__ __forceinline__ void copy(uint4* raw, const Strided3 (&ts)[NT], int64_t t0) const {
#pragma unroll
    for (int k = 0; k < W::K; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (!W::holds(i)) break;
      const int64_t left = end[k] - t0;  // steps of the vector's row from its first step to len
      const int bytes = left <= 0 ? 0 : !along_steps || left >= W::VE ? 16 : static_cast<int>(left) * sizeof(T);
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (ts[t].p) cp_async16_partial(raw + t * W::NV + i, bytes ? src[k][t] : ts[t].p, bytes);
    }
  }
  // Moves the addresses by `tiles` tiles along L.
  __device__ __forceinline__ void move(const Strided3 (&ts)[NT], int tiles) {
#pragma unroll
    for (int k = 0; k < W::K; ++k)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (src[k][t]) src[k][t] += tiles * TS * ts[t].sl;
  }
};

// for_tile over a window staged by WindowStager (complete and visible to the block): for_staged
// calls f(ch, s, v) for every element, v[k] = tensor k's value (0 for a null tensor and outside the
// window's channels and steps); staged_vector does it for the VE elements of vector i.
template <typename T, int CPB, int TS, int NT, typename F>
__device__ __forceinline__ void staged_vector(const uint4* raw, const Strided3 (&ts)[NT], int i, bool along_steps, F& f) {
  using W = StagedWindow<T, CPB, TS>;
  uint4 w[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) w[t] = ts[t].p ? raw[t * W::NV + i] : make_uint4(0, 0, 0, 0);
  int ch, s;
  W::at(along_steps ? kStepVectors : kChannelVectors, i, &ch, &s);
#pragma unroll
  for (int e = 0; e < W::VE; ++e) {
    float v[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) v[t] = lane_of<T>(w[t], e);
    if (along_steps) f(ch, s + e, v);
    else f(ch + e, s, v);
  }
}
template <typename T, int CPB, int TS, int NT, int kMode, bool kUnrolled, typename F>
__device__ __forceinline__ void for_staged_as(const uint4* raw, const Strided3 (&ts)[NT], F& f) {
  using W = StagedWindow<T, CPB, TS>;
  if constexpr (kUnrolled) {
#pragma unroll
    for (int k = 0; k < W::K; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (!W::holds(i)) break;
      staged_vector<T, CPB, TS, NT>(raw, ts, i, kMode == kStepVectors, f);
    }
  } else {
#pragma unroll 1
    for (int i = threadIdx.x; i < W::NV; i += kThreads)
      staged_vector<T, CPB, TS, NT>(raw, ts, i, kMode == kStepVectors, f);
  }
}
// One loop per staging mode (`mode`: staged_loads' result, not kScalarLoads), so no element tests
// the mode. kUnrolled: a thread's vectors unrolled, else a rolled loop; only the code's shape
// changes, and the kernels take what measured faster for them (near their register bounds the shape
// decides whether they spill; bench/NOTES.md item 34).
template <typename T, int CPB, int TS, int NT, bool kUnrolled, typename F>
__device__ __forceinline__ void for_staged(const uint4* raw, const Strided3 (&ts)[NT], int mode, F&& f) {
  if (mode == kStepVectors) for_staged_as<T, CPB, TS, NT, kStepVectors, kUnrolled>(raw, ts, f);
  else for_staged_as<T, CPB, TS, NT, kChannelVectors, kUnrolled>(raw, ts, f);
}

// The SPT values of state n0 onwards at one step of a staged (TS, NP) tile.
template <int SPT>
__device__ __forceinline__ void states_at(const float* tile, float (&out)[SPT]) {
#pragma unroll
  for (int k = 0; k < SPT / 4; ++k) {
    const float4 v = reinterpret_cast<const float4*>(tile)[k];
    out[4 * k] = v.x, out[4 * k + 1] = v.y, out[4 * k + 2] = v.z, out[4 * k + 3] = v.w;
  }
}

// Sum over the TPC adjacent lanes of a channel.
template <int TPC>
__device__ __forceinline__ float channel_sum(float v) {
#pragma unroll
  for (int m = 1; m < TPC; m *= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

struct Groups {
  int64_t b, c, segment;  // groups of B, of C; channels in a segment (dim / lcm of both)
};

// The channel a thread works on. Blocks cover one (batch, segment) each, so that the block's
// channels share their B and C rows.
struct Channel {
  int64_t b, d, row, first_d;  // row = b * dim + d; first_d: the block's first channel
  int64_t gb, gc;              // groups of B and C
  int count;                   // channels of the block inside the segment
  bool valid;
};

template <int CPB>
__device__ __forceinline__ Channel channel_of(const SelectiveParams& p, const Groups& grp) {
  const int64_t blocks_per_seg = (grp.segment + CPB - 1) / CPB;
  const int64_t seg = blockIdx.x / blocks_per_seg;
  const int64_t first = (blockIdx.x - seg * blocks_per_seg) * CPB;
  const int64_t groups = p.dim / grp.segment;
  Channel c;
  c.b = seg / groups;
  c.first_d = (seg - c.b * groups) * grp.segment + first;
  c.count = static_cast<int>(min(static_cast<int64_t>(CPB), grp.segment - first));
  int in_block = threadIdx.x / (kThreads / CPB);
  c.valid = in_block < c.count;
  if (!c.valid) in_block = c.count - 1;  // computes a real channel's steps, stores nothing
  c.d = c.first_d + in_block;
  c.row = c.b * p.dim + c.d;
  c.gb = c.d / (p.dim / grp.b);
  c.gc = c.d / (p.dim / grp.c);
  return c;
}

}  // namespace selective
}  // namespace linrec
