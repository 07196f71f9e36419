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

#include "scan_common.cuh"

namespace linrec {

struct TileArgs {
  int64_t num_chunks;       // blocks per sequence (look-back when > 1)
  int64_t tiles_per_chunk;  // tiles scanned one after the other by a block
  unsigned vec_mask;        // bit s: slot s takes 16-byte vector accesses (kPhaseShift: where its
                            // phase is the row's)
  LookbackState lb;
};

// A row's head for 16-byte vectors: its steps before the first step from which every run of whole
// vectors is aligned (forward walk: step t at base + t; reverse walk: base - t, a run read from its
// last step). Less than a vector.
template <typename T>
__device__ __forceinline__ int vector_head(const T* base, int64_t ls) {
  constexpr int kVec = 16 / sizeof(T);
  const int m = static_cast<int>(reinterpret_cast<uintptr_t>(base) % 16 / sizeof(T));
  return (ls > 0 ? kVec - m : m + 1) & (kVec - 1);
}

// A thread's E steps as E / kVec 16-byte vectors, in memory order (walk order reversed when ls < 0).
template <typename T, int E>
union StepVectors {
  static constexpr int kVec = 16 / sizeof(T);
  uint4 u[E / kVec];
  T t[E];
  // The lowest walk index among the steps of memory vector k, the vector holding those kVec steps.
  static __device__ __forceinline__ int first_step(int k, bool rev) { return rev ? E - (k + 1) * kVec : k * kVec; }
};

// Loads E steps t = tf .. tf+E-1 (element t at base + t * ls); steps from nv on get `fill`.
// `vec`: 16-byte vectors where all E are in the row. kEdgeVectors: for a row's last, partial run
// too, with the same instructions: the vectors holding a step before nv are loaded whole (their
// 16 bytes lie within the tensor's 16-byte aligned allocation), the others read as zeros, and the
// steps from nv on hold whatever the vectors held (they come after the row's last step: no output
// depends on them).
template <typename T, int E, bool kEdgeVectors = false>
__device__ __forceinline__ void load_steps(const T* base, int64_t ls, int64_t tf, int nv, bool vec, float fill,
                                           float (&out)[E]) {
  using V = StepVectors<T, E>;
  static_assert(E % V::kVec == 0, "E must be a multiple of the 16-byte vector width");
  if (vec && (kEdgeVectors || nv == E)) {
    V buf;
    const uint4* src = reinterpret_cast<const uint4*>(ls > 0 ? base + tf : base - (tf + E - 1));
#pragma unroll
    for (int k = 0; k < E / V::kVec; ++k) {
      const int w = V::first_step(k, ls < 0);
      buf.u[k] = !kEdgeVectors || w < nv ? src[k] : make_uint4(0u, 0u, 0u, 0u);
    }
    if (ls > 0) {
#pragma unroll
      for (int i = 0; i < E; ++i) out[i] = to_float(buf.t[i]);
    } else {
#pragma unroll
      for (int i = 0; i < E; ++i) out[i] = to_float(buf.t[E - 1 - i]);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < E; ++i) out[i] = i < nv ? to_float(base[(tf + i) * ls]) : fill;
}

// Stores steps tf .. tf+nv-1 (as load_steps; kEdgeVectors: whole vectors but the last partial one,
// stored per element).
template <typename T, int E, bool kEdgeVectors = false>
__device__ __forceinline__ void store_steps(T* base, int64_t ls, int64_t tf, int nv, bool vec,
                                            const float (&v)[E]) {
  using V = StepVectors<T, E>;
  if (vec && (kEdgeVectors || nv == E)) {
    V buf;
    if (ls > 0) {
#pragma unroll
      for (int i = 0; i < E; ++i) buf.t[i] = from_float<T>(v[i]);
    } else {
#pragma unroll
      for (int i = 0; i < E; ++i) buf.t[E - 1 - i] = from_float<T>(v[i]);
    }
    uint4* dst = reinterpret_cast<uint4*>(ls > 0 ? base + tf : base - (tf + E - 1));
    if (!kEdgeVectors || nv == E) {
#pragma unroll
      for (int k = 0; k < E / V::kVec; ++k) dst[k] = buf.u[k];
      return;
    }
    if constexpr (kEdgeVectors) {
#pragma unroll
      for (int k = 0; k < E / V::kVec; ++k) {
        const int w = V::first_step(k, ls < 0);
        if (w + V::kVec <= nv) {
          dst[k] = buf.u[k];
        } else if (w < nv) {
#pragma unroll
          for (int j = 0; j < V::kVec; ++j)  // element j of the vector is walk step w + j (reversed: from the end)
            if ((ls > 0 ? w + j : w + V::kVec - 1 - j) < nv)
              reinterpret_cast<T*>(dst)[k * V::kVec + j] = buf.t[k * V::kVec + j];
        }
      }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < E; ++i)
    if (i < nv) base[(tf + i) * ls] = from_float<T>(v[i]);
}

// Prefix callback of cub::BlockScan, run by warp 0: returns the state before the tile and
// advances it by the tile's aggregate; in look-back mode thread 0 publishes and looks back.
struct TileCarry {
  float carry;
  bool lookback;
  LookbackState lb;
  int64_t seq, num_seq, chunk;  // status of chunk k of sequence s at k * num_seq + s
  int64_t index;

  __device__ __forceinline__ Affine operator()(Affine agg) {
    if (lookback && chunk > 0) {
      if (threadIdx.x == 0) lb.publish_aggregate(index, agg);
      carry = lb.warp_look_back(seq, num_seq, chunk);
    }
    const Affine prefix{1.f, carry};
    carry = fmaf(agg.a, carry, agg.b);
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

// The slots of `vm` whose head (vector_head) in this row is `head`: those take vector accesses.
template <typename T>
__device__ __forceinline__ unsigned row_vector_slots(const SeqTensors<T>& s, unsigned vm, int head) {
  unsigned out = 0;
  const auto keep = [&](int slot, const T* base, int64_t ls) {
    if ((vm >> slot & 1) && vector_head<T>(base, ls) == head) out |= 1u << slot;
  };
  keep(kIn, s.in, s.ls_in);
  keep(kCoeff, s.cf, s.ls_c);
  keep(kOut, s.y, s.ls_y);
  keep(kGradIn, s.dx, s.ls_dx);
  if (!s.dc_acc) keep(kGradCoeff, s.dc, s.ls_dc);
  return out;
}

// The head of a row off the 16-byte grid (kPhaseShift), fewer steps than a vector: lane t of warp 0
// holds step t's operands (forward: x, c; backward: grad_y, c[t-1] and y[t+1], see
// shift_backward_operands); lanes past the head or the row hold an identity step.
struct HeadStep {
  float x = 0.f, c = 1.f, y_next = 0.f;
};

template <typename T, bool kBackward>
__device__ __forceinline__ HeadStep load_head_step(const SeqTensors<T>& s, int64_t L, int head) {
  HeadStep st;
  const int t = threadIdx.x;
  if (t < head && t < L) {
    st.x = to_float(s.in[t * s.ls_in]);
    if constexpr (!kBackward) {
      st.c = to_float(s.cf[t * s.ls_c]);
    } else {
      st.c = t > 0 ? to_float(s.cf[(t - 1) * s.ls_c]) : 0.f;  // multiplies the zero state
      st.y_next = t + 1 < L ? to_float(s.y[(t + 1) * s.ls_y]) : s.init;
    }
  }
  return st;
}

// Scans the head across the lanes of warp 0 (an affine scan by shuffles, from the row's first
// state: forward `initial`, backward zero), stores each step's outputs from its lane and returns
// the state after the head (in every lane). kWidth: the lanes of warp 0 (a power of two).
template <typename T, bool kBackward, int kWidth>
__device__ __forceinline__ float scan_head(const SeqTensors<T>& s, int64_t L, int head, const HeadStep& st) {
  constexpr unsigned kMask = kWidth == 32 ? 0xffffffffu : (1u << kWidth) - 1;
  const int lane = threadIdx.x;
  float a = st.c, b = st.x;  // the map of steps 0 .. lane
#pragma unroll
  for (int d = 1; d < 16 / static_cast<int>(sizeof(T)); d *= 2) {
    const float pa = __shfl_up_sync(kMask, a, d, kWidth), pb = __shfl_up_sync(kMask, b, d, kWidth);
    if (lane >= d) b = fmaf(a, pb, b), a *= pa;
  }
  const float h = fmaf(a, kBackward ? 0.f : s.init, b);
  const int n = head < L ? head : static_cast<int>(L);
  if (lane < n) {
    const int t = lane;
    if constexpr (!kBackward) {
      s.y[t * s.ls_y] = from_float<T>(h);
    } else {
      s.dx[t * s.ls_dx] = from_float<T>(h);
      if (s.dc_acc) atomicAdd(s.dc_acc + t * s.ls_dc, h * st.y_next);
      else s.dc[t * s.ls_dc] = from_float<T>(h * st.y_next);
      if (t == L - 1) *s.dh0 = from_float<T>(to_float(s.cf[(L - 1) * s.ls_c]) * h);
    }
  }
  return __shfl_sync(kMask, h, n - 1, kWidth);
}

// Backward operands of a thread's steps tf .. tf+nv-1: step t uses c[t-1] (the coefficient
// one step further along the forward scan) and y[t+1] (the forward state before step t;
// `initial` past the end). `c` and `yn` hold c[t] and y[t] on entry; `c_before` is c[tf-1]
// and `y_after` is y[tf+E] (each used only where it exists).
template <int E>
__device__ __forceinline__ void shift_backward_operands(float (&c)[E], float (&yn)[E], float c_before, float y_after,
                                                        int64_t tf, int nv, int64_t L, float init) {
#pragma unroll
  for (int i = E - 1; i > 0; --i) c[i] = i < nv ? c[i - 1] : 1.f;
  c[0] = nv > 0 ? (tf > 0 ? c_before : 0.f) : 1.f;
#pragma unroll
  for (int i = 0; i < E - 1; ++i) yn[i] = (i + 1 < nv) ? yn[i + 1] : (tf + i + 1 == L ? init : 0.f);
  yn[E - 1] = (nv == E) ? (tf + E < L ? y_after : init) : yn[E - 1];
}

// Loads a thread's operands for steps tf .. tf+nv-1 straight from global memory; thread i of
// the block holds the E steps after thread i-1's. The backward's c[tf-1] and y[tf+E] are the
// neighbouring lanes' end values (shuffles): only the lanes at a warp's edges load them from
// global memory, where every lane used to (one sector per lane and load).
template <typename T, int E, int NT, bool kBackward, bool kEdgeVectors = false>
__device__ __forceinline__ void load_tile_global(const SeqTensors<T>& s, int64_t L, int64_t tf, int nv,
                                                 unsigned vm, float (&v)[E], float (&c)[E], float (&yn)[E]) {
  load_steps<T, E, kEdgeVectors>(s.in, s.ls_in, tf, nv, vm >> kIn & 1, 0.f, v);
  load_steps<T, E, kEdgeVectors>(s.cf, s.ls_c, tf, nv, vm >> kCoeff & 1, 1.f, c);
  if constexpr (kBackward) {
    load_steps<T, E, kEdgeVectors>(s.y, s.ls_y, tf, nv, vm >> kOut & 1, 0.f, yn);
    constexpr int kWidth = NT < 32 ? NT : 32;  // a power of two
    constexpr unsigned kMask = kWidth == 32 ? 0xffffffffu : (1u << kWidth) - 1;
    const int lane = threadIdx.x & (kWidth - 1);
    // A lane with steps has a predecessor lane with all E (c[E-1] loaded), and a lane with all E
    // steps whose successor exists in the sequence has a successor with steps (yn[0] loaded).
    const float c_prev = __shfl_up_sync(kMask, c[E - 1], 1, kWidth);
    const float y_next = __shfl_down_sync(kMask, yn[0], 1, kWidth);
    float c_before = 0.f, y_after = 0.f;
    if (nv > 0 && tf > 0) c_before = lane > 0 ? c_prev : to_float(s.cf[(tf - 1) * s.ls_c]);
    if (nv == E && tf + E < L) y_after = lane < kWidth - 1 ? y_next : to_float(s.y[(tf + E) * s.ls_y]);
    shift_backward_operands<E>(c, yn, c_before, y_after, tf, nv, L, s.init);
  }
}

// Replays a thread's steps from the state `h` before them: v becomes the states (the
// forward's y, the backward's dx) and, in the backward, yn (the shifted y) becomes dc = dx * yn.
// Returns the state after the thread's last valid step.
template <int E, bool kBackward>
__device__ __forceinline__ float replay_steps(float h, int nv, float (&v)[E], const float (&c)[E],
                                              float (&yn)[E]) {
  float h_last = 0.f;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    h = fmaf(c[i], h, v[i]);
    v[i] = h;
    if (i < nv) h_last = h;
  }
  if constexpr (kBackward) {
#pragma unroll
    for (int i = 0; i < E; ++i) yn[i] *= v[i];
  }
  return h_last;
}

// Stores a thread's outputs after replay_steps (backward: `yn` holds dc) except the slots in
// `skip` (staged for a bulk store by the caller).
template <typename T, int E, bool kBackward, bool kEdgeVectors = false>
__device__ __forceinline__ void store_outputs(const SeqTensors<T>& s, int64_t L, int64_t tf, int nv, unsigned vm,
                                              unsigned skip, float h_last, const float (&v)[E], const float (&yn)[E]) {
  if constexpr (!kBackward) {
    if (!(skip >> kOut & 1)) store_steps<T, E, kEdgeVectors>(s.y, s.ls_y, tf, nv, vm >> kOut & 1, v);
  } else {
    if (!(skip >> kGradIn & 1)) store_steps<T, E, kEdgeVectors>(s.dx, s.ls_dx, tf, nv, vm >> kGradIn & 1, v);
    if (s.dc_acc) accumulate_steps<E>(s.dc_acc, s.ls_dc, tf, nv, yn, /*warp_uniform_address=*/true);
    else if (!(skip >> kGradCoeff & 1))
      store_steps<T, E, kEdgeVectors>(s.dc, s.ls_dc, tf, nv, vm >> kGradCoeff & 1, yn);
    if (nv > 0 && tf + nv == L)  // this thread holds the last step: d initial = c[L-1] * g[L-1]
      *s.dh0 = from_float<T>(to_float(s.cf[(L - 1) * s.ls_c]) * h_last);
  }
}

// Replays a thread's steps from the state `h` before them and stores the outputs.
// (Staging full tiles through shared memory for whole-line stores measured slower on the H200:
// many-short fwd+bwd 0.73 vs 0.80 of torch.add, bf16 many-short fwd 0.77 vs 0.80.)
template <typename T, int E, bool kBackward, bool kEdgeVectors>
__device__ __forceinline__ void replay_and_store(const SeqTensors<T>& s, int64_t L, int64_t tf, int nv,
                                                 unsigned vm, float h, float (&v)[E], const float (&c)[E],
                                                 float (&yn)[E]) {
  const float h_last = replay_steps<E, kBackward>(h, nv, v, c, yn);
  store_outputs<T, E, kBackward, kEdgeVectors>(s, L, tf, nv, vm, 0u, h_last, v, yn);
}

// The affine map of a thread's E steps.
template <int E>
__device__ __forceinline__ Affine reduce_steps(const float (&v)[E], const float (&c)[E]) {
  Affine agg{1.f, 0.f};
#pragma unroll
  for (int i = 0; i < E; ++i) agg = ComposeOp()(agg, Affine{c[i], v[i]});
  return agg;
}

// Scans a tile whose operands are in registers: each thread reduces its E steps to one
// affine map, cub::BlockScan (with `carry` as prefix callback) gives its exclusive prefix,
// and the thread replays its steps from there and stores them.
template <typename T, int E, int NT, bool kBackward, bool kEdgeVectors>
__device__ __forceinline__ void scan_tile_registers(typename cub::BlockScan<Affine, NT>::TempStorage& storage,
                                                    TileCarry& carry, const SeqTensors<T>& s, int64_t L, int64_t tf,
                                                    int nv, unsigned vm, float (&v)[E], const float (&c)[E],
                                                    float (&yn)[E]) {
  Affine prefix;
  cub::BlockScan<Affine, NT>(storage).ExclusiveScan(reduce_steps<E>(v, c), prefix, ComposeOp(), carry);
  replay_and_store<T, E, kBackward, kEdgeVectors>(s, L, tf, nv, vm, prefix.b, v, c, yn);
}

// One block per sequence (all its tiles, one after the other) or, with look-back
// (num_chunks > 1), one block per tile, chained to its predecessors across blocks.
// The 2-byte backward's minimum blocks per SM steer ptxas' register target (the 4-byte backward
// has none: with one block it took 84 registers instead of 58 for {8,128}, and many-short
// fwd+bwd fell from 1.00 to 0.92 on the H100). 32 steps per thread: 128 registers, a few spilled
// words outside the step loops, for a third more warps per SM than at ~154 registers, which is
// faster (bench/NOTES.md item 38). 16 steps per thread: the minimum of one block.
// kPhaseShift: rows start off the 16-byte grid (odd lengths, sliced views). Each row's tiles start
// after its head (vector_head, fewer steps than a vector), so that every thread's steps are whole
// aligned vectors in each slot of the row's head; warp 0 of the row's first block scans the head
// (a lane per step, loaded before the first tile's loads) before the tile's block scan.
template <typename T, int E, int NT, bool kBackward, bool kPhaseShift>
__global__ void __launch_bounds__(NT, kBackward && sizeof(T) == 2 ? (E == 32 ? 512 / NT : 1) : 0)
    scan_tile_kernel(const ScanParams p, const TileArgs args) {
  constexpr int kTile = E * NT;
  __shared__ typename cub::BlockScan<Affine, NT>::TempStorage scan_storage;
  __shared__ int64_t s_vid;
  __shared__ int64_t s_off[kNumSlots];

  const bool lookback = args.num_chunks > 1;
  if (threadIdx.x == 0) s_vid = lookback ? static_cast<int64_t>(atomicAdd(args.lb.counter, 1ull)) : blockIdx.x;
  __syncthreads();
  const int64_t vid = s_vid;
  // Chunk-major order: all sequences' chunk k start before any chunk k+1, keeping look-back short.
  const int64_t chunk = vid / p.num_seq, seq = vid - chunk * p.num_seq;
  if (threadIdx.x < kNumSlots) s_off[threadIdx.x] = SeqIndex(p, seq).offset(p, threadIdx.x);
  __syncthreads();
  const SeqTensors<T> s(p, s_off);
  const int64_t L = p.len;
  const int head = kPhaseShift ? vector_head<T>(s.in, s.ls_in) : 0;
  const unsigned vm = kPhaseShift ? row_vector_slots(s, args.vec_mask, head) : args.vec_mask;
  // A row's last thread holds a partial run: vector accesses there too where one load per step
  // would cost most (2-byte rows, or shifted rows, whose tails are as frequent as their heads); not
  // in the 2-byte 32-step backward, at its register cap (180-220 bytes spilled), nor for aligned
  // 4-byte rows (their 8-step forward would take 54 registers instead of 46: fewer blocks per SM).
  constexpr bool kEdgeVectors = (kPhaseShift || sizeof(T) == 2) && !(kBackward && sizeof(T) == 2 && E == 32);

  TileCarry carry{kBackward ? 0.f : s.init, lookback, args.lb, seq, p.num_seq, chunk, vid};
  constexpr int kWarp0 = NT < 32 ? NT : 32;  // a power of two
  bool head_pending = kPhaseShift && head > 0 && chunk == 0;
  HeadStep head_step;
  if (head_pending && threadIdx.x < kWarp0) head_step = load_head_step<T, kBackward>(s, L, head);
  const int64_t chunk_t0 = chunk * args.tiles_per_chunk * kTile + head;
  for (int64_t tile = 0; tile < args.tiles_per_chunk; ++tile) {
    const int64_t t0 = chunk_t0 + tile * kTile;
    if (t0 >= L) break;
    const int64_t tf = t0 + static_cast<int64_t>(threadIdx.x) * E;
    const int nv = static_cast<int>(L - tf <= 0 ? 0 : (L - tf < E ? L - tf : E));
    float v[E], c[E], yn[E];
    load_tile_global<T, E, NT, kBackward, kEdgeVectors>(s, L, tf, nv, vm, v, c, yn);
    if (head_pending) {  // the block scan's prefix (thread 0's carry) starts after the head
      if (threadIdx.x < kWarp0) {
        const float h = scan_head<T, kBackward, kWarp0>(s, L, head, head_step);
        if (threadIdx.x == 0) carry.carry = h;
      }
      head_pending = false;
    }
    scan_tile_registers<T, E, NT, kBackward, kEdgeVectors>(scan_storage, carry, s, L, tf, nv, vm, v, c, yn);
    __syncthreads();  // scan_storage is reused by the next tile
  }
  if (head_pending && threadIdx.x < kWarp0) scan_head<T, kBackward, kWarp0>(s, L, head, head_step);  // a row within its head
}

}  // namespace linrec
