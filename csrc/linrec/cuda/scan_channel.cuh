// Channel kernel: the scanned dim is not the innermost, e.g. (B, L, D) with dim=1.
//
// A block owns 32 * CPL consecutive sequences ("channels": CPL adjacent ones per lane, so
// every step is one coalesced row access per warp, of 32 * CPL elements) and a span of
// ROWS * CH steps: warp w holds steps [w CH, (w+1) CH) of its lanes' channels in registers,
// as loaded (all loads issued before the first use). Each thread reduces its CH steps per
// channel to one affine map; the block's threads then compose the ROWS maps of one channel
// each through shared memory, obtain the state before the span (the block's running state in
// pipe mode, or the per-channel decoupled look-back across blocks), and hand every warp its
// starting states; then all threads replay their steps and store.
//
// CPL > 1 moves a group of adjacent channels per access, up to 16 bytes (with one 2-byte
// channel per lane a warp row is 64 bytes, and bf16 mamba-BLD ran at half the GB/s of
// float32). It needs every streamed operand's channels adjacent (unit stride). Where D, the
// strides or the pointers leave groups partial or misaligned (odd D in 2-byte (B, L, D):
// ScanPlan::channel_unaligned), the kChecked instances give each block 31 groups of one row and
// realign every access by shuffles (RunLane).
#pragma once
#include <cstring>
#include <type_traits>

#include "plan.h"  // ChannelRows
#include "scan_common.cuh"

namespace linrec {

struct ChannelArgs {
  int64_t num_chunks;      // spans per sequence, one per block (look-back when > 1)
  int64_t spans_per_block; // spans a block walks one after the other (1 with look-back)
  int64_t num_seq_blocks;  // blocks of 32 * CPL virtual channels
  ChannelRows rows;        // kChecked: the blocks of each row (plan.h)
  LookbackState lb;
};

template <int kBytes> struct AccessWord;
template <> struct AccessWord<2> { using type = unsigned short; };
template <> struct AccessWord<4> { using type = unsigned; };
template <> struct AccessWord<8> { using type = uint2; };
template <> struct AccessWord<16> { using type = uint4; };

// A lane of a kChecked instance: a warp's 31 groups are contiguous in memory (one row), each
// access misaligned by the same `mb` bytes. A lane loads the aligned word under its group's start
// and takes the rest from the next lane's (lane 31 loads the word after lane 30's group, clamped to
// the row), and stores the aligned word under its group's end, made of its tail and the next
// lane's head, where that word lies in the row; the bytes no such word covers, by element.
struct RunLane {
  bool active;     // the lane has channels: lane < 31, inside the row
  int lane;
  int valid;       // channels of the lane's group inside the row
  int64_t col;     // the group's first channel in the row
  int64_t width;   // channels per row
};

// Bytes [sh, sh + 4 NW) of the 2 NW words x ++ y (little-endian), 0 <= sh < 4 NW, sh a multiple of 2.
template <int NW>
__device__ __forceinline__ void shift_bytes(const uint32_t (&x)[NW], const uint32_t (&y)[NW], int sh,
                                            uint32_t (&out)[NW]) {
  uint32_t z[2 * NW];
#pragma unroll
  for (int j = 0; j < NW; ++j) z[j] = x[j], z[NW + j] = y[j];
  const int q = sh >> 2;
#pragma unroll
  for (int bit = 1; bit < NW; bit <<= 1)  // shift by q words: one select stage per bit of q
#pragma unroll
    for (int j = 0; j + bit < 2 * NW; ++j) z[j] = (q & bit) ? z[j + bit] : z[j];
#pragma unroll
  for (int j = 0; j < NW; ++j) out[j] = __funnelshift_r(z[j], z[j + 1], (sh & 3) * 8);
}

// One step of CPL adjacent channels, kept as loaded (2-byte values stay packed: half the
// registers) and converted per use.
template <typename T, int CPL>
struct ChannelPack {
  using Word = typename AccessWord<CPL * sizeof(T)>::type;
  static constexpr int kBytes = CPL * sizeof(T), NW = (kBytes + 3) / 4;
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

