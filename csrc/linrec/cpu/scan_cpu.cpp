// CPU kernel of linrec::scan and linrec::scan_backward.
//
// Three paths, chosen per call from the layout:
// - walk (scan_avx2.h): every operand contiguous along L (the (N, L) layout, either direction):
//   sequences two at a time, one per half vector, 4 steps per half with an in-register scan (the
//   pair walk; a lone sequence, a chunk of a split one and float32's backward: 8 steps per vector).
//   Each sequence streams its own contiguous runs (no group of 16 rows at a power-of-two stride
//   competing for the same cache sets, as the strided path's do). Short rows back to back without
//   `initial` walk in segments: blocks of whole rows as one sequence each (segment_rows).
// - rows (scan_avx2_rows.h): channels contiguous (the (B, L, D) layout): blocks of channels walk L, each
//   step one contiguous run per operand.
// - strided: any other layout, float64, or a CPU without AVX2: groups of 16 neighbouring sequences
//   advance side by side with scalar loads at their strides.
//
// Work items (sequences, channel blocks, groups) run in parallel with at::parallel_for. When the
// walk or rows path has fewer items than threads and each is long, every item is also split along
// L into one chunk more than the threads it gets, as in a chained scan: pass 1 scans the first
// chunk for good and summarises every other chunk but the last (the product of its coefficients
// and its final state from a zero state, read without writing); the summaries chain into each
// chunk's initial state; pass 2 scans the other chunks from it. That moves 5/3 of the bytes of
// one pass over the split chunks, so it pays only with more than one core really free.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../../common/errors.h"
#include "../ops.h"
#include "scan_avx2.h"
#include "scan_avx2_pairs.h"
#include "scan_avx2_rows.h"

