// The selective-scan kernels' layout passes (declared in launch.h): B and C into the step-major
// float32 rows the kernels stage, and the backward's dB and dC accumulators back into the inputs'
// layout and dtype. Each is one launch for both tensors (and the accumulators' zero fill): as
// separate ATen copies, fills and casts they were about 15 launches per forward+backward, ~25 us on
// the H100 at the Mamba-370m shape (bench/NOTES.md item 35).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "launch.h"

namespace linrec {
namespace selective {
namespace {

constexpr int kTile = 32;  // steps x states of a block's transposed tile
constexpr int kRowsPerPass = 8;

__device__ __forceinline__ float load_as_float(const StateRows& t, int64_t off) {
  switch (t.dtype) {
    case SelectiveDType::kFloat16: return __half2float(static_cast<const __half*>(t.p)[off]);
    case SelectiveDType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(t.p)[off]);
    default: return static_cast<const float*>(t.p)[off];
  }
}

__device__ __forceinline__ void store_from_float(const StateRows& t, int64_t off, float v) {
  switch (t.dtype) {
    case SelectiveDType::kFloat16: static_cast<__half*>(t.p)[off] = __float2half_rn(v); break;
    case SelectiveDType::kBFloat16: static_cast<__nv_bfloat16*>(t.p)[off] = __float2bfloat16_rn(v); break;
    default: static_cast<float*>(t.p)[off] = v;
  }
}

// A block's tile: steps x * kTile .., row y = (batch, group) of tensor z (B or dB: 0; C or dC: 1),
// from a one-dimensional grid of tiles x rows x 2 blocks (no grid.y limit on batch x groups).
struct TileId {
  int x, y;  // int: the grid has at most 2^31 - 1 blocks (the launcher checks), so 32-bit divisions
  bool is_c;
};
__device__ __forceinline__ TileId tile_id(int64_t len, int64_t rows) {
  const int tiles = static_cast<int>((len + kTile - 1) / kTile), r = static_cast<int>(rows), id = blockIdx.x;
  return {id % tiles, (id / tiles) % r, id / tiles / r == 1};
}

// rows[bg, l, n] = t[b, g, n, l] over steps l0 .. l0 + kTile and every padded state (0 for
// n >= nstate); the same elements of `zero` (if not null) set to 0.
__device__ __forceinline__ void transpose_in(const StateRows& t, float* rows, float* zero, int64_t bg, int64_t l0,
                                             const StepMajorArgs& a, float (&tile)[kTile][kTile + 1]) {
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int groups = static_cast<int>(t.groups);  // divides rows, which fits an int
  const int64_t b = static_cast<int>(bg) / groups, g = static_cast<int>(bg) % groups;
  for (int64_t n0 = 0; n0 < a.nstate_pad; n0 += kTile) {
    for (int k = ty; k < kTile; k += kRowsPerPass) {
      const int64_t n = n0 + k, l = l0 + tx;
      tile[k][tx] = n < a.nstate && l < a.len ? load_as_float(t, b * t.sb + g * t.sg + n * t.sn + l * t.sl) : 0.f;
    }
    __syncthreads();
    for (int s = ty; s < kTile; s += kRowsPerPass) {
      const int64_t l = l0 + s, n = n0 + tx;
      if (l < a.len && n < a.nstate_pad) {
        const int64_t off = (bg * a.len + l) * a.nstate_pad + n;
        rows[off] = tile[tx][s];
        if (zero) zero[off] = 0.f;
      }
    }
    __syncthreads();
  }
}

// B and C to step-major rows (transpose_in per tile), the accumulators zeroed alongside; the grid's
// threads together zero the `fill` ranges. 8 blocks per SM (32 registers, no spills): the Mamba-370m
// shape's 1024 tiles run in one wave.
__global__ void __launch_bounds__(kTile * kRowsPerPass, 8) step_major_kernel(StepMajorArgs a) {
  __shared__ float tile[kTile][kTile + 1];
  if (a.len > 0 && a.rows > 0) {  // else a single block that runs only the fills
    const TileId id = tile_id(a.len, a.rows);
    const StateRows& t = id.is_c ? a.C : a.B;
    float* rows = id.is_c ? a.C_rows : a.B_rows;
    float* zero = id.is_c ? a.dC_zero : a.dB_zero;
    const int64_t bg = id.y, l0 = id.x * kTile;
    if (bg < a.batch * t.groups) transpose_in(t, rows, zero, bg, l0, a, tile);
  }
  const int64_t blocks = gridDim.x, block = blockIdx.x;
  for (int f = 0; f < kMaxFills; ++f)
    for (int64_t i = block * blockDim.x + threadIdx.x; i < a.fill_numel[f]; i += blocks * blockDim.x)
      a.fill[f][i] = 0.f;
}

// dB and dC from the backward's step-major accumulators: t[b, g, n, l] = rows[bg, l, n] for
// n < nstate, converted to t's dtype, a tile per block.
__global__ void __launch_bounds__(kTile * kRowsPerPass, 8) states_last_kernel(StatesLastArgs a) {
  __shared__ float tile[kTile][kTile + 1];
  const TileId id = tile_id(a.len, a.rows);
  const StateRows& t = id.is_c ? a.dC : a.dB;
  const float* rows = id.is_c ? a.dC_rows : a.dB_rows;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t bg = id.y, l0 = id.x * kTile;
  if (bg >= a.batch * t.groups) return;
  const int groups = static_cast<int>(t.groups);
  const int64_t b = static_cast<int>(bg) / groups, g = static_cast<int>(bg) % groups;
  for (int64_t n0 = 0; n0 < a.nstate; n0 += kTile) {
    for (int s = ty; s < kTile; s += kRowsPerPass) {
      const int64_t l = l0 + s, n = n0 + tx;
      tile[s][tx] = l < a.len && n < a.nstate ? rows[(bg * a.len + l) * a.nstate_pad + n] : 0.f;
    }
    __syncthreads();
    for (int k = ty; k < kTile; k += kRowsPerPass) {
      const int64_t n = n0 + k, l = l0 + tx;
      if (n < a.nstate && l < a.len) store_from_float(t, b * t.sb + g * t.sg + n * t.sn + l * t.sl, tile[tx][k]);
    }
    __syncthreads();
  }
}

// Blocks of the one-dimensional grid: a tile per (32 steps, (batch, group) row, tensor); 0 when there
// is nothing to transpose, -1 past the grid's limit.
int64_t blocks_of(int64_t batch, int64_t len, int64_t groups_b, int64_t groups_c, int64_t* rows) {
  *rows = batch * (groups_b > groups_c ? groups_b : groups_c);
  const int64_t blocks = (len + kTile - 1) / kTile * *rows * 2;
  return blocks > 0x7fffffff ? -1 : blocks;
}

}  // namespace
}  // namespace selective

cudaError_t launch_step_major(StepMajorArgs a, cudaStream_t stream) {
  const int64_t blocks = selective::blocks_of(a.batch, a.len, a.B.groups, a.C.groups, &a.rows);
  if (blocks < 0) return cudaErrorInvalidConfiguration;
  // With nothing to transpose one block still runs the fills (and skips the tile).
  selective::step_major_kernel<<<blocks > 0 ? blocks : 1, selective::kTile * selective::kRowsPerPass, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_states_last(StatesLastArgs a, cudaStream_t stream) {
  const int64_t blocks = selective::blocks_of(a.batch, a.len, a.dB.groups, a.dC.groups, &a.rows);
  if (blocks < 0) return cudaErrorInvalidConfiguration;
  if (blocks == 0) return cudaSuccess;
  selective::states_last_kernel<<<blocks, selective::kTile * selective::kRowsPerPass, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace linrec
