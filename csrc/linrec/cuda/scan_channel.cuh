// Channel kernel: the scanned dim is not the innermost, e.g. (B, L, D) with dim=1.
//
// A block owns 32 * CPL consecutive sequences ("channels": CPL adjacent ones per lane, so
// every step is one coalesced row access per warp, of 32 * CPL elements) and a span of
// ROWS * CH steps: warp w holds steps [w CH, (w+1) CH) of its lanes' channels in registers
// (all loads issued before the first use). Each thread reduces its CH steps per channel to
// one affine map; warp 0 composes the ROWS maps per channel through shared memory, obtains
// the state before the span (its running state in pipe mode, or the per-channel decoupled
// look-back across blocks), and hands every warp its starting state; then all threads replay
// their steps and store.
//
// CPL = 2 moves a pair of channels per access (2 x 2 bytes at 16 bits: with one 2-byte
// channel per lane a warp row was 64 bytes, and bf16 mamba-BLD ran at half the GB/s of
// float32). The planner takes it only where every strided operand has its channels adjacent
// (unit stride) and pairs aligned.
#pragma once
#include "scan_common.cuh"

namespace linrec {

struct ChannelArgs {
  int64_t num_chunks;      // spans per sequence, one per block (look-back when > 1)
  int64_t spans_per_block; // spans a block walks one after the other (1 with look-back)
  int64_t num_seq_blocks;  // blocks of 32 * CPL sequences
  LookbackState lb;
};

// CPL adjacent elements at `p` (aligned to CPL elements when CPL > 1) as float.
template <typename T, int CPL>
__device__ __forceinline__ void load_channels(const T* p, float (&out)[CPL]) {
  if constexpr (CPL == 1) {
    out[0] = to_float(*p);
  } else {
    static_assert(CPL == 2, "one or two channels per lane");
    if constexpr (sizeof(T) == 4) {
      const float2 u = *reinterpret_cast<const float2*>(p);
      out[0] = u.x, out[1] = u.y;
    } else {
      const unsigned u = *reinterpret_cast<const unsigned*>(p);
      T pair[2];
      *reinterpret_cast<unsigned*>(pair) = u;
      out[0] = to_float(pair[0]), out[1] = to_float(pair[1]);
    }
  }
}

template <typename T, int CPL>
__device__ __forceinline__ void store_channels(T* p, const float (&v)[CPL]) {
  if constexpr (CPL == 1) {
    *p = from_float<T>(v[0]);
  } else if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  } else {
    T pair[2] = {from_float<T>(v[0]), from_float<T>(v[1])};
    *reinterpret_cast<unsigned*>(p) = *reinterpret_cast<const unsigned*>(pair);
  }
}

