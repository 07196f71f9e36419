// Stream kernel (Hopper): sequences with the scanned dim innermost and 16-byte aligned, as
// many as the GPU has SMs or a few times more, each longer than a tile, e.g. (128, 2^20).
//
// One block walks one sequence, tile after tile, with the state carried in registers (no
// look-back). Its loads are decoupled from its work: thread 0 fetches each tile of every
// input with one bulk copy (cp.async.bulk, completion on a shared-memory mbarrier) STAGES
// tiles ahead, while the block scans the oldest staged tile: registers from shared memory,
// a block scan with one barrier per tile (scan_block_one_barrier), replay. The outputs of a
// full tile go back through shared memory: each thread writes its steps there, and after the
// next tile's barrier thread 0 stores the whole tile with one bulk copy per output (whole
// lines, no per-thread stores). (The tile kernel keeps a tile in registers and has nothing in
// flight while it scans; with too few sequences for many resident blocks it cannot hide the
// load latency.)
//
// Per tile, thread 0's producer work is on the block's critical path (every warp waits for
// it at the next barrier), so the sequence's pointers are set up once per block, and the
// tile loop has no 64-bit divisions: with them (a tile id decoded per tile, pointers rebuilt)
// a tile cost ~1.1 us more whatever its size (few-long on the H100, with cub::BlockScan and
// before the aligned stages below: 0.85 of torch.add, 0.59 with 8 KB tiles; without them and
// with the one-barrier scan: 0.88 and 0.84).
//
// The backward also needs c[t-1] and y[t+1] across the tile edges: the copies of c and y
// carry a 16-byte halo before / after the tile (where it lies inside the sequence).
// The last tile of a sequence, when partial, is read straight from global memory.
//
// A look-back variant (persistent blocks taking tiles of few long sequences in chunk-major
// order, tiles chained by decoupled look-back) measured slower on the H200 than the tile
// kernel's register-held look-back (0.42-0.61 vs 0.56-0.69 of torch.add on few-long), with
// aggregates published on landing or at scan time, and was dropped (it had the per-tile
// overheads above).
#pragma once
#include <cuda/ptx>

#include "scan_tile.cuh"
#include "scan_vec.cuh"

namespace linrec {

struct StreamArgs {
  int64_t num_chunks;  // tiles per sequence
  unsigned vec_mask;   // slots that take 16-byte vector accesses (every streamed input does)
  unsigned bulk_mask;  // output slots whose full tiles leave through shared memory in bulk stores
};

// The dynamic shared memory from its first 128-byte boundary. (The padding is worked out from the
// shared-space address: from the generic one, each rematerialized pointer reads the shared
// window's base again, bench/NOTES.md item 68.)
__device__ __forceinline__ unsigned char* smem_align128(unsigned char* raw) {
  return raw + (0u - static_cast<uint32_t>(__cvta_generic_to_shared(raw)) & 127u);
}

template <typename T, int E, int NT, int STAGES, bool kBackward>
struct StreamShape {
  static constexpr int kTile = E * NT;
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  static constexpr int kVecsPerThread = E / kVec;
  static constexpr int kStreams = kBackward ? 3 : 2;  // x or grad_y, coeffs, (y)
  static constexpr int kOuts = kBackward ? 2 : 1;     // y, or dx and dc
  // Backward: a 128-byte slot on each side of the tile, whose inner 16 bytes take the halo: tiles
  // start 128-byte aligned in shared memory. (With 16-byte slots the bulk copies of few-long read
  // 1.2x the sectors from L2: 40.3M vs 33.6M, ncu on the H100.) The forward reads no halo.
  static constexpr int kHalo = kBackward ? 128 / static_cast<int>(sizeof(T)) : 0;
  static constexpr int kRegion = kTile + 2 * kHalo;
  static_assert(E % kVec == 0 && (kVecsPerThread & (kVecsPerThread - 1)) == 0 && kVecsPerThread <= 8,
                "a thread reads a power of two of 16-byte vectors, at most 8");

