// Recycled host memory for the CPU kernels' outputs (host_pool.cpp says why).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace linrec {

// An uninitialised tensor like at::empty_like(like) (its sizes, dtype, device and strides). On
// the CPU its storage comes from the host pool: a block freed by an earlier output of about its
// size when one is idle, else a new one, which returns to the pool when the tensor's storage is
// freed. Other devices: at::empty_like.
at::Tensor empty_like_pooled(const at::Tensor& like);

struct HostPoolStats {
  int64_t hits;         // allocations served by an idle block
  int64_t misses;       // allocations of a new block (of a size the pool keeps)
  int64_t idle_bytes;   // bytes of the idle blocks the pool holds now
  int64_t limit_bytes;  // the most idle bytes it holds; blocks of more than half of it are not kept
};

HostPoolStats host_pool_stats();
// Sets the limit of idle bytes (0: keep none), releasing idle blocks beyond it; resets the counts.
void set_host_pool_limit(int64_t bytes);

}  // namespace linrec