  // The group at p of a kChecked lane (every lane of the warp calls these: shuffles); p is valid
  // memory for every lane (clamped to the row). Loaded channels past `valid` get what follows in
  // memory; stored ones are left alone.
  // Loading takes two passes over a span's groups, so that all loads are in flight before the
  // first shuffle: the aligned word under the group's start, then the realignment.
  __device__ __forceinline__ void load_aligned(const T* p) {
    static_assert(CPL > 1, "one channel per lane is never misaligned");
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    load_words(reinterpret_cast<const uint32_t*>(at - at % kBytes), v);
  }
  __device__ __forceinline__ void realign(const T* p) {
    const int mb = static_cast<int>(reinterpret_cast<uintptr_t>(p) % kBytes);
    uint32_t x[NW], y[NW], out[NW];
    memcpy(x, v, kBytes);
#pragma unroll
    for (int j = 0; j < NW; ++j) y[j] = __shfl_down_sync(0xffffffffu, x[j], 1);
    shift_bytes<NW>(x, y, mb, out);
    memcpy(v, out, kBytes);
  }
  __device__ __forceinline__ void store_run(T* p, const RunLane& r) const {
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    const int mb = static_cast<int>(at % kBytes);
    const int split = (kBytes - mb) / static_cast<int>(sizeof(T));  // channels before the next aligned word
    uint32_t x[NW], y[NW], out[NW];
    memcpy(x, v, kBytes);
#pragma unroll
    for (int j = 0; j < NW; ++j) y[j] = __shfl_down_sync(0xffffffffu, x[j], 1);
    if (!r.active) return;
    if (mb == 0) {
      if (r.valid == CPL) store_words(reinterpret_cast<uint32_t*>(at), x);
      else
#pragma unroll
        for (int k = 0; k < CPL; ++k)
          if (k < r.valid) p[k] = v[k];
      return;
    }
    // The aligned word under this group's end (its last CPL - split channels, the next lane's first
    // split) lies in the row; likewise the one under its start, stored by the previous lane.
    const bool end_word = r.lane + 1 < kCheckedLanes && r.col + CPL + split <= r.width;
    const bool start_word = r.lane > 0 && r.col + split <= r.width;
    if (end_word) {
      shift_bytes<NW>(x, y, kBytes - mb, out);
      store_words(reinterpret_cast<uint32_t*>(at - mb + kBytes), out);
    }
#pragma unroll
    for (int k = 0; k < CPL; ++k)
      if (k < r.valid && !(k < split ? start_word : end_word)) p[k] = v[k];
  }

 private:
  __device__ __forceinline__ static void load_words(const uint32_t* a, T (&w)[CPL]) {
    const Word x = *reinterpret_cast<const Word*>(a);
    memcpy(w, &x, kBytes);
  }
  __device__ __forceinline__ static void store_words(uint32_t* a, const uint32_t (&w)[NW]) {
    Word x;
    memcpy(&x, w, kBytes);
    *reinterpret_cast<Word*>(a) = x;
  }

