// How a scan is mapped onto the GPU: kernel template, config, grid, workspace.
// Host-only and torch-free. Every tuning choice is here, each with its reason.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "../scan_params.h"

namespace linrec {

// Tile kernel configs (elements per thread E, threads per block NT), one list per element
// size. Every thread moves whole 16-byte vectors, at least two per tensor: with one, the
// bf16 L=1024 case kept too few bytes in flight (0.78 of torch.add on the H100, against
// 1.00 for float32 with two).
struct TileConfig {
  int elems, threads;
  constexpr int64_t tile() const { return int64_t(elems) * threads; }
};
// Smallest tile first. 4-byte: 256 steps for short sequences (no idle threads), 1024 for
// the common L=1024 in one tile, 4096 for long sequences (fewer tiles and look-back hops).
// The last entry was meant for look-back mode (smaller blocks, more resident per SM), but
// the 4096-step tile of 256 threads measured faster on few-long (0.63 vs 0.57 of torch.add),
// so look-back mode defaults to entry 2; entry 3 stays for the override below.
// A grid-stride variant (one wave of blocks walking many sequences, to save block launches)
// measured slower on the H200 (bf16 many-short 0.76 vs 0.80 of torch.add) and was dropped.
// Entry 4 is an alternative 1024-step tile for the TORCH_LINREC_CUDA_TILE_CONFIG override,
// which replaces the length-chosen entry. On the H200 (many-short, fwd / fwd+bwd ratio to
// torch.add): float32 {8,128} 0.88 / 0.75 vs {16,64} 0.85 / 0.76; bfloat16 {16,64} 0.80 /
// 0.65 vs {32,32} 0.87 / 0.74, so the 2-byte 1024-step entry is {32,32}.
constexpr TileConfig kTileConfigs4B[] = {{8, 32}, {8, 128}, {16, 256}, {16, 128}, {16, 64}};
// 2-byte: the same tile sizes with twice the steps per thread (four 16-byte vectors per
// tensor and thread in the 1024-step entry).
constexpr TileConfig kTileConfigs2B[] = {{16, 16}, {32, 32}, {32, 128}, {32, 64}, {16, 64}};
constexpr int kNumTileConfigs = 5;
constexpr int kDefaultTileLookbackConfig = 2;  // see above
constexpr int kNumSizeTileConfigs = 3;  // chosen by length; the rest by mode
constexpr TileConfig tile_config(int elem_size, int i) {
  return elem_size == 2 ? kTileConfigs2B[i] : kTileConfigs4B[i];
}

// Channel kernel: a block is 32 lanes x `rows` warps, each lane `cpl` adjacent channels,
// each thread `steps` steps, at least `min_blocks` blocks per SM in the forward, half in the
// backward (a register cap that stays spill-free). A span of rows x steps shares one
// look-back status per channel. A first version (one warp row, 32 steps per thread, 128
// registers, 4 blocks/SM) reached 0.72 of torch.add on mamba-BLD float32; 8 rows x 16 steps
// at 98 registers (2 blocks/SM) measured 0.56 once and 0.94 in a later sweep of the four
// configs below (H100, same session), where {16,8,2} led on mamba-BLD float32 and bf16
// (0.94 / 0.63), ahead of {32,4,3} (0.88 / 0.55), {16,4,5} (0.75 / 0.43), {32,2,6} (0.71 / 0.42).
// The pair config (cpl 2, see scan_channel.cuh) holds as many values per thread as {16,8,2}.
struct ChannelConfig {
  int steps, rows, min_blocks, cpl;
  constexpr int threads() const { return 32 * rows; }
  constexpr int64_t span() const { return int64_t(steps) * rows; }
  constexpr int64_t channels() const { return 32 * cpl; }
};
// On the H200 (mamba-BLD float32 / bfloat16, 8 x 4096 x 4096): the forward is fastest with one
// channel per lane ({16,8,2,1}: 0.88 / 0.32 of torch.add, against 0.77 / 0.28 for pairs with
// 8 rows at 2 or 3 blocks per SM and 0.85 / 0.26 for {8,16,1,2}); the backward, which streams
// five tensors, with pairs in 16 rows ({8,16,1,2}: 2391 / 1437 GB/s against 1770 / 930 GB/s
// for {16,8,2,1}).
constexpr ChannelConfig kChannelConfigs[] = {{16, 8, 2, 1}, {16, 4, 5, 1}, {32, 4, 3, 1}, {32, 2, 6, 1},
                                             {8, 16, 1, 2}};
constexpr int kNumChannelConfigs = 5;
// On the H100 the float32 forward is faster with pairs (mamba-BLD 0.97 vs 0.92 of torch.add for
// {16,8,2,1}; bfloat16: 0.36 vs 0.44), unlike on the H200 above: pairs for the 4-byte forward.
// Default config: {8,16,1,2} where pairs apply (backward, 4-byte forward), else {16,8,2,1}.
constexpr int default_channel_config(bool pairs, int elem_size, bool backward) {
  return pairs && (backward || elem_size == 4) ? 4 : 0;
}

// Whether the channel kernel may take two adjacent channels per lane: every strided operand
// has unit stride between channels, an even number of them per row, and pair-aligned steps.
inline bool channel_pairs(const ScanParams& p, int elem_size) {
  if (p.nbatch == 0 || p.bsize[0] % 2 != 0) return false;
  for (int slot : {kIn, kCoeff, kOut, kGradIn, kGradCoeff}) {
    if (!p.ptr[slot] || (slot == kGradCoeff && p.accumulate_grad_coeff)) continue;
    if (p.bstride[slot][0] != 1 || p.lstride[slot] % 2 != 0) return false;
    for (int i = 1; i < p.nbatch; ++i)
      if (p.bstride[slot][i] % 2 != 0) return false;
    if (reinterpret_cast<uintptr_t>(p.ptr[slot]) % (2 * elem_size) != 0) return false;
  }
  return true;
}

// Stream kernel configs (elements per thread E, threads per block NT, staged tiles per
// block), Hopper and later: a block per sequence fed by bulk copies STAGES tiles ahead. A tile
// is 8 KB or 16 KB per input (2048 or 4096 float32 steps; twice the steps at 2 bytes); one
// block per SM needs about 55 KB in flight to keep the H200's 4.8 TB/s busy at ~1.5 us of
// latency (Little's law over 132 SMs).
struct StreamConfig {
  int elems, threads, stages_forward, stages_backward;
  constexpr int64_t tile() const { return int64_t(elems) * threads; }
  constexpr int stages(bool backward) const { return backward ? stages_backward : stages_forward; }
  // Dynamic shared memory: stages x inputs (2 forward, 3 backward) x (tile + two 128-byte halo
  // slots), two tiles of each output (1 forward, 2 backward) for the bulk stores, and up to
  // 128 bytes to align them.
  constexpr size_t smem_bytes(int elem_size, bool backward) const {
    return size_t(stages(backward)) * (backward ? 3 : 2) * (size_t(tile()) * elem_size + 256) +
           size_t(2) * (backward ? 2 : 1) * size_t(tile()) * elem_size + 128;
  }
};
// Shared memory forward / backward (at most 227 KB per block), inputs' stages + output tiles:
// 0: 16 KB tiles x 4 / 3 stages: 128 + 32 / 144 + 64 KB. 1: 16 KB x 3 / 2: 96 + 32 / 96 + 64 KB.
// 2: 8 KB x 6 / 4: 96 + 16 / 96 + 32 KB. 3: 8 KB x 4 / 3: 64 + 16 / 72 + 32 KB.
// 4: 16 KB tiles over 512 threads x 4 / 3 stages (as 0): twice the warps to hide the
// per-tile latency (the 256-thread block issued an instruction every 5.2 cycles per scheduler,
// ncu, few-long on the H200); the default.
constexpr StreamConfig kStreamConfigs4B[] = {{16, 256, 4, 3}, {16, 256, 3, 2}, {8, 256, 6, 4}, {8, 256, 4, 3},
                                             {8, 512, 4, 3}};
constexpr StreamConfig kStreamConfigs2B[] = {{32, 256, 4, 3}, {32, 256, 3, 2}, {16, 256, 6, 4}, {16, 256, 4, 3},
                                             {16, 512, 4, 3}};
constexpr int kNumStreamConfigs = 5;
constexpr size_t kMaxBlockSharedMemory = 227 * 1024;  // Hopper's per-block opt-in limit
// H200 (an earlier kernel): few-long 0.64 / 0.66 (4) vs 0.57 / 0.59 (0). H100, current kernel:
// forward 0.573 / 0.574 / 0.573 ms for 4 / 0 / 3 (0.93 of torch.add), backward 0.954 / 0.961 /
// 0.969 ms: the configs are even now that the per-tile overheads are gone; 4 stays.
constexpr int kDefaultStreamConfig[2] = {4, 4};  // forward, backward
constexpr StreamConfig stream_config(int elem_size, int i) {
  return elem_size == 2 ? kStreamConfigs2B[i] : kStreamConfigs4B[i];
}

// Tuning overrides for experiments: TORCH_LINREC_CUDA_CHANNEL_CONFIG, _TILE_CONFIG,
// _TILE_LOOKBACK_CONFIG, _STREAM_CONFIG (an index, or "off": no stream kernel), and
// TORCH_LINREC_CUDA_STREAM_STORE=direct (stream kernel outputs stored from registers).
inline int config_override(const char* name, int fallback, int count) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  if (std::strcmp(v, "off") == 0) return -1;
  const int i = std::atoi(v);
  return (i >= 0 && i < count) ? i : fallback;
}