  // Index in a stream's region of walk step `w` of the tile (-kVec <= w < kTile + kVec): the
  // tile sits after the leading halo slot in address order, which is reversed when ls < 0.
  __device__ __forceinline__ static int index(int w, bool rev) { return rev ? kHalo + kTile - 1 - w : kHalo + w; }
};

// Thread `i` reads its E steps of a staged tile (see read_chunk).
template <typename T, int E, int NT, int STAGES, bool kBackward>
__device__ __forceinline__ void load_staged(const T* region, bool rev, float (&out)[E]) {
  using S = StreamShape<T, E, NT, STAGES, kBackward>;
  read_chunk<T, E, NT>(region + S::kHalo, rev, out);
}

// L2 prefetch of walk steps [t0, L) of a sequence at `base` (a partial last tile): one bulk
// prefetch of its whole 16-byte vectors, from the lowest address (the streamed inputs are
// vectorizable: that address is 16-byte aligned, plan.h `config_applies`).
template <typename T>
__device__ __forceinline__ void prefetch_rest_l2(const T* base, int64_t ls, int64_t L, int64_t t0) {
  const T* lowest = ls < 0 ? base - (L - 1) : base + t0;
  const uint32_t bytes = static_cast<uint32_t>((L - t0) * sizeof(T)) & ~15u;
  if (bytes) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lowest), "r"(bytes) : "memory");
}

// Producer side, run by thread 0: stages tile `k` of the sequence (steps t0 = k kTile ..) in a
// stage with one bulk copy per input, completing on the stage's barrier. A partial last tile is
// only arrived on (the consumers read it from global memory) and its inputs prefetched into L2,
// so that those reads, issued when its turn comes, do not wait for DRAM.
template <typename T, int E, int NT, int STAGES, bool kBackward>
__device__ __forceinline__ void stage_tile(const SeqTensors<T>& s, int64_t L, int64_t t0, T* stage, uint64_t* bar) {
  using S = StreamShape<T, E, NT, STAGES, kBackward>;
  const bool full = t0 + S::kTile <= L;
  const bool c_halo = kBackward && t0 > 0;                       // c[t0-1]: the step before the tile
  const bool y_halo = kBackward && t0 + S::kTile + S::kVec <= L;  // y[t0+tile]: the step after
  uint32_t bytes = 0;
  if (full) bytes = (S::kStreams * S::kTile + (c_halo + y_halo) * S::kVec) * sizeof(T);
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar,
                                       bytes);
  if (!full) {
    prefetch_rest_l2(s.in, s.ls_in, L, t0);
    prefetch_rest_l2(s.cf, s.ls_c, L, t0);
    if constexpr (kBackward) prefetch_rest_l2(s.y, s.ls_y, L, t0);
    return;
  }
  // Copies walk steps [t0 + w0, t0 + w0 + cnt) of the sequence at `base` into stream `j`'s region.
  auto copy = [&](const T* base, int64_t ls, int j, int w0, int cnt) {
    const bool rev = ls < 0;
    const T* src = rev ? base - (t0 + w0 + cnt - 1) : base + (t0 + w0);
    T* dst = stage + j * S::kRegion + (rev ? S::kHalo + S::kTile - (w0 + cnt) : S::kHalo + w0);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, src,
                             static_cast<uint32_t>(cnt * sizeof(T)), bar);
  };
  copy(s.in, s.ls_in, 0, 0, S::kTile);
  copy(s.cf, s.ls_c, 1, 0, S::kTile);
  if constexpr (kBackward) {
    copy(s.y, s.ls_y, 2, 0, S::kTile);
    if (c_halo) copy(s.cf, s.ls_c, 1, -S::kVec, S::kVec);
    if (y_halo) copy(s.y, s.ls_y, 2, S::kTile, S::kVec);
  }
}

// Scan of the block's thread maps with one barrier: each warp scans its lanes' maps with
// shuffles and publishes its total; after the barrier every warp composes the totals before
// it onto the carried state (and all of them onto the next tile's carry, the same in every
// thread). `totals` is double-buffered by tile parity: a buffer is rewritten two barriers
// after it was read. (cub::BlockScan's raking algorithms take two or three barriers and one
// warp's serial raking per tile; the stream block crosses one barrier per tile.)
// Returns the state before the thread's first step.
template <int NT>
__device__ __forceinline__ float scan_block_one_barrier(Affine mine, float& carry, Affine* totals) {
  constexpr int kWarps = NT / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  Affine inc = mine;  // inclusive: lanes 0 .. lane of this warp
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const float a = __shfl_up_sync(0xffffffffu, inc.a, d), b = __shfl_up_sync(0xffffffffu, inc.b, d);
    if (lane >= d) inc = ComposeOp()(Affine{a, b}, inc);
  }
  if (lane == 31) totals[warp] = inc;
  __syncthreads();
  float h = carry, h_warp = carry;  // state before warp w, then after the tile
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp) h_warp = h;
    const Affine t = totals[w];
    h = fmaf(t.a, h, t.b);
  }
  carry = h;
  const float a = __shfl_up_sync(0xffffffffu, inc.a, 1), b = __shfl_up_sync(0xffffffffu, inc.b, 1);
  return lane == 0 ? h_warp : fmaf(a, h_warp, b);
}

