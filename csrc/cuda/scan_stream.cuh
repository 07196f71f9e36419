// Stream kernel (Hopper): long sequences with the scanned dim innermost and 16-byte aligned,
// e.g. (N, L) with few sequences and L >> tile.
//
// The tile kernel in look-back mode holds a block's whole tile in registers while warp 0
// waits on its predecessors, so the SM has no loads in flight during the wait (0.63 of
// torch.add on 128 x 2^20 float32, H100). Here a persistent block keeps STAGES tiles in
// flight: thread 0 takes tile ids from the global counter (chunk-major, as the tile kernel)
// and fetches each tile of every input with one bulk copy (cp.async.bulk, completion on a
// shared-memory mbarrier); the block scans the oldest staged tile - registers from shared
// memory, cub::BlockScan, decoupled look-back - while the next tiles stream in. A block
// scans its tiles in the order it took them, so every wait is on a tile taken earlier,
// whose block makes progress: the look-back cannot deadlock.
//
// The backward also needs c[t-1] and y[t+1] across the tile edges: the copies of c and y
// carry a 16-byte halo before / after the tile (where it lies inside the sequence).
// The last tile of a sequence, when partial, is read straight from global memory.
#pragma once
#include <cuda/ptx>

#include "scan_tile.cuh"

namespace linrec {

struct StreamArgs {
  int64_t num_chunks;  // tiles per sequence
  unsigned vec_mask;   // slots that take 16-byte vector accesses (every streamed input does)
  LookbackState lb;
};

template <typename T, int E, int NT, int STAGES, bool kBackward>
struct StreamShape {
  static constexpr int kTile = E * NT;
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  static constexpr int kVecsPerThread = E / kVec;
  static constexpr int kStreams = kBackward ? 3 : 2;  // x or grad_y, coeffs, (y)
  static constexpr int kRegion = kTile + 2 * kVec;    // a 16-byte halo slot on each side
  static constexpr size_t kSmemBytes = size_t(STAGES) * kStreams * kRegion * sizeof(T);
  static_assert(E % kVec == 0 && (kVecsPerThread & (kVecsPerThread - 1)) == 0 && kVecsPerThread <= 8,
                "a thread reads a power of two of 16-byte vectors, at most 8");

  // Index in a stream's region of walk step `w` of the tile (-kVec <= w < kTile + kVec): the
  // tile sits after the leading halo slot in address order, which is reversed when ls < 0.
  __device__ __forceinline__ static int index(int w, bool rev) { return rev ? kVec + kTile - 1 - w : kVec + w; }
};

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

// Thread `i` reads its E steps of a staged tile as kVecsPerThread 16-byte vectors. Thread i's
// vectors sit 16 * kVecsPerThread bytes apart, so in-order reads by 8 threads (one shared
// memory wavefront) would hit the same banks; each thread starts at vector
// (i / (8 / kVecsPerThread)) instead and puts the vectors back in order with selects.
template <typename T, int E, int NT, int STAGES, bool kBackward>
__device__ __forceinline__ void load_staged(const T* region, bool rev, float (&out)[E]) {
  using S = StreamShape<T, E, NT, STAGES, kBackward>;
  constexpr int kNV = S::kVecsPerThread;
  const int i = threadIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(region + S::kVec + (rev ? NT - 1 - i : i) * E);
  const int r = kNV >= 8 ? (i & (kNV - 1)) : (i / (8 / kNV)) & (kNV - 1);
  uint4 got[kNV];
#pragma unroll
  for (int k = 0; k < kNV; ++k) got[k] = src[(k + r) & (kNV - 1)];
#pragma unroll
  for (int j = 0; j < kNV; ++j) {
    uint4 u = got[0];
#pragma unroll
    for (int k = 1; k < kNV; ++k) u = select_vec(((j - r) & (kNV - 1)) == k, got[k], u);
    float f[S::kVec];
    unpack_vec<T>(u, f);
#pragma unroll
    for (int e = 0; e < S::kVec; ++e) {
      if (!rev) out[j * S::kVec + e] = f[e];
      else out[E - 1 - (j * S::kVec + e)] = f[e];
    }
  }
}

// Producer side, run by thread 0: stages tile `vid` in stage `st` (or only arrives on the
// stage's barrier when the tile is partial or past the end), recording the tile id and its
// sequence's slot offsets for the consumers.
template <typename T, int E, int NT, int STAGES, bool kBackward>
__device__ __forceinline__ void stage_tile(const ScanParams& p, int64_t vid, int64_t num_tiles, T* stage,
                                           uint64_t* bar, int64_t* s_vid, int64_t* s_off) {
  using S = StreamShape<T, E, NT, STAGES, kBackward>;
  *s_vid = vid;
  const int64_t chunk = vid / p.num_seq, seq = vid - chunk * p.num_seq;
  const int64_t t0 = chunk * S::kTile, L = p.len;
  const bool full = vid < num_tiles && t0 + S::kTile <= L;
  const bool c_halo = kBackward && t0 > 0;                       // c[t0-1]: the step before the tile
  const bool y_halo = kBackward && t0 + S::kTile + S::kVec <= L;  // y[t0+tile]: the step after
  uint32_t bytes = 0;
  if (full) bytes = (S::kStreams * S::kTile + (c_halo + y_halo) * S::kVec) * sizeof(T);
  if (vid < num_tiles) {
    const SeqIndex si(p, seq);
#pragma unroll
    for (int slot = 0; slot < kNumSlots; ++slot) s_off[slot] = si.offset(p, slot);
  }
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar,
                                       bytes);
  if (!full) return;
  // Copies walk steps [t0 + w0, t0 + w0 + cnt) of `slot` into stream `j`'s region.
  auto copy = [&](int slot, int j, int w0, int cnt) {
    const T* base = static_cast<const T*>(p.ptr[slot]) + s_off[slot];
    const bool rev = p.lstride[slot] < 0;
    const T* src = rev ? base - (t0 + w0 + cnt - 1) : base + (t0 + w0);
    T* dst = stage + j * S::kRegion + (rev ? S::kVec + S::kTile - (w0 + cnt) : S::kVec + w0);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, src,
                             static_cast<uint32_t>(cnt * sizeof(T)), bar);
  };
  copy(kIn, 0, 0, S::kTile);
  copy(kCoeff, 1, 0, S::kTile);
  if constexpr (kBackward) {
    copy(kOut, 2, 0, S::kTile);
    if (c_halo) copy(kCoeff, 1, -S::kVec, S::kVec);
    if (y_halo) copy(kOut, 2, S::kTile, S::kVec);
  }
}

