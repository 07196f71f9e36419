// Default configs on any other CUDA GPU: correct everywhere, not tuned for one.
#pragma once
#include "configs_sm90.h"

namespace linrec {

inline ScanDefaults defaults_generic(int elem_size, bool backward, int group_width) {
  // Tiles and channel groups as on Hopper (no other GPU measured).
  ScanDefaults d = defaults_sm90(elem_size, backward, group_width, 0.f);
  d.stream = d.stream_short = -1;  // bulk copies (cp.async.bulk) need compute capability 9.0
  d.stream_short_tiles = 0;
  d.ring = -1;
  return d;
}

}  // namespace linrec
