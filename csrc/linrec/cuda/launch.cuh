// Definition of launch_scan: picks the compiled template the plan names.
#pragma once
#include <type_traits>

#include "scan_channel.cuh"
#include "launch.h"
#include "scan_ring.cuh"
#include "scan_stream.cuh"
#include "scan_tile.cuh"

namespace linrec {

template <ScanDType D> struct StorageType;
template <> struct StorageType<ScanDType::kFloat32> { using type = float; };
template <> struct StorageType<ScanDType::kFloat16> { using type = __half; };
template <> struct StorageType<ScanDType::kBFloat16> { using type = __nv_bfloat16; };

inline LookbackState lookback_state(const ScanPlan& plan, const LookbackWorkspace& ws) {
  LookbackState lb{};
  if (plan.workspace_bytes == 0) return lb;
  char* base = static_cast<char*>(ws.base);
  lb.counter = reinterpret_cast<unsigned long long*>(base);
  lb.status = reinterpret_cast<unsigned long long*>(base + 16);
  lb.clean = static_cast<uint4*>(ws.clean);
  lb.clean_vectors = static_cast<int64_t>(ws.clean_bytes / 16);
  return lb;
}

// Calls f(std::integral_constant<int, I>{}) for I == index: a run-time config index turned into
// the compile-time one that picks a kernel template.
template <int N, int I = 0, typename F>
cudaError_t with_config(int index, F&& f) {
  if constexpr (I < N) {
    if (index == I) return f(std::integral_constant<int, I>{});
    return with_config<N, I + 1>(index, f);
  } else {
    return cudaErrorInvalidConfiguration;
  }
}

template <ScanDType kDType, bool kBackward>
cudaError_t launch_scan(const ScanParams& p, const ScanPlan& plan, const LookbackWorkspace& ws, cudaStream_t stream) {
  using T = typename StorageType<kDType>::type;
  if (plan.grid == 0) return cudaSuccess;
  if (plan.workspace_bytes > 0 && ws.zero) {
    const cudaError_t err = cudaMemsetAsync(ws.base, 0, plan.workspace_bytes, stream);
    if (err != cudaSuccess) return err;
  }
  const LookbackState lb = lookback_state(plan, ws);
  switch (plan.kind) {
    case ScanKind::kTile:
      return with_config<kNumTileConfigs>(plan.config, [&](auto i) {
        constexpr TileConfig cfg = tile_config(sizeof(T), i);
        const TileArgs args{plan.num_chunks, plan.per_chunk, plan.vec_mask, plan.walk_prefetch, lb};
        if (plan.segments != kNoSegments) {  // only the walking tile, aligned (plan_segments)
          if constexpr (i == kTileWalk) {
            if (plan.phase_shift) return cudaErrorInvalidConfiguration;
            if (plan.segments == kTileSegments)
              scan_tile_kernel<T, cfg.elems, cfg.threads, kBackward, false, kTileSegments>
                  <<<plan.grid, cfg.threads, 0, stream>>>(p, args);
            else
              scan_tile_kernel<T, cfg.elems, cfg.threads, kBackward, false, kRowSegments>
                  <<<plan.grid, cfg.threads, 0, stream>>>(p, args);
            return cudaGetLastError();
          } else {
            return cudaErrorInvalidConfiguration;
          }
        }
        if (plan.phase_shift)
          scan_tile_kernel<T, cfg.elems, cfg.threads, kBackward, true><<<plan.grid, cfg.threads, 0, stream>>>(p, args);
        else
          scan_tile_kernel<T, cfg.elems, cfg.threads, kBackward, false><<<plan.grid, cfg.threads, 0, stream>>>(p, args);
        return cudaGetLastError();
      });
    case ScanKind::kStream:
      return with_config<kNumStreamConfigs>(plan.config, [&](auto i) {
        constexpr StreamConfig cfg = stream_config(sizeof(T), i);
        constexpr auto kernel = scan_stream_kernel<T, cfg.elems, cfg.threads, cfg.stages(kBackward), kBackward>;
        constexpr size_t smem = cfg.smem_bytes(sizeof(T), kBackward);
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        if (err != cudaSuccess) return err;
        kernel<<<plan.grid, cfg.threads, smem, stream>>>(p, StreamArgs{plan.num_chunks, plan.vec_mask, plan.bulk_mask});
        return cudaGetLastError();
      });
    case ScanKind::kRing:
      return with_config<kNumRingConfigs>(plan.config, [&](auto i) {
        constexpr RingConfig cfg = ring_config(sizeof(T), i);
        constexpr size_t smem = cfg.smem_bytes(sizeof(T), kBackward);
        const auto kernel = p.lstride[kIn] < 0
                                ? scan_ring_kernel<T, cfg.elems, cfg.threads, cfg.slots(kBackward), kBackward, true>
                                : scan_ring_kernel<T, cfg.elems, cfg.threads, cfg.slots(kBackward), kBackward, false>;
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        if (err != cudaSuccess) return err;
        kernel<<<plan.grid, cfg.threads + 64, smem, stream>>>(p, RingArgs{plan.num_chunks, plan.vec_mask, lb});
        return cudaGetLastError();
      });
    case ScanKind::kChannel:
      return with_config<kNumChannelConfigs>(plan.config, [&](auto i) {
        constexpr ChannelConfig cfg = channel_config(sizeof(T), i);
        const ChannelArgs args{plan.num_chunks, plan.per_chunk, ceil_div(p.num_seq, cfg.channels()), lb};
        scan_channel_kernel<T, cfg.steps, cfg.rows, cfg.min_blocks, cfg.cpl, cfg.prefetch, kBackward, cfg.lanes>
            <<<plan.grid, cfg.threads(), 0, stream>>>(p, args);
        return cudaGetLastError();
      });
  }
  return cudaErrorInvalidConfiguration;
}

}  // namespace linrec
