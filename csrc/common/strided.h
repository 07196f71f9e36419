// Torch-free description of a strided problem over independent sequences, shared by every op
// family's CPU and CUDA kernels.
//
// The host (common/layout.cpp) turns tensors of any rank, dim and strides into this struct: the
// scanned dim becomes `len` with one signed stride per tensor slot, and the other ("batch") dims
// are sorted innermost-first and coalesced. Reverse walks are folded in on the host by pointing
// at the last element and negating the stride, so kernels always walk t = 0, 1, ..., len-1.
// An op family names its slots (an enum) and derives its params from StridedLayout<its count>.
#pragma once
#include <cstdint>

namespace linrec {

constexpr int kMaxBatchDims = 8;

template <int kSlots>
struct StridedLayout {
  static constexpr int kNumSlots = kSlots;
  void* ptr[kSlots];                        // base pointer of each slot, nullptr when unused
  int64_t lstride[kSlots];                  // stride along the scanned dim (elements, sign applied)
  int64_t bstride[kSlots][kMaxBatchDims];   // batch strides (elements), innermost first
  int64_t bsize[kMaxBatchDims];             // batch sizes, innermost first
  int nbatch;                               // number of batch dims after coalescing
  int64_t num_seq;                          // product of bsize: independent sequences
  int64_t len;                              // length L of the scanned dim
};

// Offset (elements) of sequence `seq` (< num_seq) in slot `slot`: mixed-radix decomposition of the
// flat sequence index over the batch dims, innermost first; the outermost dim takes what is left
// without a division (a 64-bit division per call was most of the CPU walk's ~10 ns per short row).
template <int kSlots>
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int64_t seq_offset(const StridedLayout<kSlots>& p, int slot, int64_t seq) {
  int64_t off = 0;
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int i = 0; i < kMaxBatchDims; ++i) {
    if (i >= p.nbatch) break;
    if (i == p.nbatch - 1) return off + seq * p.bstride[slot][i];
    const int64_t q = seq / p.bsize[i];
    off += (seq - q * p.bsize[i]) * p.bstride[slot][i];
    seq = q;
  }
  return off;
}

}  // namespace linrec