// Resident threads per SM the plans assume (2048 on Hopper at full occupancy).
constexpr int64_t kThreadsPerSM = 2048;

enum class ScanKind : int { kTile = 0, kChannel = 1, kStream = 2 };

struct ScanPlan {
  ScanKind kind;
  int config;              // index into the tile, channel or stream configs
  int64_t num_chunks;      // tile and channel kernels: blocks per sequence along the scan (> 1: look-back);
                           // stream kernel: tiles per sequence
  int64_t per_chunk;       // tiles (tile kernel) or spans (channel kernel) each block walks
  int64_t grid;            // blocks
  unsigned vec_mask;       // tile and stream kernels: slots that take 16-byte vector accesses
  unsigned bulk_mask;      // stream kernel: output slots stored from shared memory by bulk copies
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

// `cc_major`: the device's compute capability (the stream kernel needs 9.0: bulk copies).
inline ScanPlan plan_scan(const ScanParams& p, int elem_size, int num_sms, int cc_major) {
  ScanPlan plan{};
  const int64_t L = p.len;
  // The scan dim is innermost for the output when its stride beats every batch stride.
  const bool channel = p.nbatch > 0 && std::llabs(p.lstride[kOut]) > std::llabs(p.bstride[kOut][0]);
  if (!channel) {
    plan.kind = ScanKind::kTile;
    plan.config = kNumSizeTileConfigs - 1;
    for (int i = 0; i < kNumSizeTileConfigs; ++i)
      if (tile_config(elem_size, i).tile() >= L) {
        plan.config = i;
        break;
      }
    plan.config = config_override("TORCH_LINREC_CUDA_TILE_CONFIG", plan.config, kNumTileConfigs);
    if (plan.config < 0) plan.config = kNumSizeTileConfigs - 1;
    const TileConfig cfg = tile_config(elem_size, plan.config);
    const int64_t tiles = ceil_div(L, cfg.tile());
    const int64_t resident_blocks = num_sms * (kThreadsPerSM / cfg.threads);
    for (int s = 0; s < kNumSlots; ++s)
      if (s != kInit && s != kGradInit && !(s == kGradCoeff && p.accumulate_grad_coeff) &&
          vectorizable(p, s, elem_size))
        plan.vec_mask |= 1u << s;
    const unsigned streamed = (1u << kIn) | (1u << kCoeff) | (p.backward ? 1u << kOut : 0u);
    const int stream_cfg = config_override("TORCH_LINREC_CUDA_STREAM_CONFIG", kDefaultStreamConfig[p.backward],
                                           kNumStreamConfigs);
    plan.grid = p.num_seq;
    if (tiles == 1 || p.num_seq >= 2 * resident_blocks) {
      // Enough sequences for two waves of blocks: a block walks all tiles of a sequence,
      // the other resident blocks hide its latency.
      plan.num_chunks = 1;
      plan.per_chunk = tiles;
    } else if (4 * p.num_seq >= 3 * num_sms && cc_major >= 9 && stream_cfg >= 0 &&
               (plan.vec_mask & streamed) == streamed) {
      // A block for at least 3/4 of the SMs (the look-back below reaches ~0.55 of torch.add
      // on few-long, H200): each block walks its sequence with bulk copies in flight.
      plan.kind = ScanKind::kStream;
      plan.config = stream_cfg;
      plan.num_chunks = ceil_div(L, stream_config(elem_size, stream_cfg).tile());
      plan.per_chunk = plan.num_chunks;
      const unsigned outs = p.backward ? (1u << kGradIn) | (p.accumulate_grad_coeff ? 0u : 1u << kGradCoeff) : 1u << kOut;
      const char* store = std::getenv("TORCH_LINREC_CUDA_STREAM_STORE");
      if (!(store && std::strcmp(store, "direct") == 0)) plan.bulk_mask = plan.vec_mask & outs;
    } else {
      // Fewer sequences than SMs (or no bulk copies): one tile per block, tiles of a sequence
      // chained by look-back.
      plan.config = config_override("TORCH_LINREC_CUDA_TILE_LOOKBACK_CONFIG", kDefaultTileLookbackConfig,
                                    kNumTileConfigs);
      if (plan.config < 0) plan.config = kDefaultTileLookbackConfig;
      plan.num_chunks = ceil_div(L, tile_config(elem_size, plan.config).tile());
      plan.per_chunk = 1;
      plan.grid = p.num_seq * plan.num_chunks;
    }
  } else {
    plan.kind = ScanKind::kChannel;
    const bool pairs = channel_pairs(p, elem_size);
    const int fallback = default_channel_config(pairs, elem_size, p.backward);
    plan.config = config_override("TORCH_LINREC_CUDA_CHANNEL_CONFIG", fallback, kNumChannelConfigs);
    if (plan.config < 0 || (kChannelConfigs[plan.config].cpl > 1 && !pairs)) plan.config = fallback;
    const ChannelConfig cfg = kChannelConfigs[plan.config];
    const int64_t spans = ceil_div(L, cfg.span());
    const int64_t seq_blocks = ceil_div(p.num_seq, cfg.channels());
    const int64_t resident_blocks = num_sms * cfg.min_blocks;
    // Pipe along L inside each block only when the channel blocks alone fill two waves;
    // else every span is its own block, chained by look-back.
    if (spans == 1 || seq_blocks >= 2 * resident_blocks) {
      plan.num_chunks = 1;
      plan.per_chunk = spans;
    } else {
      plan.num_chunks = spans;
      plan.per_chunk = 1;
    }
    plan.grid = seq_blocks * plan.num_chunks;
  }
  if (plan.num_chunks > 1 && plan.kind != ScanKind::kStream) {
    // look-back: a counter, then two status words per (sequence, chunk)
    plan.workspace_bytes = 16 + static_cast<size_t>(p.num_seq * plan.num_chunks) * 16;
    plan.zeroed_bytes = plan.workspace_bytes;
  }
  return plan;
}

}  // namespace linrec
