// Definition of launch_scan: picks the compiled template the plan names.
#pragma once
#include "scan_channel.cuh"
#include "scan_launch.h"
#include "scan_stream.cuh"
#include "scan_tile.cuh"

namespace linrec {

template <ScanDType D> struct StorageType;
template <> struct StorageType<ScanDType::kFloat32> { using type = float; };
template <> struct StorageType<ScanDType::kFloat16> { using type = __half; };
template <> struct StorageType<ScanDType::kBFloat16> { using type = __nv_bfloat16; };

inline LookbackState lookback_state(const ScanPlan& plan, void* workspace) {
  LookbackState lb{};
  if (plan.workspace_bytes == 0) return lb;
  char* base = static_cast<char*>(workspace);
  lb.counter = reinterpret_cast<unsigned long long*>(base);
  lb.status = reinterpret_cast<unsigned long long*>(base + 16);
  return lb;
}

template <typename T, bool kBackward, int I = 0>
cudaError_t launch_tile(const ScanParams& p, const ScanPlan& plan, const TileArgs& args, cudaStream_t stream) {
  if constexpr (I < kNumTileConfigs) {
    constexpr TileConfig cfg = tile_config(sizeof(T), I);
    if (plan.config != I) return launch_tile<T, kBackward, I + 1>(p, plan, args, stream);
    scan_tile_kernel<T, cfg.elems, cfg.threads, kBackward><<<plan.grid, cfg.threads, 0, stream>>>(p, args);
    return cudaGetLastError();
  } else {
    return cudaErrorInvalidConfiguration;
  }
}

template <typename T, bool kBackward, int I = 0>
cudaError_t launch_channel(const ScanParams& p, const ScanPlan& plan, const ChannelArgs& args, cudaStream_t stream) {
  if constexpr (I < kNumChannelConfigs) {
    constexpr ChannelConfig cfg = kChannelConfigs[I];
    if (plan.config != I) return launch_channel<T, kBackward, I + 1>(p, plan, args, stream);
    scan_channel_kernel<T, cfg.steps, cfg.rows, cfg.min_blocks, cfg.cpl, kBackward>
        <<<plan.grid, cfg.threads(), 0, stream>>>(p, args);
    return cudaGetLastError();
  } else {
    return cudaErrorInvalidConfiguration;
  }
}

template <typename T, bool kBackward, int I = 0>
cudaError_t launch_stream(const ScanParams& p, const ScanPlan& plan, const StreamArgs& args, cudaStream_t stream) {
  if constexpr (I < kNumStreamConfigs) {
    constexpr StreamConfig cfg = stream_config(sizeof(T), I);
    if (plan.config != I) return launch_stream<T, kBackward, I + 1>(p, plan, args, stream);
    constexpr auto kernel = scan_stream_kernel<T, cfg.elems, cfg.threads, cfg.stages(kBackward), kBackward>;
    constexpr size_t smem = cfg.smem_bytes(sizeof(T), kBackward);
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return err;
    kernel<<<plan.grid, cfg.threads, smem, stream>>>(p, args);
    return cudaGetLastError();
  } else {
    return cudaErrorInvalidConfiguration;
  }
}

template <ScanDType kDType, bool kBackward>
cudaError_t launch_scan(const ScanParams& p, const ScanPlan& plan, void* workspace, cudaStream_t stream) {
  using T = typename StorageType<kDType>::type;
  if (plan.grid == 0) return cudaSuccess;
  if (plan.zeroed_bytes > 0) {
    const cudaError_t err = cudaMemsetAsync(workspace, 0, plan.zeroed_bytes, stream);
    if (err != cudaSuccess) return err;
  }
  const LookbackState lb = lookback_state(plan, workspace);
  switch (plan.kind) {
    case ScanKind::kTile:
      return launch_tile<T, kBackward>(p, plan, TileArgs{plan.num_chunks, plan.per_chunk, plan.vec_mask, lb}, stream);
    case ScanKind::kStream:
      return launch_stream<T, kBackward>(p, plan, StreamArgs{plan.num_chunks, plan.vec_mask, lb}, stream);
    case ScanKind::kChannel:
      return launch_channel<T, kBackward>(
          p, plan,
          ChannelArgs{plan.num_chunks, plan.per_chunk, ceil_div(p.num_seq, kChannelConfigs[plan.config].channels()), lb},
          stream);
  }
  return cudaErrorInvalidConfiguration;
}

}  // namespace linrec