// A thread's operands of the tile staged in `st` (from global memory when the tile is partial).
// kDir: the sign of every streamed input's stride along the scan when the caller knows it at
// compile time (+1 or -1; the ring kernel), 0: read from `s`.
template <typename T, int E, int NT, int STAGES, bool kBackward, int kDir = 0>
__device__ __forceinline__ void load_operands(const T* region, const SeqTensors<T>& s, int64_t L, int64_t t0,
                                              unsigned vm, float (&v)[E], float (&c)[E], float (&yn)[E]) {
  using S = StreamShape<T, E, NT, STAGES, kBackward>;
  const bool rev_in = kDir != 0 ? kDir < 0 : s.ls_in < 0;
  const bool rev_c = kDir != 0 ? kDir < 0 : s.ls_c < 0;
  const bool rev_y = kDir != 0 ? kDir < 0 : s.ls_y < 0;
  const int64_t tf = t0 + static_cast<int64_t>(threadIdx.x) * E;
  const StepSpan r = step_span<E>(tf, L);
  if (t0 + S::kTile > L) {
    load_tile_global<T, E, NT, kBackward>(s, L, tf, r, vm, v, c, yn);
    return;
  }
  load_staged<T, E, NT, STAGES, kBackward>(region, rev_in, v);
  load_staged<T, E, NT, STAGES, kBackward>(region + S::kRegion, rev_c, c);
  if constexpr (kBackward) {
    const T* rc = region + S::kRegion;
    const T* ry = region + 2 * S::kRegion;
    load_staged<T, E, NT, STAGES, kBackward>(ry, rev_y, yn);
    const int w = threadIdx.x * E;  // walk step of this thread's first element in the tile
    const float c_before = tf > 0 ? to_float(rc[S::index(w - 1, rev_c)]) : 0.f;
    float y_after = 0.f;
    if (tf + E < L) {
      y_after = (threadIdx.x + 1 < NT || t0 + S::kTile + S::kVec <= L) ? to_float(ry[S::index(w + E, rev_y)])
                                                                        : to_float(s.y[(tf + E) * s.ls_y]);
    }
    shift_backward_operands<E>(c, yn, c_before, y_after, tf, r, L, s.init);
  }
}

// Output slot j of the stream kernel (forward: y; backward: dx, dc), and a slot's pointer and
// signed stride.
template <bool kBackward>
__device__ __forceinline__ int out_slot(int j) {
  return kBackward ? (j == 0 ? kGradIn : kGradCoeff) : kOut;
}
template <typename T>
__device__ __forceinline__ T* out_base(const SeqTensors<T>& s, int slot, int64_t& ls) {
  ls = slot == kOut ? s.ls_y : (slot == kGradIn ? s.ls_dx : s.ls_dc);
  return slot == kOut ? s.y : (slot == kGradIn ? s.dx : s.dc);
}

// Resident blocks per SM the launch bounds ask for: eight of the 2-byte forward's small blocks (at 68
// registers an SM held seven, and 7-8 rows per SM made a second wave: H200 bf16 1000 x 12000 0.71 ->
// 0.82-0.85 of torch.add, 1050 x 10000 0.71-0.74 -> 0.85-0.88; at fewer rows per SM a 68-register
// build measured level with it, bench/NOTES.md items 85-86).
template <typename T, int NT, bool kBackward>
constexpr int stream_min_blocks() {
  return sizeof(T) == 2 && NT == 128 && !kBackward ? 8 : 1;
}

