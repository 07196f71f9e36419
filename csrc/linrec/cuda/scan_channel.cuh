// Channel kernel: the scanned dim is not the innermost, e.g. (B, L, D) with dim=1.
//
// A block owns LANES * CPL consecutive sequences ("channels": CPL adjacent ones per lane, so
// every step is one coalesced access of LANES * CPL elements) and a span of ROWS * SUB * CH
// steps, SUB = 32 / LANES: lane group s (lanes [s LANES, (s+1) LANES)) of warp w holds the CH
// steps of run w SUB + s of its lanes' channels in registers, as loaded (all loads issued before
// the first use). Each thread reduces its CH steps per channel to one affine map; a warp scans
// its SUB runs by shuffles; the block's threads then compose the ROWS warps' maps of one channel
// each through shared memory, obtain the state before the span (the block's running state in
// pipe mode, or the per-channel decoupled look-back across blocks), and hand every warp its
// starting states; then all threads replay their steps and store.
//
// CPL > 1 moves a group of adjacent channels per access, up to 16 bytes (with one 2-byte
// channel per lane a warp row is 64 bytes, and bf16 mamba-BLD ran at half the GB/s of
// float32). The planner takes it only where every strided operand has its channels adjacent
// (unit stride) and groups aligned.
#pragma once
#include <cstring>
#include <type_traits>

#include "scan_common.cuh"

namespace linrec {

struct ChannelArgs {
  int64_t num_chunks;      // spans per sequence, one per block (look-back when > 1)
  int64_t spans_per_block; // spans a block walks one after the other (1 with look-back)
  int64_t num_seq_blocks;  // blocks of LANES * CPL sequences
  LookbackState lb;
};

template <int kBytes> struct AccessWord;
template <> struct AccessWord<2> { using type = unsigned short; };
template <> struct AccessWord<4> { using type = unsigned; };
template <> struct AccessWord<8> { using type = uint2; };
template <> struct AccessWord<16> { using type = uint4; };

// One step of CPL adjacent channels, kept as loaded (2-byte values stay packed: half the
// registers) and converted per use.
template <typename T, int CPL>
struct ChannelPack {
  using Word = typename AccessWord<CPL * sizeof(T)>::type;
  T v[CPL];

