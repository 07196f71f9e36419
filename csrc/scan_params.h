// Torch-free description of one scan launch, shared by the CPU and CUDA kernels.
//
// The host (scan_layout.cpp) turns tensors of any rank, dim and strides into this
// struct: the scanned dim becomes `len` with one signed stride per tensor, and the
// other ("batch") dims are sorted innermost-first and coalesced. Reverse scans are
// folded in on the host by pointing at the last element and negating the stride,
// so kernels always walk t = 0, 1, ..., len-1.
#pragma once
#include <cstdint>

namespace linrec {

constexpr int kMaxBatchDims = 8;

// Tensor slots. Forward: reads kIn (x), kCoeff, kInit; writes kOut (y).
// Backward: reads kIn (grad_y), kCoeff, kOut (y saved by forward), kInit;
// writes kGradIn (grad_x), kGradCoeff, kGradInit.
enum Slot : int { kIn = 0, kCoeff, kOut, kInit, kGradIn, kGradCoeff, kGradInit, kNumSlots };

struct ScanParams {
  void* ptr[kNumSlots];                        // base pointer of each slot, nullptr when unused
  int64_t lstride[kNumSlots];                  // stride along the scan (elements, sign applied)
  int64_t bstride[kNumSlots][kMaxBatchDims];   // batch strides (elements), innermost first
  int64_t bsize[kMaxBatchDims];                // batch sizes, innermost first
  int nbatch;                                  // number of batch dims after coalescing
  int64_t num_seq;                             // product of bsize: independent sequences
  int64_t len;                                 // scan length L
  bool backward;                               // forward scan or its vector-Jacobian product
  // Backward with broadcast coeffs (CUDA): kGradCoeff is a float32 buffer of the coeffs'
  // shape, expanded (stride 0 where coeffs broadcast), that the kernel adds into atomically.
  bool accumulate_grad_coeff;
};

// Offset (elements) of sequence `seq` in slot `slot`: mixed-radix decomposition of the
// flat sequence index over the batch dims, innermost first.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int64_t seq_offset(const ScanParams& p, int slot, int64_t seq) {
  int64_t off = 0;
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int i = 0; i < kMaxBatchDims; ++i) {
    if (i >= p.nbatch) break;
    const int64_t q = seq / p.bsize[i];
    off += (seq - q * p.bsize[i]) * p.bstride[slot][i];
    seq = q;
  }
  return off;
}

}  // namespace linrec
