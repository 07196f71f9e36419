// Template instantiation of the selective-scan kernels for one dtype (included by one .cu each).
#pragma once
#include <numeric>

#include "launch.h"
#include "selective_bwd.cuh"
#include "selective_fwd.cuh"

namespace linrec {
namespace selective {

// kBackward: the backward kernel; else the forward kernel, its checkpoint-only form when p.out is null.
template <typename T, int SPT, int TPC, bool kBackward, bool kOut = true>
cudaError_t run(const SelectiveParams& p, const SelectiveLaunch& launch, cudaStream_t stream) {
  constexpr int CPB = kThreads / TPC;
  // Blocks stay inside one segment of channels sharing their B and C groups.
  const int64_t groups = std::lcm(p.groups_b, p.groups_c);
  const Groups grp{p.groups_b, p.groups_c, p.dim / groups};
  const int64_t blocks = p.batch * groups * ((grp.segment + CPB - 1) / CPB);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  if (blocks == 0) return cudaSuccess;
  // Raises the kernel's dynamic shared memory limit where it needs more than 48 KB, then launches it.
  auto go = [&](auto kernel, int smem, auto... args) {
    if (smem > 48 * 1024) {
      const cudaError_t err = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (err != cudaSuccess) return err;
    }
    kernel<<<blocks, kThreads, smem, stream>>>(p, grp, args...);
    return cudaGetLastError();
  };
  if constexpr (kBackward) {
    constexpr int smem = backward_smem<T, SPT, TPC>();
    return p.z.p ? go(&backward_kernel<T, SPT, TPC, true>, smem, launch.loads)
                 : go(&backward_kernel<T, SPT, TPC, false>, smem, launch.loads);
  } else {
    return go(&forward_kernel<T, SPT, TPC, kOut>, forward_smem<T, SPT, TPC>(), launch.vector_stores, launch.loads);
  }
}

template <typename T>
cudaError_t dispatch(const SelectiveParams& p, const SelectiveLaunch& launch, bool backward, cudaStream_t stream) {
  const int spt = launch.states_per_thread;
  const int64_t tpc = p.nstate_pad / spt;
#define LINREC_SELECTIVE_CASE(SPT, TPC) \
  if (spt == SPT && tpc == TPC) return run<T, SPT, TPC, false>(p, launch, stream);
#define LINREC_SELECTIVE_CKPT_CASE(SPT, TPC) \
  if (spt == SPT && tpc == TPC) return run<T, SPT, TPC, false, false>(p, launch, stream);
#define LINREC_SELECTIVE_BWD_CASE(SPT, TPC) \
  if (spt == SPT && tpc == TPC) return run<T, SPT, TPC, true>(p, launch, stream);
  if (backward) {
    LINREC_SELECTIVE_BWD_CASE(4, 4)
    LINREC_SELECTIVE_BWD_CASE(4, 8)
    LINREC_SELECTIVE_BWD_CASE(4, 16)
    LINREC_SELECTIVE_BWD_CASE(4, 32)
    LINREC_SELECTIVE_BWD_CASE(8, 32)
  } else if (p.out.p == nullptr) {  // the checkpoint pass: the default shapes only
    LINREC_SELECTIVE_CKPT_CASE(4, 4)
    LINREC_SELECTIVE_CKPT_CASE(4, 8)
    LINREC_SELECTIVE_CKPT_CASE(4, 16)
    LINREC_SELECTIVE_CKPT_CASE(8, 16)
    LINREC_SELECTIVE_CKPT_CASE(16, 16)
  } else {
    LINREC_SELECTIVE_CASE(16, 1)
    LINREC_SELECTIVE_CASE(16, 2)
    LINREC_SELECTIVE_CASE(16, 4)
    LINREC_SELECTIVE_CASE(16, 8)
    LINREC_SELECTIVE_CASE(16, 16)
    LINREC_SELECTIVE_CASE(8, 2)
    LINREC_SELECTIVE_CASE(8, 4)
    LINREC_SELECTIVE_CASE(8, 8)
    LINREC_SELECTIVE_CASE(8, 16)
    LINREC_SELECTIVE_CASE(4, 4)
    LINREC_SELECTIVE_CASE(4, 8)
    LINREC_SELECTIVE_CASE(4, 16)
    LINREC_SELECTIVE_CASE(4, 32)
  }
#undef LINREC_SELECTIVE_CASE
#undef LINREC_SELECTIVE_CKPT_CASE
#undef LINREC_SELECTIVE_BWD_CASE
  return cudaErrorInvalidConfiguration;
}

}  // namespace selective
}  // namespace linrec
