// Tile kernel: the scanned dim is the innermost (stride +-1) of every sequence.
//
// A block scans a tile of NT * E consecutive steps of one sequence: each thread holds E
// steps in registers (16-byte vector loads when aligned), reduces them to one affine map,
// the block scans the thread maps with cub::BlockScan (warp shuffles + cross-warp carries),
// and each thread replays its E steps from its exclusive prefix. The prefix callback carries
// the state across tiles: sequentially inside a block (pipe mode, many sequences), or
// across blocks through the decoupled look-back (few long sequences, one tile per block).
#pragma once
#include <cub/block/block_scan.cuh>

#include <type_traits>

#include "scan_common.cuh"
#include "scan_access.cuh"
#include "scan_segments.cuh"

namespace linrec {

struct TileArgs {
  int64_t num_chunks;       // blocks per sequence (look-back when > 1)
  int64_t tiles_per_chunk;  // tiles scanned one after the other by a block
  unsigned vec_mask;        // bit s: slot s takes 16-byte vector accesses (kPhaseShift: where its
                            // phase is the row's)
  bool prefetch;            // a walking block prefetches its next tile into L2 (ScanPlan::walk_prefetch)
  LookbackState lb;
};

// Prefix callback of cub::BlockScan, run by warp 0: returns the state before the tile and
// advances it by the tile's aggregate; in look-back mode thread 0 publishes and looks back.
struct TileCarry {
  float carry;
  bool lookback;
  LookbackState lb;
  int64_t seq, num_seq, chunk;  // status of chunk k of sequence s at k * num_seq + s
  int64_t index;
  bool reset = false;  // segmented rows: a tile aggregate with a == 0 forgets the carry (apply_map)

  __device__ __forceinline__ Affine operator()(Affine agg) {
    if (lookback && chunk > 0) {
      if (threadIdx.x == 0) lb.publish_aggregate(index, agg);
      carry = lb.warp_look_back(seq, num_seq, chunk);
    }
    const Affine prefix{1.f, carry};
    carry = reset ? apply_map<true>(agg.a, carry, agg.b) : fmaf(agg.a, carry, agg.b);
    if (lookback && threadIdx.x == 0) lb.publish_inclusive(index, carry);
    return prefix;
  }
};

// The tensors of one sequence (pointers at its step 0, signed strides along the scan).
template <typename T>
struct SeqTensors {
  const T* in;   // x (forward) or grad_y (backward)
  const T* cf;   // coeffs
  T* y;          // forward output, or the saved forward output read by the backward
  T* dx;         // backward outputs (null in the forward)
  T* dc;         // (null when accumulated into dc_acc)
  float* dc_acc; // broadcast coeffs: float32 gradient buffer (ScanParams::accumulate_grad_coeff)
  T* dh0;
  int64_t ls_in, ls_c, ls_y, ls_dx, ls_dc;
  float init;    // state before step 0