// A thread's operands of the tile staged in `st` (from global memory when the tile is partial).
template <typename T, int E, int NT, int STAGES, bool kBackward>
__device__ __forceinline__ void load_operands(const T* region, const SeqTensors<T>& s, int64_t L, int64_t t0,
                                              unsigned vm, float (&v)[E], float (&c)[E], float (&yn)[E]) {
  using S = StreamShape<T, E, NT, STAGES, kBackward>;
  const int64_t tf = t0 + static_cast<int64_t>(threadIdx.x) * E;
  const int nv = static_cast<int>(L - tf <= 0 ? 0 : (L - tf < E ? L - tf : E));
  if (t0 + S::kTile > L) {
    load_tile_global<T, E, kBackward>(s, L, tf, nv, vm, v, c, yn);
    return;
  }
  load_staged<T, E, NT, STAGES, kBackward>(region, s.ls_in < 0, v);
  load_staged<T, E, NT, STAGES, kBackward>(region + S::kRegion, s.ls_c < 0, c);
  if constexpr (kBackward) {
    const T* rc = region + S::kRegion;
    const T* ry = region + 2 * S::kRegion;
    load_staged<T, E, NT, STAGES, kBackward>(ry, s.ls_y < 0, yn);
    const int w = threadIdx.x * E;  // walk step of this thread's first element in the tile
    const float c_before = tf > 0 ? to_float(rc[S::index(w - 1, s.ls_c < 0)]) : 0.f;
    float y_after = 0.f;
    if (tf + E < L) {
      y_after = (threadIdx.x + 1 < NT || t0 + S::kTile + S::kVec <= L) ? to_float(ry[S::index(w + E, s.ls_y < 0)])
                                                                        : to_float(s.y[(tf + E) * s.ls_y]);
    }
    shift_backward_operands<E>(c, yn, c_before, y_after, tf, nv, L, s.init);
  }
}