template <typename T, int E, int NT, int STAGES, bool kBackward>
__global__ void __launch_bounds__(NT, stream_min_blocks<T, NT, kBackward>()) scan_stream_kernel(const ScanParams p, const StreamArgs args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using S = StreamShape<T, E, NT, STAGES, kBackward>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // 2 x kOuts tiles of outputs to bulk-store, then the inputs' stages, from a 128-byte boundary
  T* const outbuf = reinterpret_cast<T*>(smem_align128(smem_raw));
  T* const staged = outbuf + 2 * S::kOuts * S::kTile;  // STAGES x kStreams regions: inputs
  __shared__ Affine totals[2][NT / 32];
  __shared__ __align__(8) uint64_t bar[STAGES];
  __shared__ int64_t s_off[kNumSlots];

  const int64_t L = p.len, num_tiles = args.num_chunks;
  if (threadIdx.x < kNumSlots) s_off[threadIdx.x] = SeqIndex(p, blockIdx.x).offset(p, threadIdx.x);
  __syncthreads();
  const SeqTensors<T> s(p, s_off);
  // (tile counters taken 32-bit for the stage arithmetic: a sequence has far fewer than 2^32 tiles)
  auto region = [&](int64_t k) { return staged + (static_cast<uint32_t>(k) % STAGES) * S::kStreams * S::kRegion; };
  // Thread 0: global destinations of the outputs staged in outbuf by the previous tile (null: none).
  T* pending[S::kOuts] = {};
  auto store_pending = [&](int buf) {
    bool any = false;
#pragma unroll
    for (int j = 0; j < S::kOuts; ++j) {
      if (!pending[j]) continue;
      cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, pending[j],
                               outbuf + (buf * S::kOuts + j) * S::kTile, static_cast<uint32_t>(S::kTile * sizeof(T)));
      pending[j] = nullptr;
      any = true;
    }
    if (any) cuda::ptx::cp_async_bulk_commit_group();
  };
  if (threadIdx.x == 0) {
    for (int st = 0; st < STAGES; ++st) cuda::ptx::mbarrier_init(&bar[st], 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
    for (int64_t k = 0; k < STAGES && k < num_tiles; ++k)
      stage_tile<T, E, NT, STAGES, kBackward>(s, L, k * S::kTile, region(k), &bar[k]);
  }
  __syncthreads();

  float carry = kBackward ? 0.f : s.init;
  for (int64_t it = 0; it < num_tiles; ++it) {
    const int st = static_cast<int>(static_cast<uint32_t>(it) % STAGES), buf = static_cast<int>(it & 1);
    while (!cuda::ptx::mbarrier_try_wait_parity(&bar[st], (static_cast<uint32_t>(it) / STAGES) & 1)) {
    }
    const int64_t t0 = it * S::kTile;
    const int64_t tf = t0 + static_cast<int64_t>(threadIdx.x) * E;
    const StepSpan r = step_span<E>(tf, L);
    float v[E], c[E], yn[E];
    load_operands<T, E, NT, STAGES, kBackward>(region(it), s, L, t0, args.vec_mask, v, c, yn);
    // outbuf[buf] was last bulk-stored from after the previous barrier: thread 0 waits for those
    // reads to finish before this tile's barrier, after which every thread rewrites it
    if (threadIdx.x == 0 && args.bulk_mask) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
    StepRuns<E> runs;
    const float h = scan_block_one_barrier<NT>(reduce_steps<E>(v, c, runs), carry, totals[buf]);
    if (threadIdx.x == 0) {  // past the barrier: every thread has read stage st and written outbuf[buf ^ 1]
      store_pending(buf ^ 1);
      if (it + STAGES < num_tiles)
        stage_tile<T, E, NT, STAGES, kBackward>(s, L, (it + STAGES) * S::kTile, region(it), &bar[st]);
    }
    const float h_last = replay_steps<E, kBackward>(h, runs, r, v, c, yn);
    const unsigned bulk = t0 + S::kTile <= L ? args.bulk_mask : 0u;
    if (bulk) {
#pragma unroll
      for (int j = 0; j < S::kOuts; ++j) {
        const int slot = out_slot<kBackward>(j);
        if (!(bulk >> slot & 1)) continue;
        int64_t ls;
        T* base = out_base<T>(s, slot, ls);
        write_chunk<T, E, NT>(outbuf + (buf * S::kOuts + j) * S::kTile, ls < 0, j == 0 ? v : yn);
        if (threadIdx.x == 0) pending[j] = ls > 0 ? base + t0 : base - (t0 + S::kTile - 1);
      }
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // visible to the bulk store
    }
    store_outputs<T, E, kBackward>(s, L, tf, r, args.vec_mask, bulk, h_last, v, yn);
  }
  __syncthreads();  // the last tile's outputs are in outbuf
  if (threadIdx.x == 0) {
    store_pending(static_cast<int>((num_tiles - 1) & 1));
    cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
  }
#else
  __trap();  // planned only on compute capability >= 9.0
#endif
}

}  // namespace linrec