  // `load_init`: read `initial` (a global load the caller may not need).
  __device__ __forceinline__ SeqTensors(const ScanParams& p, const int64_t* off, bool load_init = true) {
    in = slot_ptr<T>(p, kIn, off[kIn]);
    cf = slot_ptr<T>(p, kCoeff, off[kCoeff]);
    y = slot_ptr<T>(p, kOut, off[kOut]);
    dx = slot_ptr<T>(p, kGradIn, off[kGradIn]);
    dc = p.accumulate_grad_coeff ? nullptr : slot_ptr<T>(p, kGradCoeff, off[kGradCoeff]);
    dc_acc = p.accumulate_grad_coeff ? slot_ptr<float>(p, kGradCoeff, off[kGradCoeff]) : nullptr;
    dh0 = slot_ptr<T>(p, kGradInit, off[kGradInit]);
    ls_in = p.lstride[kIn];
    ls_c = p.lstride[kCoeff];
    ls_y = p.lstride[kOut];
    ls_dx = p.lstride[kGradIn];
    ls_dc = p.lstride[kGradCoeff];
    const T* h0 = slot_ptr<T>(p, kInit, off[kInit]);
    init = h0 && load_init ? to_float(*h0) : 0.f;
  }
};

// Prefetches into L2 the line of a thread's first step at `tf` in each operand the tile reads.
template <typename T, bool kBackward>
__device__ __forceinline__ void prefetch_steps_l2(const SeqTensors<T>& s, int64_t L, int64_t tf) {
  if (tf < 0 || tf >= L) return;
  asm volatile("prefetch.global.L2 [%0];" ::"l"(s.in + tf * s.ls_in));
  asm volatile("prefetch.global.L2 [%0];" ::"l"(s.cf + tf * s.ls_c));
  if constexpr (kBackward) asm volatile("prefetch.global.L2 [%0];" ::"l"(s.y + tf * s.ls_y));
}

// The slots of `vm` whose phase (vector_phase) in this row is `phase`: those take vector accesses.
template <typename T>
__device__ __forceinline__ unsigned row_vector_slots(const SeqTensors<T>& s, unsigned vm, int phase) {
  unsigned out = 0;
  const auto keep = [&](int slot, const T* base, int64_t ls) {
    if ((vm >> slot & 1) && vector_phase<T>(base, ls) == phase) out |= 1u << slot;
  };
  keep(kIn, s.in, s.ls_in);
  keep(kCoeff, s.cf, s.ls_c);
  keep(kOut, s.y, s.ls_y);
  keep(kGradIn, s.dx, s.ls_dx);
  if (!s.dc_acc) keep(kGradCoeff, s.dc, s.ls_dc);
  return out;
}

// A shifted row's steps past its tiles (its tiles cover as many steps as the row, from `phase`
// steps before it: fewer than a vector remain). Lane i of warp 0 holds step t0 + i's operands
// (forward: x, c; backward: grad_y, c[t-1] and y[t+1], see shift_backward_operands); lanes past
// the row hold an identity step.
struct TailStep {
  float x = 0.f, c = 1.f, y_next = 0.f;
};

template <typename T, bool kBackward>
__device__ __forceinline__ TailStep load_tail_step(const SeqTensors<T>& s, int64_t L, int64_t t0) {
  TailStep st;
  const int64_t t = t0 + threadIdx.x;  // t0 > 0: the row's tiles hold its first steps
  if (t < L) {
    st.x = to_float(s.in[t * s.ls_in]);
    st.c = to_float(s.cf[(kBackward ? t - 1 : t) * s.ls_c]);
    if constexpr (kBackward) st.y_next = t + 1 < L ? to_float(s.y[(t + 1) * s.ls_y]) : s.init;
  }
  return st;
}

// Scans the tail across the lanes of warp 0 (an affine scan by shuffles) from the state `h` after
// the row's tiles and stores each step's outputs from its lane. kWidth: the lanes of warp 0 (a
// power of two, at least a vector).
template <typename T, bool kBackward, int kWidth>
__device__ __forceinline__ void scan_tail(const SeqTensors<T>& s, int64_t L, int64_t t0, float h,
                                          const TailStep& st) {
  constexpr unsigned kMask = kWidth == 32 ? 0xffffffffu : (1u << kWidth) - 1;
  const int lane = threadIdx.x;
  float a = st.c, b = st.x;  // the map of tail steps 0 .. lane
#pragma unroll
  for (int d = 1; d < 16 / static_cast<int>(sizeof(T)); d *= 2) {
    const float pa = __shfl_up_sync(kMask, a, d, kWidth), pb = __shfl_up_sync(kMask, b, d, kWidth);
    if (lane >= d) b = fmaf(a, pb, b), a *= pa;
  }
  h = fmaf(a, h, b);
  const int64_t t = t0 + lane;
  if (t >= L) return;
  if constexpr (!kBackward) {
    s.y[t * s.ls_y] = from_float<T>(h);
  } else {
    s.dx[t * s.ls_dx] = from_float<T>(h);
    if (s.dc_acc) atomicAdd(s.dc_acc + t * s.ls_dc, h * st.y_next);
    else s.dc[t * s.ls_dc] = from_float<T>(h * st.y_next);
    if (t == L - 1) *s.dh0 = from_float<T>(to_float(s.cf[(L - 1) * s.ls_c]) * h);
  }
}

// Backward operands of a thread's steps in `r`: step t uses c[t-1] (the coefficient one step
// further along the forward scan) and y[t+1] (the forward state before step t; `initial` past the
// end). `c` and `yn` hold c[t] and y[t] on entry; `c_before` is c[tf-1] and `y_after` is y[tf+E]
// (each used only where it exists). Steps before `r` (a shifted tile's first thread) get c = 1 and
// x = 0 afterwards (load_tile_global) from a zero state: they stay zero, whatever step 0 takes as c.
template <int E>
__device__ __forceinline__ void shift_backward_operands(float (&c)[E], float (&yn)[E], float c_before, float y_after,
                                                        int64_t tf, StepSpan r, int64_t L, float init) {
#pragma unroll
  for (int i = E - 1; i > 0; --i) c[i] = i < r.hi ? c[i - 1] : 1.f;
  c[0] = r.hi > 0 ? (tf > 0 ? c_before : 0.f) : 1.f;
#pragma unroll
  for (int i = 0; i < E - 1; ++i) yn[i] = (i + 1 < r.hi) ? yn[i + 1] : (tf + i + 1 == L ? init : 0.f);
  yn[E - 1] = (r.hi == E) ? (tf + E < L ? y_after : init) : yn[E - 1];
}

// Loads a thread's operands for its steps in `r` straight from global memory; thread i of
// the block holds the E steps after thread i-1's. The backward's c[tf-1] and y[tf+E] are the
// neighbouring lanes' end values (shuffles): only the lanes at a warp's edges load them from
// global memory, where every lane used to (one sector per lane and load).
// kStripe: full warps load the operands striped (WarpStripe; the tile kernel's own tiles, not the
// stream kernel's partial ones, whose shared memory is budgeted to the byte); kPartialStripe: also a
// row's last warp where the row ends on a vector boundary (WarpStripe::partial_vectors).
template <typename T, int E, int NT, bool kBackward, bool kEdgeVectors = false, bool kStripe = false,
          bool kPartialStripe = false>
__device__ __forceinline__ void load_tile_global(const SeqTensors<T>& s, int64_t L, int64_t tf, StepSpan r,
                                                 unsigned vm, float (&v)[E], float (&c)[E], float (&yn)[E]) {
  using Stripe = WarpStripe<T, E, NT>;
  bool striped = false;
  if constexpr (kStripe && Stripe::kOn) {
    constexpr unsigned kRead = 1u << kIn | 1u << kCoeff | (kBackward ? 1u << kOut : 0u);
    if ((vm & kRead) == kRead && __all_sync(0xffffffffu, r.full(E))) {
      typename Stripe::Vectors gv, gc, gy;  // every operand's loads in flight before any is rearranged
      Stripe::load(s.in, s.ls_in, tf, gv);
      Stripe::load(s.cf, s.ls_c, tf, gc);
      if constexpr (kBackward) Stripe::load(s.y, s.ls_y, tf, gy);
      vectors_to_steps<T, E>(Stripe::gather(gv, s.ls_in), s.ls_in, v);
      vectors_to_steps<T, E>(Stripe::gather(gc, s.ls_c), s.ls_c, c);
      if constexpr (!kBackward) return;  // (an early return keeps the forward's registers as they were)
      vectors_to_steps<T, E>(Stripe::gather(gy, s.ls_y), s.ls_y, yn);
      striped = true;
    } else if constexpr (kPartialStripe) {
      if (const int n = (vm & kRead) == kRead ? Stripe::partial_vectors(tf, r, L) : 0; n > 0) {
        typename Stripe::Vectors gv, gc, gy;
        Stripe::load_partial(s.in, s.ls_in, tf, n, gv);
        Stripe::load_partial(s.cf, s.ls_c, tf, n, gc);
        if constexpr (kBackward) Stripe::load_partial(s.y, s.ls_y, tf, n, gy);
        vectors_to_steps<T, E>(Stripe::gather(gv, s.ls_in), s.ls_in, v);
        vectors_to_steps<T, E>(Stripe::gather(gc, s.ls_c), s.ls_c, c);
        if constexpr (!kBackward) return;
        vectors_to_steps<T, E>(Stripe::gather(gy, s.ls_y), s.ls_y, yn);
        striped = true;
      }
    }
  }
  if (!striped) {
    load_steps<T, E, kEdgeVectors>(s.in, s.ls_in, tf, r, vm >> kIn & 1, 0.f, v);
    load_steps<T, E, kEdgeVectors>(s.cf, s.ls_c, tf, r, vm >> kCoeff & 1, 1.f, c);
    if constexpr (kBackward) load_steps<T, E, kEdgeVectors>(s.y, s.ls_y, tf, r, vm >> kOut & 1, 0.f, yn);
  }
  if constexpr (kBackward) {
    constexpr int kWidth = NT < 32 ? NT : 32;  // a power of two
    constexpr unsigned kMask = kWidth == 32 ? 0xffffffffu : (1u << kWidth) - 1;
    const int lane = threadIdx.x & (kWidth - 1);
    // A lane with steps after step 0 has a predecessor lane holding its step before (c[E-1]
    // loaded), and a lane holding its last step whose successor step exists has a successor lane
    // holding that step (yn[0] loaded).
    const float c_prev = __shfl_up_sync(kMask, c[E - 1], 1, kWidth);
    const float y_next = __shfl_down_sync(kMask, yn[0], 1, kWidth);
    float c_before = 0.f, y_after = 0.f;
    if (r.hi > 0 && tf > 0) c_before = lane > 0 ? c_prev : to_float(s.cf[(tf - 1) * s.ls_c]);
    if (r.hi == E && tf + E < L) y_after = lane < kWidth - 1 ? y_next : to_float(s.y[(tf + E) * s.ls_y]);
    shift_backward_operands<E>(c, yn, c_before, y_after, tf, r, L, s.init);
  }
  if constexpr (kEdgeVectors) {
    // Steps before the row (a shifted row's first thread) hold other data: make them identities,
    // and the backward's coefficient of step 0 too (it multiplies a zero state; it could be inf).
    // They are fewer than a vector (r.lo < 16 / sizeof(T)).
    if (r.lo > 0) {
#pragma unroll
      for (int i = 0; i < 16 / static_cast<int>(sizeof(T)); ++i) {
        if (i < r.lo) v[i] = 0.f;
        if (i < r.lo + (kBackward ? 1 : 0)) c[i] = 1.f;
      }
    }
  }
}

// load_tile_global of the 2-byte backward with c and y packed: the same steps and shifts (c[t-1],
// y[t+1], shift_backward_operands), the shifts done on the words (one byte permute per word).
template <typename T, int E, int NT, bool kEdgeVectors>
__device__ __forceinline__ void load_tile_global_packed(const SeqTensors<T>& s, int64_t L, int64_t tf, StepSpan r,
                                                        unsigned vm, float (&v)[E], PackedSteps<T, E>& c,
                                                        PackedSteps<T, E>& yn) {
  using P = PackedSteps<T, E>;
  using Stripe = WarpStripe<T, E, NT>;
  P cr, yr;
  bool striped = false;
  if constexpr (Stripe::kOn) {  // as load_tile_global
    constexpr unsigned kRead = 1u << kIn | 1u << kCoeff | 1u << kOut;
    if ((vm & kRead) == kRead && __all_sync(0xffffffffu, r.full(E))) {
      typename Stripe::Vectors gv, gc, gy;
      Stripe::load(s.in, s.ls_in, tf, gv);
      Stripe::load(s.cf, s.ls_c, tf, gc);
      Stripe::load(s.y, s.ls_y, tf, gy);
      vectors_to_steps<T, E>(Stripe::gather(gv, s.ls_in), s.ls_in, v);
      vectors_to_packed<T, E>(Stripe::gather(gc, s.ls_c), s.ls_c, cr);
      vectors_to_packed<T, E>(Stripe::gather(gy, s.ls_y), s.ls_y, yr);
      striped = true;
    }
  }
  if (!striped) {
    load_steps<T, E, kEdgeVectors>(s.in, s.ls_in, tf, r, vm >> kIn & 1, 0.f, v);
    load_packed<T, E, kEdgeVectors>(s.cf, s.ls_c, tf, r, vm >> kCoeff & 1, cr);
    load_packed<T, E, kEdgeVectors>(s.y, s.ls_y, tf, r, vm >> kOut & 1, yr);
  }
  constexpr int kWidth = NT < 32 ? NT : 32;  // a power of two
  constexpr unsigned kMask = kWidth == 32 ? 0xffffffffu : (1u << kWidth) - 1;
  const int lane = threadIdx.x & (kWidth - 1);
  // The neighbouring lanes' end steps, as in load_tile_global (bits; zero bits are +0).
  const uint32_t c_prev = __shfl_up_sync(kMask, cr.w[E / 2 - 1], 1, kWidth) >> 16;
  const uint32_t y_next = __shfl_down_sync(kMask, yr.w[0], 1, kWidth) & 0xffffu;
  uint32_t c_before = 0u, y_after = 0u;
  if (r.hi > 0 && tf > 0) c_before = lane > 0 ? c_prev : P::bits(s.cf[(tf - 1) * s.ls_c]);
  if (r.hi == E)
    y_after = tf + E == L ? P::bits(from_float<T>(s.init))
                          : (lane < kWidth - 1 ? y_next : P::bits(s.y[(tf + E) * s.ls_y]));
  c.w[0] = c_before | cr.w[0] << 16;
#pragma unroll
  for (int j = 1; j < E / 2; ++j) c.w[j] = __byte_perm(cr.w[j - 1], cr.w[j], 0x5432);
#pragma unroll
  for (int j = 0; j < E / 2 - 1; ++j) yn.w[j] = __byte_perm(yr.w[j], yr.w[j + 1], 0x5432);
  yn.w[E / 2 - 1] = __byte_perm(yr.w[E / 2 - 1], y_after, 0x5432);
  if (r.hi < E) {  // the row ends within (or before) this thread's steps
#pragma unroll
    for (int i = 0; i < E; ++i) {
      if (i >= r.hi) c.set(i, 1.f);
      if (i < E - 1 && i + 1 >= r.hi) yn.set(i, tf + i + 1 == L ? s.init : 0.f);
    }
  }
  if constexpr (kEdgeVectors) {  // steps before the row: identities (load_tile_global)
    if (r.lo > 0) {
#pragma unroll
      for (int i = 0; i < 16 / static_cast<int>(sizeof(T)); ++i) {
        if (i < r.lo) v[i] = 0.f;
        if (i < r.lo + 1) c.set(i, 1.f);
      }
    }
  }
}

// A thread's E steps as kRuns runs of E / kRuns consecutive steps whose reductions and replays are
// interleaved: a chain of E / kRuns + kRuns dependent FMAs where one run of E had E (H200, bf16
// 1000 x 4096 in one 4096-step tile per row: 0.81 -> 0.91 of torch.add forward; elsewhere within
// the noise; bench/NOTES.md item 75). The ring replays a tile apart from its reduction: one run there.
template <int E, int K = (E >= 16 ? E / 8 : 1)>
struct StepRuns {
  static constexpr int kRuns = K, kLen = E / K;
  Affine map[kRuns];  // run k's map (reduce_steps)

