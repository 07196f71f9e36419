// Channel kernel: the scanned dim is not the innermost, e.g. (B, L, D) with dim=1.
//
// One thread per sequence ("channel"); consecutive threads take consecutive sequences, so
// every step is a coalesced row access across channels. Each thread holds a chunk of CH
// steps in registers (all loads issued before the first use), reduces it to one affine map,
// obtains the state before the chunk (its own register in pipe mode, or the per-channel
// decoupled look-back across blocks), then replays the chunk and stores it.
#pragma once
#include "scan_common.cuh"

namespace linrec {

struct ChannelArgs {
  int64_t num_chunks;       // block rows per sequence (look-back when > 1)
  int64_t pieces_per_chunk;  // CH-step pieces a thread walks one after the other (1 with look-back)
  int64_t num_seq_blocks;  // blocks of NT sequences
  LookbackState lb;
};

template <typename T, int CH, int NT, bool kBackward>
__global__ void __launch_bounds__(NT) scan_channel_kernel(const ScanParams p, const ChannelArgs args) {
  __shared__ int64_t s_vid;
  const bool lookback = args.num_chunks > 1;
  const LookbackState lb = args.lb;
  if (lookback) {  // chunk-major dynamic order: predecessors of a chunk were started before it
    if (threadIdx.x == 0) s_vid = static_cast<int64_t>(atomicAdd(lb.counter, 1ull));
    __syncthreads();
  }
  const int64_t vid = lookback ? s_vid : blockIdx.x;
  const int64_t chunk = vid / args.num_seq_blocks;
  const int64_t seq = (vid - chunk * args.num_seq_blocks) * NT + threadIdx.x;
  if (seq >= p.num_seq) return;

  const SeqIndex si(p, seq);
  const T* in = slot_ptr<T>(p, kIn, si.offset(p, kIn));
  const T* cf = slot_ptr<T>(p, kCoeff, si.offset(p, kCoeff));
  T* y = slot_ptr<T>(p, kOut, si.offset(p, kOut));
  const T* h0 = slot_ptr<T>(p, kInit, si.offset(p, kInit));
  const int64_t L = p.len, ls_in = p.lstride[kIn], ls_c = p.lstride[kCoeff], ls_y = p.lstride[kOut];
  const float init = h0 ? to_float(*h0) : 0.f;

  float h = kBackward ? 0.f : init;
  for (int64_t piece = 0; piece < args.pieces_per_chunk; ++piece) {
    const int64_t t0 = (chunk * args.pieces_per_chunk + piece) * CH;
    if (t0 >= L) break;
    const int n = static_cast<int>((L - t0 < CH ? L - t0 : int64_t(CH)));
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
    if (lookback) {
      Affine agg{1.f, 0.f};
#pragma unroll
      for (int i = 0; i < CH; ++i) agg = ComposeOp()(agg, Affine{c[i], v[i]});
      const int64_t index = chunk * p.num_seq + seq;
      if (chunk > 0) {
        lb.publish_aggregate(index, agg);
        h = lb.look_back(seq, p.num_seq, chunk);
      }
      lb.publish_inclusive(index, fmaf(agg.a, h, agg.b));
    }
    float h_last = 0.f;
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
      T* dx = slot_ptr<T>(p, kGradIn, si.offset(p, kGradIn));
      T* dc = slot_ptr<T>(p, kGradCoeff, si.offset(p, kGradCoeff));
      const int64_t ls_dx = p.lstride[kGradIn], ls_dc = p.lstride[kGradCoeff];
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        if (i < n) {
          dx[(t0 + i) * ls_dx] = from_float<T>(v[i]);
          dc[(t0 + i) * ls_dc] = from_float<T>(v[i] * yn[i]);
        }
      }
      if (t0 + n == L) {  // d initial = c[L-1] * g[L-1]
        *slot_ptr<T>(p, kGradInit, si.offset(p, kGradInit)) = from_float<T>(to_float(cf[(L - 1) * ls_c]) * h_last);
      }
    }
  }
}

}  // namespace linrec
