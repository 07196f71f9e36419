// Ring kernel (Hopper): few sequences, each much longer than a tile, e.g. (16, 2^22) or (1, 2^26),
// with the scanned dim innermost and 16-byte aligned.
//
// Persistent blocks take tiles of every sequence in chunk-major order from a counter and chain
// them by decoupled look-back, like the tile kernel's look-back mode, but a block's warps are
// specialized so that no tile waits for another tile's look-back:
// - a producer warp (one lane) claims a tile (the forward's one ahead, while it waits) and, once
//   one of the block's SLOTS shared-memory slots is free, fetches each input of the tile there with
//   one bulk copy (cp.async.bulk);
// - the NT consumer threads reduce each tile as it lands (their in-tile exclusive prefixes go to
//   shared memory, the tile's aggregate to the look-back status), and replay a reduced tile from
//   its slot once its prefix is known, then free the slot; they reduce a tile as soon as it lands
//   and replay otherwise, so aggregates are published as soon as the data is there;
// - a look-back warp resolves each tile's prefix in order (warp_look_back), starting as soon as
//   the tile is claimed, so that its round trips overlap the tile's loads; once the tile is
//   reduced it publishes the inclusive state and hands the prefix to the consumers.
// A sequence's look-back status entries are contiguous (seq * tiles per sequence + chunk), so
// the look-back warp's 32-entry read touches 4 lines, not one per entry: on 16 rows a look-back
// took ~1.8 us against ~1.1 on one row, and tiles queued ~2-4 us for the look-back warp
// (bench/NOTES.md item 69).
// The tile kernel's block holds its tile in registers from its loads to its replay, across the
// look-back, so the bytes in flight per SM are cut by the look-back's latency: it reaches ~0.69
// of a vector add on 16 x 2^22 float32, this kernel ~0.9 (bench/NOTES.md item 39).
//
// Slot handshakes (mbarriers, one phase per use of the slot): claimed (producer: the record),
// full (producer's bulk copies), reduced (the consumer warp that completes the tile's reduction:
// aggregate in shared memory), prefix (look-back warp), free (one arrival per consumer warp).
// The last tile of a sequence, when partial, is read from global memory, as in the stream
// kernel, whose shared-memory layout of a staged tile this reuses.
#pragma once
#include <cuda/ptx>

#include "configs.h"
#include "scan_stream.cuh"

namespace linrec {

struct RingArgs {
  int64_t num_chunks;  // tiles per sequence
  unsigned vec_mask;
  LookbackState lb;
};

// What the producer records of the tile in a slot (read by the consumers and the look-back warp).
template <typename T>
struct RingSlotInfo {
  int64_t status;  // look-back status index (seq * tiles per sequence + chunk), -1: no more tiles
  int64_t chunk, seq;
  // The tile's sequence, SeqTensors<T> (a constructor, so not a __shared__ member itself), with
  // `initial` read where the tile needs it (the forward's first tile, the backward's last).
  alignas(8) unsigned char tensors_bytes[sizeof(SeqTensors<T>)];
  __device__ __forceinline__ const SeqTensors<T>& tensors() const {
    return *reinterpret_cast<const SeqTensors<T>*>(tensors_bytes);
  }
};

template <typename T, int E, int NT, int SLOTS, bool kBackward>
struct RingShape {
  using Staged = StreamShape<T, E, NT, SLOTS, kBackward>;
  static constexpr int kWarps = NT / 32;    // consumer warps
  static constexpr int kThreads = NT + 64;  // + producer warp + look-back warp
  static constexpr int kSlotElems = Staged::kStreams * Staged::kRegion;
  static_assert(sizeof(RingSlotInfo<T>) <= kRingRecordBytes, "a slot record outgrew its bytes");
  static_assert(kSlotElems * sizeof(T) == staged_tile_bytes(E * NT, sizeof(T), kBackward), "configs.h's layout");
};

// The ring's shared memory (RingConfig::smem_bytes): per slot the staged tile, then per slot its
// record, five mbarriers (full, reduced, prefix ready, free, claimed), each consumer thread's
// prefix in its warp, the tile's aggregate and prefix, the consumer warps' totals and their
// arrival count.
template <typename T, int E, int NT, int SLOTS, bool kBackward>
struct RingLayout {
  using R = RingShape<T, E, NT, SLOTS, kBackward>;
  T* staged;  // [SLOTS][kSlotElems]
  RingSlotInfo<T>* info;
  uint64_t *full, *reduced, *prefix_ready, *free_slot, *claimed;
  Affine* thread_prefix;  // [SLOTS][NT]
  Affine* tile_agg;
  float* tile_prefix;   // (8 bytes per slot)
  Affine* warp_totals;  // [SLOTS][kWarps]: each warp's total, then (composed) the maps before each next warp
  unsigned* arrivals;   // [SLOTS] (8 bytes reserved each): warps that have reduced the slot's tile

