// A tile of NT * E steps read from (written to) shared memory in 16-byte vectors.
//
// Thread i holds the steps [i E, (i+1) E) of the tile in walk order ("blocked"): in memory
// order its "chunk" is i (forward walk) or NT-1-i (reverse walk, elements reversed).
#pragma once
#include <cuda/ptx>
#include "scan_common.cuh"

namespace linrec {

// The elements of a 16-byte vector as float.
template <typename T> __device__ __forceinline__ void unpack_vec(uint4 u, float (&f)[16 / sizeof(T)]);
template <> __device__ __forceinline__ void unpack_vec<float>(uint4 u, float (&f)[4]) {
  f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
}
template <> __device__ __forceinline__ void unpack_vec<__half>(uint4 u, float (&f)[8]) {
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    f[2 * k] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] & 0xffffu)));
    f[2 * k + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] >> 16)));
  }
}
template <> __device__ __forceinline__ void unpack_vec<__nv_bfloat16>(uint4 u, float (&f)[8]) {
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // a bfloat16 is the high half of a float32
    f[2 * k] = __uint_as_float(w[k] << 16);
    f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

// A 16-byte vector of T from floats (round to nearest even).
template <typename T> __device__ __forceinline__ uint4 pack_vec(const float (&f)[16 / sizeof(T)]);
template <> __device__ __forceinline__ uint4 pack_vec<float>(const float (&f)[4]) {
  return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
}
__device__ __forceinline__ unsigned short bits_of(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ unsigned short bits_of(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
template <typename T>
__device__ __forceinline__ unsigned pack_pair(float lo, float hi) {
  return static_cast<unsigned>(bits_of(from_float<T>(lo))) | static_cast<unsigned>(bits_of(from_float<T>(hi))) << 16;
}
template <> __device__ __forceinline__ uint4 pack_vec<__half>(const float (&f)[8]) {
  return make_uint4(pack_pair<__half>(f[0], f[1]), pack_pair<__half>(f[2], f[3]), pack_pair<__half>(f[4], f[5]),
                    pack_pair<__half>(f[6], f[7]));
}
template <> __device__ __forceinline__ uint4 pack_vec<__nv_bfloat16>(const float (&f)[8]) {
  return make_uint4(pack_pair<__nv_bfloat16>(f[0], f[1]), pack_pair<__nv_bfloat16>(f[2], f[3]),
                    pack_pair<__nv_bfloat16>(f[4], f[5]), pack_pair<__nv_bfloat16>(f[6], f[7]));
}

// `take ? a : b` as explicit selects: written as a conditional copy, the compiler turns the
// selection among a thread's vectors back into a dynamically indexed array in local memory.
__device__ __forceinline__ unsigned select_word(bool take, unsigned a, unsigned b) {
  unsigned r;
  asm("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %3, 0;\n\tselp.b32 %0, %1, %2, p;\n\t}"
      : "=r"(r)
      : "r"(a), "r"(b), "r"(static_cast<unsigned>(take)));
  return r;
}
__device__ __forceinline__ uint4 select_vec(bool take, uint4 a, uint4 b) {
  return make_uint4(select_word(take, a.x, b.x), select_word(take, a.y, b.y), select_word(take, a.z, b.z),
                    select_word(take, a.w, b.w));
}

// A thread's chunk is kNV 16-byte vectors, 16 kNV bytes apart between threads, so in-order
// accesses by the 8 threads of one shared-memory wavefront would hit the same banks: each
// thread starts at vector `rotation` of its chunk instead and reorders with selects.
template <int kNV>
__device__ __forceinline__ int rotation(int chunk) {
  return kNV >= 8 ? (chunk & (kNV - 1)) : (chunk / (8 / kNV)) & (kNV - 1);
}

// Reads thread threadIdx.x's E steps from `tile` (NT * E elements in memory order).
template <typename T, int E, int NT>
__device__ __forceinline__ void read_chunk(const T* tile, bool rev, float (&out)[E]) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T)), kNV = E / kVec;
  static_assert(E % kVec == 0 && (kNV & (kNV - 1)) == 0 && kNV <= 8, "a power of two of vectors, at most 8");
  const int chunk = rev ? NT - 1 - static_cast<int>(threadIdx.x) : threadIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(tile) + chunk * kNV;
  const int r = rotation<kNV>(chunk);
  uint4 got[kNV];
#pragma unroll
  for (int k = 0; k < kNV; ++k) got[k] = src[(k + r) & (kNV - 1)];
#pragma unroll
  for (int j = 0; j < kNV; ++j) {  // vector j of the chunk was read at instruction (j - r) mod kNV
    uint4 u = got[0];
#pragma unroll
    for (int k = 1; k < kNV; ++k) u = select_vec(((j - r) & (kNV - 1)) == k, got[k], u);
    float f[kVec];
    unpack_vec<T>(u, f);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if (!rev) out[j * kVec + e] = f[e];
      else out[E - 1 - (j * kVec + e)] = f[e];
    }
  }
}