 public:
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

// kChecked: groups may be partial or misaligned (ScanPlan::channel_unaligned): runs of groups
// (RunLane); a separate instance, as its shuffles and checks would cost the aligned ones registers.
template <typename T, int CH, int ROWS, int MIN_BLOCKS, int CPL, bool kPrefetch, bool kBackward, bool kChecked>
__global__ void __launch_bounds__(32 * ROWS, kBackward ? (MIN_BLOCKS + 1) / 2 : MIN_BLOCKS)
    scan_channel_kernel(const ScanParams p, const ChannelArgs args) {
  constexpr int kSpan = CH * ROWS, kChannels = 32 * CPL, kThreads = 32 * ROWS;
  using Pack = ChannelPack<T, CPL>;
  // Channel (lane, k) of the block (sequence lane * CPL + k) sits at index k * 32 + lane: a
  // warp's writes of one k are 32 consecutive words.
  __shared__ int64_t s_vid;
  __shared__ float s_a[ROWS][kChannels], s_b[ROWS][kChannels], s_state[kChannels];
  const int lane = threadIdx.x & 31, row = threadIdx.x >> 5;
  const LookbackState lb = args.lb;
  const bool lookback = args.num_chunks > 1;
  if (lookback) {  // chunk-major dynamic order: predecessors of a span were started before it
    if (threadIdx.x == 0) s_vid = static_cast<int64_t>(atomicAdd(lb.counter, 1ull));
    __syncthreads();
  }
  const int64_t vid = lookback ? s_vid : blockIdx.x;
  const int64_t chunk = vid / args.num_seq_blocks;
  const int64_t seq_block = vid - chunk * args.num_seq_blocks;
  // This lane's channels: seq .. seq + valid - 1, one element apart in every streamed operand.
  // Unchecked: blocks over the flat channel index; kChecked: 31 groups of one row per block, every
  // lane's pointers clamped to its row.
  int64_t seq;
  bool active;
  int valid;
  RunLane run{};
  if constexpr (kChecked) {
    const ChannelRows cr = args.rows;
    const int64_t vrow = seq_block / cr.blocks_per_row;
    const int64_t col = (seq_block - vrow * cr.blocks_per_row) * (kCheckedLanes * CPL) + lane * CPL;
    active = lane < kCheckedLanes && col < cr.width;
    valid = active ? static_cast<int>(cr.width - col < CPL ? cr.width - col : CPL) : 0;
    seq = vrow * cr.width + (col < cr.width ? col : cr.width - 1);
    run = RunLane{active, lane, valid, col, cr.width};
  } else {
    seq = seq_block * kChannels + lane * CPL;
    active = seq < p.num_seq;  // num_seq is a multiple of CPL
    valid = CPL;
  }
  const auto store_group = [&](const Pack& g, T* ptr) {
    if constexpr (kChecked) g.store_run(ptr, run);
    else g.store(ptr);
  };

  const SeqIndex si(p, active || kChecked ? seq : 0);
  const T* in = slot_ptr<T>(p, kIn, si.offset(p, kIn));
  const T* cf = slot_ptr<T>(p, kCoeff, si.offset(p, kCoeff));
  T* y = slot_ptr<T>(p, kOut, si.offset(p, kOut));
  const T* h0 = slot_ptr<T>(p, kInit, si.offset(p, kInit));
  const int64_t L = p.len, ls_in = p.lstride[kIn], ls_c = p.lstride[kCoeff], ls_y = p.lstride[kOut];
  float init[CPL];
#pragma unroll
  for (int k = 0; k < CPL; ++k) {
    init[k] = h0 && k < valid ? to_float(h0[k * p.bstride[kInit][0]]) : 0.f;
    if (row == 0) s_state[k * 32 + lane] = kBackward ? 0.f : init[k];  // read after the first barrier
  }
  T* dx = slot_ptr<T>(p, kGradIn, si.offset(p, kGradIn));  // backward outputs (null in the forward)
  T* dc = p.accumulate_grad_coeff ? nullptr : slot_ptr<T>(p, kGradCoeff, si.offset(p, kGradCoeff));
  float* dc_acc = p.accumulate_grad_coeff ? slot_ptr<float>(p, kGradCoeff, si.offset(p, kGradCoeff)) : nullptr;
  const int64_t ls_dx = p.lstride[kGradIn], ls_dc = p.lstride[kGradCoeff];

  // A thread's CH steps of one span from t0 (n of them valid: the same for a warp's lanes in the
  // kChecked instances, whose inactive lanes take part in the shuffles); the backward's c[t-1] and
  // y[t+1] (`initial` past the end), see scan_tile.cuh.
  // kChecked: two passes, so that all loads are in flight before the first shuffle: the aligned
  // words under the groups' starts, then the realignment.
  const auto load_span = [&](int64_t t0, int n, Pack(&v)[CH], Pack(&c)[CH], Pack(&yn)[CH]) {
#pragma unroll
    for (int pass = 0; pass < (kChecked ? 2 : 1); ++pass) {
      const bool first = pass == 0;
      const auto group = [&](Pack& g, const T* ptr) {
        if constexpr (!kChecked) g.load(ptr);
        else if (first) g.load_aligned(ptr);
        else g.realign(ptr);
      };
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        const int64_t t = t0 + i;
        if (first) {
          v[i].fill(0.f);
          c[i].fill(1.f);
          if constexpr (kBackward) yn[i].fill(0.f);
        }
        if (i < n) {
          group(v[i], in + t * ls_in);
          if constexpr (!kBackward) {
            group(c[i], cf + t * ls_c);
          } else {
            if (t > 0) group(c[i], cf + (t - 1) * ls_c);
            else if (first) c[i].fill(0.f);
            if (t + 1 < L) {
              group(yn[i], y + (t + 1) * ls_y);
            } else if (first) {
#pragma unroll
              for (int k = 0; k < CPL; ++k) yn[i].set(k, init[k]);
            }
          }
        }
      }
    }
  };
  const auto span_steps = [&](int64_t span, int64_t* t0) {
    *t0 = (chunk * args.spans_per_block + span) * kSpan + row * CH;
    return (!kChecked && !active) || *t0 >= L ? 0 : static_cast<int>(L - *t0 < CH ? L - *t0 : CH);
  };
  // kPrefetch (forward, pipe mode): the next span's loads are issued before this span's compose,
  // so a block walking its channels along L keeps its loads in flight across the span's barriers.
  constexpr bool kDoubleBuffer = kPrefetch && !kBackward;
  Pack pv[kDoubleBuffer ? CH : 1], pc[kDoubleBuffer ? CH : 1];
  if constexpr (kDoubleBuffer) {
    int64_t t0;
    const int n = span_steps(0, &t0);
    load_span(t0, n, pv, pc, pv);
  }

