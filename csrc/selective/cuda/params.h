// Arguments of the CUDA selective-scan kernels (torch-free: host code fills it from tensors).
//
// u, delta, z, out and their gradients are (batch, dim, len) with any int64 strides. B and C come
// transposed and padded by the host: (batch, groups, len, nstate_pad) float32 contiguous, so the
// states a thread owns at one step are adjacent (vector loads, the same address for every channel
// of a group; launch_step_major in launch.h makes them). The kernels read A (dim, nstate) and take
// A log2(e) for their exp2, zero for padded states (which keep h = 0).
#pragma once
#include <cstdint>

namespace linrec {

struct Strided3 {  // a (batch, dim, len) tensor
  void* p = nullptr;
  int64_t sb = 0, sd = 0, sl = 0;
};

struct SelectiveParams {
  int64_t batch = 0, dim = 0, len = 0, nstate = 0, nstate_pad = 0;
  int64_t groups_b = 1, groups_c = 1;  // channel groups of B and of C (each divides dim)
  bool softplus = false;
  Strided3 u, delta, z, out;       // z.p null: no gating
  const float* B = nullptr;        // (batch, groups_b, len, nstate_pad)
  const float* C = nullptr;        // (batch, groups_c, len, nstate_pad)
  const float* A = nullptr;        // (dim, nstate) contiguous
  const float* D = nullptr;        // (dim) or null
  const float* delta_bias = nullptr;
  const float* h0 = nullptr;       // (batch, dim, nstate) contiguous, or null
  float* last = nullptr;           // (batch, dim, nstate) contiguous, or null
  float* ckpt = nullptr;           // (batch, dim, nchunks, nstate_pad): the state after each chunk, or null
  int64_t chunk = 32;              // steps per tile: selective_tile_steps(nstate_pad)
  // Backward only.
  Strided3 dout, du, ddelta, dz;   // dz.p null when z is
  const float* dlast = nullptr;    // (batch, dim, nstate) contiguous, or null
  float* dA = nullptr;             // (dim, nstate) contiguous, accumulated with atomics (zeroed by the host)
  float* dB = nullptr;             // like B, accumulated with atomics (zeroed by the host)
  float* dC = nullptr;             // like C
  float* dD = nullptr;             // (dim) or null, accumulated
  float* ddelta_bias = nullptr;    // (dim) or null, accumulated
  float* dh0 = nullptr;            // (batch, dim, nstate) contiguous, or null
};

// Steps per tile: the kernels stage a tile's B and C in shared memory (double-buffered: 4 x tile x
// nstate_pad floats, 64 KiB at most), and the backward checkpoints the states after every tile.
constexpr int64_t selective_tile_steps(int64_t nstate_pad) { return nstate_pad <= 128 ? 32 : 16; }

// Where the kernels' tile loader may use 16-byte loads (host-checked for every row it reads): along
// steps (unit step stride, 16-byte aligned rows) or along channels (unit channel stride, 16-byte
// aligned batch and step strides and base).
enum TileLoads : int { kScalarLoads = 0, kStepVectors = 1, kChannelVectors = 2 };

enum class SelectiveDType : int { kFloat32, kFloat16, kBFloat16 };

// Launch shape: `states_per_thread` states of one channel per thread, nstate_pad / states_per_thread
// threads per channel (a power of two, at most 32: one warp; at most 16 in the forward at N_pad = 256).
struct SelectiveLaunch {
  int states_per_thread = 16;
  bool vector_stores = false;  // out has unit step stride and 16-byte aligned rows
  int loads = 0;               // TileLoads: how the per-step inputs may be read (16-byte vectors or not)
};

}  // namespace linrec
