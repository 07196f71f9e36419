// How a scan is mapped onto the GPU: kernel template, config, grid, workspace.
// Host-only and torch-free. Every tuning choice is here, each with its reason.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "../scan_params.h"

namespace linrec {

// Tile kernel configs (elements per thread E, threads per block NT). E * sizeof(T) is a
// multiple of 16 bytes for every dtype, so each thread moves whole 16-byte vectors.
struct TileConfig {
  int elems, threads;
  constexpr int64_t tile() const { return int64_t(elems) * threads; }
};
// 256 steps: short sequences waste no threads; 1024: the common L=1024 in one tile with
// 8 steps per thread (enough independent loads in flight at 128 threads); 4096: long
// sequences, fewer tiles and look-back hops per sequence at moderate register use.
constexpr TileConfig kTileConfigs[] = {{8, 32}, {8, 128}, {16, 256}};
constexpr int kNumTileConfigs = 3;

// Channel kernel: CH steps per thread held in registers; 128 threads = 4 warps of
// consecutive channels. CH = 32 issues 64 loads per thread before the first use (hiding
// DRAM latency with few channels) while keeping the look-back status traffic at ~1/25
// of the data for float32.
constexpr int kChannelSteps = 32;
constexpr int kChannelThreads = 128;

// Resident threads per SM the plans assume (2048 on Hopper at full occupancy).
constexpr int64_t kThreadsPerSM = 2048;

enum class ScanKind : int { kTile = 0, kChannel = 1 };

struct ScanPlan {
  ScanKind kind;
  int config;              // index into kTileConfigs (tile kernel)
  int64_t num_chunks;      // blocks per sequence along the scan; > 1 means decoupled look-back
  int64_t per_chunk;       // tiles (tile kernel) or CH-step pieces (channel) each block walks
  int64_t grid;            // blocks
  unsigned vec_mask;       // tile kernel: slots that take 16-byte vector accesses
  size_t workspace_bytes;  // look-back status (0 without look-back)
  size_t zeroed_bytes;     // prefix of the workspace that must be zero at launch
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether every sequence of `slot` starts 16-byte aligned with unit stride along the scan.
inline bool vectorizable(const ScanParams& p, int slot, int elem_size) {
  if (!p.ptr[slot]) return false;
  const int64_t ls = p.lstride[slot];
  if (ls != 1 && ls != -1) return false;
  const int64_t vec = 16 / elem_size;
  const char* lowest = static_cast<const char*>(p.ptr[slot]) + (ls > 0 ? 0 : (p.len - 1) * ls * elem_size);
  if (reinterpret_cast<uintptr_t>(lowest) % 16 != 0) return false;
  if (ls < 0 && p.len % vec != 0) return false;
  for (int i = 0; i < p.nbatch; ++i)
    if (p.bstride[slot][i] % vec != 0) return false;
  return true;
}

inline ScanPlan plan_scan(const ScanParams& p, int elem_size, int num_sms) {
  ScanPlan plan{};
  const int64_t L = p.len;
  // The scan dim is innermost for the output when its stride beats every batch stride.
  const bool channel = p.nbatch > 0 && std::llabs(p.lstride[kOut]) > std::llabs(p.bstride[kOut][0]);
  int64_t lookback_entries = 0;
  if (!channel) {
    plan.kind = ScanKind::kTile;
    plan.config = kNumTileConfigs - 1;
    for (int i = 0; i < kNumTileConfigs; ++i)
      if (kTileConfigs[i].tile() >= L) {
        plan.config = i;
        break;
      }
    const TileConfig cfg = kTileConfigs[plan.config];
    const int64_t tiles = ceil_div(L, cfg.tile());
    const int64_t resident_blocks = num_sms * (kThreadsPerSM / cfg.threads);
    // Enough sequences for two waves: one block walks all tiles of a sequence (no status
    // traffic). Otherwise one tile per block and the tiles chain by look-back.
    if (tiles == 1 || p.num_seq >= 2 * resident_blocks) {
      plan.num_chunks = 1;
      plan.per_chunk = tiles;
    } else {
      plan.num_chunks = tiles;
      plan.per_chunk = 1;
    }
    plan.grid = p.num_seq * plan.num_chunks;
    for (int s = 0; s < kNumSlots; ++s)
      if (s != kInit && s != kGradInit && vectorizable(p, s, elem_size)) plan.vec_mask |= 1u << s;
  } else {
    plan.kind = ScanKind::kChannel;
    const int64_t pieces = ceil_div(L, kChannelSteps);
    // Pipe along L inside each thread only when the channels alone fill the GPU four times
    // over; else every CH-step piece is its own block row, chained by look-back.
    if (pieces == 1 || p.num_seq >= 4 * num_sms * kThreadsPerSM) {
      plan.num_chunks = 1;
      plan.per_chunk = pieces;
    } else {
      plan.num_chunks = pieces;
      plan.per_chunk = 1;
    }
    plan.grid = ceil_div(p.num_seq, kChannelThreads) * plan.num_chunks;
  }
  if (plan.num_chunks > 1) {
    lookback_entries = p.num_seq * plan.num_chunks;
    const size_t flags = static_cast<size_t>(ceil_div(lookback_entries * 4, 16) * 16);
    plan.zeroed_bytes = 16 + flags;
    plan.workspace_bytes = plan.zeroed_bytes + 3 * flags;
  }
  return plan;
}

}  // namespace linrec