  for (int64_t span = 0; span < args.spans_per_block; ++span) {
    const int64_t span_t0 = (chunk * args.spans_per_block + span) * kSpan;
    if (span_t0 >= L) break;
    int64_t t0;
    const int n = span_steps(span, &t0);
    Pack v[CH], c[CH], yn[CH];
    if constexpr (kDoubleBuffer) {
#pragma unroll
      for (int i = 0; i < CH; ++i) v[i] = pv[i], c[i] = pc[i];
      if (span + 1 < args.spans_per_block) {
        int64_t t1;
        const int n1 = span_steps(span + 1, &t1);
        load_span(t1, n1, pv, pc, pv);
      }
    } else {
      load_span(t0, n, v, c, yn);
    }
#pragma unroll
    for (int k = 0; k < CPL; ++k) {
      Affine agg{1.f, 0.f};
#pragma unroll
      for (int i = 0; i < CH; ++i) agg = ComposeOp()(agg, Affine{c[i].get(k), v[i].get(k)});
      s_a[row][k * 32 + lane] = agg.a;
      s_b[row][k * 32 + lane] = agg.b;
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
      // look-back status per channel slot of the block: padding slots keep to themselves
      const int64_t slot = seq_block * kChannels + j, num_slots = args.num_seq_blocks * kChannels;
      if (lookback) {
        const int64_t index = chunk * num_slots + slot;
        if (chunk > 0) {
          lb.publish_aggregate(index, total);
          h_in = lb.look_back(slot, num_slots, chunk);
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
      float h = s_b[row][k * 32 + lane], g[CH];
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
      if (kBackward && dc_acc && k < valid)
        accumulate_steps<CH>(dc_acc + k * p.bstride[kGradCoeff][0], ls_dc, t0, n, g, /*warp_uniform_address=*/false);
    }
    if constexpr (!kBackward) {
#pragma unroll
      for (int i = 0; i < CH; ++i)
        if (i < n) store_group(v[i], y + (t0 + i) * ls_y);
    } else {
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        if (i < n) store_group(v[i], dx + (t0 + i) * ls_dx);
        if (i < n && !dc_acc) store_group(yn[i], dc + (t0 + i) * ls_dc);
      }
      if (active && n > 0 && t0 + n == L) {  // d initial = c[L-1] * g[L-1]
        T* dh0 = slot_ptr<T>(p, kGradInit, si.offset(p, kGradInit));
        const T* c_last = cf + (L - 1) * ls_c;
        Pack cl;
        if constexpr (kChecked) {
#pragma unroll
          for (int k = 0; k < CPL; ++k) cl.v[k] = k < valid ? c_last[k] : T{};
        } else {
          cl.load(c_last);
        }
#pragma unroll
        for (int k = 0; k < CPL; ++k)
          if (k < valid) dh0[k * p.bstride[kGradInit][0]] = from_float<T>(cl.get(k) * h_last[k]);
      }
    }
    __syncthreads();  // s_a / s_b / s_state are rewritten by the next span
  }
}

}  // namespace linrec
