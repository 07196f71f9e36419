// Device building blocks shared by the scan kernels: dtype conversion, the affine-map
// monoid of the recurrence, sequence offsets and the decoupled look-back.
//
// The recurrence h_t = c_t h_{t-1} + x_t composes affine maps h -> a h + b:
// (a1, b1) then (a2, b2) is (a1 a2, b1 a2 + b2), an associative (not commutative)
// operator, so any contiguous span of steps reduces to one map (Blelloch 1990; the
// linrec article, Part I). Spans handled by different blocks are chained with the
// single-pass decoupled look-back of Merrill & Garland, "Single-pass Parallel Prefix
// Scan with Decoupled Look-back" (NVIDIA TR 2016-002).
#pragma once
#include <cuda/atomic>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

#include "../params.h"

namespace linrec {

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

struct Affine {
  float a, b;  // h -> a * h + b
};

// The state after a step (or map) a, b from the state h before it: a * h + b. kReset (segmented
// rows): a map whose a is 0, a row start, gives b without multiplying h, so that a non-finite
// state (0 * Inf is NaN) stays in its row; the same bits for a finite h up to a zero's sign.
template <bool kReset = false>
__device__ __forceinline__ float apply_map(float a, float h, float b) {
  return kReset && a == 0.f ? b : fmaf(a, h, b);
}

// `first`, then `second`.
template <bool kReset = false>
struct ComposeOpT {
  __device__ __forceinline__ Affine operator()(const Affine& first, const Affine& second) const {
    if (kReset && second.a == 0.f) return second;
    return {first.a * second.a, fmaf(first.b, second.a, second.b)};
  }
};
using ComposeOp = ComposeOpT<false>;

// Batch index of flat sequence `seq` (innermost dim first) and per-slot offsets from it.
struct SeqIndex {
  int64_t idx[kMaxBatchDims];
  __device__ __forceinline__ SeqIndex(const ScanParams& p, int64_t seq) {
#pragma unroll
    for (int i = 0; i < kMaxBatchDims; ++i) {
      idx[i] = 0;
      if (i + 1 == p.nbatch) {
        idx[i] = seq;  // the outermost dim: seq < bsize[i]
      } else if (i < p.nbatch) {
        // 32-bit division where both fit (a 64-bit one is a long software sequence)
        const int64_t q = seq <= INT32_MAX && p.bsize[i] <= INT32_MAX
                              ? static_cast<int64_t>(static_cast<uint32_t>(seq) / static_cast<uint32_t>(p.bsize[i]))
                              : seq / p.bsize[i];
        idx[i] = seq - q * p.bsize[i];
        seq = q;
      }
    }
  }
  __device__ __forceinline__ int64_t offset(const ScanParams& p, int slot) const {
    int64_t off = 0;
#pragma unroll
    for (int i = 0; i < kMaxBatchDims; ++i)
      if (i < p.nbatch) off += idx[i] * p.bstride[slot][i];
    return off;
  }
};

template <typename T>
__device__ __forceinline__ T* slot_ptr(const ScanParams& p, int slot, int64_t offset) {
  return p.ptr[slot] ? static_cast<T*>(p.ptr[slot]) + offset : nullptr;
}

// Adds a thread's gradient values g[lo..n) of steps tf+lo .. tf+n-1 into the float32 buffer
// `acc` (stride ls along the scan). With ls == 0 (coeffs constant along the scan) the thread
// sums first; `warp_uniform_address`: every lane adds to the same address, so the warp sums too.
template <int E>
__device__ __forceinline__ void accumulate_steps(float* acc, int64_t ls, int64_t tf, int lo, int n,
                                                 const float (&g)[E], bool warp_uniform_address) {
  if (ls != 0) {
#pragma unroll
    for (int i = 0; i < E; ++i)
      if (i >= lo && i < n) atomicAdd(acc + (tf + i) * ls, g[i]);
    return;
  }
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < E; ++i) sum += i >= lo && i < n ? g[i] : 0.f;
  if (warp_uniform_address) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
    if ((threadIdx.x & 31) == 0 && sum != 0.f) atomicAdd(acc, sum);
  } else if (n > 0) {
    atomicAdd(acc, sum);
  }
}

// Status of every (sequence, chunk) for the decoupled look-back: two 64-bit words per
// entry, each holding a flag (high half) and a float (low half). Word 0: (kAggregate, a).
// Word 1: (kAggregate, b), later overwritten by (kInclusive, state after the chunk). An entry is
// read with one 16-byte load (one round trip; each word is read whole, but the pair is not
// atomic): a reader that sees word 1 flagged kAggregate but word 0 still zero polls again. The
// counter and the status are zero at launch: zeroed before it, or left zero by the launch before
// on the same stream, which cleans the region its predecessor used (launch.h).
struct LookbackState {
  unsigned long long* counter;  // dynamic chunk order: blocks take ids in the order they start
  unsigned long long* status;   // 2 words per entry, 16-byte aligned
  uint4* clean;                 // a region to zero, `clean_vectors` 16-byte words (or none)
  int64_t clean_vectors;