  // p: aligned to CPL elements (the planner's check).
  __device__ __forceinline__ void load(const T* p) {
    const Word w = *reinterpret_cast<const Word*>(p);
    memcpy(v, &w, sizeof(Word));
  }
  __device__ __forceinline__ void store(T* p) const {
    Word w;
    memcpy(&w, v, sizeof(Word));
    *reinterpret_cast<Word*>(p) = w;
  }
  __device__ __forceinline__ void fill(float f) {
#pragma unroll
    for (int k = 0; k < CPL; ++k) v[k] = from_float<T>(f);
  }
  // 2-byte values convert by volatile asm: the compiler converts at every use instead of keeping
  // the converted floats of the compose pass alive for the replay (twice the registers, spills).
  __device__ __forceinline__ float get(int k) const {
    if constexpr (sizeof(T) == 4) {
      return to_float(v[k]);
    } else {
      unsigned short bits;
      memcpy(&bits, &v[k], 2);
      float f;
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // the high half of a float
        unsigned u;
        asm volatile("mov.b32 %0, {%1, %2};" : "=r"(u) : "h"(static_cast<unsigned short>(0)), "h"(bits));
        f = __uint_as_float(u);
      } else {
        asm volatile("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
      }
      return f;
    }
  }
  __device__ __forceinline__ void set(int k, float f) { v[k] = from_float<T>(f); }
};

template <typename T, int CH, int ROWS, int MIN_BLOCKS, int CPL, bool kPrefetch, bool kBackward, int LANES = 32>
__global__ void __launch_bounds__(32 * ROWS, kBackward ? (MIN_BLOCKS + 1) / 2 : MIN_BLOCKS)
    scan_channel_kernel(const ScanParams p, const ChannelArgs args) {
  static_assert(LANES == 32 || LANES == 16 || LANES == 8, "LANES divides a warp");
  constexpr int kSub = 32 / LANES, kSpan = CH * ROWS * kSub, kChannels = LANES * CPL, kThreads = 32 * ROWS;
  using Pack = ChannelPack<T, CPL>;
  // Channel (lane, k) of the block (sequence lane * CPL + k) sits at index k * LANES + lane: a
  // lane group's writes of one k are LANES consecutive words.
  __shared__ int64_t s_vid;
  __shared__ float s_a[ROWS][kChannels], s_b[ROWS][kChannels], s_state[kChannels];
  const int lane = threadIdx.x % LANES, sub = (threadIdx.x & 31) / LANES, row = threadIdx.x >> 5;
  const LookbackState lb = args.lb;
  const bool lookback = args.num_chunks > 1;
  if (lookback) {  // chunk-major dynamic order: predecessors of a span were started before it
    lb.clean_up();
    if (threadIdx.x == 0) s_vid = static_cast<int64_t>(atomicAdd(lb.counter, 1ull));
    __syncthreads();
  }
  const int64_t vid = lookback ? s_vid : blockIdx.x;
  const int64_t chunk = vid / args.num_seq_blocks;
  const int64_t block_seq = (vid - chunk * args.num_seq_blocks) * kChannels;
  // This lane's channels: seq .. seq + CPL - 1, one step apart in every streamed operand.
  const int64_t seq = block_seq + lane * CPL;
  const bool active = seq < p.num_seq;  // CPL > 1: num_seq is a multiple of CPL

  // Each slot's offset: (B, L, D) rows are two batch dims, one 32-bit division (the general
  // decomposition over eight, predicated, per thread and block; see scan_tile.cuh's offsets).
  int64_t off[kNumSlots];
  if (p.nbatch <= 2 && p.num_seq <= INT32_MAX) {
    const uint32_t s32 = static_cast<uint32_t>(active ? seq : 0), d = static_cast<uint32_t>(p.bsize[0]);
    const uint32_t outer = p.nbatch == 2 ? s32 / d : 0u, inner = s32 - outer * d;
#pragma unroll
    for (int slot = 0; slot < kNumSlots; ++slot)
      off[slot] = int64_t(inner) * p.bstride[slot][0] + (p.nbatch == 2 ? int64_t(outer) * p.bstride[slot][1] : 0);
  } else {
    const SeqIndex si(p, active ? seq : 0);
#pragma unroll
    for (int slot = 0; slot < kNumSlots; ++slot) off[slot] = si.offset(p, slot);
  }
  const T* in = slot_ptr<T>(p, kIn, off[kIn]);
  const T* cf = slot_ptr<T>(p, kCoeff, off[kCoeff]);
  T* y = slot_ptr<T>(p, kOut, off[kOut]);
  const T* h0 = slot_ptr<T>(p, kInit, off[kInit]);
  const int64_t L = p.len, ls_in = p.lstride[kIn], ls_c = p.lstride[kCoeff], ls_y = p.lstride[kOut];
  float init[CPL];
#pragma unroll
  for (int k = 0; k < CPL; ++k) {
    init[k] = h0 && active ? to_float(h0[k * p.bstride[kInit][0]]) : 0.f;
    if (row == 0 && sub == 0) s_state[k * LANES + lane] = kBackward ? 0.f : init[k];  // read after the first barrier
  }
  T* dx = slot_ptr<T>(p, kGradIn, off[kGradIn]);  // backward outputs (null in the forward)
  T* dc = p.accumulate_grad_coeff ? nullptr : slot_ptr<T>(p, kGradCoeff, off[kGradCoeff]);
  float* dc_acc = p.accumulate_grad_coeff ? slot_ptr<float>(p, kGradCoeff, off[kGradCoeff]) : nullptr;
  const int64_t ls_dx = p.lstride[kGradIn], ls_dc = p.lstride[kGradCoeff];

  // A thread's CH steps of one span from t0 (n of them valid); the backward's c[t-1] and y[t+1]
  // (`initial` past the end), see scan_tile.cuh.
  const auto load_span = [&](int64_t t0, int n, Pack(&v)[CH], Pack(&c)[CH], Pack(&yn)[CH]) {
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      const int64_t t = t0 + i;
      v[i].fill(0.f);
      c[i].fill(1.f);
      if constexpr (kBackward) yn[i].fill(0.f);
      if (i < n) {
        v[i].load(in + t * ls_in);
        if constexpr (!kBackward) {
          c[i].load(cf + t * ls_c);
        } else {
          if (t > 0) c[i].load(cf + (t - 1) * ls_c);
          else c[i].fill(0.f);
          if (t + 1 < L) {
            yn[i].load(y + (t + 1) * ls_y);
          } else {
#pragma unroll
            for (int k = 0; k < CPL; ++k) yn[i].set(k, init[k]);
          }
        }
      }
    }
  };
  const auto span_steps = [&](int64_t span, int64_t* t0) {
    *t0 = (chunk * args.spans_per_block + span) * kSpan + (row * kSub + sub) * CH;
    return !active || *t0 >= L ? 0 : static_cast<int>(L - *t0 < CH ? L - *t0 : CH);
  };
  // kPrefetch (pipe mode): the next span's loads are issued before this span's compose, so a
  // block walking its channels along L keeps its loads in flight across the span's barriers. Not
  // in a backward of 512 threads: its third operand's buffer would spill (128 registers at most).
  constexpr bool kDoubleBuffer = kPrefetch && (!kBackward || ROWS <= 8);
  Pack pv[kDoubleBuffer ? CH : 1], pc[kDoubleBuffer ? CH : 1], pyn[kDoubleBuffer && kBackward ? CH : 1];
  const auto prefetch = [&](int64_t span) {
    int64_t t0;
    const int n = span_steps(span, &t0);
    if constexpr (kDoubleBuffer && kBackward)
      load_span(t0, n, pv, pc, pyn);
    else if constexpr (kDoubleBuffer)
      load_span(t0, n, pv, pc, pv);
  };
  if constexpr (kDoubleBuffer) prefetch(0);

