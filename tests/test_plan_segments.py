"""The CUDA planner's segmented short rows (csrc/linrec/cuda/plan_segments.h), checked on the host
with the system compiler like tests/test_plan_host.py (no GPU needed)."""
import pytest

from test_plan_host import CXX, _run_program


_SEGMENTS_PROGRAM = r"""
#include <cstdio>
#include "linrec/cuda/plan_segments.h"
using namespace linrec;
// Contiguous rows (the layout of (rows, len) tensors): reversed walks point at each row's last step.
static void show(int elem_size, bool backward, bool reverse, long long rows, long long len, bool initial = false,
                 long long misalign = 0, float dram_gbps_per_sm = 25.4f) {
  ScanParams p{};
  p.len = len; p.num_seq = rows; p.nbatch = 1; p.bsize[0] = rows; p.backward = backward;
  alignas(16) static char buf[64];
  for (int s = 0; s < kNumSlots; ++s) {
    p.lstride[s] = is_batch_slot(s) ? 0 : (reverse ? -1 : 1);
    p.bstride[s][0] = is_batch_slot(s) ? 1 : len;
  }
  for (int s : {kIn, kCoeff, kOut}) p.ptr[s] = buf + 16 + misalign * elem_size + (reverse ? (len - 1) * elem_size : 0);
  if (backward)
    for (int s : {kGradIn, kGradCoeff}) p.ptr[s] = buf + 16 + (reverse ? (len - 1) * elem_size : 0);
  if (backward) p.ptr[kGradInit] = buf;
  if (initial) p.ptr[kInit] = buf;
  const DeviceInfo dev{132, 9, 232448, dram_gbps_per_sm};
  const long long g = segment_rows(p, elem_size, dev);
  if (g == 1) { std::printf("%d %d %d %lld %lld 1\n", elem_size, backward, reverse, rows, len); return; }
  const ScanParams q = segment_params(p, g, elem_size);
  const ScanPlan plan = plan_segments(q, elem_size, dev);
  std::printf("%d %d %d %lld %lld %lld %lld %lld %lld %lld %lld %s %lld %lld %d %lld %lld %lld %lld\n", elem_size,
              backward, reverse, rows, len, g, (long long)q.len, (long long)q.num_seq, (long long)q.seg_len,
              (long long)((char*)q.ptr[kIn] - (char*)p.ptr[kIn]) / elem_size,
              backward ? (long long)((char*)q.ptr[kGradInit] - (char*)p.ptr[kGradInit]) / elem_size * 1000 +
                             q.seg_grad_init_step : 0,
              config_name(plan.kind, elem_size, plan.config), (long long)plan.num_chunks,
              (long long)plan.per_chunk, plan.segments, (long long)q.seg_short_seq, (long long)q.seg_short_len,
              (long long)q.seg_short_off[kIn], (long long)q.seg_short_off[kGradInit]);
}
int main() {
  for (int elem : {4, 2})
    for (bool bwd : {false, true})
      for (bool rev : {false, true}) {
        show(elem, bwd, rev, 8448, 128);
        show(elem, bwd, rev, 48000, 37);
        show(elem, bwd, rev, 1081344, 1);
      }
  show(4, false, false, 4224, 255);      // 4 rows of 255 float32 steps: 4080 bytes, aligned
  show(2, false, false, 4224, 255);      // 2-byte: 2040 / 1530 bytes, off the grid: not grouped
  show(4, false, false, 8448, 128, true);  // initial
  show(4, false, false, 8448, 128, false, 1);  // rows off the 16-byte grid
  show(4, false, false, 8000, 128);      // 1000 groups of 8: fewer than 8 per SM; 2000 of 4 fill their tile, 1600 of 5 not
  show(4, false, false, 4000, 128);      // 500 of 8, 800 of 5, 1000 of 4: too few
  show(4, false, false, 131072, 512);    // a whole walking tile: 2 (float32 forward: 1024 steps)
  show(4, true, false, 131072, 512);     // the backward: 4 (2048 steps)
  show(2, false, false, 131072, 512);    // 2-byte: 4
  show(4, false, false, 131072, 513);    // longer than the walking tile
  show(4, false, false, 131072, 300);    // 5 rows (a ragged last group of 2): 1500 steps fill 3 tiles to 98% (8: 94%)
  show(2, true, false, 131072, 1024, false, 0, 36.4f);  // two walking tiles, 2-byte backward, fast DRAM: pairs
  show(2, true, false, 131072, 1024);    // not on slower DRAM
  show(2, false, false, 131072, 1024, false, 0, 36.4f);  // nor in the forward
  // ragged last groups: 131072 = 13107 x 10 + 2 = 6553 x 20 + 12
  show(4, false, false, 131072, 100);    // 10 rows: 1000 steps fill 2 tiles to 98% (powers of two: 32, 89%)
  show(4, false, true, 131072, 100);     // reversed: the last group's walk starts 8 rows lower
  show(2, true, false, 131072, 100);     // the 2-byte backward: 20 rows (2048 steps); grad_initial 8 rows lower
  show(2, true, true, 131072, 100);      // reversed: its walk starts 8 rows lower, grad_initial as the others'
  show(2, false, false, 131071, 100);    // rows ending off a 16-byte vector: only divisors (131071 is prime)
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_segmented_rows_default(tmp_path):
    """Many rows of at most one walking tile (512 steps) run as sequences of g rows back to back
    (plan_segments.h's segment_rows): among the group sizes with at least one walking tile and at
    most 4096 steps per sequence, 16-byte aligned and 8 per SM, the one that fills its tiles best,
    then the one nearest 2048 steps (the float32 forward: 1024); walked by the walking tile with
    segments; a reverse walk starts at each group's last step; the backward writes grad_initial
    from the row of the sequence's last step in walk order (the last row forward, the first
    reversed); rows of whole walking tiles take the kernel that masks at tile edges only. The
    2-byte backward also pairs rows of two walking tiles where DRAM gives each SM more than 30 GB/s.
    Not with `initial`, rows off the 16-byte grid, too few groups, or other rows longer than a
    walking tile. Where all the rows end on a 16-byte vector g need not divide them: the last
    sequence holds fewer rows, a reversed walk's starts that many rows lower, and a forward walk's
    grad_initial rows count from that many rows lower (ScanParams::seg_short_*)."""
    got = [line.split() for line in _run_program(tmp_path, "segments", _SEGMENTS_PROGRAM)]
    walk = {4: "tile.e8t64", 2: "tile.e16t32"}
    expect = []
    for elem in (4, 2):
        for bwd in (0, 1):
            for rev in (0, 1):
                # 48000 x 37: 40 rows fill 3 tiles to 96% (16-32 rows: 58-87%)
                for rows, length, g in ((8448, 128, 8), (48000, 37, 40), (1081344, 1, 1024)):
                    steps = g * length
                    ptr = (g - 1) * length if rev else 0
                    grad_init = ((0 if rev else g - 1) * 1000 + (1 if rev else -1)) if bwd else 0
                    expect.append([str(v) for v in (elem, bwd, rev, rows, length, g, steps, rows // g, length,
                                                    ptr, grad_init, walk[elem], 1, -(-steps // 512), 1, -1, steps,
                                                    0, 0)])
    expect.append(["4", "0", "0", "4224", "255", "4", "1020", "1056", "255", "0", "0", "tile.e8t64", "1", "2", "1",
                   "-1", "1020", "0", "0"])
    expect += [["2", "0", "0", "4224", "255", "1"], ["4", "0", "0", "8448", "128", "1"],
               ["4", "0", "0", "8448", "128", "1"]]
    expect.append(["4", "0", "0", "8000", "128", "4", "512", "2000", "128", "0", "0", "tile.e8t64", "1", "1", "1",
                   "-1", "512", "0", "0"])
    expect.append(["4", "0", "0", "4000", "128", "1"])
    # rows of whole walking tiles: the masks at tile edges only (kTileSegments = 2)
    expect.append(["4", "0", "0", "131072", "512", "2", "1024", "65536", "512", "0", "0", "tile.e8t64", "1", "2", "2",
                   "-1", "1024", "0", "0"])
    expect.append(["4", "1", "0", "131072", "512", "4", "2048", "32768", "512", "0", "2999", "tile.e8t64", "1", "4",
                   "2", "-1", "2048", "0", "0"])
    expect.append(["2", "0", "0", "131072", "512", "4", "2048", "32768", "512", "0", "0", "tile.e16t32", "1", "4", "2",
                   "-1", "2048", "0", "0"])
    expect.append(["4", "0", "0", "131072", "513", "1"])
    expect.append(["4", "0", "0", "131072", "300", "5", "1500", "26215", "300", "0", "0", "tile.e8t64", "1", "3", "1",
                   "26214", "600", "0", "0"])
    expect.append(["2", "1", "0", "131072", "1024", "2", "2048", "65536", "1024", "0", "999", "tile.e16t32", "1", "4",
                   "2", "-1", "2048", "0", "0"])
    expect += [["2", "1", "0", "131072", "1024", "1"], ["2", "0", "0", "131072", "1024", "1"]]
    # ragged: the last sequence (13107 of 10 rows, 6553 of 20) holds 2 or 12 rows
    expect.append(["4", "0", "0", "131072", "100", "10", "1000", "13108", "100", "0", "0", "tile.e8t64", "1", "2", "1",
                   "13107", "200", "0", "0"])
    expect.append(["4", "0", "1", "131072", "100", "10", "1000", "13108", "100", "900", "0", "tile.e8t64", "1", "2", "1",
                   "13107", "200", "-800", "0"])
    expect.append(["2", "1", "0", "131072", "100", "20", "2000", "6554", "100", "0", "18999", "tile.e16t32", "1", "4",
                   "1", "6553", "1200", "0", "-8"])
    expect.append(["2", "1", "1", "131072", "100", "20", "2000", "6554", "100", "1900", "1", "tile.e16t32", "1", "4",
                   "1", "6553", "1200", "-800", "0"])
    expect.append(["2", "0", "0", "131071", "100", "1"])
    assert got == expect
