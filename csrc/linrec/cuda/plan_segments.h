// Segmented rows: many short rows planned as sequences of several rows each (the tile kernel's
// segments, scan_segments.cuh). Host-only and torch-free, like plan.h.
#pragma once
#include <algorithm>
#include <cstdint>

#include "plan.h"

namespace linrec {

// Short rows, many of them: a block of the walking tile would hold one row and leave the rest of
// its threads idle (float32 131072 x 128 at 0.40 / 0.55 of torch.add on the H200 / H100, bf16
// backward 0.17 / 0.22; bench/NOTES.md items 76-78). Instead `g` rows back to back make one
// sequence of g x len steps, scanned by the walking tile with the coefficient at each row start
// zeroed (ScanParams::seg_len): the affine map of a step whose coefficient is 0 forgets the state
// before it, so the block scan needs no segment flags. Rows of at most one walking tile (and the
// tile pairs below); returns g (1: the rows stay as they are): among the group sizes that keep the
// sequence at least one walking tile and at most kSegmentMaxSteps, 16-byte aligned and 8 sequences
// per SM, the one whose sequences fill their tiles best, then the one nearest segment_target_steps;
// if its sequences walk (walk_min_rows, no phase shift). g need not divide the rows where they end
// on a 16-byte vector: the last group holds fewer (ragged), so that powers of two of rows are not
// held to powers of two of rows per group (H200, 128000 x 100, group of 10 or 20 against 32: float32
// forward 0.79 -> 0.93 of torch.add, bf16 backward 0.58 -> 0.70; bench/NOTES.md item 86). Only where every
// operand's rows lie back to back with unit stride, without `initial` (its gradient would need the
// coefficient before the mask) or a broadcast coefficient's accumulated gradient.
constexpr int64_t kSegmentMaxSteps = 4096;
// Sequences of 2048 steps: 1024 lost 0.02-0.2 of torch.add on 2-byte rows and in the backward, 4096
// 0.01-0.05; the float32 forward's of 1024 (2048 lost ~0.02 on rows of 16-256 steps; H200, item 78).
constexpr int64_t segment_target_steps(int elem_size, bool backward) {
  return elem_size == 4 && !backward ? 1024 : 2048;
}
inline ScanParams segment_params(const ScanParams& p, int64_t g, int elem_size);

inline int64_t segment_rows(const ScanParams& p, int elem_size, const DeviceInfo& dev) {
  const ScanDefaults def = device_defaults(dev, elem_size, p.backward, 1);
  if (def.tile_walk < 0 || p.nbatch != 1 || p.len < 1 || p.ptr[kInit] || p.accumulate_grad_coeff ||
      is_channel_layout(p))
    return 1;
  const int64_t walk_tile = tile_config(elem_size, def.tile_walk).tile();
  // Also the 2-byte backward's rows of two walking tiles where DRAM gives each SM more than 30 GB/s:
  // a one-warp block walks two of them as four tiles (H200 bf16 131072 x 1024 backward 0.90 -> 0.92
  // of torch.add, fp16 0.91 -> 0.93; item 78).
  const bool tile_pairs = elem_size == 2 && p.backward && dev.dram_gbps_per_sm > kFastDramGbpsPerSm &&
                          p.len == 2 * walk_tile;
  if (p.len > walk_tile && !tile_pairs) return 1;
  // Every group starts where its first row's lowest step is: 16-byte aligned there and a multiple of
  // a vector long, it is aligned (vectorizable); the check is a loop of integer tests (host time).
  const int64_t vec = 16 / elem_size;
  for (int s = 0; s < kNumSlots; ++s) {
    if (is_batch_slot(s) || !p.ptr[s]) continue;
    if (p.lstride[s] != p.lstride[kIn] || !unit_stride(p, s) || p.bstride[s][0] != p.len) return 1;
    const char* lowest = static_cast<const char*>(p.ptr[s]) + (p.lstride[s] > 0 ? 0 : (1 - p.len) * elem_size);
    if (reinterpret_cast<uintptr_t>(lowest) % 16 != 0) return 1;
  }
  const int64_t target = segment_target_steps(elem_size, p.backward);
  const int64_t min_groups = 8 * int64_t(dev.num_sms);  // walk_min_rows' most
  // A last group of fewer rows where the rows end on a vector (a reversed walk starts there).
  const bool ragged = (p.num_seq * p.len) % vec == 0;
  int64_t best = 1;
  double best_fill = 0, best_dist = 0;
  for (int64_t g = std::min(kSegmentMaxSteps / p.len, p.num_seq / min_groups); g >= 2 && g * p.len >= walk_tile; --g) {
    if ((p.num_seq % g != 0 && !ragged) || (g * p.len) % vec != 0) continue;
    const int64_t groups = p.num_seq / g, last = (p.num_seq % g) * p.len;  // last: the ragged group's steps
    const int64_t steps = g * p.len, padded = ceil_div(steps, walk_tile) * walk_tile;
    const double fill = double(p.num_seq * p.len) / double(groups * padded + ceil_div(last, walk_tile) * walk_tile);
    const double dist = std::max(double(steps) / target, double(target) / steps);  // a ratio: 1 is the target
    if (fill > best_fill * (1 + 1e-9) || (fill >= best_fill * (1 - 1e-9) && dist < best_dist)) {
      best = g, best_fill = fill, best_dist = dist;
    }
  }
  if (best == 1) return 1;
  const ScanParams q = segment_params(p, best, elem_size);  // the plan's own checks, once
  const bool walks = q.num_seq >= walk_min_rows(q, elem_size, dev) && !tile_phase_shift(q, elem_size) &&
                     vector_slots(q, elem_size) == vector_slots(q, elem_size, /*aligned=*/false);
  return walks ? best : 1;
}

// `p` with each `g` consecutive rows made one sequence (segment_rows checked that they lie back to
// back; `elem_size`: bytes of every slot's elements): a reverse walk starts at the group's last
// step, and the backward's grad_initial pointer at the row that holds the sequence's last step in
// walk order.
inline ScanParams segment_params(const ScanParams& p, int64_t g, int elem_size) {
  ScanParams q = p;
  q.seg_len = p.len;
  q.len = p.len * g;
  q.num_seq = ceil_div(p.num_seq, g);
  q.bsize[0] = q.num_seq;
  const bool reversed = p.lstride[kIn] < 0;
  for (int s = 0; s < kNumSlots; ++s) {
    q.bstride[s][0] = p.bstride[s][0] * g;
    if (!p.ptr[s] || is_batch_slot(s) || !reversed) continue;
    q.ptr[s] = static_cast<char*>(p.ptr[s]) + (g - 1) * p.len * elem_size;
  }
  if (p.backward && p.ptr[kGradInit]) {
    // Forward walk: the sequence's last step is in its last row, and the rows before it come
    // earlier in memory; reverse walk: its first row, then the ones after it.
    const int64_t step = p.bstride[kGradInit][0];
    q.seg_grad_init_step = reversed ? step : -step;
    if (!reversed) q.ptr[kGradInit] = static_cast<char*>(p.ptr[kGradInit]) + (g - 1) * step * elem_size;
  }
  // A last group of r < g rows: a sequence of r rows, where a reversed walk starts g - r rows before
  // a whole group's start (its last row is the tensor's), and a forward walk's last row is g - r
  // rows before a whole group's (the backward's grad_initial rows count from it).
  const int64_t r = p.num_seq - (q.num_seq - 1) * g;
  q.seg_short_seq = r < g ? q.num_seq - 1 : -1;
  q.seg_short_len = r * p.len;
  for (int s = 0; s < kNumSlots; ++s) {
    q.seg_short_off[s] = 0;
    if (r == g || !p.ptr[s]) continue;
    if (!is_batch_slot(s) && reversed) q.seg_short_off[s] = (g - r) * p.len * p.lstride[s];
    if (s == kGradInit && p.backward && !reversed) q.seg_short_off[s] = (g - r) * q.seg_grad_init_step;
  }
  return q;
}

// The plan of segment_params(p, g, elem_size): blocks of the walking tile (the only one compiled
// with segments, launch.cuh) walk the grouped rows.
inline ScanPlan plan_segments(const ScanParams& q, int elem_size, const DeviceInfo& dev) {
  const ScanDefaults def = device_defaults(dev, elem_size, q.backward, 1);
  ScanPlan plan{};
  plan.vec_mask = vector_slots(q, elem_size);
  plan_tile(plan, q, elem_size, dev, -1, def.tile_lookback, def.tile_walk, /*walk_many=*/true);
  const int64_t walk_tile = tile_config(elem_size, plan.config).tile();
  plan.segments = q.seg_len % walk_tile == 0 ? kTileSegments : kRowSegments;
  return plan;
}

}  // namespace linrec
