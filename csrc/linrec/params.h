// Torch-free parameters of one linrec::scan launch (forward or backward), shared by the CPU and
// CUDA kernels: the strided layout of common/strided.h over the scan's tensor slots.
#pragma once
#include "../common/strided.h"

namespace linrec {

// Tensor slots. Forward: reads kIn (x), kCoeff, kInit; writes kOut (y).
// Backward: reads kIn (grad_y), kCoeff, kOut (y saved by forward), kInit;
// writes kGradIn (grad_x), kGradCoeff, kGradInit.
enum Slot : int { kIn = 0, kCoeff, kOut, kInit, kGradIn, kGradCoeff, kGradInit, kNumSlots };

struct ScanParams : StridedLayout<kNumSlots> {
  bool backward;  // forward scan or its vector-Jacobian product
  // Backward with broadcast coeffs (CUDA): kGradCoeff is a float32 buffer of the coeffs'
  // shape, expanded (stride 0 where coeffs broadcast), that the kernel adds into atomically.
  bool accumulate_grad_coeff;
  // torch.use_deterministic_algorithms(True) was in force: no atomics (accumulate_grad_coeff off)
  // and no look-back between blocks (whose carries may compose in a timing-dependent order), so
  // every run gives the same bits.
  bool deterministic;
  // Tile kernel (CUDA): each sequence holds whole rows of `seg_len` steps back to back, scanned
  // independently (cuda/plan_segments.h segment_rows; 0: off). The kernel zeroes the coefficient that would
  // carry a state across a row start, and in the backward writes each row's grad_initial at
  // `seg_grad_init_step` elements from the previous row's (in walk order, counted from the row
  // that holds the sequence's last step).
  int64_t seg_len;
  int64_t seg_grad_init_step;
  // The one sequence that holds fewer rows than the others (a ragged last group; -1: none), its
  // length, and what each slot's offset adds for it (cuda/plan_segments.h segment_params).
  int64_t seg_short_seq;
  int64_t seg_short_len;
  int64_t seg_short_off[kNumSlots];
};

// How a tile kernel's sequences hold rows (ScanParams::seg_len): one row each (none), rows of any
// length, or rows of whole tiles (a row starts or ends only at a tile's edge).
enum SegmentKind : int { kNoSegments = 0, kRowSegments = 1, kTileSegments = 2 };

// Batch-shaped slots (x's shape without the scanned dim); the others have x's shape.
constexpr bool is_batch_slot(int slot) { return slot == kInit || slot == kGradInit; }

}  // namespace linrec
