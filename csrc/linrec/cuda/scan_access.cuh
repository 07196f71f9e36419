// A thread's run of E consecutive steps in global memory: which steps of the row it holds
// (StepSpan), as 16-byte vectors (StepVectors), loaded and stored by the thread alone (load_steps,
// store_steps) or by its warp, striped (WarpStripe: each access instruction covers 512 contiguous
// bytes, rearranged through shared memory); the 2-byte backward's c and y kept packed (PackedSteps).
// The tile kernel's accesses (scan_tile.cuh).
#pragma once
#include <cstdint>
#include <type_traits>

#include "scan_common.cuh"

namespace linrec {

// A thread's E steps as E / kVec 16-byte vectors, in memory order (walk order reversed when ls < 0).
template <typename T, int E>
union StepVectors {
  static constexpr int kVec = 16 / sizeof(T);
  uint4 u[E / kVec];
  T t[E];
  // The lowest walk index among the steps of memory vector k, the vector holding those kVec steps.
  static __device__ __forceinline__ int first_step(int k, bool rev) { return rev ? E - (k + 1) * kVec : k * kVec; }
};

// A thread's E steps between 16-byte vectors (memory order) and floats in walk order.
template <typename T, int E>
__device__ __forceinline__ void vectors_to_steps(const StepVectors<T, E>& buf, int64_t ls, float (&out)[E]) {
  if (ls > 0) {
#pragma unroll
    for (int i = 0; i < E; ++i) out[i] = to_float(buf.t[i]);
  } else {
#pragma unroll
    for (int i = 0; i < E; ++i) out[i] = to_float(buf.t[E - 1 - i]);
  }
}
template <typename T, int E>
__device__ __forceinline__ void steps_to_vectors(const float (&v)[E], int64_t ls, StepVectors<T, E>& buf) {
  if (ls > 0) {
#pragma unroll
    for (int i = 0; i < E; ++i) buf.t[i] = from_float<T>(v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < E; ++i) buf.t[E - 1 - i] = from_float<T>(v[i]);
  }
}

// Which of a thread's E steps tf .. tf+E-1 lie in the sequence [0, L): [lo, hi). Only the first
// thread of a tile shifted back by its row's phase (kPhaseShift) can have lo > 0.
struct StepSpan {
  int lo, hi;
  __device__ __forceinline__ bool full(int E) const { return lo == 0 && hi == E; }
  __device__ __forceinline__ bool has(int i) const { return i >= lo && i < hi; }
};
template <int E, bool kPhaseShift = false>
__device__ __forceinline__ StepSpan step_span(int64_t tf, int64_t L) {
  const int lo = !kPhaseShift || tf >= 0 ? 0 : (-tf < E ? static_cast<int>(-tf) : E);
  const int hi = L - tf <= 0 ? 0 : (L - tf < E ? static_cast<int>(L - tf) : E);
  return {lo, hi};
}

// A row's phase for 16-byte vectors: the steps by which its tiles must start earlier so that every
// thread's E steps are whole aligned vectors (forward walk: step t at base + t, aligned when t +
// phase is a multiple of the vector; reverse walk: base - t, the run read from its last step).
template <typename T>
__device__ __forceinline__ int vector_phase(const T* base, int64_t ls) {
  constexpr int kVec = 16 / sizeof(T);
  const int m = static_cast<int>(reinterpret_cast<uintptr_t>(base) % 16 / sizeof(T));
  return ls > 0 ? m : kVec - 1 - m;
}

// The 16-byte vectors holding steps tf .. tf+E-1 (element t at base + t * ls), in memory order;
// kEdgeVectors: those holding no step of `r` read as zeros (see load_steps).
template <typename T, int E, bool kEdgeVectors>
__device__ __forceinline__ StepVectors<T, E> load_vectors(const T* base, int64_t ls, int64_t tf, StepSpan r) {
  using V = StepVectors<T, E>;
  static_assert(E % V::kVec == 0, "E must be a multiple of the 16-byte vector width");
  V buf;
  const uint4* src = reinterpret_cast<const uint4*>(ls > 0 ? base + tf : base - (tf + E - 1));
#pragma unroll
  for (int k = 0; k < E / V::kVec; ++k) {
    const int w = V::first_step(k, ls < 0);
    buf.u[k] = !kEdgeVectors || (w < r.hi && w + V::kVec > r.lo) ? src[k] : make_uint4(0u, 0u, 0u, 0u);
  }
  return buf;
}

// Loads E steps t = tf .. tf+E-1 (element t at base + t * ls); steps outside `r` get `fill`.
// `vec`: 16-byte vectors where `r` is full. kEdgeVectors: for a partial run too (a row's first or
// last thread), with the same instructions: the vectors holding a step of `r` are loaded whole
// (aligned 16 bytes holding a valid element cannot fault; they may reach up to 15 bytes past the
// tensor's data, README Limitations), the others read as zeros, and steps outside `r` hold
// whatever the vectors held (the caller neutralizes those before `r`, see load_tile_global; those
// after it reach no output).
template <typename T, int E, bool kEdgeVectors = false>
__device__ __forceinline__ void load_steps(const T* base, int64_t ls, int64_t tf, StepSpan r, bool vec, float fill,
                                           float (&out)[E]) {
  if (vec && (kEdgeVectors || r.full(E))) {
    vectors_to_steps<T, E>(load_vectors<T, E, kEdgeVectors>(base, ls, tf, r), ls, out);
    return;
  }
#pragma unroll
  for (int i = 0; i < E; ++i) out[i] = r.has(i) ? to_float(base[(tf + i) * ls]) : fill;
}

// Stores the steps of `r` (as load_steps; kEdgeVectors: whole vectors where `r` covers them, single
// elements at its edges).
template <typename T, int E, bool kEdgeVectors = false>
__device__ __forceinline__ void store_steps(T* base, int64_t ls, int64_t tf, StepSpan r, bool vec,
                                            const float (&v)[E]) {
  using V = StepVectors<T, E>;
  if (vec && (kEdgeVectors || r.full(E))) {
    V buf;
    steps_to_vectors<T, E>(v, ls, buf);
    uint4* dst = reinterpret_cast<uint4*>(ls > 0 ? base + tf : base - (tf + E - 1));
    if (!kEdgeVectors || r.full(E)) {
#pragma unroll
      for (int k = 0; k < E / V::kVec; ++k) dst[k] = buf.u[k];
      return;
    }
    if constexpr (kEdgeVectors) {
#pragma unroll
      for (int k = 0; k < E / V::kVec; ++k) {
        const int w = V::first_step(k, ls < 0);
        if (w >= r.lo && w + V::kVec <= r.hi) {
          dst[k] = buf.u[k];
        } else if (w < r.hi && w + V::kVec > r.lo) {
#pragma unroll
          for (int j = 0; j < V::kVec; ++j)  // element j of the vector is walk step w + j (reversed: from the end)
            if (r.has(ls > 0 ? w + j : w + V::kVec - 1 - j))
              reinterpret_cast<T*>(dst)[k * V::kVec + j] = buf.t[k * V::kVec + j];
        }
      }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < E; ++i)
    if (r.has(i)) base[(tf + i) * ls] = from_float<T>(v[i]);
}

// Warp-striped 16-byte accesses for a warp whose 32 x E steps lie in the row (or its first n vectors,
// where the row ends inside the warp's steps on a vector boundary: partial_vectors): each access
// instruction of the warp covers 512 contiguous bytes, and shared memory moves the vectors between
// that order and the blocked one the scan needs (lane l: steps tf .. tf+E-1, tf = the warp's first
// step + l * E). Blocked 16-byte accesses of two or more vectors per lane touch twice the sectors
// per instruction (ncu, H200: bf16 1000 x 4096 on 4096-step tiles, 50% of the sectors excess, 13.8 us
// against 8.8 us for Triton's kernel on the same tiles with striped accesses). Striped, that forward
// went from 0.69 to 0.88 of torch.add and the backward of float32 1000 x 4096 from 0.70 to 0.93
// (bench/NOTES.md item 74).
template <typename T, int E, int NT>
struct WarpStripe {
  static constexpr int kVectors = E * static_cast<int>(sizeof(T)) / 16;  // per lane
  static constexpr int kWarpVectors = 32 * kVectors;
  // The 2-byte 16-step tile over one warp too, at its 64-register cap: spill-free since the tile
  // kernel's prologue keeps no offsets in shared memory (bf16 131072 x 1024 on the H200: 0.965 /
  // 0.890 -> 0.984 / 0.904 of a vector add forward / backward; bench/NOTES.md item 75).
  static constexpr bool kOn = NT >= 32 && NT % 32 == 0 && kVectors >= 2;
  using Vectors = uint4[kVectors];

  // The shared-memory slot of the warp's vector j (memory order), swizzled so that neither the
  // striped (lane-consecutive) nor the blocked (kVectors apart) accesses of 8 lanes share banks.
  static __device__ __forceinline__ int slot(int j) { return j ^ ((j >> 3) & (kVectors - 1)); }
  static __device__ __forceinline__ uint4* stage() {
    __shared__ uint4 buffer[kOn ? NT * kVectors : 1];
    return buffer + (threadIdx.x & ~31) * kVectors;
  }
  // The warp's lowest vector (ls = +-1): lane 0 starts the walk (ls > 0) or ends it in memory.
  template <typename P>
  static __device__ __forceinline__ P* first_vector(P* base, int64_t ls, int64_t tf) {
    const int64_t w0 = tf - static_cast<int64_t>(threadIdx.x & 31) * E;
    return reinterpret_cast<P*>(ls > 0 ? base + w0 : base - (w0 + 32 * E - 1));
  }
  // Lane l's blocked run is the (l)th of the warp in memory order, or the (31 - l)th when ls < 0.
  static __device__ __forceinline__ int run(int64_t ls) { return ls > 0 ? (threadIdx.x & 31) : 31 - (threadIdx.x & 31); }

  static __device__ __forceinline__ void load(const T* base, int64_t ls, int64_t tf, Vectors& g) {
    const uint4* v0 = reinterpret_cast<const uint4*>(first_vector(base, ls, tf));
#pragma unroll
    for (int k = 0; k < kVectors; ++k) g[k] = v0[k * 32 + (threadIdx.x & 31)];
  }
  // A row's last warp, where the row ends inside the warp's steps on a vector boundary (e.g. L = 1000
  // over 512-step tiles): how many of the warp's vectors (walk order) lie before the row's end; else
  // 0 (blocked accesses: the row ends inside a vector, or a shifted row's first thread). For a warp
  // whose steps are not all in the row; warp-uniform, every lane calls it.
  static __device__ __forceinline__ int partial_vectors(int64_t tf, StepSpan r, int64_t L) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    const int64_t left = L - (tf - static_cast<int64_t>(threadIdx.x & 31) * E);  // steps from the warp's first
    const bool ok = __all_sync(0xffffffffu, r.lo == 0) && left > 0 && left < int64_t(kWarpVectors) * kVec &&
                    left % kVec == 0;
    return ok ? static_cast<int>(left / kVec) : 0;
  }
  // Whether the warp's vector j (memory order) is among its first n in walk order.
  static __device__ __forceinline__ bool in_row(int j, int64_t ls, int n) {
    return (ls > 0 ? j : kWarpVectors - 1 - j) < n;
  }
  // load of the warp's first n vectors (partial_vectors); the others read as zeros, touching no memory.
  static __device__ __forceinline__ void load_partial(const T* base, int64_t ls, int64_t tf, int n, Vectors& g) {
    const uint4* v0 = reinterpret_cast<const uint4*>(first_vector(base, ls, tf));
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < kVectors; ++k)
      g[k] = in_row(k * 32 + lane, ls, n) ? v0[k * 32 + lane] : make_uint4(0u, 0u, 0u, 0u);
  }
  // Striped vectors (from load) -> this lane's run, in memory order.
  static __device__ __forceinline__ StepVectors<T, E> gather(const Vectors& g, int64_t ls) {
    uint4* st = stage();
#pragma unroll
    for (int k = 0; k < kVectors; ++k) st[slot(k * 32 + (threadIdx.x & 31))] = g[k];
    __syncwarp();
    StepVectors<T, E> buf;
    const int run0 = run(ls) * kVectors;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) buf.u[k] = st[slot(run0 + k)];
    __syncwarp();
    return buf;
  }
  // This lane's E steps (walk order) -> memory, striped; kPartial: the warp's first n vectors only
  // (partial_vectors).
  template <bool kPartial = false>
  static __device__ __forceinline__ void store(T* base, int64_t ls, int64_t tf, const float (&v)[E], int n = 0) {
    StepVectors<T, E> buf;
    steps_to_vectors<T, E>(v, ls, buf);
    uint4* st = stage();
    const int run0 = run(ls) * kVectors;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) st[slot(run0 + k)] = buf.u[k];
    __syncwarp();
    uint4* v0 = reinterpret_cast<uint4*>(first_vector(base, ls, tf));
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < kVectors; ++k)
      if (!kPartial || in_row(k * 32 + lane, ls, n)) v0[k * 32 + lane] = st[slot(k * 32 + lane)];
    __syncwarp();
  }
};