namespace linrec {
namespace {

constexpr int64_t kGroup = 16;           // sequences per group of the strided path
constexpr int64_t kMinChunk = 1 << 14;   // fewest elements (steps x state width) of one chunk of a split
constexpr int64_t kGrainElems = 1 << 15; // fewest elements per parallel_for task
// The segmented walk's blocks (segment_rows): about kSegmentSteps steps each (this VM, in one process:
// 8192 ahead of 2048, 512 behind both).
constexpr int64_t kSegmentSteps = 8192;

// The first chunk's length relative to the others' in the chained split (pass 1 scans it beside the
// summaries of the others). This VM, 2 threads, interleaved in one process (bench/NOTES.md item 80):
// float32 1 x 2^22 forward 1.41 -> 1.20 ms, backward 2.21 -> 2.09 (best of 60); equal chunks or the
// shares that bytes alone predict (0.5 / 0.3) were slower.
constexpr double kFirstChunkForward = 0.7, kFirstChunkBackward = 0.55;

// The rows path (B, L, D) writes float32 outputs of at least this many bytes by non-temporal stores:
// no read for ownership of lines about to be overwritten. This VM (32 MiB L3), blocks of 12 calls of
// each variant taking turns in one process, median ms (bench/NOTES.md item 80): float32 1 x 4096 x
// 1024 (16 MiB) forward 1.43-1.44 -> 1.10-1.25, backward 2.15-2.40 -> 1.70-2.01; 8 x 1024 x 1024
// 2.65-2.72 -> 2.12-2.14 / 4.85-5.15 -> 3.74-3.85; at 8 MiB level or slower (1 x 1024 x 2048 forward
// 0.36-0.39 -> 0.36-0.46). Not 2-byte outputs (bf16 2 x 4096 x 1024 forward 1.33 -> 1.77 ms).
constexpr int64_t kStreamMinBytes = int64_t(16) << 20;

// Chunks per item of the chained split below (1: none): one more than the threads an item gets,
// where there are fewer items than threads and each has at least kMinChunk elements per chunk.
int64_t split_chunks(int64_t items, int64_t width, int64_t L) {
  const int64_t threads = at::get_num_threads();
  if (items >= threads || threads == 1) return 1;
  return std::max<int64_t>(1, std::min((threads + items - 1) / items + 1, L * width / kMinChunk));
}

// ---------------------------------------------------------------------------------------------
// The chained split, over `items` independent work items of `width` states each:
//   run(item, t0, t1, h, prod) advances the item's states h over steps [t0, t1) (with prod: only
//   summarises, see above); init(item, h) sets its initial states; end(item, h) gets the final
//   states of the item's last chunk; `backward`: the runs are the backward's (for chunk lengths).
template <typename Run, typename Init, typename End>
void chained(int64_t items, int64_t width, int64_t L, bool backward, const Run& run, const Init& init, const End& end) {
  const int64_t chunks = split_chunks(items, width, L);
  if (chunks == 1) {
    const int64_t grain = std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, L * width));
    at::parallel_for(0, items, grain, [&](int64_t begin, int64_t end_) {
      std::vector<float> h(width);
      for (int64_t i = begin; i < end_; ++i) {
        init(i, h.data());
        run(i, 0, L, h.data(), nullptr);
        end(i, h.data());
      }
    });
    return;
  }
  // Chunk 0 is `first` times as long as each of the others: its full scan in pass 1 runs beside
  // summaries, which move fewer bytes (they read two operands and write nothing).
  const double first = backward ? kFirstChunkBackward : kFirstChunkForward, tail = static_cast<double>(chunks - 1);
  auto bound = [&](int64_t k) {
    if (k == 0) return int64_t(0);
    if (k == chunks) return L;
    return static_cast<int64_t>(static_cast<double>(L) * (first + static_cast<double>(k - 1)) / (tail + first));
  };
  // Chunk k of item i: its initial states at state[(i * chunks + k) * width].
  std::vector<float> state(items * chunks * width, 0.f), last(items * chunks * width, 0.f),
      prod(items * chunks * width, 1.f);
  at::parallel_for(0, items * (chunks - 1), 1, [&](int64_t begin, int64_t end_) {
    for (int64_t j = begin; j < end_; ++j) {
      const int64_t i = j / (chunks - 1), k = j % (chunks - 1), off = (i * chunks + k) * width;
      if (k == 0) {  // the first chunk starts from the true initial state: scanned for good here
        init(i, &last[off]);
        std::fill(&prod[off], &prod[off] + width, 0.f);
        run(i, bound(0), bound(1), &last[off], nullptr);
      } else {
        run(i, bound(k), bound(k + 1), &last[off], &prod[off]);
      }
    }
  });
  for (int64_t i = 0; i < items; ++i)
    for (int64_t k = 1; k < chunks; ++k)
      for (int64_t g = 0; g < width; ++g) {
        const int64_t off = (i * chunks + k) * width + g;
        state[off] = prod[off - width] * state[off - width] + last[off - width];
      }
  at::parallel_for(0, items * (chunks - 1), 1, [&](int64_t begin, int64_t end_) {
    for (int64_t j = begin; j < end_; ++j) {
      const int64_t i = j / (chunks - 1), k = j % (chunks - 1) + 1;
      float* h = &state[(i * chunks + k) * width];
      run(i, bound(k), bound(k + 1), h, nullptr);
      if (k == chunks - 1) end(i, h);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Strided path: a group of up to kGroup sequences starting at flat sequence seq0.
template <typename scalar_t>
void scan_group(const ScanParams& p, int64_t seq0, int64_t n) {
  using acc_t = at::opmath_type<scalar_t>;
  auto ptr = [&](int slot) { return static_cast<scalar_t*>(p.ptr[slot]) + seq_offset(p, slot, seq0); };
  auto cs = [&](int slot) -> int64_t { return p.nbatch > 0 ? p.bstride[slot][0] : 0; };
  const int64_t L = p.len;
  const scalar_t* c = ptr(kCoeff);
  const scalar_t* h0 = p.ptr[kInit] ? ptr(kInit) : nullptr;
  const int64_t ls_c = p.lstride[kCoeff], cs_c = cs(kCoeff), cs_h0 = cs(kInit);
  acc_t h[kGroup];
  if (!p.backward) {
    const scalar_t* x = ptr(kIn);
    scalar_t* y = ptr(kOut);
    const int64_t ls_x = p.lstride[kIn], ls_y = p.lstride[kOut], cs_x = cs(kIn), cs_y = cs(kOut);
    for (int64_t g = 0; g < n; ++g) h[g] = h0 ? static_cast<acc_t>(h0[g * cs_h0]) : acc_t(0);
    for (int64_t t = 0; t < L; ++t)
      for (int64_t g = 0; g < n; ++g) {
        h[g] = static_cast<acc_t>(c[t * ls_c + g * cs_c]) * h[g] + static_cast<acc_t>(x[t * ls_x + g * cs_x]);
        y[t * ls_y + g * cs_y] = static_cast<scalar_t>(h[g]);
      }
    return;
  }
  // Backward, walking u = 0..L-1 in the direction opposite to the forward scan:
  //   g_u = c_{u-1} g_{u-1} + dy_u,  dx_u = g_u,  dc_u = g_u y_{u+1}  (y_L = initial),
  //   d_initial = c_{L-1} g_{L-1}.
  const scalar_t* dy = ptr(kIn);
  const scalar_t* y = ptr(kOut);
  scalar_t* dx = ptr(kGradIn);
  scalar_t* dc = ptr(kGradCoeff);
  scalar_t* dh0 = ptr(kGradInit);
  const int64_t ls_dy = p.lstride[kIn], ls_y = p.lstride[kOut], ls_dx = p.lstride[kGradIn],
                ls_dc = p.lstride[kGradCoeff];
  const int64_t cs_dy = cs(kIn), cs_y = cs(kOut), cs_dx = cs(kGradIn), cs_dc = cs(kGradCoeff), cs_dh0 = cs(kGradInit);
  for (int64_t g = 0; g < n; ++g) h[g] = acc_t(0);
  for (int64_t u = 0; u < L; ++u)
    for (int64_t g = 0; g < n; ++g) {
      const acc_t cprev = u > 0 ? static_cast<acc_t>(c[(u - 1) * ls_c + g * cs_c]) : acc_t(0);
      h[g] = cprev * h[g] + static_cast<acc_t>(dy[u * ls_dy + g * cs_dy]);
      const acc_t ynext = u + 1 < L ? static_cast<acc_t>(y[(u + 1) * ls_y + g * cs_y])
                                    : (h0 ? static_cast<acc_t>(h0[g * cs_h0]) : acc_t(0));
      dx[u * ls_dx + g * cs_dx] = static_cast<scalar_t>(h[g]);
      dc[u * ls_dc + g * cs_dc] = static_cast<scalar_t>(h[g] * ynext);
    }
  for (int64_t g = 0; g < n; ++g)
    dh0[g * cs_dh0] = static_cast<scalar_t>(static_cast<acc_t>(c[(L - 1) * ls_c + g * cs_c]) * h[g]);
}

template <typename scalar_t>
void scan_strided(const ScanParams& p) {
  const int64_t inner = p.nbatch > 0 ? p.bsize[0] : 1;
  const int64_t groups_per_row = (inner + kGroup - 1) / kGroup;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, p.len * kGroup));
  at::parallel_for(0, p.num_seq / inner * groups_per_row, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t inner0 = (i % groups_per_row) * kGroup;
      scan_group<scalar_t>(p, i / groups_per_row * inner + inner0, std::min(kGroup, inner - inner0));
    }
  });
}

