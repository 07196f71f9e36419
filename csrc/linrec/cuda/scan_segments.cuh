// Segmented rows in the tile kernel (ScanParams::seg_len = S; plan_segments.h segment_rows): a sequence holds
// whole rows of S steps back to back. The step at each row start in walk order forgets the state
// before it (coefficient 0): the affine maps' scan needs no segment flags.
#pragma once
#include <type_traits>

#include "scan_common.cuh"
#include "scan_access.cuh"

namespace linrec {

// Step i of a thread's operands: a float array, or packed 2-byte steps (their set()).
template <typename A>
__device__ __forceinline__ void set_step(A& a, int i, float f) {
  if constexpr (std::is_array_v<A>) a[i] = f;
  else a.set(i, f);
}

// `c` and `yn` as scan_tile_registers takes them (the backward's shifted, shift_backward_operands):
// c at each row start becomes 0, and in the backward the forward row start's y[t+1] is the zero
// initial state; steps past the sequence (r.hi) stay identities.
template <int E, bool kBackward, typename C, typename Y>
__device__ __forceinline__ void mask_segments(int64_t tf, int seg, StepSpan r, C& c, Y& yn) {
  int k = static_cast<int>(static_cast<uint32_t>(tf) % static_cast<uint32_t>(seg));  // steps into tf's row
#pragma unroll
  for (int i = 0; i < E; ++i) {
    if (i < r.hi) {
      if (k == 0) set_step(c, i, 0.f);
      if constexpr (kBackward)
        if (k == seg - 1) set_step(yn, i, 0.f);
    }
    k = k + 1 == seg ? 0 : k + 1;
  }
}

// The same where rows are whole tiles of kTile steps (p.seg_len a multiple of it): only a tile's
// first step can start a row in walk order and only its last end one, so two threads test once
// (mask_segments' per-step tests took the one-warp 2-byte backward over its register cap).
template <int E, int NT, bool kBackward, typename C, typename Y>
__device__ __forceinline__ void mask_tile_segments(int64_t t0, int seg, C& c, Y& yn) {
  const uint32_t first = static_cast<uint32_t>(t0) % static_cast<uint32_t>(seg);
  if (threadIdx.x == 0 && first == 0) set_step(c, 0, 0.f);
  if constexpr (kBackward)
    if (threadIdx.x == NT - 1 && first + E * NT == static_cast<uint32_t>(seg)) set_step(yn, E - 1, 0.f);
}

// The backward: each row's grad_initial, c[t] * dx[t] at its forward start (walk step t with (t + 1)
// % S == 0), read back from global memory after the tile's stores (a loop over the rows, not the
// steps: with the steps unrolled over registers the one-warp 2-byte and the 4-byte walking backward
// spilled 84-92 bytes). The row that holds the sequence's last step is also written by the tile's
// own grad_initial store, with the same value up to dx's rounding. `s`: the sequence's tensors
// (scan_tile.cuh's SeqTensors).
template <typename T, typename Seq>
__device__ __forceinline__ void store_segment_grad_init(const Seq& s, const ScanParams& p, int64_t L, int64_t tf,
                                                        StepSpan r) {
  const uint32_t seg = static_cast<uint32_t>(p.seg_len), first = static_cast<uint32_t>(tf);
  __syncwarp();  // striped stores (WarpStripe): other lanes of the warp stored some of these steps
  for (uint32_t t = first + (seg - 1 - first % seg); t < first + r.hi; t += seg)
    s.dh0[int64_t((static_cast<uint32_t>(L) - 1 - t) / seg) * p.seg_grad_init_step] =
        from_float<T>(to_float(s.cf[int64_t(t) * s.ls_c]) * to_float(s.dx[int64_t(t) * s.ls_dx]));
}

}  // namespace linrec
