// Default configs on any other CUDA GPU: correct everywhere, not tuned for one.
#pragma once
#include "configs_sm90.h"

namespace linrec {

inline ScanDefaults defaults_generic(int elem_size, bool backward, int group_width) {
  ScanDefaults d{};
  d.tile_lookback = 2;  // the largest tile: fewest look-back hops
  d.stream = -1;        // bulk copies (cp.async.bulk) need compute capability 9.0
  // Channel groups as on Hopper (no other GPU measured).
  const ScanDefaults hopper = defaults_sm90(elem_size, backward, group_width);
  d.channel = hopper.channel;
  d.channel_pipe = hopper.channel_pipe;
  return d;
}

}  // namespace linrec