// The slots a forward or backward call reads or writes along L.
bool uses_slot(const ScanParams& p, int slot) {
  if (is_batch_slot(slot) || !p.ptr[slot]) return false;
  return p.backward || slot == kIn || slot == kCoeff || slot == kOut;
}

#ifdef LINREC_HAVE_AVX2
// ---------------------------------------------------------------------------------------------
// Walk path: every used slot has step stride S (+1 or -1), or 0 for an input constant along L.

// Whether the walk takes its sequences two at a time (avx2::Walk::pair_step): when none is split
// along L, the pairs still give every thread one (else a thread would idle for a 1.4x faster
// kernel; the bits are the same either way) and a backward row has steps to pair. float32's
// backward walks them one at a time: its pair kernel, 12 16-byte loads per 8 steps against the
// lone walk's 3 of 32 bytes, measured 1.1-1.5x slower (bench/NOTES.md item 61), where the 2-byte
// types' pair kernels are faster.
template <typename T>
bool pair_walk(const ScanParams& p) {
  if (p.backward && std::is_same_v<T, float>) return false;
  // The backward pairs the steps after the first 8 and before the last partial vector: rows with
  // none to pair walk one at a time, one call each, not two (bf16 (N, 16) 1.4x faster; item 79).
  if (p.backward && p.len < 9 + avx2::kPairSteps<T>) return false;
  const int64_t threads = at::get_num_threads();
  return p.num_seq >= 2 && (threads == 1 || (p.num_seq + 1) / 2 >= threads) &&
         split_chunks(p.num_seq, 1, p.len) == 1;
}