  __device__ __forceinline__ explicit RingLayout(unsigned char* raw) {
    unsigned char* at = smem_align128(raw);
    auto take = [&](size_t bytes) {
      unsigned char* p = at;
      at += bytes;
      return p;
    };
    staged = reinterpret_cast<T*>(take(size_t(SLOTS) * R::kSlotElems * sizeof(T)));
    info = reinterpret_cast<RingSlotInfo<T>*>(take(SLOTS * kRingRecordBytes));
    full = reinterpret_cast<uint64_t*>(take(SLOTS * 8));
    reduced = reinterpret_cast<uint64_t*>(take(SLOTS * 8));
    prefix_ready = reinterpret_cast<uint64_t*>(take(SLOTS * 8));
    free_slot = reinterpret_cast<uint64_t*>(take(SLOTS * 8));
    claimed = reinterpret_cast<uint64_t*>(take(SLOTS * 8));
    thread_prefix = reinterpret_cast<Affine*>(take(SLOTS * NT * sizeof(Affine)));
    tile_agg = reinterpret_cast<Affine*>(take(SLOTS * sizeof(Affine)));
    tile_prefix = reinterpret_cast<float*>(take(SLOTS * 8));
    warp_totals = reinterpret_cast<Affine*>(take(SLOTS * R::kWarps * sizeof(Affine)));
    arrivals = reinterpret_cast<unsigned*>(take(SLOTS * 8));
  }
};

// Inclusive scan of the warp's lanes' maps (lane 0's first).
__device__ __forceinline__ void warp_inclusive_scan(Affine& inc) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const float a = __shfl_up_sync(0xffffffffu, inc.a, d), b = __shfl_up_sync(0xffffffffu, inc.b, d);
    if (lane >= d) inc = ComposeOp()(Affine{a, b}, inc);
  }
}

namespace ring {
// The mbarriers by their 32-bit shared-space addresses (the cuda::ptx wrappers take generic
// pointers, converted again at every poll).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.release.cta.shared::cta.b64 st, [%0];\n}" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool test(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
// Blocks until the phase of parity `parity` has completed (try_wait suspends the thread for a
// while rather than spinning).
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!ok);
}
// Whether the phase has completed, for the whole warp: each lane's test is its own acquire, and
// the warp goes on only if every lane saw it (else all poll again).
__device__ __forceinline__ bool warp_test(uint32_t bar, uint32_t parity) {
  return __all_sync(0xffffffffu, test(bar, parity));
}
// Counts one warp's arrival at a slot (release of its total, acquire of the others'); true for the
// last of `warps`, which resets the count for the slot's next tile.
__device__ __forceinline__ bool last_arrival(unsigned* count, unsigned warps) {
  cuda::atomic_ref<unsigned, cuda::thread_scope_block> a(*count);
  if (a.fetch_add(1u, cuda::memory_order_acq_rel) != warps - 1) return false;
  a.store(0u, cuda::memory_order_relaxed);
  return true;
}
// A block's n-th tile (counters are 32-bit: a block takes far fewer than 2^32 tiles): its slot and
// the parity of the slot's use. (Kept as counts alone: cursors with the slot and parity in
// registers made the 2-byte 512-thread backward spill.)
template <int SLOTS>
__device__ __forceinline__ uint32_t slot_of(uint32_t n) {
  return n % SLOTS;
}
template <int SLOTS>
__device__ __forceinline__ uint32_t parity_of(uint32_t n) {
  return n / SLOTS & 1u;
}
}  // namespace ring

