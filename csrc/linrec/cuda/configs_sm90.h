// Default configs on Hopper (compute capability 9.x): one line of reason per choice, measurements
// in bench/NOTES.md. The tuned config cache (torch_linrec/configs) overrides these per problem.
#pragma once
#include "configs.h"

namespace linrec {

struct ScanDefaults {
  int tile_lookback;  // tile config when a sequence spans blocks chained by look-back
  int stream;         // stream config, or -1: no stream kernel
  int channel;        // channel config
};

inline ScanDefaults defaults_sm90(int elem_size, bool backward, bool channel_pairs) {
  ScanDefaults d{};
  // 4096-step tiles of 256 threads: few-long 0.63 of torch.add vs 0.57 for 128 threads (H200).
  d.tile_lookback = 2;
  // 512 threads: twice the warps hide the per-tile latency (the configs are even since the
  // per-tile overheads went; 4 stayed).
  d.stream = 4;
  // Pairs for the backward (five streams) and the 4-byte forward (H100 mamba-BLD 0.97 vs 0.92);
  // the 2-byte forward keeps one channel per lane (0.44 vs 0.36 with pairs).
  d.channel = channel_pairs && (backward || elem_size == 4) ? 4 : 0;
  return d;
}

}  // namespace linrec
