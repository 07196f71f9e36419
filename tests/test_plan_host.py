"""The CUDA planner's default choices, checked on the host: csrc/linrec/cuda/plan.h is torch-free,
so a small C++ program compiled with the system compiler runs it with an H100's device properties
(no GPU needed)."""
import shutil
import subprocess

import pytest

from test_nvcc import ROOT

CXX = shutil.which("c++") or shutil.which("g++")


def _run_program(tmp_path, name, program):
    """Compiles `program` (C++ including csrc/) with the system compiler, runs it, returns its lines."""
    src = tmp_path / f"{name}.cpp"
    src.write_text(program)
    exe = tmp_path / name
    subprocess.run([CXX, "-std=c++17", "-I", str(ROOT / "csrc"), str(src), "-o", str(exe)], check=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()

# Prints the default plan of `rows` sequences of length `len` (innermost, contiguous, aligned) on a
# device of compute capability `cc` with an H100's SMs, shared memory and (unless `dram` is set)
# DRAM bandwidth per SM: cc, element size, direction, rows, length, config, chunks (blocks per
# sequence), tiles per block. plan_of(...) returns the plan itself.
_SHOW = r"""
#include <cstdio>
#include "linrec/cuda/plan.h"
using namespace linrec;
static float dram = 25.4f;  // GB/s per SM: the H100 SXM's 3.35 TB/s over 132 SMs
static ScanPlan plan_of(int cc, int elem_size, bool backward, long long rows, long long len) {
  ScanParams p{};
  p.len = len; p.num_seq = rows; p.nbatch = 1; p.bsize[0] = rows; p.backward = backward;
  alignas(16) static float buf[4];
  for (int s = 0; s < kNumSlots; ++s) { p.lstride[s] = 1; p.bstride[s][0] = len; }
  for (int s : {kIn, kCoeff, kOut, kGradIn, kGradCoeff}) p.ptr[s] = buf;
  const DeviceInfo dev{132, cc, 232448, dram};
  bool inapplicable;
  return plan_scan(p, elem_size, dev, ConfigRequest{}, &inapplicable);
}
static void show(int cc, int elem_size, bool backward, long long rows, long long len) {
  const ScanPlan plan = plan_of(cc, elem_size, backward, rows, len);
  std::printf("%d %d %d %lld %lld %s %lld %lld\n", cc, elem_size, backward ? 1 : 0, rows, len,
              config_name(plan.kind, elem_size, plan.config), static_cast<long long>(plan.num_chunks),
              static_cast<long long>(plan.per_chunk));
}
"""

_PROGRAM = _SHOW + r"""
int main() {
  for (int cc : {9, 8})
    for (int elem : {4, 2})
      for (bool bwd : {false, true}) {
        show(cc, elem, bwd, 16, 1ll << 22);
        show(cc, elem, bwd, 1, 1ll << 26);
      }
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_look_back_defaults(tmp_path):
    """Few long sequences are chained by look-back: on Hopper through the ring kernel (configs_sm90.h),
    elsewhere with the tile the tuner chose for those buckets, for every element size and direction
    (the tile default's index once reached the planner as a bool, so every problem ran the second
    tile config)."""
    rows = [line.split() for line in _run_program(tmp_path, "plan", _PROGRAM)]
    expect = {("9", "4", "0"): "ring.e8t512s6", ("9", "4", "1"): "ring.e8t512s6", ("9", "2", "0"): "ring.e16t512s6",
              ("9", "2", "1"): "ring.e16t512s6", ("8", "4", "0"): "tile.e16t128", ("8", "4", "1"): "tile.e8t128",
              ("8", "2", "0"): "tile.e32t128", ("8", "2", "1"): "tile.e32t128"}
    assert len(rows) == 16
    for cc, elem, bwd, n, length, name, chunks, _per_block in rows:
        assert name == expect[cc, elem, bwd], (cc, elem, bwd, n, length)
        if cc == "9":  # one status entry per ring tile: 4096 float32 or 8192 16-bit steps
            assert int(chunks) == int(length) // (4096 if elem == "4" else 8192)
        assert int(chunks) > 1, "a look-back plan"


_PHASE_PROGRAM = r"""
#include <cstdio>
#include "linrec/cuda/plan.h"
using namespace linrec;
// Prints the default H100 plan of `rows` sequences of length `len`, `pitch` elements apart, each
// tensor's step 0 `offset` elements past a 16-byte boundary, stride `ls` along the scan.
static void show(int elem_size, long long rows, long long len, long long pitch, int offset, int ls,
                 bool backward = false) {
  ScanParams p{};
  p.len = len; p.num_seq = rows; p.nbatch = 1; p.bsize[0] = rows; p.backward = backward;
  alignas(16) static char buf[64];
  for (int s = 0; s < kNumSlots; ++s) { p.lstride[s] = ls; p.bstride[s][0] = pitch; }
  for (int s : {kIn, kCoeff, kOut}) p.ptr[s] = buf + offset * elem_size;
  const DeviceInfo dev{132, 9, 232448};
  bool inapplicable;
  const ScanPlan plan = plan_scan(p, elem_size, dev, ConfigRequest{}, &inapplicable);
  std::printf("%s %d %u %lld %lld\n", config_name(plan.kind, elem_size, plan.config), plan.phase_shift ? 1 : 0,
              plan.vec_mask, static_cast<long long>(plan.num_chunks), static_cast<long long>(plan.per_chunk));
}
int main() {
  show(2, 1000, 3001, 3001, 0, 1);      // odd length: rows off the grid
  show(2, 1000, 3008, 3008, 0, 1);      // aligned rows
  show(2, 1000, 3000, 3001, 1, 1);      // a sliced view (x[:, 1:] of 3001 columns)
  show(4, 1000, 1024, 2048, 0, 2);      // strided along the scan: per-step loads
  show(4, 1000, 1023, 1023, 0, -1);     // reverse walk, odd length
  show(2, 1000, 1023, 1023, 0, 1);      // shifted rows' last steps past the tile: scan_tail
  show(2, 1000, 1023, 1023, 0, 1, true);   // its backward: 16 steps per thread, no per-step edges
  show(2, 1000, 1000, 1000, 0, 1, true);   // aligned, but a partial run at the end
  show(2, 1000, 1024, 1024, 0, 1, true);   // aligned whole runs: 32 steps per thread
  show(2, 100000, 1023, 1023, 0, 1);       // many rows: the walking 512-step tile, shifted too
  show(2, 100000, 1023, 1023, 0, 1, true);
  show(4, 16, (1 << 22) + 1, (1 << 22) + 1, 0, 1);  // few long odd rows: the tile look-back (the ring
                                                     // and stream kernels' bulk copies need aligned rows)
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_phase_shift_plans(tmp_path):
    """Rows whose input starts off the 16-byte grid (odd lengths, sliced views, reverse walks of odd
    lengths) take the tile kernel shifted to each row's phase, every unit-stride slot marked for
    vector access, and the tiles of the row's length; aligned rows and strided inputs do not."""
    got = _run_program(tmp_path, "phase", _PHASE_PROGRAM)
    streamed = (1 << 0) | (1 << 1) | (1 << 2)  # kIn, kCoeff, kOut
    assert got == [
        # 7.6 rows per SM: the 2-byte forward walks the 1024-step two-warp tile (plan.h's walk_tile)
        f"tile.e16t64 1 {streamed} 1 3",
        f"tile.e16t64 0 {streamed} 1 3",
        f"tile.e16t64 1 {streamed} 1 3",
        "tile.e8t128 0 0 1 1",
        f"tile.e8t128 1 {streamed} 1 1",
        f"tile.e32t32 1 {streamed} 1 1",
        f"tile.e16t64 1 {streamed} 1 1",
        f"tile.e16t64 0 {streamed} 1 1",
        f"tile.e32t32 0 {streamed} 1 1",
        f"tile.e16t32 1 {streamed} 1 2",
        f"tile.e16t32 1 {streamed} 1 2",
        f"tile.e16t128 1 {streamed} {((1 << 22) + 1 + 2047) // 2048} 1",  # 2048-step tiles
    ], got


_WALK_PROGRAM = _SHOW + r"""
int main() {
  for (int cc : {9, 8})
    for (int elem : {4, 2})
      for (bool bwd : {false, true}) {
        show(cc, elem, bwd, 131072, 1024);  // many rows: the 512-step tile, walked
        show(cc, elem, bwd, 65536, 2048);
        show(cc, elem, bwd, 1056, 300);     // 8 rows per SM, just over 256 steps
        show(cc, elem, bwd, 1055, 1024);    // fewer: the tile that holds the row
        show(cc, elem, bwd, 131072, 256);   // short rows: the 256-step tile
        show(cc, elem, bwd, 4096, 4097);    // off the 16-byte grid, just over the longest tile
        show(cc, elem, bwd, 2000, 6001);    // off the grid too, fewer than 2 waves of the longest tile's blocks
        show(cc, elem, bwd, 2000, 6000);    // aligned, at most 16 walking tiles: not the stream kernel
        show(cc, elem, bwd, 2000, 32768);   // aligned, 64 walking tiles: the stream kernel (Hopper)
      }
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_walking_tile_defaults(tmp_path):
    """Many rows (at least 8 per SM) of more than 256 steps take the 512-step tile, walked along each
    row, on every device; fewer rows the tile that holds a row, shorter rows the 256-step tile. Rows
    longer than the longest tile walk too where the stream kernel cannot take them (off the 16-byte
    grid; chained by look-back, bf16 4096 x 4097 ran at 0.45 of a vector add forward, walked at 0.88)
    or they are at most 16 walking tiles long (bf16 2000 x 6000 on the stream kernel: 0.41, walked
    0.70); longer aligned rows keep the stream kernel on Hopper (float32 1100 x 32768: 1.02 against
    0.86 walked), and walk from 15 rows per SM where there is none (plan.h's walk_over_lookback).
    The 2-byte backward of such rows, fewer than 16 per SM, chains 1024-step look-back tiles instead
    (plan.h's backward_lookback_1024; bf16 1100 x 8001: 0.60 of a vector add walked, 0.73). On
    Hopper, rows of more than 2048 steps walk 1024-step tiles where few share an SM (plan.h's
    walk_tile): the 4-byte backward below 32 rows per SM (float32 3000 x 8001: 0.84 -> 0.93), the
    2-byte forward at 14-18 (bf16 2000 x 6001: 0.76 -> 0.84)."""
    got = [" ".join(line.split()[5:]) for line in _run_program(tmp_path, "walk", _WALK_PROGRAM)]
    walk = {4: "tile.e8t64", 2: "tile.e16t32"}
    whole = {4: "tile.e8t128", 2: "tile.e32t32"}
    short = {4: "tile.e8t32", 2: "tile.e16t16"}
    long_rows = {(9, 4): "stream.e8t512s4 8 8", (9, 2): "stream.e16t512s4 4 4", (8, 4): "tile.e8t64 1 64",
                 (8, 2): "tile.e16t32 1 64"}
    expect = []
    for _cc in (9, 8):
        for elem in (4, 2):
            for bwd in (0, 1):
                # the 2-byte backward of fewer than 16 rows per SM: 1024-step look-back tiles
                mid = ["tile.e16t64 6 1"] * 2 if (elem, bwd) == (2, 1) else [f"{walk[elem]} 1 12"] * 2
                odd = f"{walk[elem]} 1 9"
                if _cc == 9 and (elem, bwd) == (4, 1):  # 1024-step walking tiles below 32 rows per SM
                    mid, odd = ["tile.e8t128 1 6"] * 2, "tile.e8t128 1 5"
                elif _cc == 9 and (elem, bwd) == (2, 0):  # and for the 2-byte forward at 14-18 rows per SM
                    mid = ["tile.e32t32 1 6"] * 2
                expect += [f"{walk[elem]} 1 2", f"{walk[elem]} 1 4", f"{walk[elem]} 1 1", f"{whole[elem]} 1 1",
                           f"{short[elem]} 1 1", odd, *mid, long_rows[(_cc, elem)]]
    assert got == expect


_ROWS_PER_SM_PROGRAM = _SHOW + r"""
int main() {
  for (long long rows : {1100, 2000, 3000, 4096}) show(9, 4, false, rows, 8001);  // 8.3, 15.2, 22.7, 31 per SM
  for (float d : {25.4f, 37.f}) {  // H100, H200
    dram = d;
    show(9, 2, false, 600, 8000);  // 4.5 rows per SM
    show(9, 2, false, 500, 3001);  // 3.8
  }
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_walk_rules_by_rows_per_sm(tmp_path):
    """float32 forward rows of more than 2048 steps walk the 1024-step tile below 9 and from 18 to 28
    rows per SM, the 512-step tile between and above (3000 x 8001: 0.81 -> 0.88 of torch.add on the
    H100, 0.75 -> 0.82 on the H200); the 2-byte forward walks from 5 rows per SM, from 4 where DRAM
    gives each SM more than 30 GB/s (H200: bf16 600 x 6000 0.57 -> 0.68; plan.h's walk_tile and
    walk_min_rows), unless the H200's small stream blocks take them (aligned rows: 600 x 8000)."""
    got = [" ".join(line.split()[5:]) for line in _run_program(tmp_path, "rows", _ROWS_PER_SM_PROGRAM)]
    assert got == ["tile.e8t128 1 8", "tile.e8t64 1 16", "tile.e8t128 1 8", "tile.e8t64 1 16",
                   "stream.e16t256s4 2 2", "tile.e32t128 1 1",  # H100: the stream kernel, one tile per row
                   "stream.e16t128s2 4 4", "tile.e32t128 1 1"]  # H200: small stream blocks; rows off the grid


_RING_OR_STREAM_PROGRAM = _SHOW + r"""
int main() {
  for (float gbps : {25.4f, 37.2f, 0.f}) {  // H100, H200, unknown
    dram = gbps;
    for (int elem : {4, 2})
      for (bool bwd : {false, true})
        for (long long rows : {100, 128, 200, 1000}) show(9, elem, bwd, rows, rows == 1000 ? 1 << 18 : 1 << 20);
    for (int elem : {4, 2})  // shorter rows: the stream kernel everywhere
      for (bool bwd : {false, true})
        for (long long rows : {128, 1000}) show(9, elem, bwd, rows, rows == 1000 ? 1 << 17 : 1 << 16);
  }
  // x walked forward, coeffs backward (a flipped view): the ring walks its streamed inputs one way
  // and does not apply; the stream kernel does, on the H100 too
  ScanParams p{};
  const long long len = 1 << 20;
  p.len = len; p.num_seq = 128; p.nbatch = 1; p.bsize[0] = 128;
  alignas(16) static float buf[4];
  for (int s = 0; s < kNumSlots; ++s) { p.lstride[s] = 1; p.bstride[s][0] = len; }
  for (int s : {kIn, kCoeff, kOut}) p.ptr[s] = buf;
  p.lstride[kCoeff] = -1;
  p.ptr[kCoeff] = reinterpret_cast<char*>(buf) + (len - 1) * 4;  // its lowest address is buf's
  bool inapplicable;
  const ScanPlan plan = plan_scan(p, 4, DeviceInfo{132, 9, 232448, 25.4f}, ConfigRequest{}, &inapplicable);
  std::printf("9 4 0 128 %lld %s\n", len, config_name(plan.kind, 4, plan.config));
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_ring_or_stream_defaults(tmp_path):
    """As many rows as SMs or more: on a Hopper card whose DRAM gives each SM at most 30 GB/s (the
    H100's 25) the ring for rows of 2^18 steps or more, except for the 2-byte backward; with more
    per SM (the H200's 37), an unknown bandwidth or shorter rows, one stream block per row; and
    where the ring does not apply (inputs walked different ways), the stream kernel on the H100 too."""
    got = [line.split()[5] for line in _run_program(tmp_path, "ring_or_stream", _RING_OR_STREAM_PROGRAM)]
    ring = {4: "ring.e8t512s6", 2: "ring.e16t512s6"}
    stream = {4: "stream.e8t512s4", 2: "stream.e16t512s4"}
    expect = []
    for device in ("H100", "H200", "unknown"):
        for elem in (4, 2):
            for bwd in (False, True):
                name = ring[elem] if device == "H100" and not (elem == 2 and bwd) else stream[elem]
                expect += [name] * 4
        expect += [stream[elem] for elem in (4, 2) for bwd in (False, True) for rows in (128, 1000)]
    assert got == expect + [stream[4]]


_PREFETCH_PROGRAM = _SHOW + r"""
// config, tiles per block, whether a walking block prefetches its next tile (Hopper)
static void show(int elem_size, bool backward, long long rows, long long len) {
  const ScanPlan plan = plan_of(9, elem_size, backward, rows, len);
  std::printf("%s %lld %d\n", config_name(plan.kind, elem_size, plan.config),
              static_cast<long long>(plan.per_chunk), plan.walk_prefetch ? 1 : 0);
}
int main() {
  for (bool bwd : {false, true}) {
    show(2, bwd, 1100, 8001);    // KiB of one tensor's tiles per SM: 17 (two-warp 1024-step blocks)
    show(2, bwd, 2000, 6000);    // 30 (one-warp 1024-step blocks): no prefetch
    show(2, bwd, 3000, 6000);    // 23: no prefetch
    show(2, bwd, 4096, 4097);    // 31: no prefetch
    show(4, bwd, 1100, 2000);    // 17 KiB (two-warp 512-step blocks; 2048 steps would take one tile)
    show(4, bwd, 1100, 8001);    // longer rows: the 1024-step tile, 33 KiB: no prefetch
    show(4, bwd, 2000, 6000);    // 30: no prefetch
    show(4, bwd, 131072, 1024);  // many-short: no prefetch
    show(4, bwd, 1055, 1024);    // one tile per row: nothing to prefetch
    show(2, bwd, 131072, 1024);  // 2-byte rows of two tiles: no prefetch here (the H100)
  }
  dram = 37.f;  // an H200: below 25 KiB per SM
  show(2, false, 2600, 6000);    // 20
  show(2, false, 3000, 6000);    // 23
  show(2, false, 3300, 6000);    // 25: no prefetch
  show(4, false, 1500, 8001);    // 23
  show(4, false, 2000, 8001);    // 30: no prefetch
  for (bool bwd : {false, true}) {
    show(2, bwd, 131072, 1024);  // 2-byte rows of two tiles, however many
    show(2, bwd, 131072, 1000);  // (shifted rows)
    show(2, bwd, 32768, 4096);   // more tiles per row: no prefetch
    show(4, bwd, 131072, 1024);  // float32: no prefetch
  }
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_walk_prefetch_defaults(tmp_path):
    """A walking block prefetches its next tile into L2 only with less than 18 KiB of one tensor's
    tiles per SM (with more, the prefetches cost bandwidth: bf16 3000 x 6000 forward 0.82 of
    torch.add without, 0.76 with; 2000 x 6000 on one-warp 1024-step tiles 0.84 without, 0.75 with),
    and only when it walks more than one tile (plan.h's plan_tile); below 25 KiB where DRAM gives each
    SM more than 30 GB/s (H200: bf16 2600 x 6000 0.71 without, 0.79 with; float32 2000 x 8001, 30 KiB,
    0.83 without, 0.79 with), where also 2-byte rows of two tiles prefetch however many they are
    (bf16 131072 x 1024 backward 0.86 without, 0.90 with)."""
    got = _run_program(tmp_path, "prefetch", _PREFETCH_PROGRAM)
    fwd = ["tile.e16t64 8 1", "tile.e32t32 6 0", "tile.e16t32 12 0", "tile.e16t32 9 0", "tile.e8t64 4 1",
           "tile.e8t128 8 0", "tile.e8t64 12 0", "tile.e8t64 2 0", "tile.e8t128 1 0", "tile.e16t32 2 0"]
    # the 2-byte backward of 1100 and 2000 rows chains 1024-step look-back tiles (backward_lookback_1024);
    # the 4-byte backward walks 1024-step tiles below 32 rows per SM (walk_tile)
    bwd = ["tile.e16t64 1 0", "tile.e16t64 1 0", *fwd[2:5], "tile.e8t128 8 0", "tile.e8t128 6 0", *fwd[7:]]
    h200 = ["tile.e16t32 12 1", "tile.e16t32 12 1", "tile.e16t32 12 0", "tile.e8t64 16 1", "tile.e8t64 16 0"]
    h200 += ["tile.e16t32 2 1", "tile.e16t32 2 1", "tile.e16t32 8 0", "tile.e8t64 2 0"] * 2
    assert got == fwd + bwd + h200


_SHORT_STREAM_PROGRAM = _SHOW + r"""
int main() {
  for (int elem : {4, 2})
    for (bool bwd : {false, true}) {
      show(9, elem, bwd, 600, 8000);   // 4.5 rows per SM of one or two stream tiles: 1024-step look-back tiles
      show(9, elem, bwd, 200, 6000);   // 1.5 rows per SM
      show(9, elem, bwd, 128, 8192);   // one per SM: the stream kernel
      show(9, elem, bwd, 600, 4000);   // within the longest tile: one tile per row
      show(9, elem, bwd, 600, 65536);  // many stream tiles: the stream kernel
      if (elem == 4) show(9, elem, bwd, 1000, 4608);  // the last 256-thread stream tile a quarter full
    }
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_short_stream_rows_defaults(tmp_path):
    """Rows longer than the longest tile but of at most two stream tiles, 1.5 to 8 per SM, chain
    1024-step look-back tiles instead of one stream block per row (bf16 600 x 8000 backward: 0.56 of
    torch.add on the stream kernel, 0.81; plan.h's short_stream_rows), but the forward from two rows
    per SM takes the stream kernel's 256-thread config unless its last tile is under half full; one
    row per SM, rows that fit a tile and rows of many stream tiles keep their plans."""
    got = [" ".join(line.split()[5:]) for line in _run_program(tmp_path, "short", _SHORT_STREAM_PROGRAM)]
    lookback = {(4, 0): "tile.e8t128", (4, 1): "tile.e8t128", (2, 0): "tile.e32t32", (2, 1): "tile.e16t64"}
    stream = {4: "stream.e8t512s4", 2: "stream.e16t512s4"}
    short = {4: "stream.e8t256s4", 2: "stream.e16t256s4"}
    expect = []
    for elem in (4, 2):
        for bwd in (0, 1):
            lb = lookback[(elem, bwd)]
            one_tile = "tile.e32t128" if elem == 2 else "tile.e16t256"
            stream_tile = 4096 if elem == 4 else 8192  # steps
            tiles = 8192 // stream_tile, 65536 // stream_tile
            # the forward from two rows per SM keeps the stream kernel, 256 threads (stream_default)
            first = f"{lb} 8 1" if bwd else f"{short[elem]} {-(-8000 // (stream_tile // 2))} {-(-8000 // (stream_tile // 2))}"
            expect += [first, f"{lb} 6 1", f"{stream[elem]} {tiles[0]} {tiles[0]}", f"{one_tile} 1 1",
                       f"{stream[elem]} {tiles[1]} {tiles[1]}"] + ([f"{lb} 5 1"] if elem == 4 else [])
    assert got == expect


_STREAM_SHORT_PROGRAM = _SHOW + r"""
int main() {
  for (int elem : {4, 2})
    for (bool bwd : {false, true}) {
      show(9, elem, bwd, 1100, 8192);   // 8.3 rows per SM of whole stream tiles (one or two)
      show(9, elem, bwd, 1100, 12288);  // two or three stream tiles
      show(9, elem, bwd, 2000, 16384);  // two or four stream tiles
      show(9, elem, bwd, 1000, 32768);  // four or eight stream tiles
      show(9, elem, bwd, 600, 65536);   // many stream tiles
      show(9, elem, bwd, 128, 8192);    // one row per SM
    }
  dram = 37.f;  // H200: the 2-byte forward's rows of three or four tiles too (beyond 8 per SM: up to
  show(9, 2, false, 1100, 32768);  // 8 per SM, small stream blocks, test_small_stream_rows_default)
  show(9, 2, false, 1000, 65536);
  show(9, 2, true, 2200, 32768);
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_stream_short_rows_default(tmp_path):
    """Rows the stream kernel takes with at most two of its default tiles (four for 4-byte types) and
    two or more rows per SM run the 256-thread 4-stage config (two blocks per SM; H100 bf16 1100 x
    12288 forward 0.57 -> 0.91 of torch.add, configs_sm90.h's stream_short); longer rows and one row
    per SM keep the 512-thread config. On the H200 the 2-byte forward takes it for four tiles too (bf16
    1000 x 20000 0.54 -> 0.77), the backward not."""
    got = [" ".join(line.split()[5:]) for line in _run_program(tmp_path, "stream_short", _STREAM_SHORT_PROGRAM)]
    got, h200 = got[:-3], got[-3:]
    assert h200 == ["stream.e16t256s4 8 8", "stream.e16t512s4 8 8", "stream.e16t512s4 4 4"]
    wide = {4: "stream.e8t512s4", 2: "stream.e16t512s4"}
    short = {4: "stream.e8t256s4", 2: "stream.e16t256s4"}
    expect = []
    for elem in (4, 2):
        tile = {4: 4096, 2: 8192}[elem]  # steps of a wide tile; a short-rows tile has half
        for _ in (0, 1):
            for rows, length in ((1100, 8192), (1100, 12288), (2000, 16384), (1000, 32768), (600, 65536),
                                 (128, 8192)):
                wide_tiles, short_tiles = -(-length // tile), -(-length // (tile // 2))
                if wide_tiles <= (4 if elem == 4 else 2) and rows >= 2 * 132:
                    expect.append(f"{short[elem]} {short_tiles} {short_tiles}")
                else:
                    expect.append(f"{wide[elem]} {wide_tiles} {wide_tiles}")
    assert got == expect


_STREAM_WHOLE_ROWS_PROGRAM = _SHOW + r"""
int main() {
  for (bool bwd : {false, true}) {
    show(9, 4, bwd, 3000, 8192);    // two whole stream tiles, 22.7 rows per SM
    show(9, 4, bwd, 8192, 16384);   // four, 62 per SM
    show(9, 4, bwd, 3000, 20480);   // five
    show(9, 4, bwd, 3000, 6144);    // one and a half
    show(9, 2, bwd, 3000, 8192);    // 2-byte
  }
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_stream_whole_rows_default(tmp_path):
    """Many 4-byte rows of at most four whole stream tiles take the stream kernel's 256-thread config
    rather than walk (float32 3000 x 8192: 0.90 / 0.95 of torch.add walked on the H100, 0.97 / 0.99
    on the stream kernel; plan.h's stream_whole_rows); longer rows, rows off whole tiles and 2-byte
    rows keep the walk."""
    got = [" ".join(line.split()[5:]) for line in _run_program(tmp_path, "whole", _STREAM_WHOLE_ROWS_PROGRAM)]
    for bwd in (0, 1):
        rows = got[5 * bwd:5 * bwd + 5]
        assert rows[:2] == ["stream.e8t256s4 4 4", "stream.e8t256s4 8 8"]
        assert all(r.startswith("tile.") for r in rows[2:]), rows



_SMALL_STREAM_PROGRAM = _SHOW + r"""
int main() {
  for (float d : {37.f, 25.4f}) {  // H200, H100
    dram = d;
    show(9, 4, false, 1000, 4608);   // 7.6 rows per SM: small stream blocks (H200)
    show(9, 4, false, 264, 3072);    // 2 per SM: not
    show(9, 4, false, 4000, 4608);   // 30 per SM: not
    show(9, 4, false, 1000, 9000);   // 7.6 per SM of 8193-16384 steps: small stream blocks (H200)
    show(9, 4, false, 1000, 4001);   // off the 16-byte grid: the stream kernel does not apply
    show(9, 4, false, 1000, 4096);   // a whole-row tile
    show(9, 2, false, 500, 10000);   // 3.8 per SM: small stream blocks (H200)
    show(9, 2, false, 1000, 3000);   // at most 4096 steps: not
    show(9, 2, false, 2000, 8192);   // 15 per SM: not
    show(9, 2, false, 1056, 16384);  // 8 per SM of more than 12288 steps: small stream blocks (H200)
    show(9, 2, false, 2000, 10000);  // 15 per SM of 8193-16384 steps: small stream blocks (H200)
    show(9, 2, false, 2000, 16392);  // 15 per SM of more than 16384 steps: not
    show(9, 4, true, 1000, 3000);    // small stream blocks (H200)
    show(9, 4, true, 1100, 3000);    // 8.3 per SM (walks): not
    show(9, 2, true, 1056, 8192);    // the default's stream block per row: small ones (H200)
    show(9, 2, true, 500, 10000);    // look-back tiles: kept
    show(9, 2, true, 1000, 1 << 18); // longer than 32768 steps: not
    show(9, 4, false, 1200, 12288);  // 9.1 per SM of 8193-16384 steps: not
    show(9, 4, false, 1000, 16392);  // longer than 16384 steps: not
    show(9, 2, false, 900, 16384);   // 6.8 per SM beyond 12288 steps (one wave of these blocks): small (H200)
    show(9, 2, false, 1100, 24576);  // 8.3 per SM beyond 12288 steps (a second wave): not
    show(9, 2, true, 900, 16384);    // whole small stream tiles, look-back tiles by default: small (H200)
    show(9, 2, true, 2000, 8192);    // 15 per SM of whole tiles: small (H200)
    show(9, 2, true, 900, 4096);     // not beyond 4096 steps: not
  }
  // a tuned choice (tile.e16t128) yields to them where they apply (1000 rows), not elsewhere; a plain
  // preference runs as named
  for (long long rows : {1000, 1100, -1000}) {
    const bool tuned = rows > 0;
    if (rows < 0) rows = -rows;
    ScanParams p{};
    p.len = 3000; p.num_seq = rows; p.nbatch = 1; p.bsize[0] = rows; p.backward = true;
    alignas(16) static float buf[4];
    for (int s = 0; s < kNumSlots; ++s) { p.lstride[s] = 1; p.bstride[s][0] = 3000; }
    for (int s : {kIn, kCoeff, kOut, kGradIn, kGradCoeff}) p.ptr[s] = buf;
    bool inapplicable;
    const ScanPlan plan =
        plan_scan(p, 4, DeviceInfo{132, 9, 232448, 37.f}, ConfigRequest{ScanKind::kTile, 3, true, tuned}, &inapplicable);
    std::printf("9 4 1 %lld 3000 %s\n", rows, config_name(plan.kind, 4, plan.config));
  }
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_small_stream_rows_default(tmp_path):
    """Aligned rows of mid length take the small stream config (128 threads, two stages, 8 blocks per
    SM) on the H200 only: the 4-byte forward at 2-24 rows per SM (2-8 of 8193-16384 steps), the 2-byte
    forward at 2-9 (8 beyond 12288 steps) and, of 8193-16384 steps, from 9 on; the 4-byte backward at
    2-8, the 2-byte backward at 2-16 where the default takes a stream block per row or the rows are
    whole small tiles beyond 4096 steps (bf16 500 x 10000 forward 0.61 -> 0.80 of torch.add, float32
    1000 x 3000 backward 0.57 -> 0.89, bf16 900 x 16384 backward 0.69 -> 0.80; plan.h's
    small_stream_rows); outside those ranges, and on the H100, the plans stay.
    A tuned choice yields to them (the caches predate them); a config preferred by name does not."""
    got = [" ".join(line.split()[5:]) for line in _run_program(tmp_path, "small_stream", _SMALL_STREAM_PROGRAM)]
    h200, h100, tuned = got[:24], got[24:48], got[48:]
    assert tuned == ["stream.e8t128s2", "tile.e16t128", "tile.e16t128"]
    small = [i for i, name in enumerate(h200) if name.startswith(("stream.e8t128s2", "stream.e16t128s2"))]
    assert small == [0, 3, 6, 9, 10, 12, 14, 19, 21, 22]
    assert [h200[i] for i in small] == ["stream.e8t128s2 5 5", "stream.e8t128s2 9 9", "stream.e16t128s2 5 5",
                                        "stream.e16t128s2 8 8", "stream.e16t128s2 5 5", "stream.e8t128s2 3 3", "stream.e16t128s2 4 4",
                                        "stream.e16t128s2 8 8", "stream.e16t128s2 8 8", "stream.e16t128s2 4 4"]
    assert not any("t128s2" in name for name in h100)
    assert h200[5] == "tile.e16t256 1 1" and h200[15] == "tile.e16t64 10 1"
    assert h100[21] == "tile.e16t64 16 1" and h200[23] == h100[23]

_WHOLE_ROW_TILE_PROGRAM = _SHOW + r"""
int main() {
  for (int elem : {4, 2})
    for (bool bwd : {false, true})
      for (long long rows : {528ll, 3168ll, 8448ll, 8449ll, 131072ll})
        for (long long len : {2048ll, 4096ll, 3000ll, 1024ll}) show(9, elem, bwd, rows, len);
  show(8, 4, false, 3168, 2048);
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_whole_row_tile_default(tmp_path):
    """Rows of exactly 2048 or 4096 steps, 4 to 64 per SM, take one tile per row on Hopper (plan.h's
    whole_row_tile; H200 float32 2048 steps, 24 rows per SM: 0.80 -> 0.92 of torch.add forward); not
    the float32 backward of 4096 steps, rows a tile holds with room to spare, more rows, nor Ampere."""
    got = [line.split() for line in _run_program(tmp_path, "whole_row", _WHOLE_ROW_TILE_PROGRAM)]
    whole = {(4, 2048): "tile.e16t128", (4, 4096): "tile.e16t256", (2, 2048): "tile.e32t64", (2, 4096): "tile.e32t128"}
    for cc, elem, bwd, rows, length, config, chunks, per_chunk in got[:-1]:
        key, rows = (int(elem), int(length)), int(rows)
        if key in whole and 4 * 132 <= rows <= 64 * 132 and not (bwd == "1" and key == (4, 4096)):
            assert (config, chunks, per_chunk) == (whole[key], "1", "1"), (elem, bwd, rows, length)
        elif key in whole and rows > 64 * 132:  # many rows: the 512-step tiles, walked
            assert int(per_chunk) > 1, (elem, bwd, rows, length, config)
    # Ampere walks them
    assert int(got[-1][7]) > 1, got[-1]
