// How a scan is mapped onto the GPU: kernel template, config, grid, workspace. Host-only and
// torch-free. The config is an explicit request (by name, configs.h) or the device's default
// (configs_sm90.h, configs_generic.h), chosen from the device's properties at run time.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "../params.h"
#include "configs_generic.h"
#include "configs_sm90.h"

namespace linrec {

// What the planner needs to know of the device (read once per device by the caller).
struct DeviceInfo {
  int num_sms;
  int cc_major;
  size_t smem_per_block_optin;  // largest dynamic + static shared memory a block may opt into
  float dram_gbps_per_sm = 0.f;  // peak DRAM bandwidth over the SMs (GB/s per SM); 0: unknown
};

// A config named by the caller: `kind` and `index` into its table; `index` -1: the default.
// `prefer`: where the config does not apply to this problem, plan the default instead of failing
// (the tuned cache's choices, made per problem bucket, use this). `tuned` (with `prefer`): a tuned
// cache's choice, which also yields to the small stream blocks (plan_scan).
struct ConfigRequest {
  ScanKind kind = ScanKind::kTile;
  int index = -1;
  bool prefer = false;
  bool tuned = false;
};

// Resident threads per SM the plans assume (2048 on every GPU since Volta at full occupancy).
constexpr int64_t kThreadsPerSM = 2048;
// Tile configs chosen by length (the first that holds the row); the rest are chosen by name.
constexpr int kNumSizeTileConfigs = 3;

struct ScanPlan {
  ScanKind kind;
  int config;              // index into the tile, channel, stream or ring configs
  int64_t num_chunks;      // tile and channel kernels: blocks per sequence along the scan (> 1: look-back);
                           // stream and ring kernels: tiles per sequence
  int64_t per_chunk;       // tiles (tile kernel) or spans (channel kernel) each block walks
  int64_t grid;            // blocks
  unsigned vec_mask;       // tile, stream and ring kernels: slots that take 16-byte vector accesses
  bool phase_shift;        // tile kernel: rows off the 16-byte grid, tiles shifted per row (scan_tile_kernel)
  bool walk_prefetch;      // tile kernel: a walking block prefetches its next tile into L2
  SegmentKind segments;    // tile kernel: how sequences hold rows (ScanParams::seg_len; segment_rows)
  unsigned bulk_mask;      // stream kernel: output slots stored from shared memory by bulk copies
  size_t workspace_bytes;  // look-back counters and status (0 without look-back; launch.h)
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether the scanned dim is not the innermost of the output (the channel kernel's layout).
inline bool is_channel_layout(const ScanParams& p) {
  return p.nbatch > 0 && std::llabs(p.lstride[kOut]) > std::llabs(p.bstride[kOut][0]);
}

inline bool unit_stride(const ScanParams& p, int slot) {
  return p.ptr[slot] && (p.lstride[slot] == 1 || p.lstride[slot] == -1);
}

// Whether every sequence of `slot` starts 16-byte aligned with unit stride along the scan.
inline bool vectorizable(const ScanParams& p, int slot, int elem_size) {
  if (!unit_stride(p, slot)) return false;
  const int64_t ls = p.lstride[slot];
  const int64_t vec = 16 / elem_size;
  const char* lowest = static_cast<const char*>(p.ptr[slot]) + (ls > 0 ? 0 : (p.len - 1) * ls * elem_size);
  if (reinterpret_cast<uintptr_t>(lowest) % 16 != 0) return false;
  if (ls < 0 && p.len % vec != 0) return false;
  for (int i = 0; i < p.nbatch; ++i)
    if (p.bstride[slot][i] % vec != 0) return false;
  return true;
}

// Whether the channel kernel may take groups of `cpl` adjacent channels per lane: every strided operand
// has unit stride between channels, a multiple of `cpl` per row, group-aligned steps (one access each).
inline bool channel_groups(const ScanParams& p, int elem_size, int cpl) {
  if (cpl == 1) return true;
  if (p.nbatch == 0 || p.bsize[0] % cpl != 0) return false;
  for (int slot : {kIn, kCoeff, kOut, kGradIn, kGradCoeff}) {
    if (!p.ptr[slot] || (slot == kGradCoeff && p.accumulate_grad_coeff)) continue;
    if (p.bstride[slot][0] != 1 || p.lstride[slot] % cpl != 0) return false;
    for (int i = 1; i < p.nbatch; ++i)
      if (p.bstride[slot][i] % cpl != 0) return false;
    if (reinterpret_cast<uintptr_t>(p.ptr[slot]) % (cpl * elem_size) != 0) return false;
  }
  return true;
}

// The widest channel group per lane (1, 2, 4 or 8 channels, at most 16 bytes) this problem allows.
inline int channel_group_width(const ScanParams& p, int elem_size) {
  for (int cpl = 16 / elem_size; cpl > 1; cpl /= 2)
    if (channel_groups(p, elem_size, cpl)) return cpl;
  return 1;
}

inline ScanDefaults device_defaults(const DeviceInfo& dev, int elem_size, bool backward, int group_width) {
  return dev.cc_major >= 9 ? defaults_sm90(elem_size, backward, group_width, dev.dram_gbps_per_sm)
                           : defaults_generic(elem_size, backward, group_width);
}

// Slots the tile, stream and ring kernels may access with 16-byte vectors (`aligned`: in every
// sequence from step 0; else where their phase is the sequence's, see scan_tile_kernel's kPhaseShift).
inline unsigned vector_slots(const ScanParams& p, int elem_size, bool aligned = true) {
  unsigned mask = 0;
  for (int s = 0; s < kNumSlots; ++s)
    if (!is_batch_slot(s) && !(s == kGradCoeff && p.accumulate_grad_coeff) &&
        (aligned ? vectorizable(p, s, elem_size) : unit_stride(p, s)))
      mask |= 1u << s;
  return mask;
}

// Whether the tile kernel shifts each row's tiles to the row's 16-byte phase: the input has unit
// stride but some row starts off the grid (an odd length, a sliced view).
// Per-step loads there touch a sector per lane and step (fp16 1000 x 3001 ran at 0.18 of
// torch.add, bench/NOTES.md 45).
inline bool tile_phase_shift(const ScanParams& p, int elem_size) {
  return unit_stride(p, kIn) && !vectorizable(p, kIn, elem_size);
}

// Whether config `index` of `kind` can run this problem on this device (correctness, not speed).
inline bool config_applies(const ScanParams& p, int elem_size, const DeviceInfo& dev, ScanKind kind, int index) {
  if (index < 0 || index >= num_configs(kind)) return false;
  const bool channel = is_channel_layout(p);
  switch (kind) {
    case ScanKind::kTile: return !channel;
    case ScanKind::kChannel: return channel && channel_groups(p, elem_size, channel_config(elem_size, index).cpl);
    case ScanKind::kStream:
    case ScanKind::kRing: {
      if (channel || dev.cc_major < 9) return false;
      const size_t smem = kind == ScanKind::kStream
                              ? stream_config(elem_size, index).smem_bytes(elem_size, p.backward) + kStreamStaticSharedMemory
                              : ring_config(elem_size, index).smem_bytes(elem_size, p.backward) + kRingStaticSharedMemory;
      if (smem > dev.smem_per_block_optin) return false;
      const unsigned streamed = (1u << kIn) | (1u << kCoeff) | (p.backward ? 1u << kOut : 0u);
      if ((vector_slots(p, elem_size) & streamed) != streamed) return false;
      if (kind == ScanKind::kStream) return true;
      // The ring chains its tiles by look-back (whose order of composition depends on timing), and
      // walks its inputs in one direction, known at compile time.
      const bool rev = p.lstride[kIn] < 0;
      return !p.deterministic && (p.lstride[kCoeff] < 0) == rev && (!p.backward || (p.lstride[kOut] < 0) == rev);
    }
  }
  return false;
}

// The names of the configs that can run this problem, comma separated (for error messages).
inline std::string applicable_config_names(const ScanParams& p, int elem_size, const DeviceInfo& dev) {
  std::string out;
  for (ScanKind kind : kAllKinds)
    for (int i = 0; i < num_configs(kind); ++i)
      if (config_applies(p, elem_size, dev, kind, i)) out += (out.empty() ? "" : ", ") + std::string(config_name(kind, elem_size, i));
  return out;
}

// The 2-byte tile configs of 1024 steps (configs.h): 32 steps x 32 threads, 16 x 64; 4-byte 8 x 128.
constexpr int kTile2B32x32 = 1, kTile2B16x64 = 4, kTile4B8x128 = 1;
static_assert(kTileConfigs2B[kTile2B32x32].elems == 32 && kTileConfigs2B[kTile2B32x32].threads == 32 &&
              kTileConfigs2B[kTile2B16x64].elems == 16 && kTileConfigs2B[kTile2B16x64].threads == 64 &&
              kTileConfigs4B[kTile4B8x128].elems == 8 && kTileConfigs4B[kTile4B8x128].threads == 128);

// The tile config of blocks walking rows of more than 2048 steps (the only ones measured) on Hopper
// when few rows share an SM: a larger tile keeps more bytes in flight per block. H100, ratio to a
// vector add, 512-step walk -> this tile (bench/NOTES.md item 66):
// - 2-byte forward, 5 to 14 rows per SM: the 1024-step tile of two warps (bf16 800 x 8001 0.62 ->
//   0.72, 1100 x 8001 0.67 -> 0.78, 1700 x 6000 0.79 -> 0.85; fp16 1000 x 3001 0.67 -> 0.73);
// - 2-byte forward, 14 to 18 rows per SM: the 1024-step tile of one warp (bf16 2000 x 6001 0.76 ->
//   0.84, 2000 x 16385 0.78 -> 0.87); from 20 rows per SM it is no faster;
// - 4-byte forward, fewer than 9 rows per SM: the 1024-step tile (float32 1100 x 8001 0.79 -> 0.86;
//   at 11 rows per SM 0.82 -> 0.80), and from 18 to 28 (3000 x 8001 0.81 -> 0.88, H200 0.75 -> 0.82;
//   at 15 rows per SM 0.88 -> 0.88, H200 0.83 -> 0.81; at 31 0.90 -> 0.90);
// - 4-byte backward, fewer than 32 rows per SM: the same (float32 3000 x 8001 0.84 -> 0.93, 4096 x
//   4097 0.90 -> 0.92, 1100 x 4097 0.78 -> 0.78).
// The 2-byte backward of these rows chains look-back tiles instead (backward_lookback_1024).
inline int walk_tile(const ScanParams& p, int elem_size, const DeviceInfo& dev, int tile_walk) {
  const int64_t sms = dev.num_sms;
  if (p.len <= 2048 || dev.cc_major < 9) return tile_walk;
  if (elem_size == 2 && !p.backward)
    return p.num_seq < 14 * sms ? kTile2B16x64 : p.num_seq < 18 * sms ? kTile2B32x32 : tile_walk;
  if (elem_size == 4 && p.backward) return p.num_seq < 32 * sms ? kTile4B8x128 : tile_walk;
  if (elem_size == 4)
    return p.num_seq < 9 * sms || (p.num_seq >= 18 * sms && p.num_seq < 28 * sms) ? kTile4B8x128 : tile_walk;
  return tile_walk;
}

// Rows from which plan_tile walks them (with `walk_many`): 8 per SM; on Hopper the 2-byte forward
// of rows longer than 2048 steps from 5 (walk_tile's two-warp tile; at 3.8 rows per SM one tile
// or look-back tiles per row stay ahead: fp16 500 x 3001 0.75 against 0.70 walked), from 4 where
// DRAM gives each SM more than 30 GB/s (H200: 37; bf16 600 x 6000 0.57 -> 0.68, 600 x 8001 0.52
// -> 0.58; fp16 500 x 3001 level; item 67).
inline int64_t walk_min_rows(const ScanParams& p, int elem_size, const DeviceInfo& dev) {
  if (elem_size == 2 && !p.backward && p.len > 2048 && dev.cc_major >= 9)
    return (dev.dram_gbps_per_sm > kFastDramGbpsPerSm ? 4 : 5) * int64_t(dev.num_sms);
  return 8 * int64_t(dev.num_sms);
}

// `walk_many`: with the default config, many rows (8 per SM) walk whatever their tile count, not
// only when they fill two waves of the longest tile's blocks (walk_over_lookback says where).
inline void plan_tile(ScanPlan& plan, const ScanParams& p, int elem_size, const DeviceInfo& dev, int config,
                      int lookback_default, int walk_config, bool walk_many = false) {
  plan.phase_shift = tile_phase_shift(p, elem_size);
  if (plan.phase_shift) plan.vec_mask = vector_slots(p, elem_size, /*aligned=*/false);
  const int64_t L = p.len;
  int by_length = kNumSizeTileConfigs - 1;
  for (int i = 0; i < kNumSizeTileConfigs; ++i)
    if (tile_config(elem_size, i).tile() >= L) {
      by_length = i;
      break;
    }
  const int64_t resident_blocks =
      dev.num_sms * (kThreadsPerSM / tile_config(elem_size, config >= 0 ? config : by_length).threads);
  const int64_t tiles = ceil_div(L, tile_config(elem_size, config >= 0 ? config : by_length).tile());
  plan.kind = ScanKind::kTile;
  plan.grid = p.num_seq;
  // The look-back is run by a whole warp (full-warp shuffles): a config of fewer threads (the
  // 2-byte 256-step tile) walks its sequences one block each instead.
  const bool whole_warp = tile_config(elem_size, config >= 0 ? config : lookback_default).threads >= 32;
  const bool walk_default = walk_config >= 0 && L > 256 && p.num_seq >= walk_min_rows(p, elem_size, dev);
  if (tiles == 1 || p.num_seq >= 2 * resident_blocks || !whole_warp || p.deterministic ||
      (config < 0 && walk_many && walk_default)) {
    // Enough sequences for two waves of blocks: a block walks all tiles of a sequence, the other
    // resident blocks hide its latency.
    plan.config = config >= 0 ? config : walk_default ? walk_config : by_length;
    // The 2-byte 32-step backward loads a partial run per step (its registers are capped, see
    // scan_tile_kernel): rows with one (off the grid, or of a length not a multiple of 32) take the
    // 16-step config of the same 1024-step tile instead (bf16 131072 x 1000 fwd+bwd at 0.48 of
    // torch.add with it on the H200, 0.76 at 1024).
    if (config < 0 && p.backward && elem_size == 2 && plan.config == kTile2B32x32 &&
        (plan.phase_shift || L % 32 != 0))
      plan.config = kTile2B16x64;
    plan.num_chunks = 1;
    plan.per_chunk = ceil_div(L, tile_config(elem_size, plan.config).tile());
    // With less than 18 KiB of one tensor's tiles per SM (18 warps of the 512-step tiles) the
    // walking blocks' own loads leave DRAM idle: each also prefetches its next tile into L2. With
    // more it costs bandwidth (H100, ratio to torch.add, forward, without -> with: bf16 1100 x 6000
    // 0.64 -> 0.75 (8 KiB), 2000 x 6000 0.73 -> 0.77 (15), float32 1100 x 8001 0.73 -> 0.78 (17);
    // bf16 3000 x 6000 (23) 0.82 -> 0.76, float32 2000 x 6000 (30) 0.88 -> 0.78, bf16 131072 x 1024
    // 0.99 -> 0.92; the 1024-step one-warp tile, bf16 2000 x 6000 (30) 0.84 -> 0.75; items 65-66).
    // Where DRAM gives each SM more than 30 GB/s the bound is 25 KiB (H200: bf16 2600 x 6000 (20)
    // 0.71 -> 0.79, 1400 x 8001 (22) 0.67 -> 0.71, float32 1500 x 8001 (23) 0.76 -> 0.81; bf16 3200
    // x 6000 (25) level, float32 2000 x 8001 (30) 0.83 -> 0.79; item 67).
    // There, 2-byte rows of two tiles prefetch their second tile however many they are: it doubles
    // a one-warp block's loads in flight (H200, bf16 131072 x 1024 forward / backward 0.875 / 0.860
    // -> 0.943 / 0.904, fp16 0.880 / 0.862 -> 0.945 / 0.891, bf16 131072 x 1000 0.84 / 0.78 -> 0.91
    // / 0.81, 16384 x 1024 0.835 / 0.905 -> 0.85-0.87 / 0.88-0.89; not with more tiles per row: bf16
    // 32768 x 4096 0.915 / 0.856 -> 0.887 / 0.760; nor float32 131072 x 1024, 0.975 -> 0.956
    // forward; item 70).
    const TileConfig walked = tile_config(elem_size, plan.config);
    const bool fast_dram = dev.dram_gbps_per_sm > kFastDramGbpsPerSm;
    const int64_t prefetch_kib = fast_dram ? 25 : 18;
    plan.walk_prefetch =
        plan.per_chunk > 1 && (p.num_seq * walked.tile() * elem_size < prefetch_kib * 1024 * int64_t(dev.num_sms) ||
                               (fast_dram && elem_size == 2 && plan.per_chunk == 2));
  } else {
    // Fewer sequences than SMs can hide: one tile per block, the tiles of a sequence chained by
    // look-back (not under deterministic algorithms, see params.h).
    plan.config = config >= 0 ? config : lookback_default;
    plan.num_chunks = ceil_div(L, tile_config(elem_size, plan.config).tile());
    plan.per_chunk = 1;
    plan.grid = p.num_seq * plan.num_chunks;
  }
}

// Whether many rows (8 per SM) longer than the longest tile walk (plan_tile's `walk_many`) rather
// than chain look-back tiles or take the stream kernel (`stream_ok`: it can take them). H100
// measurements (bench/NOTES.md item 64; ratio to a vector add, forward):
// - Rows of at most 16 walking tiles walk: look-back tiles split them unevenly (bf16 4096 x 4097: a
//   4096-step and a 1-step tile, 0.45; walked 0.88) and a stream block per row pays its fill and
//   drain, and a partial tile's slow path, for one or two tiles (bf16 2000 x 6000: 0.41; walked
//   0.70). Except rows of whole stream tiles with fewer than 15 rows per SM (float32 1100 x 8192:
//   stream 0.84, walked 0.80).
// - Aligned rows of at most 32 walking tiles walk from 30 rows per SM (bf16 4096 x 16384: 0.96
//   walked, 0.85 with the default stream config; a tuned one, stream.e16t256s6, reaches 0.98);
//   longer ones keep the stream kernel (4096 x 32768: 1.05 against 0.97).
// - Rows the stream kernel cannot take walk from 15 rows per SM (bf16 2000 x 32769: walked 0.79,
//   look-back 0.68; 4000 x 65537: 0.95 against 0.71; with 1100 rows 0.61 against 0.67).
inline bool walk_over_lookback(const ScanParams& p, int elem_size, const DeviceInfo& dev, const ScanDefaults& def,
                               bool stream_ok) {
  if (def.tile_walk < 0) return false;
  const int64_t sms = dev.num_sms, walk_tiles = ceil_div(p.len, tile_config(elem_size, def.tile_walk).tile());
  if (!stream_ok) return walk_tiles <= 16 || p.num_seq >= 15 * sms;
  const bool whole_stream_tiles = p.len % stream_config(elem_size, def.stream).tile() == 0;
  return (walk_tiles <= 16 && !(whole_stream_tiles && p.num_seq < 15 * sms)) ||
         (walk_tiles <= 32 && p.num_seq >= 30 * sms);
}

// Whether the 2-byte backward of rows that walk_over_lookback lets walk (also below 8 rows per SM,
// where plan_tile does not walk them) chains 1024-step look-back tiles (tile.e16t64) instead: with
// fewer than 16 rows per SM of 9-16 walking tiles (512 steps), the walking blocks are too few to
// keep the backward's five streams in flight (longer rows: not measured). H100, ratio to a vector
// add, walked -> look-back (bench/NOTES.md items 64-65): bf16 1100 x 6000 0.61 -> 0.74, 1100 x 8001
// 0.60 -> 0.73, 1500 x 5000 0.66 -> 0.69, 2000 x 6000 0.75 -> 0.78; from ~20 rows per SM the walk
// is ahead (3000 x 6000: 0.86 against 0.78), and the forward keeps it (1100 x 8001: 0.58 / 0.64).
inline bool backward_lookback_1024(const ScanParams& p, int elem_size, const DeviceInfo& dev, const ScanDefaults& def,
                                   bool walk_many) {
  const int64_t walk_tiles = ceil_div(p.len, tile_config(elem_size, def.tile_walk).tile());
  return walk_many && p.backward && elem_size == 2 && !p.deterministic && p.num_seq < 16 * int64_t(dev.num_sms) &&
         walk_tiles > 8 && walk_tiles <= 16;
}

// The default stream config of a problem: `def.stream`, or `def.stream_short` for rows of at most
// `def.stream_short_tiles` of its tiles with at least two rows per SM (configs_sm90.h says why).
inline int stream_default(const ScanParams& p, int elem_size, const DeviceInfo& dev, const ScanDefaults& def) {
  const bool short_rows = p.num_seq >= 2 * int64_t(dev.num_sms) &&
                          ceil_div(p.len, stream_config(elem_size, def.stream).tile()) <= def.stream_short_tiles;
  return short_rows && config_applies(p, elem_size, dev, ScanKind::kStream, def.stream_short) ? def.stream_short
                                                                                               : def.stream;
}

// Whether stream_default picks `def.stream_short` for the problem.
inline bool takes_stream_short(const ScanParams& p, int elem_size, const DeviceInfo& dev, const ScanDefaults& def) {
  return def.stream_short >= 0 && stream_default(p, elem_size, dev, def) == def.stream_short;
}

// Whether rows longer than the longest tile but of at most two stream tiles, 1.5 to 8 per SM (fewer
// than the walk takes), chain 1024-step look-back tiles instead of taking one stream block each:
// a block per row has little to overlap its loads with. H100, ratio to torch.add, stream ->
// 1024-step look-back tiles, fwd | bwd (bench/NOTES.md item 65): bf16 600 x 8000 0.54 -> 0.65 |
// 0.56 -> 0.81, 1000 x 12000 0.53 -> 0.75 | 0.56 -> 0.83, 200 x 6000 0.56-0.64 -> 0.62-0.65 | 0.67-0.70
// -> 0.87-0.97; float32 1000 x 4608 0.51 -> 0.79 | 0.59 -> 0.86, 1000 x 8192 0.80 -> 0.83 | 0.92 ->
// 0.89. With one row per SM the stream kernel is ahead (float32 128 x 8192: 0.81 against 0.69).
inline bool short_stream_rows(const ScanParams& p, int elem_size, const DeviceInfo& dev, const ScanDefaults& def,
                              bool stream_ok) {
  const int64_t longest_tile = tile_config(elem_size, kNumSizeTileConfigs - 1).tile();  // else one tile per row
  // The forward from two rows per SM keeps the stream kernel (its 256-thread config, stream_default)
  // unless the row's last tile is under half full: bf16 264 x 16384 ran at 0.93 / 0.80 of torch.add on
  // the H100 / H200 against 0.64 / 0.55 on the look-back tiles, float32 264 x 8192 0.90 against 0.68
  // (H100), but float32 1000 x 4608 (a quarter tile left) 0.71 against 0.82. The backward's look-back
  // tiles were ahead at 400 x 12288, 0.81 / 0.73 against 0.79 / 0.61 (bench/NOTES.md items 72-73).
  if (!stream_ok || p.deterministic || p.len <= longest_tile || 2 * p.num_seq < 3 * dev.num_sms ||
      p.num_seq >= 8 * int64_t(dev.num_sms) || ceil_div(p.len, stream_config(elem_size, def.stream).tile()) > 2)
    return false;
  if (p.backward || !takes_stream_short(p, elem_size, dev, def)) return true;
  const int64_t short_tile = stream_config(elem_size, def.stream_short).tile();
  const int64_t last = p.len % short_tile;  // steps in a partial last tile
  return last != 0 && 2 * last < short_tile;
}

// Whether 4-byte rows longer than the longest tile, of whole stream tiles, that stream_default gives the 256-thread
// config (at most four tiles, two or more rows per SM) take the stream kernel however many they are, rather than walk:
// float32 3000 x 8192 walked 0.90 / 0.95 of torch.add (fwd / bwd, H100), 0.84 / 0.89 (H200), on the stream kernel 0.97
// / 0.99, 0.94 / 0.97; H100 4096 x 8192 0.92 / 0.96 against 0.99 / 0.99, 2000 x 8192 0.91 / 0.96 against 0.95 / 1.00
// (bench/NOTES.md items 72-73). Not 2-byte rows (bf16 3000 x 8192 walked 0.87 / 0.87, on the stream kernel 0.87 /
// 0.65), nor rows off whole tiles (float32 2000 x 6000: 0.87 / 0.93 walked, 0.83 / 0.89).
inline bool stream_whole_rows(const ScanParams& p, int elem_size, const DeviceInfo& dev, const ScanDefaults& def,
                              bool stream_ok) {
  const int64_t longest_tile = tile_config(elem_size, kNumSizeTileConfigs - 1).tile();
  return elem_size == 4 && stream_ok && p.len > longest_tile &&
         p.len % stream_config(elem_size, def.stream).tile() == 0 && takes_stream_short(p, elem_size, dev, def);
}

// The tile config whose tile is the whole row, or -1: rows of exactly 2048 or 4096 steps, 4 to 64
// per SM (the range measured; many more walk, bench/NOTES.md item 48), on Hopper. One block per row
// loads the row at once with warp-striped accesses (scan_access.cuh) instead of walking it tile by
// tile. Ratio to torch.add, default -> one tile, forward | backward (bench/NOTES.md item 74): H200
// bf16 2048 steps, 8 rows per SM 0.66 -> 0.79 | 0.81 -> 1.01, 24 per SM 0.78 -> 0.86 | 0.85 -> 1.00;
// bf16 4096 steps, 8 per SM 0.76 -> 0.81 | 0.77 -> 0.91; float32 2048 steps, 4 per SM 0.70 -> 0.84 |
// 0.84 -> 1.07, 24 per SM 0.80 -> 0.92 | 0.92 -> 1.02; float32 4096 steps, 32 per SM 0.90 -> 0.94
// forward (its backward keeps the walk: 0.93 against 0.92); the H100 alike (bf16 4096 steps, 8 per
// SM 0.79 -> 0.92 | 0.85 -> 1.04). Rows a tile holds with room to spare lose (1536 or 3000 steps:
// 0.35-0.75 of the walk), so only whole tiles.
inline int whole_row_tile(const ScanParams& p, int elem_size, const DeviceInfo& dev) {
  if (dev.cc_major < 9 || p.num_seq < 4 * int64_t(dev.num_sms) || p.num_seq > 64 * int64_t(dev.num_sms)) return -1;
  constexpr int kTile2048 = 3, kTile4096 = 2;  // in both tables (configs.h)
  static_assert(kTileConfigs4B[kTile2048].tile() == 2048 && kTileConfigs2B[kTile2048].tile() == 2048 &&
                    kTileConfigs4B[kTile4096].tile() == 4096 && kTileConfigs2B[kTile4096].tile() == 4096,
                "the whole-row tiles");
  if (p.len == 2048) return kTile2048;
  if (p.len == 4096 && !(p.backward && elem_size == 4)) return kTile4096;
  return -1;
}

inline void plan_stream(ScanPlan& plan, const ScanParams& p, int elem_size, int config) {
  const StreamConfig cfg = stream_config(elem_size, config);
  plan.kind = ScanKind::kStream;
  plan.config = config;
  plan.grid = p.num_seq;
  plan.num_chunks = ceil_div(p.len, cfg.tile());
  plan.per_chunk = plan.num_chunks;
  const unsigned outs =
      p.backward ? (1u << kGradIn) | (p.accumulate_grad_coeff ? 0u : 1u << kGradCoeff) : 1u << kOut;
  plan.bulk_mask = cfg.bulk_store ? plan.vec_mask & outs : 0u;
}

// Persistent ring blocks (as many as fit, at most one per tile) over every tile of every sequence.
inline void plan_ring(ScanPlan& plan, const ScanParams& p, int elem_size, const DeviceInfo& dev, int config) {
  const RingConfig cfg = ring_config(elem_size, config);
  plan.kind = ScanKind::kRing;
  plan.config = config;
  plan.num_chunks = ceil_div(p.len, cfg.tile());
  plan.per_chunk = 1;
  plan.grid = std::min<int64_t>(int64_t(dev.num_sms) * cfg.blocks, p.num_seq * plan.num_chunks);
}

// Whether the channel blocks of config `cfg` walk L one span after the other ("pipe", no
// look-back): when they alone fill two waves (3/4 of one for a prefetching config, whose blocks
// keep their loads in flight along L: in the backward, blocks of at most 256 threads; its launch
// bounds ask half the blocks per SM).
inline bool channel_pipe(const ScanParams& p, const DeviceInfo& dev, const ChannelConfig& cfg) {
  const int64_t seq_blocks = ceil_div(p.num_seq, cfg.channels());
  if (cfg.prefetch && (!p.backward || cfg.rows <= 8))
    return 4 * seq_blocks >= 3 * int64_t(dev.num_sms) * cfg.blocks_per_sm(p.backward);
  return seq_blocks >= 2 * int64_t(dev.num_sms) * cfg.min_blocks;
}

// Whether a default may take the prefetching channel config `cfg` where channel_pipe lets its
// blocks walk L. The 8-lane configs (configs.h: a quarter of the channels per block, so enough
// blocks to walk L where the 32-lane blocks chain spans by look-back), H200, of torch.add, look-back
// default -> 8 lanes (bench/NOTES.md item 81): the float32 backward gains from 3/4 of a wave of blocks
// on (4 x 2048 x 1000 0.63 -> 0.88, 4 x 2048 x 1536 at 1.45 waves 0.66 -> 0.80, 4 x 4096 x 2048 0.67
// -> 0.92); the forwards where the blocks fit one wave (float32 2 x 16384 x 1024 0.79 -> 0.83, bf16
// 4 x 4096 x 2048 0.72 -> 0.78), the 2-byte forward also from 7/4 waves (bf16 8 x 4096 x 2048 0.76
// -> 0.80, 8 x 2048 x 2560 0.75 -> 0.79, 32 x 512 x 768 0.70 -> 0.73). With a partial second wave
// the forward's walks lose (fp16 12 x 6144 x 1024 0.74 -> 0.66, float32 3 x 2048 x 1024 0.74 ->
// 0.69; the float32 forward at 2-3 waves too, 6 x 2048 x 1024 0.80 -> 0.76), and a 2-byte block's
// 64-byte accesses lose on rows not 128-byte aligned at any count measured (bf16 D = 1000: 0.58-0.61
// against 0.67-0.70).
// The 2-byte backward (item 82): the 8-lane blocks of one per SM and 256-step spans walk wherever
// they run 8 spans or more (bf16 8 x 8192 x 1024 0.73 -> 0.85, 3 x 4096 x 4096 0.70 -> 0.84, fp16
// 12 x 6144 x 1024 0.70 -> 0.85, bf16 6 x 4096 x 3072 0.55 -> 0.76), else where they fit one wave;
// those of two per SM and 128-step spans on shorter rows (24 x 1024 x 1024 0.75 -> 0.82, 32 x 512 x
// 768 0.78 -> 0.83; they lose to the former from 2048 steps, 3 x 4096 x 4096 0.72 against 0.84). The
// 32-lane blocks whose last wave is less than 3/4 full yield, on rows the 8-lane blocks take: to them
// (one per SM: 8 x 2048 x 2560 at 1.21 waves 0.63 -> 0.80, 12 x 2048 x 2048 at 1.45 0.74 -> 0.79) or
// to the 32-lane ones of one per SM (two per SM at 1.45 waves, 48 x 1024 x 1024: 0.80 -> 0.90 with
// one per SM at 2.9); with full waves they stay ahead (16 x 2048 x 1024 at 0.97 waves 0.91 against
// 0.80 with 8 lanes).
inline bool channel_lanes_default(const ScanParams& p, int elem_size, const DeviceInfo& dev, const ChannelConfig& cfg) {
  const int64_t wave = int64_t(dev.num_sms) * cfg.blocks_per_sm(p.backward);
  const int64_t blocks = ceil_div(p.num_seq, cfg.channels());
  const bool lanes8_rows = elem_size == 4 || channel_groups(p, elem_size, 128 / elem_size);
  if (elem_size == 2 && p.backward) {
    if (cfg.lanes == 32) return !lanes8_rows || 4 * blocks >= 3 * ceil_div(blocks, wave) * wave;
    return lanes8_rows && (cfg.blocks_per_sm(true) > 1 || blocks <= wave || p.len >= 8 * cfg.span());
  }
  if (cfg.lanes == 32 || (elem_size == 4 && p.backward)) return true;
  if (!lanes8_rows) return false;
  return blocks <= wave || (elem_size == 2 && !p.backward && 4 * blocks >= 7 * wave);
}

inline void plan_channel(ScanPlan& plan, const ScanParams& p, int elem_size, const DeviceInfo& dev, int config) {
  const ChannelConfig cfg = channel_config(elem_size, config);
  plan.kind = ScanKind::kChannel;
  plan.config = config;
  const int64_t spans = ceil_div(p.len, cfg.span());
  const int64_t seq_blocks = ceil_div(p.num_seq, cfg.channels());
  if (spans == 1 || channel_pipe(p, dev, cfg) || p.deterministic) {
    plan.num_chunks = 1;
    plan.per_chunk = spans;
  } else {  // every span its own block, chained by look-back
    plan.num_chunks = spans;
    plan.per_chunk = 1;
  }
  plan.grid = seq_blocks * plan.num_chunks;
}

// The small stream config (configs.h: 128 threads, two stages of 2048 2-byte or 1024 4-byte steps,
// 24 KB of shared memory in the forward: 8 blocks per SM) for aligned rows of mid length at 2 to 24
// per SM, on Hopper GPUs whose DRAM gives each SM more than kFastDramGbpsPerSm (measured on the H200
// only; the H100 keeps its plans): one wave of these blocks holds every row with its loads in flight,
// where the defaults' larger stream blocks (2 per SM), look-back tiles or walks leave part of it idle.
// Where it pays (H200, ratio to torch.add; bench/NOTES.md items 79, 80, 83, 84, 86 give the figures):
// - forward 4-byte, 2048 < L <= 8192 at 2-24 rows per SM (float32 1000 x 4608 0.69 -> 0.91), 8192 <
//   L <= 16384 at 2-8 (600 x 12288 0.82 -> 0.90); it loses at one or two rows per SM (132 x 8192
//   0.75 -> 0.63) and is level or lower beyond (longer rows from 16 per SM, beyond 8192 steps from 9);
// - forward 2-byte, 4096 < L <= 32768 at 2-9 rows per SM, to 8 beyond 12288 steps (one wave of these
//   blocks; bf16 1000 x 14000 0.65-0.69 -> 0.82-0.86), and 8192 < L <= 16384 from 9 per SM (2000 x
//   10000 0.59 -> 0.78); not shorter rows (1000 x 3000 0.80 -> 0.61), nor a second wave beyond 12288
//   steps (1100 x 24576 0.75 against 0.86 with 256 threads);
// - backward 4-byte, 2048 < L <= 16384 at 2-8 rows per SM where the default does not walk (float32
//   1000 x 3000 0.57 -> 0.89);
// - backward 2-byte, L <= 32768 at 2-16 rows per SM where the default takes a stream block per row
//   (bf16 1056 x 8192 0.55 -> 0.81) or rows of whole small stream tiles beyond 4096 steps (300 x 8192
//   0.72 -> 0.82 against look-back tiles); a partial last tile loses (600 x 10000 0.76 -> 0.72).
inline bool small_stream_device(const DeviceInfo& dev) {
  return dev.cc_major == 9 && dev.dram_gbps_per_sm > kFastDramGbpsPerSm;
}
inline bool small_stream_rows(const ScanParams& p, int elem_size, const DeviceInfo& dev, const ScanPlan& plan) {
  if (!small_stream_device(dev) || whole_row_tile(p, elem_size, dev) >= 0 ||
      !config_applies(p, elem_size, dev, ScanKind::kStream, kStreamSmall))
    return false;
  const int64_t L = p.len, rows = p.num_seq, sms = dev.num_sms;
  if (p.backward && elem_size == 2)
    return rows >= 2 * sms && rows <= 16 * sms && L <= 32768 &&
           (plan.kind == ScanKind::kStream || (L > 4096 && L % stream_config(2, kStreamSmall).tile() == 0));
  if (rows <= 2 * sms) return false;
  if (p.backward) return L > 2048 && L <= 16384 && rows < 8 * sms;
  if (elem_size == 4) return L > 2048 && (L <= 8192 ? rows <= 24 * sms : L <= 16384 && rows <= 8 * sms);
  return (L > 4096 && L <= 32768 && rows <= (L > 12288 ? 8 : 9) * sms) || (L > 8192 && L <= 16384 && rows > 9 * sms);
}

// The default plan of a problem whose scanned dim is innermost (before small_stream_rows).
inline void plan_innermost(ScanPlan& plan, const ScanParams& p, int elem_size, const DeviceInfo& dev,
                           const ScanDefaults& def) {
  if (const int whole = whole_row_tile(p, elem_size, dev); whole >= 0) {
    plan_tile(plan, p, elem_size, dev, whole, def.tile_lookback, def.tile_walk);
    return;
  }
  const bool stream_ok = def.stream >= 0 && config_applies(p, elem_size, dev, ScanKind::kStream, def.stream);
  if (stream_whole_rows(p, elem_size, dev, def, stream_ok)) {
    plan_stream(plan, p, elem_size, def.stream_short);
    return;
  }
  const bool walk_many = walk_over_lookback(p, elem_size, dev, def, stream_ok);
  // 1024-step look-back tiles where neither the walk nor the stream kernel suits the rows.
  // (Not for rows plan_tile walks from fewer rows per SM: walk_min_rows.)
  const bool walks = walk_many && p.num_seq >= walk_min_rows(p, elem_size, dev);
  const bool lookback_1024 = backward_lookback_1024(p, elem_size, dev, def, walk_many) ||
                             (short_stream_rows(p, elem_size, dev, def, stream_ok) && !walks);
  const int tile_1024 = elem_size == 4 ? kTile4B8x128 : p.backward ? kTile2B16x64 : kTile2B32x32;
  plan_tile(plan, p, elem_size, dev, lookback_1024 ? tile_1024 : -1, def.tile_lookback,
            walk_tile(p, elem_size, dev, def.tile_walk), walk_many);
  // The ring instead of one block per tile, once its tiles outnumber its blocks (so that a
  // block's ring has tiles to overlap).
  const bool ring = !lookback_1024 && plan.num_chunks > 1 && def.ring >= 0 &&
                    p.num_seq * ceil_div(p.len, ring_config(elem_size, def.ring).tile()) >= 2 * dev.num_sms &&
                    config_applies(p, elem_size, dev, ScanKind::kRing, def.ring);
  // The stream kernel instead for about as many sequences as SMs (a block for at least 3/4 of
  // them), unless the device prefers the ring for rows this long: the look-back reached ~0.55
  // of torch.add on few-long (H200).
  const bool ring_preferred = ring && def.ring_over_stream_len > 0 && p.len >= def.ring_over_stream_len;
  if (!lookback_1024 && plan.num_chunks > 1 && 4 * p.num_seq >= 3 * dev.num_sms && stream_ok && !ring_preferred)
    plan_stream(plan, p, elem_size, stream_default(p, elem_size, dev, def));
  else if (ring)
    plan_ring(plan, p, elem_size, dev, def.ring);
}

// Plans the launch. An explicit request (`req.index >= 0`) that does not apply sets `*error` (the
// caller raises it, listing applicable_config_names) unless `req.prefer`.
inline ScanPlan plan_scan(const ScanParams& p, int elem_size, const DeviceInfo& dev, ConfigRequest req,
                          bool* inapplicable) {
  ScanPlan plan{};
  *inapplicable = false;
  if (req.index >= 0 && !config_applies(p, elem_size, dev, req.kind, req.index)) {
    if (!req.prefer) {
      *inapplicable = true;
      return plan;
    }
    req.index = -1;
  }
  const bool channel = is_channel_layout(p);
  // A tuned choice ("auto") yields to the small stream blocks where they apply: the shipped caches
  // were tuned before them (H200 float32 1000 x 3000 forward+backward, CUDA graph: 0.037 ms by
  // default against 0.049 with the cache's tile.e16t128 backward; bench/NOTES.md item 79). A
  // config the caller names, or prefers, runs as named.
  if (req.tuned && req.index >= 0 && !channel && small_stream_device(dev) &&
      config_applies(p, elem_size, dev, ScanKind::kStream, kStreamSmall)) {
    const ScanPlan by_default = plan_scan(p, elem_size, dev, ConfigRequest{}, inapplicable);
    if (by_default.kind == ScanKind::kStream && by_default.config == kStreamSmall) return by_default;
  }
  const ScanDefaults def = device_defaults(dev, elem_size, p.backward, channel ? channel_group_width(p, elem_size) : 1);
  if (channel) {
    int config = req.index >= 0 ? req.index : def.channel;
    if (req.index < 0 && def.channel_wide >= 0) {
      const int64_t blocks = ceil_div(p.num_seq, channel_config(elem_size, def.channel_wide).channels());
      if (blocks >= 32) config = def.channel_wide;
      else if (blocks >= 2 && def.channel_mid >= 0) config = def.channel_mid;
    }
    if (req.index < 0)
      for (const int pipe : def.channel_pipe)  // the first prefetching config whose blocks walk L
        if (pipe >= 0 && channel_pipe(p, dev, channel_config(elem_size, pipe)) &&
            channel_lanes_default(p, elem_size, dev, channel_config(elem_size, pipe))) {
          config = pipe;
          break;
        }
    plan_channel(plan, p, elem_size, dev, config);
  } else {
    plan.vec_mask = vector_slots(p, elem_size);
    if (req.index >= 0 && req.kind == ScanKind::kStream) {
      plan_stream(plan, p, elem_size, req.index);
    } else if (req.index >= 0 && req.kind == ScanKind::kRing) {
      plan_ring(plan, p, elem_size, dev, req.index);
    } else if (req.index >= 0) {
      plan_tile(plan, p, elem_size, dev, req.index, def.tile_lookback, def.tile_walk);
    } else {
      plan_innermost(plan, p, elem_size, dev, def);
      if (small_stream_rows(p, elem_size, dev, plan)) {
        plan = ScanPlan{};
        plan.vec_mask = vector_slots(p, elem_size);
        plan_stream(plan, p, elem_size, kStreamSmall);
      }
    }
  }
  if ((plan.num_chunks > 1 && plan.kind != ScanKind::kStream) || plan.kind == ScanKind::kRing) {
    // look-back: a counter (16 bytes), then two status words per (sequence, chunk)
    plan.workspace_bytes = 16 + static_cast<size_t>(p.num_seq * plan.num_chunks) * 16;
  }
  return plan;
}

}  // namespace linrec
