"""The CUDA planner's default choices, checked on the host: csrc/linrec/cuda/plan.h is torch-free,
so a small C++ program compiled with the system compiler runs it with an H100's device properties
(no GPU needed)."""
import shutil
import subprocess

import pytest

from test_nvcc import ROOT

CXX = shutil.which("c++") or shutil.which("g++")

_PROGRAM = r"""
#include <cstdio>
#include "linrec/cuda/plan.h"
using namespace linrec;
// Prints the default plan of `rows` sequences of length `len` (innermost, contiguous, aligned) on
// a device of compute capability `cc` (an H100's SMs and shared memory).
static void show(int cc, int elem_size, bool backward, long long rows, long long len) {
  ScanParams p{};
  p.len = len; p.num_seq = rows; p.nbatch = 1; p.bsize[0] = rows; p.backward = backward;
  alignas(16) static float buf[4];
  for (int s = 0; s < kNumSlots; ++s) { p.lstride[s] = 1; p.bstride[s][0] = len; }
  for (int s : {kIn, kCoeff, kOut, kGradIn, kGradCoeff}) p.ptr[s] = buf;
  const DeviceInfo dev{132, cc, 232448};
  bool inapplicable;
  const ScanPlan plan = plan_scan(p, elem_size, dev, ConfigRequest{}, &inapplicable);
  std::printf("%d %d %d %lld %lld %s %lld\n", cc, elem_size, backward ? 1 : 0, rows, len,
              config_name(plan.kind, elem_size, plan.config), static_cast<long long>(plan.num_chunks));
}
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
    src = tmp_path / "plan.cpp"
    src.write_text(_PROGRAM)
    exe = tmp_path / "plan"
    subprocess.run([CXX, "-std=c++17", "-I", str(ROOT / "csrc"), str(src), "-o", str(exe)], check=True)
    rows = [line.split() for line in subprocess.run([str(exe)], check=True, capture_output=True,
                                                       text=True).stdout.splitlines()]
    expect = {("9", "4", "0"): "ring.e8t512s6", ("9", "4", "1"): "ring.e8t512s6", ("9", "2", "0"): "ring.e16t512s6",
              ("9", "2", "1"): "ring.e16t512s6", ("8", "4", "0"): "tile.e16t128", ("8", "4", "1"): "tile.e8t128",
              ("8", "2", "0"): "tile.e32t128", ("8", "2", "1"): "tile.e32t128"}
    assert len(rows) == 16
    for cc, elem, bwd, n, length, name, chunks in rows:
        assert name == expect[cc, elem, bwd], (cc, elem, bwd, n, length)
        if cc == "9":  # one status entry per ring tile: 4096 float32 or 8192 16-bit steps
            assert int(chunks) == int(length) // (4096 if elem == "4" else 8192)
        assert int(chunks) > 1, "a look-back plan"