// Each tile goes through two steps one loop iteration apart. Reduce: the tile's aggregate is
// published as soon as its copy lands (its exclusive prefix within the tile is kept per
// thread). Finish, one iteration later, after the next tile was reduced: look back, publish
// the inclusive prefix, replay from the staged operands and store; then the stage is
// refilled. Publishing aggregates one tile ahead keeps the blocks scanning later tiles of a
// sequence from waiting on tiles still queued in another block's stages (with reduce and
// finish in one step, the look-back waits chained: 0.61 of torch.add on few-long, H200).
template <typename T, int E, int NT, int STAGES, bool kBackward>
__global__ void __launch_bounds__(NT) scan_stream_kernel(const ScanParams p, const StreamArgs args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using S = StreamShape<T, E, NT, STAGES, kBackward>;
  static_assert(STAGES >= 2, "a tile stays staged until it is finished, while the next is reduced");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const staged = reinterpret_cast<T*>(smem_raw);
  __shared__ typename cub::BlockScan<Affine, NT>::TempStorage scan_storage;
  __shared__ __align__(8) uint64_t bar[STAGES];
  __shared__ int64_t s_vid[STAGES];
  __shared__ int64_t s_off[STAGES][kNumSlots];
  __shared__ Affine s_agg[STAGES];
  __shared__ float s_state;

  const int64_t num_tiles = p.num_seq * args.num_chunks, L = p.len;
  const LookbackState lb = args.lb;
  const unsigned vm = args.vec_mask;
  int64_t next_vid = 0;  // thread 0: the id the next staged tile gets (fetched one tile ahead)
  if (threadIdx.x == 0) {
    for (int st = 0; st < STAGES; ++st) cuda::ptx::mbarrier_init(&bar[st], 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
    next_vid = static_cast<int64_t>(atomicAdd(lb.counter, 1ull));
  }
  __syncthreads();
  auto stage_next = [&](int st) {  // thread 0 only
    const int64_t vid = next_vid;
    next_vid = static_cast<int64_t>(atomicAdd(lb.counter, 1ull));
    stage_tile<T, E, NT, STAGES, kBackward>(p, vid, num_tiles, staged + st * S::kStreams * S::kRegion, &bar[st],
                                            &s_vid[st], s_off[st]);
  };
  auto region_of = [&](int st) { return staged + st * S::kStreams * S::kRegion; };
  if (threadIdx.x == 0)
    for (int st = 0; st < STAGES; ++st) stage_next(st);

  Affine pending_prefix{1.f, 0.f};  // this thread's exclusive prefix within the pending tile
  int pending = -1;                 // stage of the reduced, unfinished tile
  for (int it = 0;; ++it) {
    // Reduce the tile staged next.
    const int st = it % STAGES;
    while (!cuda::ptx::mbarrier_try_wait_parity(&bar[st], static_cast<uint32_t>((it / STAGES) & 1))) {
    }
    const int64_t vid = s_vid[st];
    const bool more = vid < num_tiles;  // ids only grow: past the end, no copy is left in flight
    Affine prefix{1.f, 0.f};
    if (more) {
      const int64_t chunk = vid / p.num_seq, t0 = chunk * S::kTile;
      const SeqTensors<T> s(p, s_off[st], /*load_init=*/chunk == 0 || (kBackward && t0 + S::kTile >= L));
      float v[E], c[E], yn[E];
      load_operands<T, E, NT, STAGES, kBackward>(region_of(st), s, L, t0, vm, v, c, yn);
      Affine agg;
      cub::BlockScan<Affine, NT>(scan_storage).ExclusiveScan(reduce_steps<E>(v, c), prefix, Affine{1.f, 0.f},
                                                             ComposeOp(), agg);
      if (threadIdx.x == 0) {
        s_agg[st] = agg;
        if (chunk == 0) lb.publish_inclusive(vid, fmaf(agg.a, kBackward ? 0.f : s.init, agg.b));
        else lb.publish_aggregate(vid, agg);
      }
    }
    // Finish the pending tile.
    if (pending >= 0) {
      const int64_t pvid = s_vid[pending];
      const int64_t chunk = pvid / p.num_seq, seq = pvid - chunk * p.num_seq, t0 = chunk * S::kTile;
      const SeqTensors<T> s(p, s_off[pending], /*load_init=*/chunk == 0 || (kBackward && t0 + S::kTile >= L));
      if (threadIdx.x < 32) {
        float h_in = kBackward ? 0.f : s.init;
        if (chunk > 0) {
          h_in = lb.warp_look_back(seq, p.num_seq, chunk);
          if (threadIdx.x == 0) lb.publish_inclusive(pvid, fmaf(s_agg[pending].a, h_in, s_agg[pending].b));
        }
        if (threadIdx.x == 0) s_state = h_in;
      }
      __syncthreads();
      const float h_in = s_state;
      const int64_t tf = t0 + static_cast<int64_t>(threadIdx.x) * E;
      const int nv = static_cast<int>(L - tf <= 0 ? 0 : (L - tf < E ? L - tf : E));
      float v[E], c[E], yn[E];
      load_operands<T, E, NT, STAGES, kBackward>(region_of(pending), s, L, t0, vm, v, c, yn);
      replay_and_store<T, E, kBackward>(s, L, tf, nv, vm, fmaf(pending_prefix.a, h_in, pending_prefix.b), v, c,
                                        yn);
      __syncthreads();  // the pending stage is consumed (and s_state read): refill it
      if (threadIdx.x == 0) stage_next(pending);
    }
    if (!more) break;
    if (pending < 0) __syncthreads();  // scan_storage is reused by the next reduce
    pending = st;
    pending_prefix = prefix;
  }
#else
  __trap();  // planned only on compute capability >= 9.0
#endif
}

}  // namespace linrec