// One sequence of the walk, at its step 0: the forward's c, x -> y, the backward's c, dy, y -> dx, dc
// and d_initial (where dh0 is set); `init` is the forward's entering state, the backward's y_L.
template <typename T, int S>
struct WalkSeq {
  avx2::WalkIn<S, T> c, in, y;  // in: x or dy; y: the backward's saved forward output
  T* out;                       // y or dx
  T* dc;
  T* dh0;
  float init;
};

// Walks one sequence of L steps, or two side by side (rows = 2): each pair's middle steps by the pair
// kernels, its first and last steps (partial vectors) one sequence at a time.
// The final states go to h_out where set.
template <typename T, int S>
void walk_pair(bool backward, int64_t L, int rows, const WalkSeq<T, S>* q, float* h_out = nullptr) {
  const int64_t K = avx2::kPairSteps<T>;
  float h[2];
  if (!backward) {
    const int64_t body = rows == 2 ? L / K * K : 0;
    for (int k = 0; k < rows; ++k) h[k] = q[k].init;
    if (body > 0) avx2::walk_forward_pair(q[0].c, q[0].in, q[0].out, q[1].c, q[1].in, q[1].out, 0, body, h);
    for (int k = 0; k < rows && body < L; ++k)
      avx2::walk_forward<S, false>(q[k].c, q[k].in, q[k].out, body, L, &h[k], nullptr);
    if (h_out) std::copy(h, h + rows, h_out);
    return;
  }
  // The first 8 steps (c_{-1} = 0) and the last ones (past the last full iteration whose y_{u+1}
  // reads stay before step L) alone, the rest paired.
  const int64_t head = std::min<int64_t>(L, 8);
  const int64_t body_end = rows == 2 && L - 1 > head ? head + (L - 1 - head) / K * K : head;
  auto alone = [&](int k, int64_t t0, int64_t t1) {
    avx2::walk_backward<S, false>(q[k].c, q[k].in, q[k].y, q[k].out, q[k].dc, q[k].init, L, t0, t1, &h[k], nullptr);
  };
  for (int k = 0; k < rows; ++k) h[k] = 0.f, alone(k, 0, head);
  if (body_end > head)
    avx2::walk_backward_pair(q[0].c, q[0].in, q[0].y, q[0].out, q[0].dc, q[1].c, q[1].in, q[1].y, q[1].out, q[1].dc,
                             head, body_end, h);
  for (int k = 0; k < rows; ++k) {
    alone(k, body_end, L);
    if (q[k].dh0) *q[k].dh0 = static_cast<T>(q[k].c.value(L - 1) * h[k]);  // c_{L-1} g_{L-1}
  }
  if (h_out) std::copy(h, h + rows, h_out);
}