// kRev: the streamed inputs are walked downwards in memory (stride -1 along the scan; +1 else).
template <typename T, int E, int NT, int SLOTS, bool kBackward, bool kRev>
__global__ void __launch_bounds__(NT + 64, 1) scan_ring_kernel(const ScanParams p, const RingArgs args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using R = RingShape<T, E, NT, SLOTS, kBackward>;
  using S = typename R::Staged;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const RingLayout<T, E, NT, SLOTS, kBackward> sh(smem_raw);
  T* const staged = sh.staged;
  RingSlotInfo<T>* const info = sh.info;
  // the slots' mbarriers by their shared-space addresses (slot s at + 8 s)
  const uint32_t full = ring::smem_u32(sh.full), reduced = ring::smem_u32(sh.reduced),
                 prefix_ready = ring::smem_u32(sh.prefix_ready), free_slot = ring::smem_u32(sh.free_slot);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t L = p.len, num_tiles = p.num_seq * args.num_chunks;
  args.lb.clean_up();
  if (threadIdx.x == 0) {
    for (int s = 0; s < SLOTS; ++s) {
      cuda::ptx::mbarrier_init(&sh.full[s], 1);
      cuda::ptx::mbarrier_init(&sh.reduced[s], 1);
      cuda::ptx::mbarrier_init(&sh.prefix_ready[s], 1);
      cuda::ptx::mbarrier_init(&sh.free_slot[s], R::kWarps);
      cuda::ptx::mbarrier_init(&sh.claimed[s], 1);
      sh.arrivals[s] = 0;
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();

  // The producer's work per tile is on the slot's critical path (a lone thread among spinning
  // warps: its index arithmetic took ~1.3 us per tile with 64-bit divisions, item 69), hence
  // a 32-bit division where the tile ids fit and none for the batch index of (N, L) inputs (here,
  // not in SeqIndex: there it made the 2-byte reverse backward spill 62 bytes instead of 46).
  // The forward claims each tile and works out its record one tile ahead, while it waits for the
  // slot to be freed, so that a freed slot's copies are issued at once (a claimed tile depends
  // only on tiles claimed before it, each in a slot or held by a block whose slots hold earlier
  // ones: no cycle); H200 forward +1-3%, H100 +0.3-1.3%. Not the backward: its four slots live
  // longer, and a tile claimed early holds up its row's later tiles (H100 1 x 2^26 and 4 x 2^24
  // backward -2%; item 70).
  if (warp == R::kWarps) {  // producer
    if (lane != 0) return;
    constexpr bool kClaimAhead = !kBackward;
    const uint32_t claimed = ring::smem_u32(sh.claimed);
    const bool narrow = num_tiles <= 0xffffffffll;
    auto claim = [&] { return static_cast<int64_t>(atomicAdd(args.lb.counter, 1ull)); };
    int64_t vid = kClaimAhead ? claim() : 0;
    for (uint32_t i = 0;; ++i) {
      const int s = static_cast<int>(ring::slot_of<SLOTS>(i));
      const uint32_t free_bar = free_slot + 8 * s;
      const uint32_t free_parity = ring::parity_of<SLOTS>(i) ^ 1u;  // the first use of each slot passes at once
      if constexpr (!kClaimAhead) {
        ring::wait(free_bar, free_parity);
        vid = claim();
      }
      RingSlotInfo<T>& in = info[s];
      if (vid >= num_tiles) {  // ends the consumers and the look-back warp
        if constexpr (kClaimAhead) ring::wait(free_bar, free_parity);
        in.status = -1;
        ring::arrive(full + 8 * s);
        ring::arrive(claimed + 8 * s);
        return;
      }
      // chunk-major ids: all sequences' chunk k are claimed before any chunk k + 1
      const int64_t chunk = narrow ? static_cast<uint32_t>(vid) / static_cast<uint32_t>(p.num_seq) : vid / p.num_seq;
      const int64_t seq = vid - chunk * p.num_seq;
      int64_t off[kNumSlots];
      if (p.nbatch == 1) {  // (N, L): no division
#pragma unroll
        for (int j = 0; j < kNumSlots; ++j) off[j] = seq * p.bstride[j][0];
      } else {
        const SeqIndex index(p, seq);
#pragma unroll
        for (int j = 0; j < kNumSlots; ++j) off[j] = index.offset(p, j);
      }
      const bool needs_init = kBackward ? chunk == args.num_chunks - 1 : chunk == 0;
      const SeqTensors<T> st(p, off, needs_init);
      if constexpr (kClaimAhead) ring::wait(free_bar, free_parity);
      in.status = seq * args.num_chunks + chunk, in.chunk = chunk, in.seq = seq;
      *reinterpret_cast<SeqTensors<T>*>(in.tensors_bytes) = st;
      ring::arrive(claimed + 8 * s);  // (release: the record, for the look-back warp)
      stage_tile<T, E, NT, SLOTS, kBackward>(st, L, chunk * S::kTile, staged + s * R::kSlotElems, &sh.full[s]);
      if constexpr (kClaimAhead) vid = claim();
    }
  }

  if (warp == R::kWarps + 1) {  // look-back
    const uint32_t claimed = ring::smem_u32(sh.claimed);
    for (uint32_t i = 0;; ++i) {
      const int s = static_cast<int>(ring::slot_of<SLOTS>(i));
      ring::wait(claimed + 8 * s, ring::parity_of<SLOTS>(i));
      const RingSlotInfo<T>& in = info[s];
      if (in.status < 0) return;
      // (the tile's own aggregate is not needed until the inclusive state is published)
      const float h = in.chunk == 0 ? (kBackward ? 0.f : in.tensors().init)
                                    : args.lb.warp_look_back(in.status - in.chunk, 1, in.chunk);
      ring::wait(reduced + 8 * s, ring::parity_of<SLOTS>(i));
      __syncwarp();  // every lane has read the record before lane 0's release frees it for reuse
      if (lane == 0) {
        if (in.chunk + 1 < args.num_chunks)
          args.lb.publish_inclusive(in.status, fmaf(sh.tile_agg[s].a, h, sh.tile_agg[s].b));
        sh.tile_prefix[s] = h;
        ring::arrive(prefix_ready + 8 * s);
      }
      __syncwarp();
    }
  }

  // Consumers: reduce the next staged tile as soon as it lands (its aggregate is what the
  // look-backs of later tiles, in other blocks too, wait for), else replay the oldest reduced tile
  // when its prefix is ready (bench/NOTES.md item 58: bf16 16 x 2^22 backward -4% against replay
  // first). Each warp goes at its own pace (no barrier between consumer warps): it scans its
  // lanes' maps and leaves its total, and the tile's last warp to do so composes the totals and
  // hands the tile's aggregate to the look-back warp.
  // The warp polls both events only while both can happen; when one cannot, it blocks in try_wait
  // on the other. Polls were ~40% of the consumers' instructions (ncu, H200; bench/NOTES.md item 68).
  uint32_t next_reduce = 0, next_replay = 0;
  bool claimed_all = false;
  for (;;) {
    const bool can_replay = next_replay != next_reduce;
    // The next tile's slot is refilled only once every warp, this one too, has replayed its last tile.
    const bool can_reduce = !claimed_all && next_reduce - next_replay < SLOTS;
    const uint32_t full_bar = full + 8 * ring::slot_of<SLOTS>(next_reduce), full_parity = ring::parity_of<SLOTS>(next_reduce);
    const uint32_t prefix_bar = prefix_ready + 8 * ring::slot_of<SLOTS>(next_replay),
                   prefix_parity = ring::parity_of<SLOTS>(next_replay);
    bool reduce;
    if (can_reduce && can_replay) {
      // (an inner loop: the addresses above are not worked out again at every poll; a try_wait
      // with a suspend-time hint in place of the first test was 35% slower, item 68)
      for (;;) {
        if (ring::warp_test(full_bar, full_parity)) {
          reduce = true;
          break;
        }
        if (ring::warp_test(prefix_bar, prefix_parity)) {
          reduce = false;
          break;
        }
      }
    } else if (can_reduce) {
      ring::wait(full_bar, full_parity);
      reduce = true;
    } else if (can_replay) {
      ring::wait(prefix_bar, prefix_parity);
      reduce = false;
    } else {
      break;
    }
    if (reduce) {
      const int s = static_cast<int>(ring::slot_of<SLOTS>(next_reduce));
      const RingSlotInfo<T>& in = info[s];
      if (in.status < 0) {
        claimed_all = true;
        continue;
      }
      float v[E], c[E], yn[E];
      load_operands<T, E, NT, SLOTS, kBackward, kRev ? -1 : 1>(staged + s * R::kSlotElems, in.tensors(), L,
                                                                 in.chunk * S::kTile, args.vec_mask, v, c, yn);
      StepRuns<E> runs;
      Affine inc = reduce_steps<E>(v, c, runs);
      warp_inclusive_scan(inc);
      const float ea = __shfl_up_sync(0xffffffffu, inc.a, 1), eb = __shfl_up_sync(0xffffffffu, inc.b, 1);
      sh.thread_prefix[s * NT + threadIdx.x] = lane == 0 ? Affine{1.f, 0.f} : Affine{ea, eb};
      Affine* const totals = sh.warp_totals + s * R::kWarps;
      bool last = false;
      if (lane == 31) {
        totals[warp] = inc;
        last = ring::last_arrival(&sh.arrivals[s], R::kWarps);
      }
      ++next_reduce;
      if (!__shfl_sync(0xffffffffu, last, 31)) continue;
      __syncwarp();  // lane 31's acquire of the other warps' totals orders the lanes' reads below
      // Lane w < kWarps takes warp w's total; their scan gives each warp the map before the next one
      // and the tile's aggregate.
      Affine t = lane < R::kWarps ? totals[lane] : Affine{1.f, 0.f};
      warp_inclusive_scan(t);
      if (lane < R::kWarps) totals[lane] = t;
      const Affine all{__shfl_sync(0xffffffffu, t.a, R::kWarps - 1), __shfl_sync(0xffffffffu, t.b, R::kWarps - 1)};
      __syncwarp();  // the composed totals are written before lane 0's release on `reduced`
      if (lane == 0) {
        if (in.chunk > 0) args.lb.publish_aggregate(in.status, all);
        sh.tile_agg[s] = all;
        ring::arrive(reduced + 8 * s);
      }
      continue;
    }
    const int s = static_cast<int>(ring::slot_of<SLOTS>(next_replay));
    const RingSlotInfo<T>& in = info[s];
    const SeqTensors<T>& st = in.tensors();
    const int64_t t0 = in.chunk * S::kTile;
    float v[E], c[E], yn[E];
    load_operands<T, E, NT, SLOTS, kBackward, kRev ? -1 : 1>(staged + s * R::kSlotElems, st, L, t0, args.vec_mask,
                                                               v, c, yn);
    const Affine pre = sh.thread_prefix[s * NT + threadIdx.x];
    float h = sh.tile_prefix[s];
    if (warp > 0) {
      const Affine before = sh.warp_totals[s * R::kWarps + warp - 1];
      h = fmaf(before.a, h, before.b);
    }
    h = fmaf(pre.a, h, pre.b);
    const int64_t tf = t0 + static_cast<int64_t>(threadIdx.x) * E;
    const StepSpan r = step_span<E>(tf, L);
    const float h_last = replay_steps<E, kBackward>(h, StepRuns<E, 1>{}, r, v, c, yn);
    // A full tile's outputs, when all run the inputs' way 16-byte aligned, go through the slot's
    // first region (x or grad_y: each step there is read only by the thread that holds it). The
    // gradient of the initial state is written here, not by store_outputs: with store_outputs on
    // this path the 2-byte 512-thread backward spilled 130 bytes instead of 58.
    constexpr unsigned kOuts = kBackward ? (1u << kGradIn) | (1u << kGradCoeff) : 1u << kOut;
    const bool via_slot = t0 + S::kTile <= L && (args.vec_mask & kOuts) == kOuts &&
                          (kBackward ? (st.ls_dx < 0) == kRev && (st.ls_dc < 0) == kRev : (st.ls_y < 0) == kRev);
    if (via_slot) {
      T* const region = staged + s * R::kSlotElems + S::kHalo;
      store_span_by_warps<T, E, NT, kBackward>(region, kBackward ? st.dx : st.y, t0, kRev, v);
      if constexpr (kBackward) {
        store_span_by_warps<T, E, NT, kBackward>(region, st.dc, t0, kRev, yn);
        if (t0 + S::kTile == L && threadIdx.x == NT - 1)  // d initial = c[L-1] * g[L-1]
          *st.dh0 = from_float<T>(to_float(st.cf[(L - 1) * st.ls_c]) * h_last);
      }
    } else {
      store_outputs<T, E, kBackward>(st, L, tf, r, args.vec_mask, 0u, h_last, v, yn);
    }
    // The slot's record (st) is read until here; the producer's next bulk copy into the region
    // must come after the forward's generic-proxy writes above (the backward's bulk stores
    // have read it).
    if (!kBackward && via_slot) cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
    __syncwarp();
    if (lane == 0) ring::arrive(free_slot + 8 * s);
    ++next_replay;
  }
  if (kBackward && lane == 0) cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});  // the warp's output stores
#else
  __trap();  // planned only on compute capability >= 9.0
#endif
}

}  // namespace linrec
