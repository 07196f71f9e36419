// A thread's run of E consecutive steps as 16-byte vectors, and the warp-striped global accesses
// of the tile kernel (scan_tile.cuh): a warp's 32 runs moved so that each access instruction covers
// 512 contiguous bytes, rearranged through shared memory.
#pragma once
#include <cstdint>

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

// Warp-striped 16-byte accesses for a warp whose 32 x E steps all lie in the row: each access
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
  // Not the 2-byte 16-step tile over one warp, held to 64 registers (32 warps per SM,
  // scan_tile.cuh's tile_min_blocks): staging spilled there (4 bytes forward, 32 backward); bf16
  // 131072 x 1024 lost ~0.01 both ways on the H100, gained ~0.02 on the H200 (bench/NOTES.md item 74).
  static constexpr bool kOn = NT >= 32 && NT % 32 == 0 && kVectors >= 2 && !(sizeof(T) == 2 && E == 16 && NT == 32);
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
  // This lane's E steps (walk order) -> memory, striped.
  static __device__ __forceinline__ void store(T* base, int64_t ls, int64_t tf, const float (&v)[E]) {
    StepVectors<T, E> buf;
    steps_to_vectors<T, E>(v, ls, buf);
    uint4* st = stage();
    const int run0 = run(ls) * kVectors;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) st[slot(run0 + k)] = buf.u[k];
    __syncwarp();
    uint4* v0 = reinterpret_cast<uint4*>(first_vector(base, ls, tf));
#pragma unroll
    for (int k = 0; k < kVectors; ++k) v0[k * 32 + (threadIdx.x & 31)] = st[slot(k * 32 + (threadIdx.x & 31))];
    __syncwarp();
  }
};

}  // namespace linrec
