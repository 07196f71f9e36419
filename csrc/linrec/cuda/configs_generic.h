// Default configs on any other CUDA GPU: correct everywhere, not tuned for one.
#pragma once
#include "configs_sm90.h"

namespace linrec {

inline ScanDefaults defaults_generic(int elem_size, bool backward, bool channel_pairs) {
  (void)elem_size;
  ScanDefaults d{};
  d.tile_lookback = 2;  // the largest tile: fewest look-back hops
  d.stream = -1;        // bulk copies (cp.async.bulk) need compute capability 9.0
  // Pairs where they halve the accesses of the five backward streams; one channel per lane for
  // the forward (no device measured faster with pairs there but the H100).
  d.channel = channel_pairs && backward ? 4 : 0;
  return d;
}

}  // namespace linrec