  // The state before each run from the state `h` before the first.
  template <bool kReset = false>
  __device__ __forceinline__ void starts(float h, float (&out)[kRuns]) const {
    out[0] = h;
#pragma unroll
    for (int k = 1; k < kRuns; ++k) out[k] = apply_map<kReset>(map[k - 1].a, out[k - 1], map[k - 1].b);
  }
};

// The affine map of a thread's E steps; `runs` gets each run's. kReset: apply_map.
template <int E, bool kReset = false, int K, typename C>
__device__ __forceinline__ Affine reduce_steps(const float (&v)[E], const C& c, StepRuns<E, K>& runs) {
  using R = StepRuns<E, K>;
  using Compose = ComposeOpT<kReset>;
#pragma unroll
  for (int k = 0; k < R::kRuns; ++k) runs.map[k] = Affine{c[k * R::kLen], v[k * R::kLen]};
#pragma unroll
  for (int j = 1; j < R::kLen; ++j)
#pragma unroll
    for (int k = 0; k < R::kRuns; ++k)
      runs.map[k] = Compose()(runs.map[k], Affine{c[k * R::kLen + j], v[k * R::kLen + j]});
  Affine agg = runs.map[0];
#pragma unroll
  for (int k = 1; k < R::kRuns; ++k) agg = Compose()(agg, runs.map[k]);
  return agg;
}

// The state after a thread's last step in `r`, once v holds the states.
template <int E>
__device__ __forceinline__ float last_state(StepSpan r, const float (&v)[E]) {
  float h_last = 0.f;
#pragma unroll
  for (int i = 0; i < E; ++i)
    if (i < r.hi) h_last = v[i];
  return h_last;
}

// Replays a thread's runs from the state `h` before them (`runs` from reduce_steps): v[i] becomes the
// state after step i, and `each(i)` runs once it has.
template <bool kReset, int E, int K, typename C, typename F>
__device__ __forceinline__ void replay_runs(float h, const StepRuns<E, K>& runs, float (&v)[E], const C& c, F&& each) {
  using R = StepRuns<E, K>;
  float st[R::kRuns];
  runs.template starts<kReset>(h, st);
#pragma unroll
  for (int j = 0; j < R::kLen; ++j)
#pragma unroll
    for (int k = 0; k < R::kRuns; ++k) {
      const int i = k * R::kLen + j;
      st[k] = apply_map<kReset>(c[i], st[k], v[i]);
      v[i] = st[k];
      each(i);
    }
}

// Replays a thread's steps: v becomes the states (the forward's y, the backward's dx) and, in the
// backward, yn (the shifted y) becomes dc = dx * yn. Returns the state after the thread's last step
// in `r`.
template <int E, bool kBackward, bool kReset = false, int K>
__device__ __forceinline__ float replay_steps(float h, const StepRuns<E, K>& runs, StepSpan r, float (&v)[E],
                                              const float (&c)[E], float (&yn)[E]) {
  replay_runs<kReset>(h, runs, v, c, [](int) {});
  if constexpr (kBackward) {
#pragma unroll
    for (int i = 0; i < E; ++i) yn[i] *= v[i];
  }
  return last_state<E>(r, v);
}

// replay_steps with packed c and y (the tile kernel's 2-byte backward): dc = dx * yn into `dc`.
template <bool kReset, int E, typename T, int K>
__device__ __forceinline__ float replay_steps(float h, const StepRuns<E, K>& runs, StepSpan r, float (&v)[E],
                                              const PackedSteps<T, E>& c, const PackedSteps<T, E>& yn,
                                              float (&dc)[E]) {
  replay_runs<kReset>(h, runs, v, c, [&](int i) { dc[i] = v[i] * yn[i]; });
  return last_state<E>(r, v);
}

// Stores a thread's outputs after replay_steps (backward: `yn` holds dc) except the slots in
// `skip` (staged for a bulk store by the caller).
// kStripeNT: the block's threads, whose full warps store striped (WarpStripe), or 0;
// kPartialStripe: as load_tile_global's.
template <typename T, int E, bool kBackward, bool kEdgeVectors = false, int kStripeNT = 0, bool kPartialStripe = false>
__device__ __forceinline__ void store_outputs(const SeqTensors<T>& s, int64_t L, int64_t tf, StepSpan r, unsigned vm,
                                              unsigned skip, float h_last, const float (&v)[E], const float (&yn)[E]) {
  using Stripe = WarpStripe<T, E, kStripeNT>;
  if constexpr (!kBackward) {
    if constexpr (Stripe::kOn) {
      if (!(skip >> kOut & 1) && (vm >> kOut & 1) && __all_sync(0xffffffffu, r.full(E))) {
        Stripe::store(s.y, s.ls_y, tf, v);
        return;
      }
      if constexpr (kPartialStripe) {
        if (const int n = !(skip >> kOut & 1) && (vm >> kOut & 1) ? Stripe::partial_vectors(tf, r, L) : 0; n > 0) {
          Stripe::template store<true>(s.y, s.ls_y, tf, v, n);
          return;
        }
      }
    }
    if (!(skip >> kOut & 1)) store_steps<T, E, kEdgeVectors>(s.y, s.ls_y, tf, r, vm >> kOut & 1, v);
  } else {
    if constexpr (Stripe::kOn) {
      const unsigned want = vm & ~skip & (1u << kGradIn | (s.dc_acc ? 0u : 1u << kGradCoeff));
      if (want && __all_sync(0xffffffffu, r.full(E))) {
        if (want >> kGradIn & 1) Stripe::store(s.dx, s.ls_dx, tf, v);
        if (want >> kGradCoeff & 1) Stripe::store(s.dc, s.ls_dc, tf, yn);
        skip |= want;
      } else if constexpr (kPartialStripe) {
        if (const int n = want ? Stripe::partial_vectors(tf, r, L) : 0; n > 0) {
          if (want >> kGradIn & 1) Stripe::template store<true>(s.dx, s.ls_dx, tf, v, n);
          if (want >> kGradCoeff & 1) Stripe::template store<true>(s.dc, s.ls_dc, tf, yn, n);
          skip |= want;
        }
      }
    }
    if (!(skip >> kGradIn & 1)) store_steps<T, E, kEdgeVectors>(s.dx, s.ls_dx, tf, r, vm >> kGradIn & 1, v);
    if (s.dc_acc) accumulate_steps<E>(s.dc_acc, s.ls_dc, tf, r.lo, r.hi, yn, /*warp_uniform_address=*/true);
    else if (!(skip >> kGradCoeff & 1))
      store_steps<T, E, kEdgeVectors>(s.dc, s.ls_dc, tf, r, vm >> kGradCoeff & 1, yn);
    if (r.hi > r.lo && tf + r.hi == L)  // this thread holds the last step: d initial = c[L-1] * g[L-1]
      *s.dh0 = from_float<T>(to_float(s.cf[(L - 1) * s.ls_c]) * h_last);
  }
}

// Replays a thread's steps from the state `h` before them and stores the outputs.
// (Staging full tiles through shared memory for whole-line stores measured slower on the H200:
// many-short fwd+bwd 0.73 vs 0.80 of torch.add, bf16 many-short fwd 0.77 vs 0.80.)
template <typename T, int E, int NT, bool kBackward, bool kEdgeVectors, bool kReset, bool kPartialStripe, int K,
          typename C, typename Y>
__device__ __forceinline__ void replay_and_store(const SeqTensors<T>& s, int64_t L, int64_t tf, StepSpan r,
                                                 unsigned vm, float h, const StepRuns<E, K>& runs, float (&v)[E],
                                                 const C& c, Y& yn) {
  if constexpr (std::is_same_v<Y, PackedSteps<T, E>>) {
    float dc[E];
    const float h_last = replay_steps<kReset>(h, runs, r, v, c, yn, dc);
    store_outputs<T, E, kBackward, kEdgeVectors, NT>(s, L, tf, r, vm, 0u, h_last, v, dc);
  } else {
    const float h_last = replay_steps<E, kBackward, kReset>(h, runs, r, v, c, yn);
    store_outputs<T, E, kBackward, kEdgeVectors, NT, kPartialStripe>(s, L, tf, r, vm, 0u, h_last, v, yn);
  }
}

// Scans a tile whose operands are in registers: each thread reduces its E steps to one
// affine map, cub::BlockScan (with `carry` as prefix callback) gives its exclusive prefix,
// and the thread replays its steps from there and stores them. kReset: segmented rows (apply_map).
template <typename T, int E, int NT, bool kBackward, bool kEdgeVectors, bool kReset = false,
          bool kPartialStripe = false, typename C, typename Y>
__device__ __forceinline__ void scan_tile_registers(typename cub::BlockScan<Affine, NT>::TempStorage& storage,
                                                    TileCarry& carry, const SeqTensors<T>& s, int64_t L, int64_t tf,
                                                    StepSpan r, unsigned vm, float (&v)[E], const C& c, Y& yn) {
  Affine prefix;
  // One run for the 2-byte 16-step tiles, at their register caps (a second run's map spilled there).
  StepRuns<E, sizeof(T) == 2 && E == 16 ? 1 : StepRuns<E>::kRuns> runs;
  cub::BlockScan<Affine, NT>(storage).ExclusiveScan(reduce_steps<E, kReset>(v, c, runs), prefix,
                                                    ComposeOpT<kReset>(), carry);
  replay_and_store<T, E, NT, kBackward, kEdgeVectors, kReset, kPartialStripe>(s, L, tf, r, vm, prefix.b, runs, v, c, yn);
}

// One block per sequence (all its tiles, one after the other) or, with look-back
// (num_chunks > 1), one block per tile, chained to its predecessors across blocks.
// The 2-byte backward's minimum blocks per SM steer ptxas' register target (the 4-byte backward
// has none: with one block it took 84 registers instead of 58 for {8,128}, and many-short
// fwd+bwd fell from 1.00 to 0.92 on the H100). With c and y packed (PackedSteps), 32 steps per
// thread take 113-128 registers at 16 warps per SM (item 38); 16 steps over one warp 64 for 32
// warps per SM (H200 bf16 131072 x 1024: 0.93 of a vector add, 0.90 at 71 registers and 28 warps;
// item 49); over two warps 72 (28 warps; 64 spilled 84 bytes and ran slower); over 16 threads the
// minimum of one block. None of them spills (item 75).
// kPhaseShift: rows start off the 16-byte grid (odd lengths, sliced views); each block shifts its
// tiles `phase` steps before its row, so that all but the first thread's steps are whole aligned
// vectors in every slot of the row's phase. The tiles cover as many steps as the row: the row's
// last block scans the steps left past them (fewer than a vector) across warp 0 (scan_tail).
// The 2-byte forward's 16-step tile over one warp is capped at 64 registers (32 warps per SM): the
// walk's L2 prefetch took its shifted-row variant from 64 to 70, too many for the 31 rows per SM of
// bf16 4096 x 4097 in one wave (0.83 -> 0.71 of torch.add); capped, it does not spill.
// The 4-byte backward's 512-step walking tile (8 steps x 64 threads) is held to 64 registers (16
// blocks per SM): its warp-striped accesses took it to 80 (H200, float32 2048 x 1024 backward 1.02 ->
// 0.94 of a vector add).
// Minimum blocks per SM of scan_tile_kernel (see there).
// The segmented 2-byte backward over one warp (mask_segments on packed c and y) spilled at 64
// registers: 24 blocks per SM (up to 85 registers) for it.
template <typename T, int E, int NT, bool kBackward, int kSegments = kNoSegments>
constexpr int tile_min_blocks() {
  if (kSegments == kRowSegments && sizeof(T) == 2 && kBackward && NT == 32) return 24;
  if (sizeof(T) != 2) return kBackward && E == 8 && NT == 64 ? 16 : 0;
  if (!kBackward) return E == 16 && NT == 32 ? 32 : 0;
  return E == 32 ? 512 / NT : NT == 32 ? 32 : NT > 32 ? 896 / NT : 1;
}
// kSegments (a SegmentKind): the sequences hold whole rows of p.seg_len steps (mask_segments,
// mask_tile_segments).
template <typename T, int E, int NT, bool kBackward, bool kPhaseShift, int kSegments = kNoSegments>
__global__ void __launch_bounds__(NT, tile_min_blocks<T, E, NT, kBackward, kSegments>())
    scan_tile_kernel(const ScanParams p, const TileArgs args) {
  constexpr int kTile = E * NT;
  __shared__ typename cub::BlockScan<Affine, NT>::TempStorage scan_storage;
  __shared__ int64_t s_vid;

  // Every thread finds its row's offsets itself: no barrier before the loads (a block's first tile
  // waited at one for warp 0's offsets, ncu, bench/NOTES.md item 75); look-back blocks take their
  // id from the counter, shared through one.
  const bool lookback = args.num_chunks > 1;
  int64_t vid = blockIdx.x;
  if (lookback) {
    args.lb.clean_up();
    if (threadIdx.x == 0) s_vid = static_cast<int64_t>(atomicAdd(args.lb.counter, 1ull));
    __syncthreads();
    vid = s_vid;
  }
  // Chunk-major order: all sequences' chunk k start before any chunk k+1, keeping look-back short.
  const int64_t chunk = lookback ? vid / p.num_seq : 0, seq = vid - chunk * p.num_seq;
  // One batch dim (rows back to back, coalesced): each offset is one product. The general
  // decomposition over every batch dim, predicated for all eight, was most of the ~750 instructions
  // a block ran once (bf16 131072 x 1024 backward, ncu: against ~610 per tile, at ~3 of 4 issued per
  // cycle; bench/NOTES.md items 84, 85). Not in the 4-byte backward's 16-step tiles (124 registers
  // instead of 92-94), the 2-byte forward's 32-step tiles (117-121 instead of 94-100) nor its
  // 16-thread tiles (86 instead of 64).
  constexpr bool kOneProduct = kBackward ? (sizeof(T) == 2 || E == 8) : (E <= 16 && NT >= 32);
  int64_t off[kNumSlots];
  if (kOneProduct && p.nbatch == 1) {
#pragma unroll
    for (int slot = 0; slot < kNumSlots; ++slot) off[slot] = seq * p.bstride[slot][0];
  } else {
    const SeqIndex index(p, seq);
#pragma unroll
    for (int slot = 0; slot < kNumSlots; ++slot) off[slot] = index.offset(p, slot);
  }
  // Segmented rows: the last group may hold fewer rows than the others (segment_params).
  const bool short_group = kSegments != kNoSegments && seq == p.seg_short_seq;
  if (short_group)
#pragma unroll
    for (int slot = 0; slot < kNumSlots; ++slot) off[slot] += p.seg_short_off[slot];
  const SeqTensors<T> s(p, off);
  const int64_t L = short_group ? p.seg_short_len : p.len;
  const int phase = kPhaseShift ? vector_phase<T>(s.in, s.ls_in) : 0;
  // A shifted row's first thread and a row's last thread hold partial runs: vector accesses there
  // too where one load per step would cost most (16 or 32 per operand and thread); not in the
  // 2-byte 32-step backward, at its register cap, nor for aligned 4-byte rows (their 8-step
  // forward would take 54 registers instead of 46: fewer blocks per SM).
  constexpr bool kEdgeVectors = (kPhaseShift || sizeof(T) == 2) && !(kBackward && sizeof(T) == 2 && E == 32);
  const unsigned vm = kPhaseShift ? row_vector_slots(s, args.vec_mask, phase) : args.vec_mask;
  // A 4-byte row's last warp loads and stores striped too where the row ends on a vector boundary
  // (H200, float32 131072 x 1000 backward 0.83 -> 0.89 of torch.add: its blocked accesses had 33% of
  // the sectors excess, ncu); not 2-byte rows (bf16 131072 x 1000 backward unchanged, 0.78, and the
  // one-warp forward's full tiles slower, 0.99 -> 0.97), nor shifted rows (bench/NOTES.md item 82).
  constexpr bool kPartialStripe = sizeof(T) == 4 && !kPhaseShift;
  // The 2-byte backward keeps c and y packed (PackedSteps), the rest float arrays.
  constexpr bool kPacked = kBackward && sizeof(T) == 2;
  using Operands = std::conditional_t<kPacked, PackedSteps<T, E>, float[E]>;

  TileCarry carry{kBackward ? 0.f : s.init, lookback, args.lb, seq, p.num_seq, chunk, vid, kSegments != kNoSegments};
  const int64_t chunk_t0 = chunk * args.tiles_per_chunk * kTile - phase;

  for (int64_t tile = 0; tile < args.tiles_per_chunk; ++tile) {
    const int64_t t0 = chunk_t0 + tile * kTile;
    if (t0 >= L) break;
    const int64_t tf = t0 + static_cast<int64_t>(threadIdx.x) * E;
    // A prefetching walk has the next tile's lines on their way to L2 while it scans this one.
    if (args.prefetch && tile + 1 < args.tiles_per_chunk) prefetch_steps_l2<T, kBackward>(s, L, tf + kTile);
    const StepSpan r = step_span<E, kPhaseShift>(tf, L);
    float v[E];
    Operands c, yn;
    if constexpr (kPacked)
      load_tile_global_packed<T, E, NT, kEdgeVectors>(s, L, tf, r, vm, v, c, yn);
    else
      load_tile_global<T, E, NT, kBackward, kEdgeVectors, /*kStripe=*/true, kPartialStripe>(s, L, tf, r, vm, v, c, yn);
    if constexpr (kSegments == kRowSegments) mask_segments<E, kBackward>(tf, static_cast<int>(p.seg_len), r, c, yn);
    if constexpr (kSegments == kTileSegments) mask_tile_segments<E, NT, kBackward>(t0, static_cast<int>(p.seg_len), c, yn);
    scan_tile_registers<T, E, NT, kBackward, kEdgeVectors, kSegments != kNoSegments, kPartialStripe>(
        scan_storage, carry, s, L, tf, r, vm, v, c, yn);
    if constexpr (kSegments != kNoSegments && kBackward) store_segment_grad_init<T>(s, p, L, tf, r);
    if (tile + 1 < args.tiles_per_chunk) __syncthreads();  // scan_storage is reused by the next tile
  }
  // Warp 0 holds the state after the tiles (each lane ran the prefix callback alike).
  constexpr int kWarp0 = NT < 32 ? NT : 32;  // a power of two
  const int64_t tail_t0 = chunk_t0 + args.tiles_per_chunk * kTile;
  if (kPhaseShift && chunk == args.num_chunks - 1 && tail_t0 < L && threadIdx.x < kWarp0)
    scan_tail<T, kBackward, kWarp0>(s, L, tail_t0, carry.carry, load_tail_step<T, kBackward>(s, L, tail_t0));
}

}  // namespace linrec