// The walk over pairs of sequences (the last alone where their number is odd). Sequence j pairs
// with j + ceil(n/2), so that a thread's sequences make two unbroken streams per operand: adjacent
// pairs (2j, 2j+1) made each stream a run of one row that skipped the next, which the prefetchers
// followed poorly (2-byte rows of 1024 steps: 1.1-1.5x slower from memory; bench/NOTES.md item 65).
// seq(i): sequence i's WalkSeq (scan_walk).
template <typename T, int S, typename Seq>
void scan_walk_pairs(const ScanParams& p, const Seq& seq) {
  const int64_t L = p.len, n = p.num_seq, half = (n + 1) / 2;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / (2 * L));
  at::parallel_for(0, half, grain, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const int rows = j + half < n ? 2 : 1;
      const WalkSeq<T, S> q[2] = {seq(j), rows == 2 ? seq(j + half) : WalkSeq<T, S>{}};
      walk_pair<T, S>(p.backward, L, rows, q);
    }
  });
}

// Rows of the walk per segment (1: none). Short rows lying back to back in every operand (unit step
// stride in the walk's direction, row stride L), without `initial`: each block of G rows is walked
// as one sequence of G x L steps, with the coefficient that would carry a state across a row start
// zeroed in a copy (as the GPU's segments, cuda/plan_segments.h), so the per-row calls and partial
// vectors go. Where the rows' own walk is slower (this VM, 2 threads, fwd / bwd ratio to torch.add,
// rows -> segments; bench/NOTES.md item 84): 2-byte rows under 128 steps (bf16 131072 x 9 0.15 / 0.17
// -> 0.68 / 0.58, x 33 0.23 / 0.23 -> 0.77 / 0.64, 65536 x 100 0.63 / 0.60 -> 0.82 / 0.72, fp16 65536
// x 33 0.16 / 0.17 -> 0.63 / 0.57; 32768 x 128 0.88 / 0.85 -> 0.77 / 0.73 not), 4-byte rows under 48
// steps off the 8-step vectors (float32 131072 x 9 0.37 / 0.34 -> 0.76 / 0.72, x 33 0.45 / 0.77 ->
// 0.87 / 0.81; x 24 0.89 / 0.70 -> 0.74 / 0.68, 65536 x 63 0.95 / 1.0 -> 0.88 / 0.84 not).
template <int S>
int64_t segment_rows(const ScanParams& p, int elem_size) {
  const int64_t L = p.len;
  if (p.nbatch != 1 || p.ptr[kInit] || (elem_size == 2 ? L >= 128 : L >= 48 || L % 8 == 0)) return 1;
  for (int slot = 0; slot < kNumSlots; ++slot)
    if (uses_slot(p, slot) && (p.lstride[slot] != S || p.bstride[slot][0] != L)) return 1;
  // (at least two blocks per thread where there are several)
  const int64_t threads = at::get_num_threads();
  return std::max<int64_t>(1, std::min(kSegmentSteps / L, threads == 1 ? p.num_seq : p.num_seq / (2 * threads)));
}