// The 2-byte backward's c and y in the tile kernel, kept packed: E steps in walk order, two per
// 32-bit word (the even step in the low half), converted to float where read (the reduction and
// the replay read c, the replay y). Half the registers of float arrays: the 16-step tile over a
// warp fits 64 registers (bench/NOTES.md item 49).
template <typename T, int E>
struct PackedSteps {
  uint32_t w[E / 2];

  static __device__ __forceinline__ uint32_t bits(T v) { return reinterpret_cast<const unsigned short&>(v); }
  __device__ __forceinline__ float operator[](int i) const {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      return __uint_as_float(i & 1 ? w[i / 2] & 0xffff0000u : w[i / 2] << 16);
    else
      return to_float(__ushort_as_half(static_cast<unsigned short>(i & 1 ? w[i / 2] >> 16 : w[i / 2] & 0xffffu)));
  }
  __device__ __forceinline__ void set(int i, float f) {
    const uint32_t b = bits(from_float<T>(f));
    w[i / 2] = i & 1 ? (w[i / 2] & 0xffffu) | b << 16 : (w[i / 2] & 0xffff0000u) | b;
  }
};

// A thread's E steps from 16-byte vectors (memory order) into PackedSteps (walk order).
template <typename T, int E>
__device__ __forceinline__ void vectors_to_packed(const StepVectors<T, E>& buf, int64_t ls, PackedSteps<T, E>& out) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(buf.u);
#pragma unroll
  for (int j = 0; j < E / 2; ++j) out.w[j] = ls > 0 ? words[j] : __byte_perm(words[E / 2 - 1 - j], 0u, 0x1032);
}

// load_steps into PackedSteps (steps outside `r` read as zeros, or what their vector held).
template <typename T, int E, bool kEdgeVectors>
__device__ __forceinline__ void load_packed(const T* base, int64_t ls, int64_t tf, StepSpan r, bool vec,
                                            PackedSteps<T, E>& out) {
  if (vec && (kEdgeVectors || r.full(E))) {
    vectors_to_packed<T, E>(load_vectors<T, E, kEdgeVectors>(base, ls, tf, r), ls, out);
    return;
  }
#pragma unroll
  for (int j = 0; j < E / 2; ++j) {
    const uint32_t lo = r.has(2 * j) ? PackedSteps<T, E>::bits(base[(tf + 2 * j) * ls]) : 0u;
    const uint32_t hi = r.has(2 * j + 1) ? PackedSteps<T, E>::bits(base[(tf + 2 * j + 1) * ls]) : 0u;
    out.w[j] = lo | hi << 16;
  }
}

}  // namespace linrec