  for (int64_t span = 0; span < args.spans_per_block; ++span) {
    const int64_t span_t0 = (chunk * args.spans_per_block + span) * kSpan;
    if (span_t0 >= L) break;
    int64_t t0;
    const int n = span_steps(span, &t0);
    Pack v[CH], c[CH], yn[CH];
    if constexpr (kDoubleBuffer) {
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        v[i] = pv[i], c[i] = pc[i];
        if constexpr (kBackward) yn[i] = pyn[i];
      }
      if (span + 1 < args.spans_per_block) prefetch(span + 1);
    } else {
      load_span(t0, n, v, c, yn);
    }
    Affine before[CPL];  // kSub > 1: the map of the warp's runs before this thread's, per channel
#pragma unroll
    for (int k = 0; k < CPL; ++k) {
      Affine agg{1.f, 0.f};
#pragma unroll
      for (int i = 0; i < CH; ++i) agg = ComposeOp()(agg, Affine{c[i].get(k), v[i].get(k)});
#pragma unroll
      for (int d = 1; d < kSub; d <<= 1) {  // inclusive scan of the warp's runs, LANES lanes apart
        const Affine e{__shfl_up_sync(0xffffffffu, agg.a, d * LANES), __shfl_up_sync(0xffffffffu, agg.b, d * LANES)};
        if (sub >= d) agg = ComposeOp()(e, agg);
      }
      if constexpr (kSub > 1) {
        before[k] = {__shfl_up_sync(0xffffffffu, agg.a, LANES), __shfl_up_sync(0xffffffffu, agg.b, LANES)};
        if (sub == 0) before[k] = {1.f, 0.f};
      }
      if (sub == kSub - 1) {
        s_a[row][k * LANES + lane] = agg.a;
        s_b[row][k * LANES + lane] = agg.b;
      }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < kChannels; j += kThreads) {  // one channel per thread
      Affine total{1.f, 0.f};
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {  // exclusive prefix of the rows, in place
        const Affine m{s_a[r][j], s_b[r][j]};
        s_a[r][j] = total.a;
        s_b[r][j] = total.b;
        total = ComposeOp()(total, m);
      }
      float h_in = s_state[j];
      const int64_t seq_j = block_seq + (j % LANES) * CPL + j / LANES;
      if (lookback && seq_j < p.num_seq) {
        const int64_t index = chunk * p.num_seq + seq_j;
        if (chunk > 0) {
          lb.publish_aggregate(index, total);
          h_in = lb.look_back(seq_j, p.num_seq, chunk);
        }
        lb.publish_inclusive(index, fmaf(total.a, h_in, total.b));
      }
      s_state[j] = fmaf(total.a, h_in, total.b);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) s_b[r][j] = fmaf(s_a[r][j], h_in, s_b[r][j]);
    }
    __syncthreads();
    float h_last[CPL];
#pragma unroll
    for (int k = 0; k < CPL; ++k) {
      float h = s_b[row][k * LANES + lane], g[CH];
      if constexpr (kSub > 1) h = fmaf(before[k].a, h, before[k].b);
      h_last[k] = 0.f;
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        h = fmaf(c[i].get(k), h, v[i].get(k));
        if constexpr (kBackward) {  // d coeff[t] = g[t] * y[t-1] (reversed: the next y), from the unrounded g
          g[i] = yn[i].get(k) * h;
          if (!dc_acc) yn[i].set(k, g[i]);
        }
        v[i].set(k, h);
        if (i < n) h_last[k] = h;
      }
      if (kBackward && dc_acc)
        accumulate_steps<CH>(dc_acc + k * p.bstride[kGradCoeff][0], ls_dc, t0, 0, n, g, /*warp_uniform_address=*/false);
    }
    if constexpr (!kBackward) {
#pragma unroll
      for (int i = 0; i < CH; ++i)
        if (i < n) v[i].store(y + (t0 + i) * ls_y);
    } else {
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        if (i < n) v[i].store(dx + (t0 + i) * ls_dx);
        if (i < n && !dc_acc) yn[i].store(dc + (t0 + i) * ls_dc);
      }
      if (n > 0 && t0 + n == L) {  // d initial = c[L-1] * g[L-1]
        T* dh0 = slot_ptr<T>(p, kGradInit, off[kGradInit]);
        Pack cl;
        cl.load(cf + (L - 1) * ls_c);
#pragma unroll
        for (int k = 0; k < CPL; ++k) dh0[k * p.bstride[kGradInit][0]] = from_float<T>(cl.get(k) * h_last[k]);
      }
    }
    __syncthreads();  // s_a / s_b / s_state are rewritten by the next span
  }
}

}  // namespace linrec