// The segmented walk (segment_rows): blocks of G rows, two at a time as the pair walk's sequences
// (block j with j + ceil(blocks / 2)), each through thread-local copies of its coefficients (the
// backward's also of y) in which the steps that would cross a row start read zero: the forward's
// c at each row's first step (times 0, so that a NaN or inf coefficient there still poisons the
// state as c h_{-1} does); the backward's c_{u-1} at a row's first walk step (c at the previous
// row's last) and its y_{u+1} at a row's last walk step (y at the next row's first). d_initial of
// each row, c_{L-1} g_{L-1} in walk order, is taken afterwards from its c and stored dx. A block
// whose final state is not finite walks again row by row (seq(i), as scan_walk_pairs): a NaN or an
// inf state would reach the next rows as 0 x inf, and any non-finite state reaches the block's end.
template <typename T, int S, typename At, typename Seq>
void scan_walk_segments(const ScanParams& p, int64_t G, const At& at, const Seq& seq) {
  const int64_t L = p.len, N = p.num_seq, n = G * L, blocks = (N + G - 1) / G, half = (blocks + 1) / 2;
  at::parallel_for(0, half, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> buf((p.backward ? 4 : 2) * n);
    // A copy of `len` walk steps from src (step u at src + u * S) into buffer k; returns its step 0.
    auto copy = [&](int k, const T* src, int64_t len) {
      T* lowest = buf.data() + k * n;
      std::memcpy(lowest, S > 0 ? src : src - (len - 1), len * sizeof(T));
      return S > 0 ? lowest : lowest + (len - 1);
    };
    for (int64_t j = begin; j < end; ++j) {
      const int64_t b[2] = {j, j + half};
      const int blocks_here = b[1] < blocks ? 2 : 1;
      WalkSeq<T, S> q[2];
      int64_t rows[2];
      for (int k = 0; k < blocks_here; ++k) {
        const int64_t r0 = b[k] * G;
        rows[k] = std::min(G, N - r0);
        T* c = copy(k, at(kCoeff, r0), rows[k] * L);
        if (!p.backward) {
          for (int64_t i = 0; i < rows[k]; ++i) c[i * L * S] = static_cast<T>(static_cast<float>(c[i * L * S]) * 0.f);
          q[k] = {{c, false}, {at(kIn, r0), false}, {}, at(kOut, r0), nullptr, nullptr, 0.f};
          continue;
        }
        T* y = copy(2 + k, at(kOut, r0), rows[k] * L);
        for (int64_t i = 0; i < rows[k]; ++i) c[(i * L + L - 1) * S] = T(0.f), y[i * L * S] = T(0.f);
        q[k] = {{c, false}, {at(kIn, r0), false}, {y, false}, at(kGradIn, r0), at(kGradCoeff, r0), nullptr, 0.f};
      }
      float h[2];
      if (blocks_here == 2 && rows[0] == rows[1]) {
        walk_pair<T, S>(p.backward, rows[0] * L, 2, q, h);
      } else {
        for (int k = 0; k < blocks_here; ++k) walk_pair<T, S>(p.backward, rows[k] * L, 1, &q[k], &h[k]);
      }
      for (int k = 0; k < blocks_here; ++k) {
        const int64_t r0 = b[k] * G;
        if (!std::isfinite(h[k])) {
          for (int64_t r = r0; r < r0 + rows[k]; ++r) {
            const WalkSeq<T, S> row = seq(r);
            walk_pair<T, S>(p.backward, L, 1, &row);
          }
        } else if (p.backward) {
          const T* c = at(kCoeff, r0);
          for (int64_t i = 0; i < rows[k]; ++i) {
            const int64_t last = (i * L + L - 1) * S;  // the row's last walk step
            *at(kGradInit, r0 + i) = static_cast<T>(static_cast<float>(c[last]) * static_cast<float>(q[k].out[last]));
          }
        }
      }
    }
  });
}

template <typename T, int S>
void scan_walk(const ScanParams& p) {
  const int64_t L = p.len;
  // Items in the walk's direction: a downward walk takes the sequences last to first, so that
  // consecutive (N, L) rows make one descending stream.
  auto at = [&](int slot, int64_t i) {
    return static_cast<T*>(p.ptr[slot]) + seq_offset(p, slot, S > 0 ? i : p.num_seq - 1 - i);
  };
  auto in = [&](int slot, int64_t i) { return avx2::WalkIn<S, T>{at(slot, i), p.lstride[slot] == 0}; };
  auto init_value = [&](int64_t i) { return p.ptr[kInit] ? static_cast<float>(*at(kInit, i)) : 0.f; };
  auto seq = [&](int64_t i) {
    return p.backward ? WalkSeq<T, S>{in(kCoeff, i), in(kIn, i), in(kOut, i), at(kGradIn, i), at(kGradCoeff, i),
                                      at(kGradInit, i), init_value(i)}
                      : WalkSeq<T, S>{in(kCoeff, i), in(kIn, i), {}, at(kOut, i), nullptr, nullptr, init_value(i)};
  };
  if (const int64_t g = segment_rows<S>(p, sizeof(T)); g > 1) return scan_walk_segments<T, S>(p, g, at, seq);
  if (pair_walk<T>(p)) return scan_walk_pairs<T, S>(p, seq);
  if (!p.backward) {
    chained(
        p.num_seq, 1, L, false,
        [&](int64_t i, int64_t t0, int64_t t1, float* h, float* prod) {
          if (prod)
            avx2::walk_forward<S, true>(in(kCoeff, i), in(kIn, i), at(kOut, i), t0, t1, h, prod);
          else
            avx2::walk_forward<S, false>(in(kCoeff, i), in(kIn, i), at(kOut, i), t0, t1, h, nullptr);
        },
        [&](int64_t i, float* h) { *h = init_value(i); }, [](int64_t, float*) {});
    return;
  }
  chained(
      p.num_seq, 1, L, true,
      [&](int64_t i, int64_t t0, int64_t t1, float* h, float* prod) {
        if (prod)
          avx2::walk_backward<S, true>(in(kCoeff, i), in(kIn, i), in(kOut, i), at(kGradIn, i), at(kGradCoeff, i),
                                       init_value(i), L, t0, t1, h, prod);
        else
          avx2::walk_backward<S, false>(in(kCoeff, i), in(kIn, i), in(kOut, i), at(kGradIn, i), at(kGradCoeff, i),
                                        init_value(i), L, t0, t1, h, nullptr);
      },
      [](int64_t, float* h) { *h = 0.f; },
      [&](int64_t i, float* h) {  // d_initial = c_{L-1} g_{L-1}
        *at(kGradInit, i) = static_cast<T>(in(kCoeff, i).value(L - 1) * *h);
      });
}

