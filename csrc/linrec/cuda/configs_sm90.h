// Default configs on Hopper (compute capability 9.x): one line of reason per choice, measurements
// in bench/NOTES.md. The tuned config cache (torch_linrec/configs) overrides these per problem.
#pragma once
#include "configs.h"

namespace linrec {

struct ScanDefaults {
  int tile_walk;      // tile config of blocks that walk rows of more than 256 steps, when they are many
  int tile_lookback;  // tile config when a sequence spans blocks chained by look-back
  int stream;         // stream config, or -1: no stream kernel
  int stream_short;   // stream config for rows of few `stream` tiles, two or more per SM (stream_default)
  int stream_short_tiles;  // rows of at most this many `stream` tiles take `stream_short`
  int ring;           // ring config for fewer sequences than the stream kernel takes, or -1
  int64_t ring_over_stream_len;  // rows at least this long take the ring where stream blocks would fill the SMs (0: none)
  int channel;        // channel config
  int channel_wide;   // channel config instead where 32 or more of its blocks span the channels, or -1
  int channel_mid;    // channel config instead where 2 to 31 of channel_wide's blocks would, or -1
  int channel_pipe[4];  // channel configs whose blocks walk L (enough channel blocks): the first that may, or -1
};

// Peak DRAM bandwidth per SM above which a Hopper device's kernels need more bytes in flight per SM
// than the H100 SXM's (25.4 GB/s per SM) plans keep: the H200 has 37.
constexpr float kFastDramGbpsPerSm = 30.f;

// dram_gbps_per_sm: the device's peak DRAM bandwidth per SM (0: unknown).
inline ScanDefaults defaults_sm90(int elem_size, bool backward, int group_width, float dram_gbps_per_sm) {
  ScanDefaults d{};
  // Many rows (at least 8 per SM) walked tile by tile take 512-step tiles, one warp (2-byte) or two
  // (4-byte), whatever the rows' length: more, smaller blocks keep more loads in flight than one tile
  // holding the row (bench/NOTES.md item 48; H200 backward, of a vector add: bf16 65536 x 2048 0.34
  // -> 0.83, float32 131072 x 1024 0.86 -> 0.97).
  d.tile_walk = kTileWalk;
  static_assert(kTileConfigs4B[kTileWalk].tile() == 512 && kTileConfigs2B[kTileWalk].tile() == 512, "the walking tile");
  // The tuner's choices for the look-back buckets (16 x 2^22, 4 x 2^24) on the H100 and the H200:
  // 4-byte forward 2048-step tiles of 128 threads (H100 16 x 2^22: 0.65 of torch.add vs 0.56 with
  // 1024-step tiles), backward 1024-step tiles of 128 threads; 2-byte 4096-step tiles of 128
  // threads both ways (bf16 forward 0.53, backward 0.56).
  d.tile_lookback = elem_size == 2 ? 2 : backward ? 1 : 3;
  // 512 threads: twice the warps hide the per-tile latency (the configs are even since the
  // per-tile overheads went; 4 stayed).
  d.stream = 4;
  // Rows of at most two of those tiles (four for 4-byte types), two or more per SM: 256 threads in
  // 4 stages, two blocks per SM, so that a second row's loads overlap one's fill and drain (bf16
  // 1100 x 12288 forward 0.57 -> 0.91 of torch.add on the H100, 0.45 -> 0.77 on the H200); longer
  // rows keep 512 threads (bf16 600 x 65536: 0.93 against 0.85; bench/NOTES.md item 72). 4-byte
  // rows of three or four tiles gain too on the H200 (float32 2000 x 16384 0.86 -> 0.94; H100 0.97
  // either way); 2-byte ones lose in the backward (H100 bf16 1000 x 32768 0.91 -> 0.86) and gain in
  // the forward on the H200 (bf16 1000 x 20000 0.54 -> 0.77, 3000 x 24576 0.71 -> 0.94; item 83).
  d.stream_short = 3;
  d.stream_short_tiles = elem_size == 4 || (!backward && dram_gbps_per_sm > kFastDramGbpsPerSm) ? 4 : 2;
  static_assert(kStreamConfigs4B[3].threads == 256 && kStreamConfigs2B[3].threads == 256 &&
                    kStreamConfigs4B[3].stages_forward == 4 && kStreamConfigs2B[3].stages_forward == 4,
                "the short rows' stream config");
  // 16 KB tiles in a six-slot ring over 512 consumer threads: twice the warps of 256 replay the
  // tiles (16 x 2^22 float32 forward / backward 0.93 / 0.95 of a vector add vs 0.84 / 0.82; the
  // tile kernel's look-back 0.69 / 0.71).
  d.ring = 0;
  // The ring where DRAM gives each SM at most 30 GB/s (H100 SXM: 25), however many sequences of at
  // least 2^18 steps: there it beat one stream block per row at 100-1000 rows of 2^18-2^20 steps,
  // float32 forward / backward by up to 12% / 7%, 2-byte forward by up to 7%, most where rows leave
  // part of a wave idle (100 x 2^20: 0.45 vs 0.51 ms; bench/NOTES.md items 56, 58). Shorter rows
  // keep the stream kernel: the ring's fill and drain cost more than a wave's tail (100 x 2^15
  // 0.030 vs 0.019 ms, 128 x 2^16 0.051 vs 0.043, 1024 x 2^16 0.29 vs 0.28). Not the 2-byte
  // backward (128 x 2^20: 0.55 vs 0.50 ms), nor where each SM gets more (H200: 37) than the ring
  // moves per SM (~23, item 41).
  const bool ring_dram = dram_gbps_per_sm > 0.f && dram_gbps_per_sm <= kFastDramGbpsPerSm;
  d.ring_over_stream_len = ring_dram && !(elem_size == 2 && backward) ? int64_t(1) << 18 : 0;
  // Channel groups by what measured fastest (bench/NOTES.md item 23): 16 steps of pairs for the
  // 4-byte forward (mamba-BLD 0.96 of torch.add vs 0.94 with 4 channels), 16 steps of 4 channels
  // for the 2-byte forward (bf16 mamba-BLD 0.84 vs 0.73 with 8, 0.59 with pairs); pairs for the
  // 4-byte backward (4-channel groups are faster but need 32-step spans: 4x the look-back
  // status), 8 steps of 4 channels for the 2-byte backward (fwd+bwd 0.83 vs 0.67 with pairs).
  if (!backward)
    d.channel = elem_size == 4 ? (group_width >= 2 ? 5 : 0) : (group_width >= 4 ? 5 : 0);
  else
    d.channel = elem_size == 2 && group_width >= 4 ? 6 : group_width >= 2 ? 4 : 0;
  // The float32 backward by look-back, 4 channels per lane (128 per block) where they span 2 or more
  // blocks (H100, of a vector add, against pairs; bench/NOTES.md item 77): from 32 blocks 4 steps
  // over 8 warps, 3 blocks per SM (8 x 8192 x 1024 0.79 against 0.62, 4 x 2048 x 1000 0.72 / 0.59;
  // 16 steps over 4 warps: 0.72, 0.67), below 16 steps over 4 warps, 2 blocks per SM (2 x 4096 x 768
  // 0.71 / 0.64, 1 x 16384 x 512 0.67 / 0.62, 1 x 32768 x 256 0.64 / 0.60; 4 steps: 0.69, 0.65,
  // 0.59). Their 32- and 64-step spans take 4x and 2x the look-back status of the pairs' 128 (0.5
  // and 0.25 bytes per element).
  d.channel_wide = backward && elem_size == 4 && group_width >= 4 ? 7 : -1;
  d.channel_mid = backward && elem_size == 4 && group_width >= 4 ? 8 : -1;
  static_assert(kChannelConfigs4B[7].cpl == 4 && kChannelConfigs4B[7].channels() == 128 &&
                    kChannelConfigs4B[8].cpl == 4 && kChannelConfigs4B[8].channels() == 128,
                "the 4-channel backward configs");
  // Prefetching blocks that walk L need no look-back: bf16 mamba-BLD forward 0.94 vs 0.87, float32
  // 0.97 vs 0.96 (8 steps of 4 channels / pairs, the next span's loads issued before the scan).
  // Backward (H200, of a vector add): bf16 8 x 4096 x 4096 0.94 with 4 steps of 4 channels over two
  // blocks per SM vs 0.68 by look-back; fewer channel blocks (bf16 32 x 512 x 768, 192 of them)
  // fill one block per SM of 8 steps, 0.78 vs 0.72; float32 4 steps of 4 channels, 0.96 vs 0.58
  // (32 x 512 x 768: 0.84 vs 0.60).
  // Where too few of their blocks span the channels, the same configs with 8 lanes per step (a
  // quarter of the channels per block) walk L instead of chaining spans by look-back; the 2-byte
  // backward's of one block per SM before those of two (plan.h channel_lanes_default).
  for (int& c : d.channel_pipe) c = -1;
  if (!backward) {
    if (group_width >= (elem_size == 2 ? 4 : 2)) d.channel_pipe[0] = 9, d.channel_pipe[1] = 11;
  } else if (group_width >= 4) {
    if (elem_size == 2)
      d.channel_pipe[0] = 10, d.channel_pipe[1] = 9, d.channel_pipe[2] = 11, d.channel_pipe[3] = 12;
    else
      d.channel_pipe[0] = 10, d.channel_pipe[1] = 12;
  }
  static_assert(kChannelConfigs4B[9].prefetch && kChannelConfigs4B[10].prefetch && kChannelConfigs2B[9].prefetch &&
                    kChannelConfigs2B[10].prefetch && kChannelConfigs4B[10].cpl == 4 && kChannelConfigs2B[10].cpl == 4 &&
                    kChannelConfigs2B[9].cpl == 4,
                "the prefetching channel configs");
  static_assert(kChannelConfigs4B[11].lanes == 8 && kChannelConfigs4B[11].cpl == kChannelConfigs4B[9].cpl &&
                    kChannelConfigs4B[12].lanes == 8 && kChannelConfigs4B[12].cpl == 4 &&
                    kChannelConfigs2B[11].lanes == 8 && kChannelConfigs2B[11].cpl == 4 &&
                    kChannelConfigs2B[12].lanes == 8 && kChannelConfigs2B[12].cpl == 4,
                "the 8-lane prefetching channel configs: 9 and 10 with 8 lanes per step");
  return d;
}

}  // namespace linrec
