"""The CUDA planner's channel-kernel defaults ((B, L, D) scanned along L), checked on the host as in
test_plan_host (plan.h is torch-free); and the shipped tuned caches' channel entries against them."""
import json
import re
from pathlib import Path

import pytest

from test_plan_host import _SHOW, CXX, _run_program

# (B, L, D) contiguous, scanned along L (the channel kernel's layout), 128-byte aligned rows where D
# allows: bld_plan(dev, ...) is the default plan on device `dev`.
_BLD = _SHOW + r"""
static ScanPlan bld_plan(const DeviceInfo& dev, int elem_size, bool backward, long long B, long long L, long long D) {
  ScanParams p{};
  p.len = L; p.num_seq = B * D; p.nbatch = 2; p.bsize[0] = D; p.bsize[1] = B; p.backward = backward;
  alignas(128) static float buf[32];
  for (int s = 0; s < kNumSlots; ++s) { p.lstride[s] = D; p.bstride[s][0] = 1; p.bstride[s][1] = L * D; }
  for (int s : {kIn, kCoeff, kOut, kGradIn, kGradCoeff}) p.ptr[s] = buf;
  bool inapplicable;
  return plan_scan(p, elem_size, dev, ConfigRequest{}, &inapplicable);
}
"""

_CHANNEL_PROGRAM = _BLD + r"""
// On an H100.
static void show_bld(int elem_size, bool backward, long long B, long long L, long long D) {
  const ScanPlan plan = bld_plan(DeviceInfo{132, 9, 232448}, elem_size, backward, B, L, D);
  std::printf("%s %lld %lld\n", config_name(plan.kind, elem_size, plan.config),
              static_cast<long long>(plan.num_chunks), static_cast<long long>(plan.per_chunk));
}
int main() {
  for (int elem : {4, 2})
    for (bool bwd : {false, true}) {
      show_bld(elem, bwd, 8, 4096, 4096);  // mamba-BLD: channel blocks for a wave and more
      show_bld(elem, bwd, 32, 512, 768);   // 192 blocks of 128 channels, 768 of 32 (8 lanes)
      show_bld(elem, bwd, 4, 4096, 2048);  // 64: look-back, or 256 of 32 channels (8 lanes)
      show_bld(elem, bwd, 1, 8192, 256);   // 2: chained by look-back
      show_bld(elem, bwd, 1, 8192, 128);   // 1
    }
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_channel_pipe_defaults(tmp_path):
    """Channel blocks walk L with prefetching configs where they fill 3/4 of a wave, forward and
    backward (backward: 4 steps of 4 channels, two blocks per SM for a 2-byte type and one for
    float32; else for a 2-byte type 8 steps over one block per SM), then the same configs with 8 lanes
    per step where channel_lanes_default takes them (see test_channel_lanes_defaults); fewer channel
    blocks take the default config chained by look-back: the float32 backward over 32 or more blocks
    of 128 channels takes 4 steps of 4 channels (configs_sm90.h's channel_wide), over 2-31 blocks 16
    steps of 4 channels (1 x 8192 x 256), over one, pairs (1 x 8192 x 128)."""
    got = _run_program(tmp_path, "channel", _CHANNEL_PROGRAM)
    assert got == [
        # float32 forward: pairs, 8 steps over 16 warps, prefetching, where they fill 3/4 of a wave
        "channel.s8r16b1p2.pipe 1 32", "channel.s8r16b1p2.pipe 1 4", "channel.s8r16b1p2.pipe 1 32",
        "channel.s16r8b2p2 64 1", "channel.s16r8b2p2 64 1",
        # float32 backward: groups of 4 channels, 128 per block; 64 blocks look back over 32-step
        # spans of 4 channels, 2 blocks over 64-step spans of 4 channels, 1 over 128-step spans of pairs
        # (4 x 4096 x 2048: 256 blocks of 32 channels walk L, 8 lanes)
        "channel.s4r8b2c4.pipe 1 128", "channel.s4r8b2c4.pipe 1 16", "channel.s4r8b2c4l8.pipe 1 32",
        "channel.s16r4b2c4 128 1", "channel.s8r16b1p2 64 1",
        # 2-byte forward: 768 blocks of 32 channels (8 lanes) walk L at 2.9 waves; 256 at one wave
        "channel.s8r8b2c4.pipe 1 64", "channel.s8r8b2c4l8.pipe 1 2", "channel.s8r8b2c4l8.pipe 1 16",
        "channel.s16r8b2c4 64 1", "channel.s16r8b2c4 64 1",
        # 2-byte backward: 198 blocks or more two per SM, 99 to 132 one per SM; else 8 lanes: one per SM
        # on rows of 8 spans or more (4 x 4096 x 2048), two per SM on shorter ones (32 x 512 x 768:
        # 192 blocks of 128 channels would take 1.45 waves)
        "channel.s4r8b3c4.pipe 1 128", "channel.s4r8b3c4l8.pipe 1 4", "channel.s8r8b2c4l8.pipe 1 16",
        "channel.s8r8b2c4 128 1",
        "channel.s8r8b2c4 128 1",
    ]


_LANES_PROGRAM = _BLD + r"""
static void show_bld(int elem_size, bool backward, long long B, long long L, long long D) {
  const ScanPlan plan = bld_plan(DeviceInfo{132, 9, 232448, 36.4f}, elem_size, backward, B, L, D);  // an H200
  std::printf("%s\n", config_name(plan.kind, elem_size, plan.config));
}
int main() {
  show_bld(4, true, 4, 2048, 1536);   // float32 backward, 192 blocks of 32 channels: 1.45 waves
  show_bld(4, false, 4, 2048, 1536);  // its forward: 384 blocks of 16 at 2.9 waves, look-back
  show_bld(4, false, 2, 16384, 1024); // 128 blocks of 16: one wave
  show_bld(2, false, 4, 4096, 2048);  // 2-byte forward, 256 blocks of 32 (two per SM): one wave
  show_bld(2, false, 12, 6144, 1024); // 384: 1.45 waves, look-back
  show_bld(2, false, 8, 4096, 2048);  // 512: 1.94 waves
  show_bld(2, false, 16, 2048, 1000); // 500, rows of 2000 bytes: look-back
  show_bld(2, true, 4, 4096, 2048);   // 2-byte backward, 256 blocks of 32 over 16 spans
  show_bld(2, true, 12, 6144, 1024);  // 384 over 24 spans
  show_bld(2, true, 8, 2048, 2560);   // 160 blocks of 128 channels: 1.21 waves; 640 of 32 over 8 spans
  show_bld(2, true, 24, 1024, 1024);  // 192 of 128: 1.45 waves; 768 of 32 over 8 spans of 128 steps
  show_bld(2, true, 16, 2048, 1024);  // 128 of 128: one wave
  show_bld(2, true, 24, 2048, 1000);  // 192 of 128 at 1.45 waves, rows of 2000 bytes: kept
  show_bld(2, true, 2, 4096, 1536);   // 96 of 32 channels over 16 spans: look-back
  show_bld(2, true, 48, 1024, 1024);  // 384 of 128: 1.45 waves of two per SM, 2.9 of one per SM
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_channel_lanes_defaults(tmp_path):
    """The 8-lane channel configs (a quarter of the channels per block) walk L by default where the
    32-lane blocks would chain spans by look-back: the float32 backward from 3/4 of a wave of blocks;
    the forwards where the blocks fit one wave, and the 2-byte forward from 7/4 waves; the 2-byte
    backward's one-per-SM config on rows of 8 spans or more, its two-per-SM config on shorter rows, and
    in place of 32-lane blocks whose last wave is less than 3/4 full (which yield to the 32-lane
    config of one block per SM where its waves are full: 48 x 1024 x 1024); 2-byte types on 128-byte
    aligned rows only (plan.h channel_lanes_default)."""
    got = _run_program(tmp_path, "lanes", _LANES_PROGRAM)
    assert got == [
        "channel.s4r8b2c4l8.pipe", "channel.s16r8b2p2", "channel.s8r16b1p2l8.pipe",
        "channel.s8r8b2c4l8.pipe", "channel.s16r8b2c4", "channel.s8r8b2c4l8.pipe", "channel.s16r8b2c4",
        "channel.s8r8b2c4l8.pipe", "channel.s8r8b2c4l8.pipe", "channel.s8r8b2c4l8.pipe",
        "channel.s4r8b3c4l8.pipe", "channel.s8r8b2c4.pipe", "channel.s8r8b2c4.pipe", "channel.s8r8b2c4",
        "channel.s8r8b2c4.pipe",
    ]


# Peak DRAM bandwidth per SM (GB/s) of the GPUs with a shipped cache, as the planner reads it.
_SHIPPED_DRAM = {"nvidia-h200": 36.4, "nvidia-h100-80gb-hbm3": 25.4}


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_shipped_channel_entries_are_not_the_default(tmp_path):
    """No channel-layout entry of a shipped tuned cache names the config the default plans on every
    problem it was tuned on: there such an entry changes nothing, and elsewhere in its bucket it pins
    the config where the default adapts (the H200's float32 4 x 4096 x 2048 forward ran such an entry
    at 0.82 of torch.add, the default at 0.95; bench/NOTES.md item 82). After a change of the planner's
    rules, set those entries to "native" (the cache's `edits` record it)."""
    root = Path(__file__).resolve().parents[1] / "torch_linrec" / "configs"
    jobs, lines = [], []
    for stem, dram in _SHIPPED_DRAM.items():
        data = json.loads((root / f"{stem}.json").read_text())
        sms = data["_metadata"]["device"]["sms"]
        for key, entry in data["entries"].items():
            _, direction, dtype, layout, _, _ = key.split("/")
            if layout != "strided" or not entry["config"].startswith("channel."):
                continue
            for problem in entry["problem"].split("+"):
                b, length, d = re.fullmatch(r"BLD-(\d+)x(\d+)x(\d+)", problem).groups()
                elem = 4 if dtype == "float32" else 2
                jobs.append((stem, key, entry["config"]))
                lines.append(f"show({sms}, {dram}f, {elem}, {str(direction == 'bwd').lower()}, {b}, {length}, {d});")
    program = _BLD + r"""
static void show(int sms, float dram, int elem_size, bool backward, long long B, long long L, long long D) {
  const ScanPlan plan = bld_plan(DeviceInfo{sms, 9, 232448, dram}, elem_size, backward, B, L, D);
  std::printf("%s\n", config_name(plan.kind, elem_size, plan.config));
}
int main() {
""" + "\n".join(lines) + "\n}\n"
    defaults = _run_program(tmp_path, "entries", program)
    assert len(defaults) == len(jobs)
    same: dict = {}
    for (stem, key, config), default in zip(jobs, defaults):
        same.setdefault((stem, key), []).append(default == config)
    assert [k for k, s in same.items() if all(s)] == []