  // Zeroes this block's share of the region to clean (every block calls it once, all threads).
  __device__ __forceinline__ void clean_up() const {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < clean_vectors; i += stride)
      clean[i] = make_uint4(0u, 0u, 0u, 0u);
  }

  static constexpr unsigned kAggregate = 1, kInclusive = 2;

  __device__ __forceinline__ static unsigned long long pack(unsigned flag, float v) {
    return static_cast<unsigned long long>(flag) << 32 | __float_as_uint(v);
  }
  __device__ __forceinline__ static unsigned flag_of(unsigned long long w) { return static_cast<unsigned>(w >> 32); }
  __device__ __forceinline__ static float value_of(unsigned long long w) {
    return __uint_as_float(static_cast<unsigned>(w));
  }
  // Whether a read entry holds an inclusive prefix or a complete aggregate.
  __device__ __forceinline__ static bool ready(unsigned long long w0, unsigned long long w1) {
    return flag_of(w1) == kInclusive || (flag_of(w1) == kAggregate && flag_of(w0) == kAggregate);
  }
  __device__ __forceinline__ void load_entry(int64_t i, unsigned long long& w0, unsigned long long& w1) const {
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(w0), "=l"(w1) : "l"(status + 2 * i) : "memory");
  }
  // Polls entry i until it is ready.
  __device__ __forceinline__ void wait_entry(int64_t i, unsigned long long& w0, unsigned long long& w1) const {
    do load_entry(i, w0, w1);
    while (!ready(w0, w1));
  }

  __device__ __forceinline__ void publish_aggregate(int64_t i, Affine agg) const {
    asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(status + 2 * i), "l"(pack(kAggregate, agg.a)),
                 "l"(pack(kAggregate, agg.b))
                 : "memory");
  }
  __device__ __forceinline__ void publish_inclusive(int64_t i, float h) const {
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>(status[2 * i + 1])
        .store(pack(kInclusive, h), cuda::memory_order_relaxed);
  }

  // State before chunk `chunk` (> 0) of a sequence whose chunk k lives at index base + k * step.
  // Predecessors started before this block (dynamic order), so the spin always ends.
  __device__ __forceinline__ float look_back(int64_t base, int64_t step, int64_t chunk) const {
    float p = 1.f, q = 0.f;  // state before `chunk` = p * (state after chunk k) + q
    for (int64_t k = chunk - 1;; --k) {
      unsigned long long w0, w1;
      wait_entry(base + k * step, w0, w1);
      if (flag_of(w1) == kInclusive) return fmaf(p, value_of(w1), q);
      q = fmaf(p, value_of(w1), q);
      p *= value_of(w0);
    }
  }

  // Same as look_back, run by a whole warp over one sequence: each lane reads one of 32
  // predecessors per round trip (lane 0 the nearest); the aggregates before the nearest
  // inclusive prefix are composed with an ordered shuffle reduction. Returns the state on
  // every lane. Chunk 0 always publishes an inclusive prefix, so lanes past it never count.
  // (Polling again only the entries nearer than the nearest inclusive prefix, or reading 64 or
  // 128 entries per round, measured no faster: bench/NOTES.md item 32.)
  __device__ __forceinline__ float warp_look_back(int64_t base, int64_t step, int64_t chunk) const {
    const int lane = threadIdx.x & 31;
    float p = 1.f, q = 0.f;
    for (int64_t hi = chunk - 1;; hi -= 32) {
      const int64_t k = hi - lane;
      unsigned long long w0 = 0, w1 = pack(kInclusive, 0.f);
      if (k >= 0) wait_entry(base + k * step, w0, w1);
      const bool found = flag_of(w1) == kInclusive;
      const unsigned inclusive = __ballot_sync(0xffffffffu, found);
      const int stop = inclusive ? __ffs(inclusive) - 1 : 32;
      float a = value_of(w0), b = value_of(w1);
      if (lane >= stop) a = 1.f, b = 0.f;
      // Ordered reduction: lane 0 ends with map_0 o map_1 o ... o map_31 (map_0 applied last).
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const float a2 = __shfl_down_sync(0xffffffffu, a, d), b2 = __shfl_down_sync(0xffffffffu, b, d);
        if (lane + d < 32) {
          b = fmaf(a, b2, b);
          a *= a2;
        }
      }
      a = __shfl_sync(0xffffffffu, a, 0);
      b = __shfl_sync(0xffffffffu, b, 0);
      if (stop < 32) {
        const float h = __shfl_sync(0xffffffffu, value_of(w1), stop);
        return fmaf(p, fmaf(a, h, b), q);
      }
      q = fmaf(p, b, q);
      p *= a;
    }
  }
};

}  // namespace linrec