template <typename T, int CH, int ROWS, int MIN_BLOCKS, int CPL, bool kBackward>
__global__ void __launch_bounds__(32 * ROWS, kBackward ? (MIN_BLOCKS + 1) / 2 : MIN_BLOCKS)
    scan_channel_kernel(const ScanParams p, const ChannelArgs args) {
  constexpr int kSpan = CH * ROWS;
  __shared__ int64_t s_vid;
  __shared__ float s_a[ROWS][32 * CPL], s_b[ROWS][32 * CPL];
  const int lane = threadIdx.x & 31, row = threadIdx.x >> 5;
  const LookbackState lb = args.lb;
  const bool lookback = args.num_chunks > 1;
  if (lookback) {  // chunk-major dynamic order: predecessors of a span were started before it
    if (threadIdx.x == 0) s_vid = static_cast<int64_t>(atomicAdd(lb.counter, 1ull));
    __syncthreads();
  }
  const int64_t vid = lookback ? s_vid : blockIdx.x;
  const int64_t chunk = vid / args.num_seq_blocks;
  // This lane's channels: seq .. seq + CPL - 1, one step apart in every streamed operand.
  const int64_t seq = ((vid - chunk * args.num_seq_blocks) * 32 + lane) * CPL;
  const bool active = seq < p.num_seq;  // CPL > 1: num_seq is a multiple of CPL

  const SeqIndex si(p, active ? seq : 0);
  const T* in = slot_ptr<T>(p, kIn, si.offset(p, kIn));
  const T* cf = slot_ptr<T>(p, kCoeff, si.offset(p, kCoeff));
  T* y = slot_ptr<T>(p, kOut, si.offset(p, kOut));
  const T* h0 = slot_ptr<T>(p, kInit, si.offset(p, kInit));
  const int64_t L = p.len, ls_in = p.lstride[kIn], ls_c = p.lstride[kCoeff], ls_y = p.lstride[kOut];
  float init[CPL];
#pragma unroll
  for (int k = 0; k < CPL; ++k) init[k] = h0 ? to_float(h0[k * p.bstride[kInit][0]]) : 0.f;
  T* dx = slot_ptr<T>(p, kGradIn, si.offset(p, kGradIn));  // backward outputs (null in the forward)
  T* dc = p.accumulate_grad_coeff ? nullptr : slot_ptr<T>(p, kGradCoeff, si.offset(p, kGradCoeff));
  float* dc_acc = p.accumulate_grad_coeff ? slot_ptr<float>(p, kGradCoeff, si.offset(p, kGradCoeff)) : nullptr;
  const int64_t ls_dx = p.lstride[kGradIn], ls_dc = p.lstride[kGradCoeff];

  float state[CPL];  // warp 0: state before the next span (pipe mode)
#pragma unroll
  for (int k = 0; k < CPL; ++k) state[k] = kBackward ? 0.f : init[k];
  for (int64_t span = 0; span < args.spans_per_block; ++span) {
    const int64_t span_t0 = (chunk * args.spans_per_block + span) * kSpan;
    if (span_t0 >= L) break;
    const int64_t t0 = span_t0 + row * CH;
    const int n = !active || t0 >= L ? 0 : static_cast<int>(L - t0 < CH ? L - t0 : CH);
    float v[CH][CPL], c[CH][CPL], yn[CH][CPL];
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      const int64_t t = t0 + i;
#pragma unroll
      for (int k = 0; k < CPL; ++k) v[i][k] = 0.f, c[i][k] = 1.f, yn[i][k] = 0.f;
      if (i < n) {
        load_channels<T, CPL>(in + t * ls_in, v[i]);
        if constexpr (!kBackward) {
          load_channels<T, CPL>(cf + t * ls_c, c[i]);
        } else {
          // Step t uses c[t-1] and y[t+1] (`initial` past the end); see scan_tile.cuh.
          if (t > 0) load_channels<T, CPL>(cf + (t - 1) * ls_c, c[i]);
          else for (int k = 0; k < CPL; ++k) c[i][k] = 0.f;
          if (t + 1 < L) load_channels<T, CPL>(y + (t + 1) * ls_y, yn[i]);
          else for (int k = 0; k < CPL; ++k) yn[i][k] = init[k];
        }
      }
    }
#pragma unroll
    for (int k = 0; k < CPL; ++k) {
      Affine agg{1.f, 0.f};
#pragma unroll
      for (int i = 0; i < CH; ++i) agg = ComposeOp()(agg, Affine{c[i][k], v[i][k]});
      s_a[row][lane * CPL + k] = agg.a;
      s_b[row][lane * CPL + k] = agg.b;
    }
    __syncthreads();
    if (row == 0) {
#pragma unroll
      for (int k = 0; k < CPL; ++k) {
        const int ch = lane * CPL + k;
        Affine total{1.f, 0.f};
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {  // exclusive prefix of the rows, in place
          const Affine m{s_a[r][ch], s_b[r][ch]};
          s_a[r][ch] = total.a;
          s_b[r][ch] = total.b;
          total = ComposeOp()(total, m);
        }
        float h_in = state[k];
        if (lookback && active) {
          const int64_t index = chunk * p.num_seq + seq + k;
          if (chunk > 0) {
            lb.publish_aggregate(index, total);
            h_in = lb.look_back(seq + k, p.num_seq, chunk);
          }
          lb.publish_inclusive(index, fmaf(total.a, h_in, total.b));
        }
        state[k] = fmaf(total.a, h_in, total.b);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) s_b[r][ch] = fmaf(s_a[r][ch], h_in, s_b[r][ch]);
      }
    }
    __syncthreads();
    float h_last[CPL];
#pragma unroll
    for (int k = 0; k < CPL; ++k) {
      float h = s_b[row][lane * CPL + k];
      h_last[k] = 0.f;
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        h = fmaf(c[i][k], h, v[i][k]);
        v[i][k] = h;
        if (i < n) h_last[k] = h;
      }
    }
    if constexpr (!kBackward) {
#pragma unroll
      for (int i = 0; i < CH; ++i)
        if (i < n) store_channels<T, CPL>(y + (t0 + i) * ls_y, v[i]);
    } else {
#pragma unroll
      for (int i = 0; i < CH; ++i) {
#pragma unroll
        for (int k = 0; k < CPL; ++k) yn[i][k] *= v[i][k];
        if (i < n) store_channels<T, CPL>(dx + (t0 + i) * ls_dx, v[i]);
      }
      if (dc_acc) {
#pragma unroll
        for (int k = 0; k < CPL; ++k) {
          float g[CH];
#pragma unroll
          for (int i = 0; i < CH; ++i) g[i] = yn[i][k];
          accumulate_steps<CH>(dc_acc + k * p.bstride[kGradCoeff][0], ls_dc, t0, n, g,
                               /*warp_uniform_address=*/false);
        }
      } else {
#pragma unroll
        for (int i = 0; i < CH; ++i)
          if (i < n) store_channels<T, CPL>(dc + (t0 + i) * ls_dc, yn[i]);
      }
      if (n > 0 && t0 + n == L) {  // d initial = c[L-1] * g[L-1]
        T* dh0 = slot_ptr<T>(p, kGradInit, si.offset(p, kGradInit));
        float cl[CPL];
        load_channels<T, CPL>(cf + (L - 1) * ls_c, cl);
#pragma unroll
        for (int k = 0; k < CPL; ++k) dh0[k * p.bstride[kGradInit][0]] = from_float<T>(cl[k] * h_last[k]);
      }
    }
    __syncthreads();  // s_a / s_b are rewritten by the next span
  }
}

}  // namespace linrec
