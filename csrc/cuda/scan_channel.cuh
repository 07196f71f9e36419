// Channel kernel: the scanned dim is not the innermost, e.g. (B, L, D) with dim=1.
//
// A block owns 32 consecutive sequences ("channels", one per lane, so every step is one
// coalesced row access per warp) and a span of ROWS * CH steps: warp w holds steps
// [w CH, (w+1) CH) of each channel in registers (all loads issued before the first use).
// Each thread reduces its CH steps to one affine map; warp 0 composes the ROWS maps per
// channel through shared memory, obtains the state before the span (its running state in
// pipe mode, or the per-channel decoupled look-back across blocks), and hands every warp
// its starting state; then all threads replay their steps and store.
#pragma once
#include "scan_common.cuh"

namespace linrec {

struct ChannelArgs {
  int64_t num_chunks;      // spans per sequence, one per block (look-back when > 1)
  int64_t spans_per_block; // spans a block walks one after the other (1 with look-back)
  int64_t num_seq_blocks;  // blocks of 32 sequences
  LookbackState lb;
};

template <typename T, int CH, int ROWS, int MIN_BLOCKS, bool kBackward>
__global__ void __launch_bounds__(32 * ROWS, kBackward ? (MIN_BLOCKS + 1) / 2 : MIN_BLOCKS)
    scan_channel_kernel(const ScanParams p, const ChannelArgs args) {
  constexpr int kSpan = CH * ROWS;
  __shared__ int64_t s_vid;
  __shared__ float s_a[ROWS][32], s_b[ROWS][32];
  const int lane = threadIdx.x & 31, row = threadIdx.x >> 5;
  const LookbackState lb = args.lb;
  const bool lookback = args.num_chunks > 1;
  if (lookback) {  // chunk-major dynamic order: predecessors of a span were started before it
    if (threadIdx.x == 0) s_vid = static_cast<int64_t>(atomicAdd(lb.counter, 1ull));
    __syncthreads();
  }
  const int64_t vid = lookback ? s_vid : blockIdx.x;
  const int64_t chunk = vid / args.num_seq_blocks;
  const int64_t seq = (vid - chunk * args.num_seq_blocks) * 32 + lane;
  const bool active = seq < p.num_seq;

  const SeqIndex si(p, active ? seq : 0);
  const T* in = slot_ptr<T>(p, kIn, si.offset(p, kIn));
  const T* cf = slot_ptr<T>(p, kCoeff, si.offset(p, kCoeff));
  T* y = slot_ptr<T>(p, kOut, si.offset(p, kOut));
  const T* h0 = slot_ptr<T>(p, kInit, si.offset(p, kInit));
  const int64_t L = p.len, ls_in = p.lstride[kIn], ls_c = p.lstride[kCoeff], ls_y = p.lstride[kOut];
  const float init = h0 ? to_float(*h0) : 0.f;
  T* dx = slot_ptr<T>(p, kGradIn, si.offset(p, kGradIn));  // backward outputs (null in the forward)
  T* dc = p.accumulate_grad_coeff ? nullptr : slot_ptr<T>(p, kGradCoeff, si.offset(p, kGradCoeff));
  float* dc_acc = p.accumulate_grad_coeff ? slot_ptr<float>(p, kGradCoeff, si.offset(p, kGradCoeff)) : nullptr;
  const int64_t ls_dx = p.lstride[kGradIn], ls_dc = p.lstride[kGradCoeff];

  float state = kBackward ? 0.f : init;  // warp 0: state before the next span (pipe mode)
  for (int64_t span = 0; span < args.spans_per_block; ++span) {
    const int64_t span_t0 = (chunk * args.spans_per_block + span) * kSpan;
    if (span_t0 >= L) break;
    const int64_t t0 = span_t0 + row * CH;
    const int n = !active || t0 >= L ? 0 : static_cast<int>(L - t0 < CH ? L - t0 : CH);
    float v[CH], c[CH], yn[CH];
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      const int64_t t = t0 + i;
      v[i] = i < n ? to_float(in[t * ls_in]) : 0.f;
      if constexpr (!kBackward) {
        c[i] = i < n ? to_float(cf[t * ls_c]) : 1.f;
      } else {
        // Step t uses c[t-1] and y[t+1] (`initial` past the end); see scan_tile.cuh.
        c[i] = i < n ? (t > 0 ? to_float(cf[(t - 1) * ls_c]) : 0.f) : 1.f;
        yn[i] = i < n ? (t + 1 < L ? to_float(y[(t + 1) * ls_y]) : init) : 0.f;
      }
    }
    Affine agg{1.f, 0.f};
#pragma unroll
    for (int i = 0; i < CH; ++i) agg = ComposeOp()(agg, Affine{c[i], v[i]});
    s_a[row][lane] = agg.a;
    s_b[row][lane] = agg.b;
    __syncthreads();
    if (row == 0) {
      Affine total{1.f, 0.f};
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {  // exclusive prefix of the rows, in place
        const Affine m{s_a[r][lane], s_b[r][lane]};
        s_a[r][lane] = total.a;
        s_b[r][lane] = total.b;
        total = ComposeOp()(total, m);
      }
      float h_in = state;
      if (lookback && active) {
        const int64_t index = chunk * p.num_seq + seq;
        if (chunk > 0) {
          lb.publish_aggregate(index, total);
          h_in = lb.look_back(seq, p.num_seq, chunk);
        }
        lb.publish_inclusive(index, fmaf(total.a, h_in, total.b));
      }
      state = fmaf(total.a, h_in, total.b);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) s_b[r][lane] = fmaf(s_a[r][lane], h_in, s_b[r][lane]);
    }
    __syncthreads();
    float h = s_b[row][lane], h_last = 0.f;
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      h = fmaf(c[i], h, v[i]);
      v[i] = h;
      if (i < n) h_last = h;
    }
    if constexpr (!kBackward) {
#pragma unroll
      for (int i = 0; i < CH; ++i)
        if (i < n) y[(t0 + i) * ls_y] = from_float<T>(v[i]);
    } else {
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        yn[i] *= v[i];
        if (i < n) dx[(t0 + i) * ls_dx] = from_float<T>(v[i]);
      }
      if (dc_acc) {
        accumulate_steps<CH>(dc_acc, ls_dc, t0, n, yn, /*warp_uniform_address=*/false);
      } else {
#pragma unroll
        for (int i = 0; i < CH; ++i)
          if (i < n) dc[(t0 + i) * ls_dc] = from_float<T>(yn[i]);
      }
      if (n > 0 && t0 + n == L)  // d initial = c[L-1] * g[L-1]
        *slot_ptr<T>(p, kGradInit, si.offset(p, kGradInit)) = from_float<T>(to_float(cf[(L - 1) * ls_c]) * h_last);
    }
    __syncthreads();  // s_a / s_b are rewritten by the next span
  }
}

}  // namespace linrec