// Whether every slot the rows path writes starts each block's row at a multiple of 8 elements of
// `elem` bytes: the base, the step stride and the outer batch strides (channel blocks start at
// multiples of 8 channels).
bool rows_aligned(const ScanParams& p, int64_t elem) {
  const int64_t bytes = 8 * elem;
  for (int slot : {kOut, kGradIn, kGradCoeff}) {
    if (p.backward == (slot == kOut) || !p.ptr[slot]) continue;
    if (reinterpret_cast<uintptr_t>(p.ptr[slot]) % bytes != 0 || (p.lstride[slot] * elem) % bytes != 0) return false;
    for (int i = 1; i < p.nbatch; ++i)
      if ((p.bstride[slot][i] * elem) % bytes != 0) return false;
  }
  return true;
}

// Rows path: channels (the innermost batch dim) contiguous in every used slot.
template <typename T>
void scan_rows(const ScanParams& p) {
  const int64_t L = p.len, D = p.bsize[0], outer = p.num_seq / D;
  // Blocks of at most kMaxRowBlock channels; more for the threads only while every block still
  // covers 16 KiB per row: a run of part of each page is 2-3x slower to stream (the prefetchers
  // do not follow it from row to row), and measured 4-8 KiB runs still lost to splitting along L,
  // so with fewer items than threads each block is split along L instead (chained).
  const int64_t threads = at::get_num_threads();
  const int64_t page_blocks = std::max<int64_t>(1, D * static_cast<int64_t>(sizeof(T)) / 16384);
  int64_t blocks = std::max((D + avx2::kMaxRowBlock - 1) / avx2::kMaxRowBlock,
                            std::min((threads + outer - 1) / outer, page_blocks));
  const int64_t W = ((D + blocks - 1) / blocks + 7) / 8 * 8;
  blocks = (D + W - 1) / W;
  auto seq0 = [&](int64_t j) { return j / blocks * D + j % blocks * W; };
  auto width = [&](int64_t j) { return std::min(W, D - j % blocks * W); };
  auto at = [&](int slot, int64_t j) { return static_cast<T*>(p.ptr[slot]) + seq_offset(p, slot, seq0(j)); };
  auto gather_init = [&](int64_t j, float* h) {  // the initial state of each channel, zero without one
    const int64_t n = width(j), cs = p.bstride[kInit][0];
    const T* h0 = p.ptr[kInit] ? at(kInit, j) : nullptr;
    for (int64_t d = 0; d < n; ++d) h[d] = h0 ? static_cast<float>(h0[d * cs]) : 0.f;
  };
  auto zero = [&](int64_t, float* h) { std::fill(h, h + W, 0.f); };
  const int64_t* ls = p.lstride;
  // float32 outputs of at least kStreamMinBytes each go out by non-temporal stores where aligned.
  auto forward = avx2::rows_forward<false, T>;
  auto backward = avx2::rows_backward<false, T>;
  if constexpr (std::is_same_v<T, float>) {
    if (p.num_seq * L * int64_t(sizeof(T)) >= kStreamMinBytes && rows_aligned(p, sizeof(T)))
      forward = avx2::rows_forward<true, T>, backward = avx2::rows_backward<true, T>;
  }
  if (!p.backward) {
    chained(
        outer * blocks, W, L, false,
        [&](int64_t j, int64_t t0, int64_t t1, float* h, float* prod) {
          forward(at(kCoeff, j), ls[kCoeff], at(kIn, j), ls[kIn], at(kOut, j), ls[kOut], width(j), t0, t1, h, prod);
        },
        gather_init, [](int64_t, float*) {});
    return;
  }
  chained(
      outer * blocks, W, L, true,
      [&](int64_t j, int64_t t0, int64_t t1, float* h, float* prod) {
        float init[avx2::kMaxRowBlock];
        if (p.ptr[kInit] && t1 == L) gather_init(j, init);
        backward(at(kCoeff, j), ls[kCoeff], at(kIn, j), ls[kIn], at(kOut, j), ls[kOut], at(kGradIn, j), ls[kGradIn],
                 at(kGradCoeff, j), ls[kGradCoeff], p.ptr[kInit] ? init : nullptr, L, width(j), t0, t1, h, prod);
      },
      zero,
      [&](int64_t j, float* h) {  // d_initial = c_{L-1} g_{L-1}
        const T* c_last = at(kCoeff, j) + (L - 1) * ls[kCoeff];
        T* dh0 = at(kGradInit, j);
        const int64_t cs = p.bstride[kGradInit][0];
        for (int64_t d = 0; d < width(j); ++d) dh0[d * cs] = static_cast<T>(static_cast<float>(c_last[d]) * h[d]);
      });
}