// Writes thread threadIdx.x's E steps into `tile` (the layout read_chunk reads, the same
// rotation against bank conflicts).
template <typename T, int E, int NT>
__device__ __forceinline__ void write_chunk(T* tile, bool rev, const float (&in)[E]) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T)), kNV = E / kVec;
  static_assert(E % kVec == 0 && (kNV & (kNV - 1)) == 0 && kNV <= 8, "a power of two of vectors, at most 8");
  const int chunk = rev ? NT - 1 - static_cast<int>(threadIdx.x) : threadIdx.x;
  uint4* dst = reinterpret_cast<uint4*>(tile) + chunk * kNV;
  const int r = rotation<kNV>(chunk);
  uint4 packed[kNV];
#pragma unroll
  for (int j = 0; j < kNV; ++j) {  // vector j in memory order
    float f[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) f[e] = rev ? in[E - 1 - (j * kVec + e)] : in[j * kVec + e];
    packed[j] = pack_vec<T>(f);
  }
#pragma unroll
  for (int k = 0; k < kNV; ++k) {  // instruction k writes vector (k + r) mod kNV
    uint4 u = packed[0];
#pragma unroll
    for (int m = 1; m < kNV; ++m) u = select_vec(((k + r) & (kNV - 1)) == m, packed[m], u);
    dst[(k + r) & (kNV - 1)] = u;
  }
}

// Stores a full tile's output `out` (NT * E steps from walk step t0 of the sequence at `base`;
// rev: walked downwards in memory) through `buf` (NT * E elements of shared memory that only this
// thread's warp touches in its span): each thread writes its E steps where write_chunk puts them,
// then the warp stores its span (32 E contiguous elements): kBulk, lane 0 with one bulk copy,
// waiting until it has read `buf`; else the lanes, every instruction covering 512 contiguous
// bytes. Stored straight from registers, a thread's E steps are two or more 16-byte vectors 16 E
// bytes apart between lanes, so each instruction writes every 32-byte sector it touches in halves
// (bench/NOTES.md items 55 and 58).
template <typename T, int E, int NT, bool kBulk>
__device__ __forceinline__ void store_span_by_warps(T* buf, T* base, int64_t t0, bool rev, const float (&out)[E]) {
  static_assert(NT % 32 == 0, "whole warps");  // (write_chunk asserts whole vectors)
  constexpr int kNV = E * static_cast<int>(sizeof(T)) / 16;
  constexpr int64_t kTile = int64_t(E) * NT;
  write_chunk<T, E, NT>(buf, rev, out);
  if constexpr (kBulk) cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // visible to the bulk copy
  __syncwarp();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int first = (rev ? NT - 32 * (warp + 1) : 32 * warp) * kNV;  // the warp's first vector in memory order
  const uint4* src = reinterpret_cast<const uint4*>(buf) + first;
  uint4* dst = reinterpret_cast<uint4*>(rev ? base - (t0 + kTile - 1) : base + t0) + first;
  if constexpr (kBulk) {
    if (lane == 0) {
      cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, dst, src, 32u * kNV * 16u);
      cuda::ptx::cp_async_bulk_commit_group();
      cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
    }
  } else {
#pragma unroll
    for (int j = 0; j < kNV; ++j) dst[j * 32 + lane] = src[j * 32 + lane];
  }
  __syncwarp();  // the span is read before the next output overwrites it
}

}  // namespace linrec
