// Every compiled config of the four CUDA scan templates, by name. Host-only and torch-free.
//
// A config is a compile-time instantiation of a kernel template; the launcher turns the run-time
// index into the template arguments (launch.cuh). Which config runs is decided per device at run
// time (plan.h: the defaults of configs_sm90.h or configs_generic.h, or an explicit name) from the
// device's compute capability, SM count and shared memory per block. Names are
// "<template>.<fields>" and stable: the tuned config cache (torch_linrec/configs) stores them.
// Why each entry exists, and its measurements: bench/NOTES.md.
#pragma once
#include <cstddef>
#include <cstdint>

namespace linrec {

enum class ScanKind : int { kTile = 0, kChannel = 1, kStream = 2, kRing = 3 };
// In the order the config names are listed (and matched).
constexpr ScanKind kAllKinds[] = {ScanKind::kTile, ScanKind::kStream, ScanKind::kRing, ScanKind::kChannel};

// Tile kernel (scanned dim innermost): E elements per thread, NT threads per block. Every thread
// moves whole 16-byte vectors, at least two per tensor (one left bf16 L=1024 at 0.78 of torch.add).
struct TileConfig {
  const char* name;
  int elems, threads;
  constexpr int64_t tile() const { return int64_t(elems) * threads; }
};
// 4-byte: 256-step tiles for short rows, 1024 for the common L=1024 in one tile, 4096 for long
// rows; then a 2048-step tile, a 1024-step tile of fewer threads, and the 512-step tile of two
// warps that blocks walking many rows take (plan_tile).
constexpr TileConfig kTileConfigs4B[] = {
    {"tile.e8t32", 8, 32},    {"tile.e8t128", 8, 128}, {"tile.e16t256", 16, 256}, {"tile.e16t128", 16, 128},
    {"tile.e16t64", 16, 64}, {"tile.e8t64", 8, 64}};
// 2-byte: the same tile sizes with twice the steps per thread (the 512-step tile: one warp).
constexpr TileConfig kTileConfigs2B[] = {
    {"tile.e16t16", 16, 16},  {"tile.e32t32", 32, 32}, {"tile.e32t128", 32, 128}, {"tile.e32t64", 32, 64},
    {"tile.e16t64", 16, 64}, {"tile.e16t32", 16, 32}};
constexpr int kNumTileConfigs = 6;
// The walking tile of the defaults (configs_sm90.h), also the only one compiled for segmented rows.
constexpr int kTileWalk = 5;
constexpr TileConfig tile_config(int elem_size, int i) {
  return elem_size == 2 ? kTileConfigs2B[i] : kTileConfigs4B[i];
}

// Channel kernel (scanned dim not innermost): ROWS warps, CPL adjacent channels per lane,
// STEPS steps per thread, at least MIN_BLOCKS blocks per SM in the forward (half in the backward).
// LANES lanes share a step: a warp holds 32 / LANES consecutive runs of STEPS steps of LANES * CPL
// channels (fewer channels per block, hence more blocks: enough to walk L without look-back on
// fewer channels). A span of ROWS x (32 / LANES) x STEPS steps shares one look-back status per channel.
struct ChannelConfig {
  const char* name;
  int steps, rows, min_blocks, cpl;
  bool prefetch = false;  // a block walking its channels along L loads the next span early
  int lanes = 32;
  constexpr int threads() const { return 32 * rows; }
  constexpr int64_t span() const { return int64_t(steps) * rows * (32 / lanes); }
  constexpr int64_t channels() const { return int64_t(lanes) * cpl; }
  // Resident blocks per SM its launch bounds ask for (the kernel's: half in the backward).
  constexpr int blocks_per_sm(bool backward) const { return backward ? (min_blocks + 1) / 2 : min_blocks; }
};
// One channel per lane (any channel stride); a pair per lane; then groups of up to 16 bytes per
// lane (4 float32 / 4 or 8 16-bit channels) with fewer steps per thread to keep the registers; the
// prefetching configs, then the same with 8 lanes per step (64- or 128-byte accesses per step).
// The tables have equal lengths and differ from index 5 on.
constexpr ChannelConfig kChannelConfigs4B[] = {
    {"channel.s16r8b2", 16, 8, 2, 1},     {"channel.s16r4b5", 16, 4, 5, 1},  {"channel.s32r4b3", 32, 4, 3, 1},
    {"channel.s32r2b6", 32, 2, 6, 1},     {"channel.s8r16b1p2", 8, 16, 1, 2}, {"channel.s16r8b2p2", 16, 8, 2, 2},
    {"channel.s8r8b2c4", 8, 8, 2, 4},     {"channel.s4r8b3c4", 4, 8, 3, 4},  {"channel.s16r4b2c4", 16, 4, 2, 4},
    {"channel.s8r16b1p2.pipe", 8, 16, 1, 2, true}, {"channel.s4r8b2c4.pipe", 4, 8, 2, 4, true},
    {"channel.s8r16b1p2l8.pipe", 8, 16, 1, 2, true, 8}, {"channel.s4r8b2c4l8.pipe", 4, 8, 2, 4, true, 8}};
constexpr ChannelConfig kChannelConfigs2B[] = {
    {"channel.s16r8b2", 16, 8, 2, 1},     {"channel.s16r4b5", 16, 4, 5, 1},  {"channel.s32r4b3", 32, 4, 3, 1},
    {"channel.s32r2b6", 32, 2, 6, 1},     {"channel.s8r16b1p2", 8, 16, 1, 2}, {"channel.s16r8b2c4", 16, 8, 2, 4},
    {"channel.s8r8b2c4", 8, 8, 2, 4},     {"channel.s16r4b3c4", 16, 4, 3, 4}, {"channel.s8r8b2c8", 8, 8, 2, 8},
    {"channel.s8r8b2c4.pipe", 8, 8, 2, 4, true}, {"channel.s4r8b3c4.pipe", 4, 8, 3, 4, true},
    {"channel.s8r8b2c4l8.pipe", 8, 8, 2, 4, true, 8}, {"channel.s4r8b3c4l8.pipe", 4, 8, 3, 4, true, 8}};
constexpr int kNumChannelConfigs = 13;
static_assert(sizeof(kChannelConfigs4B) / sizeof(ChannelConfig) == kNumChannelConfigs &&
                  sizeof(kChannelConfigs2B) / sizeof(ChannelConfig) == kNumChannelConfigs,
              "channel config tables of equal lengths");
constexpr ChannelConfig channel_config(int elem_size, int i) {
  return elem_size == 2 ? kChannelConfigs2B[i] : kChannelConfigs4B[i];
}

// Shared memory of one staged tile of the stream and ring kernels: its inputs (x or grad_y, coeffs,
// and y in the backward), each with two 128-byte halo slots in the backward (StreamShape).
constexpr size_t staged_tile_bytes(int64_t tile, int elem_size, bool backward) {
  return backward ? 3 * (size_t(tile) * elem_size + 256) : 2 * size_t(tile) * elem_size;
}

// Stream kernel (Hopper: bulk copies): one block per sequence, E x NT steps per tile, tiles
// staged STAGES ahead (forward / backward). `bulk_store`: full output tiles leave through shared
// memory by bulk stores (else stored from registers).
struct StreamConfig {
  const char* name;
  int elems, threads, stages_forward, stages_backward;
  bool bulk_store;
  constexpr int64_t tile() const { return int64_t(elems) * threads; }
  constexpr int stages(bool backward) const { return backward ? stages_backward : stages_forward; }
  // Dynamic shared memory: stages x inputs (2 forward, 3 backward) x tile (backward: plus two
  // 128-byte halo slots), two tiles of each output (1 forward, 2 backward) for the bulk stores,
  // and up to 128 bytes to align them.
  constexpr size_t smem_bytes(int elem_size, bool backward) const {
    return size_t(stages(backward)) * staged_tile_bytes(tile(), elem_size, backward) +
           size_t(2) * (backward ? 2 : 1) * size_t(tile()) * elem_size + 128;
  }
};
// 16 KB tiles (4096 float32 steps) or 8 KB; the 512-thread entry hides the per-tile latency
// with twice the warps; the last, 4 KB tiles of 128 threads in two stages, is the small block
// (24 KB of shared memory in the forward) that mid-length rows take (plan.h `small_stream_rows`).
constexpr StreamConfig kStreamConfigs4B[] = {
    {"stream.e16t256s4", 16, 256, 4, 3, true}, {"stream.e16t256s3", 16, 256, 3, 2, true},
    {"stream.e8t256s6", 8, 256, 6, 4, true},   {"stream.e8t256s4", 8, 256, 4, 3, true},
    {"stream.e8t512s4", 8, 512, 4, 3, true},   {"stream.e8t512s4.direct", 8, 512, 4, 3, false},
    {"stream.e8t128s2", 8, 128, 2, 2, true}};
constexpr StreamConfig kStreamConfigs2B[] = {
    {"stream.e32t256s4", 32, 256, 4, 3, true}, {"stream.e32t256s3", 32, 256, 3, 2, true},
    {"stream.e16t256s6", 16, 256, 6, 4, true}, {"stream.e16t256s4", 16, 256, 4, 3, true},
    {"stream.e16t512s4", 16, 512, 4, 3, true}, {"stream.e16t512s4.direct", 16, 512, 4, 3, false},
    {"stream.e16t128s2", 16, 128, 2, 2, true}};
constexpr int kNumStreamConfigs = 7;
// The small stream config (the last of both tables).
constexpr int kStreamSmall = 6;
constexpr StreamConfig stream_config(int elem_size, int i) {
  return elem_size == 2 ? kStreamConfigs2B[i] : kStreamConfigs4B[i];
}
// Static shared memory of the stream kernel besides its dynamic buffer (barriers, warp totals).
constexpr size_t kStreamStaticSharedMemory = 1024;

// Bytes of a ring slot besides its staged tile: record, five mbarriers, a prefix per consumer
// thread, the tile's aggregate and prefix, a total per consumer warp and their arrival count.
constexpr size_t kRingRecordBytes = 128;
constexpr size_t ring_slot_extra_bytes(int threads) {
  return kRingRecordBytes + 40 + 8 * size_t(threads) + 16 + 8 * size_t(threads / 32) + 8;
}

// Ring kernel (Hopper: bulk copies, warp-specialized): persistent blocks of NT consumer threads
// plus a producer and a look-back warp, E x NT steps per tile, a ring of slots (forward /
// backward) in shared memory; tiles of few long sequences chained by look-back. `blocks`: blocks
// per SM the grid assumes.
struct RingConfig {
  const char* name;
  int elems, threads, slots_forward, slots_backward, blocks;
  constexpr int64_t tile() const { return int64_t(elems) * threads; }
  constexpr int slots(bool backward) const { return backward ? slots_backward : slots_forward; }
  // Shared memory (all dynamic, laid out by scan_ring.cuh's RingLayout): per slot its staged tile
  // and ring_slot_extra_bytes; up to 128 bytes to align.
  constexpr size_t smem_bytes(int elem_size, bool backward) const {
    return size_t(slots(backward)) * (staged_tile_bytes(tile(), elem_size, backward) + ring_slot_extra_bytes(threads)) +
           128;
  }
};
// 16 KB tiles (4096 float32 steps) in a ring of ~220 KB over 512 consumer threads, or 256 (fewer
// warps to reduce and replay a tile); 8 KB tiles in twice the slots. 2-byte: 16 KB tiles over 512
// threads; 8 KB tiles over 256 threads, in twelve slots or two blocks of five per SM (32 steps per
// thread spill in the backward).
constexpr RingConfig kRingConfigs4B[] = {
    {"ring.e8t512s6", 8, 512, 6, 4, 1}, {"ring.e16t256s6", 16, 256, 6, 4, 1}, {"ring.e8t256s12", 8, 256, 12, 8, 1}};
constexpr RingConfig kRingConfigs2B[] = {
    {"ring.e16t512s6", 16, 512, 6, 4, 1}, {"ring.e16t256s12", 16, 256, 12, 8, 1}, {"ring.e16t256s5", 16, 256, 5, 3, 2}};
constexpr int kNumRingConfigs = 3;
constexpr RingConfig ring_config(int elem_size, int i) {
  return elem_size == 2 ? kRingConfigs2B[i] : kRingConfigs4B[i];
}
// Static shared memory of the ring kernel besides its dynamic buffer (none; a margin).
constexpr size_t kRingStaticSharedMemory = 256;

constexpr int num_configs(ScanKind kind) {
  return kind == ScanKind::kTile      ? kNumTileConfigs
         : kind == ScanKind::kChannel ? kNumChannelConfigs
         : kind == ScanKind::kStream  ? kNumStreamConfigs
                                      : kNumRingConfigs;
}
inline const char* config_name(ScanKind kind, int elem_size, int i) {
  switch (kind) {
    case ScanKind::kTile: return tile_config(elem_size, i).name;
    case ScanKind::kChannel: return channel_config(elem_size, i).name;
    case ScanKind::kStream: return stream_config(elem_size, i).name;
    case ScanKind::kRing: return ring_config(elem_size, i).name;
  }
  return "";
}

}  // namespace linrec