// The walk direction shared by every used slot: +1 or -1, where every slot written has that step
// stride and every slot read has it or 0; 0 otherwise.
int walk_direction(const ScanParams& p) {
  int dir = 0;
  for (int slot = 0; slot < kNumSlots; ++slot) {
    if (!uses_slot(p, slot)) continue;
    const int64_t s = p.lstride[slot];
    const bool read = slot == kIn || slot == kCoeff || (p.backward && slot == kOut);
    if (s == 0 && read) continue;
    if ((s != 1 && s != -1) || (dir != 0 && s != dir)) return 0;
    dir = static_cast<int>(s);
  }
  return p.len > 1 ? dir : 0;
}

bool channels_contiguous(const ScanParams& p) {
  if (p.nbatch == 0) return false;
  for (int slot = 0; slot < kNumSlots; ++slot)
    if (uses_slot(p, slot) && p.bstride[slot][0] != 1) return false;
  return true;
}
#endif

// The CPU kernel's one config (named after the strided path's groups of 16; it runs the path the
// layout picks).
constexpr const char* kCpuConfig = "cpu.g16";

void launch_cpu(const ScanParams& p, at::ScalarType dtype, const at::Device&, const OptConfig& config) {
  if (config.has_value()) {
    bool prefer;
    const std::string name = strip_prefer(*config, &prefer);
    TORCH_CHECK_VALUE(prefer || name == kCpuConfig || name == kNativeDefault, "linrec.scan: unknown config '", name,
                      "' for the CPU kernel; valid: ", kNativeDefault, ", ", kCpuConfig);
  }
  if (p.num_seq == 0 || p.len == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "linrec_scan_cpu", [&] {
#ifdef LINREC_HAVE_AVX2
    if constexpr (!std::is_same_v<scalar_t, double>) {
      if (avx2::supported()) {
        const int dir = walk_direction(p);
        if (dir == 1) return scan_walk<scalar_t, 1>(p);
        if (dir == -1) return scan_walk<scalar_t, -1>(p);
        if (channels_contiguous(p)) return scan_rows<scalar_t>(p);
      }
    }
#endif
    scan_strided<scalar_t>(p);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, CPU, m) { impl_scan_ops<launch_cpu>(m); }

}  // namespace linrec
