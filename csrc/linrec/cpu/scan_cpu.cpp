// CPU kernel of linrec::scan and linrec::scan_backward.
//
// Sequences are processed in groups of G neighbours along the innermost batch dim, one tile of
// steps at a time: each operand's tile is copied into an L1-resident buffer laid out
// [step][sequence] in the accumulation type, the group's recurrences advance side by side there
// (vector lanes), and the outputs are copied back. In the (B, L, D) layout a tile row is a
// D-contiguous run; in the (N, L) layout each sequence's tile is a contiguous run of steps, so a
// group streams through G short runs rather than touching G rows per step (rows that, at
// power-of-two lengths, all map to the same cache sets).
//
// Groups run in parallel with at::parallel_for. When there are fewer groups than threads and the
// sequences are long, each group is also split along L into one chunk more than the threads it
// gets, as in a chained scan: pass 1 scans the first chunk for good and every other chunk but the
// last from a zero state, keeping (product of its coeffs, final state); pass 2 chains those
// summaries into each chunk's initial state; pass 3 re-scans the other chunks from their initial
// state and writes their outputs (re-reading x and coeffs moves fewer bytes than writing y twice).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../../common/errors.h"
#include "../ops.h"

namespace linrec {
namespace {

constexpr int64_t kTileElems = 2048;  // elements of one operand's tile buffer
constexpr int64_t kMinChunk = 16384;  // shortest chunk when a sequence is split along L
constexpr int64_t kWideGroup = 64;    // sequences per group in the (B, L, D) layout, 16 in (N, L)

// One slot of one group: base pointer at the group's first sequence, step and sequence strides.
template <typename scalar_t>
struct Operand {
  scalar_t* ptr;
  int64_t ls, cs;
};

// buf[t * G + g] = src[(t0 + t) * ls + g * cs] for t < T, g < n, converted to acc_t.
template <int64_t G, typename acc_t, typename scalar_t>
void load_tile(acc_t* buf, const Operand<scalar_t>& src, int64_t t0, int64_t T, int64_t n) {
  const scalar_t* s = src.ptr + t0 * src.ls;
  if (src.cs == 1) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < n; ++g) buf[t * G + g] = static_cast<acc_t>(s[t * src.ls + g]);
  } else {
    for (int64_t g = 0; g < n; ++g)
      for (int64_t t = 0; t < T; ++t) buf[t * G + g] = static_cast<acc_t>(s[t * src.ls + g * src.cs]);
  }
}

// The inverse copy: dst[(t0 + t) * ls + g * cs] = buf[t * G + g].
template <int64_t G, typename acc_t, typename scalar_t>
void store_tile(const Operand<scalar_t>& dst, const acc_t* buf, int64_t t0, int64_t T, int64_t n) {
  scalar_t* d = dst.ptr + t0 * dst.ls;
  if (dst.cs == 1) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < n; ++g) d[t * dst.ls + g] = static_cast<scalar_t>(buf[t * G + g]);
  } else {
    for (int64_t g = 0; g < n; ++g)
      for (int64_t t = 0; t < T; ++t) d[t * dst.ls + g * dst.cs] = static_cast<scalar_t>(buf[t * G + g]);
  }
}

template <typename scalar_t, int64_t G>
struct Group {
  using acc_t = at::opmath_type<scalar_t>;
  static constexpr int64_t T = kTileElems / G;  // steps per tile

  const ScanParams& p;
  int64_t seq0, n;  // first flat sequence index, sequences in the group (<= G)

  Operand<scalar_t> operand(int slot) const {
    const int64_t cs = p.nbatch > 0 ? p.bstride[slot][0] : 0;
    return {static_cast<scalar_t*>(p.ptr[slot]) + seq_offset(p, slot, seq0), p.lstride[slot], cs};
  }

  // The initial state of each sequence (zero without one).
  void initial(acc_t* h) const {
    std::fill(h, h + G, acc_t(0));
    if (!p.ptr[kInit]) return;
    const Operand<scalar_t> h0 = operand(kInit);
    for (int64_t g = 0; g < n; ++g) h[g] = static_cast<acc_t>(h0.ptr[g * h0.cs]);
  }

  // Advances the state h over steps [t0, t1) of the recurrence (the forward scan, or the backward
  // one g_u = c_{u-1} g_{u-1} + dy_u) and writes the outputs; with `prod` (a chunk summary) it
  // multiplies prod by every step's coefficient instead of writing outputs.
  void run(int64_t t0, int64_t t1, acc_t* h_io, acc_t* prod_io) const {
    acc_t h[G], p1[G];  // local copies, so that the recurrence stays in registers
    std::copy(h_io, h_io + G, h);
    if (prod_io) std::copy(prod_io, prod_io + G, p1);
    acc_t* prod = prod_io ? p1 : nullptr;
    // Three tile buffers, staggered so that equal indices do not share their low address bits
    // (a store to one would stall the load of the same index from another: 4K aliasing).
    constexpr int64_t kPitch = kTileElems + 96 / sizeof(acc_t) * 2;
    alignas(64) acc_t buf[3 * kPitch];
    if (n < G) std::fill(buf, buf + 3 * kPitch, acc_t(0));  // idle lanes compute on zeros
    acc_t *a = buf, *b = buf + kPitch, *e = buf + 2 * kPitch;
    for (int64_t t = t0; t < t1; t += T) {
      const int64_t m = std::min(T, t1 - t);
      if (p.backward)
        backward_tile(t, m, h, prod, a, b, e);
      else
        forward_tile(t, m, h, prod, a, b);
    }
    std::copy(h, h + G, h_io);
    if (prod_io) std::copy(p1, p1 + G, prod_io);
  }

  void forward_tile(int64_t t, int64_t m, acc_t* h, acc_t* prod, acc_t* c, acc_t* x) const {
    load_tile<G>(c, operand(kCoeff), t, m, n);
    load_tile<G>(x, operand(kIn), t, m, n);
    if (prod) {
      for (int64_t s = 0; s < m; ++s)
        for (int64_t g = 0; g < G; ++g) {
          prod[g] *= c[s * G + g];
          h[g] = c[s * G + g] * h[g] + x[s * G + g];
        }
      return;
    }
    for (int64_t s = 0; s < m; ++s)
      for (int64_t g = 0; g < G; ++g) {
        h[g] = c[s * G + g] * h[g] + x[s * G + g];
        x[s * G + g] = h[g];
      }
    store_tile<G>(operand(kOut), x, t, m, n);
  }

  // Step u of the backward: dx_u = g_u, dc_u = g_u y_{u+1} (y_L = initial); c_{-1} = 0.
  void backward_tile(int64_t t, int64_t m, acc_t* h, acc_t* prod, acc_t* cprev, acc_t* dy, acc_t* ynext) const {
    const Operand<scalar_t> c = operand(kCoeff);
    if (t == 0) {
      std::fill(cprev, cprev + G, acc_t(0));
      load_tile<G>(cprev + G, c, 0, m - 1, n);
    } else {
      load_tile<G>(cprev, c, t - 1, m, n);
    }
    load_tile<G>(dy, operand(kIn), t, m, n);
    if (prod) {
      for (int64_t s = 0; s < m; ++s)
        for (int64_t g = 0; g < G; ++g) {
          prod[g] *= cprev[s * G + g];
          h[g] = cprev[s * G + g] * h[g] + dy[s * G + g];
        }
      return;
    }
    const bool last = t + m == p.len;
    load_tile<G>(ynext, operand(kOut), t + 1, last ? m - 1 : m, n);
    if (last) initial(ynext + (m - 1) * G);
    for (int64_t s = 0; s < m; ++s)
      for (int64_t g = 0; g < G; ++g) {
        h[g] = cprev[s * G + g] * h[g] + dy[s * G + g];
        dy[s * G + g] = h[g];
        ynext[s * G + g] *= h[g];
      }
    store_tile<G>(operand(kGradIn), dy, t, m, n);
    store_tile<G>(operand(kGradCoeff), ynext, t, m, n);
    if (last) {  // d_initial = c_{L-1} g_{L-1}
      const Operand<scalar_t> dh0 = operand(kGradInit);
      const scalar_t* c_last = c.ptr + (p.len - 1) * c.ls;
      for (int64_t g = 0; g < n; ++g)
        dh0.ptr[g * dh0.cs] = static_cast<scalar_t>(static_cast<acc_t>(c_last[g * c.cs]) * h[g]);
    }
  }
};

template <typename scalar_t, int64_t G>
void scan_groups(const ScanParams& p) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t inner = p.nbatch > 0 ? p.bsize[0] : 1;
  const int64_t groups_per_row = (inner + G - 1) / G;
  const int64_t groups = p.num_seq / inner * groups_per_row;
  const int64_t L = p.len;
  auto group = [&](int64_t i) {
    const int64_t outer = i / groups_per_row, inner0 = (i % groups_per_row) * G;
    return Group<scalar_t, G>{p, outer * inner + inner0, std::min(G, inner - inner0)};
  };
  const int64_t threads = at::get_num_threads();
  const int64_t chunks =
      groups >= threads ? 1 : std::max<int64_t>(1, std::min((threads + groups - 1) / groups + 1, L / kMinChunk));
  auto bound = [&](int64_t k) { return k * L / chunks; };
  // The initial state of chunk k of group i: state[(i * chunks + k) * G + g].
  std::vector<acc_t> state(groups * chunks * G, acc_t(0));
  if (!p.backward)
    for (int64_t i = 0; i < groups; ++i) group(i).initial(&state[i * chunks * G]);
  if (chunks > 1) {
    std::vector<acc_t> last(groups * chunks * G, acc_t(0)), prod(groups * chunks * G, acc_t(1));
    at::parallel_for(0, groups * (chunks - 1), 1, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        const int64_t i = j / (chunks - 1), k = j % (chunks - 1), off = (i * chunks + k) * G;
        if (k == 0) {  // the first chunk starts from the true initial state: scanned for good here
          std::copy(&state[off], &state[off] + G, &last[off]);
          std::fill(&prod[off], &prod[off] + G, acc_t(0));
          group(i).run(bound(0), bound(1), &last[off], nullptr);
        } else {
          group(i).run(bound(k), bound(k + 1), &last[off], &prod[off]);
        }
      }
    });
    for (int64_t i = 0; i < groups; ++i)
      for (int64_t k = 1; k < chunks; ++k)
        for (int64_t g = 0; g < G; ++g) {
          const int64_t off = (i * chunks + k) * G + g;
          state[off] = prod[off - G] * state[off - G] + last[off - G];
        }
  }
  const int64_t grain = chunks > 1 ? 1 : std::max<int64_t>(1, 32768 / std::max<int64_t>(1, L * G));
  at::parallel_for(0, groups * chunks, grain, [&](int64_t begin, int64_t end) {
    if (G == kWideGroup && chunks == 1) {  // (B, L, D): neighbouring groups in step, one run per row
      constexpr int64_t T = Group<scalar_t, G>::T;
      for (int64_t t = 0; t < L; t += T)
        for (int64_t j = begin; j < end; ++j) group(j).run(t, std::min(L, t + T), &state[j * G], nullptr);
      return;
    }
    for (int64_t j = begin; j < end; ++j) {
      const int64_t i = j / chunks, k = j % chunks;
      if (chunks > 1 && k == 0) continue;
      group(i).run(bound(k), bound(k + 1), &state[j * G], nullptr);
    }
  });
}

bool channels_contiguous(const ScanParams& p) {
  if (p.nbatch == 0) return false;
  for (int slot = 0; slot < kNumSlots; ++slot) {
    if (!p.ptr[slot]) continue;
    if (slot == kInit || slot == kGradInit) continue;  // read once per sequence
    if (p.bstride[slot][0] != 1) return false;
  }
  return true;
}

// The CPU kernel's one config.
constexpr const char* kCpuConfig = "cpu.g16";

void launch_cpu(const ScanParams& p, at::ScalarType dtype, const at::Device&, const OptConfig& config) {
  if (config.has_value()) {
    bool prefer;
    const std::string name = strip_prefer(*config, &prefer);
    TORCH_CHECK_VALUE(prefer || name == kCpuConfig || name == kNativeDefault, "linrec.scan: unknown config '", name,
                      "' for the CPU kernel; valid: ", kNativeDefault, ", ", kCpuConfig);
  }
  // Channel-contiguous groups (the (B, L, D) layout) are wider: each tile row is one longer run.
  // Fewer than 16 neighbours (a few long rows) run one sequence per group, not idle lanes.
  const bool contig = channels_contiguous(p);
  const bool narrow = !contig && (p.nbatch == 0 || p.bsize[0] < 16);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "linrec_scan_cpu", [&] {
    if (contig)
      scan_groups<scalar_t, kWideGroup>(p);
    else if (narrow)
      scan_groups<scalar_t, 1>(p);
    else
      scan_groups<scalar_t, 16>(p);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, CPU, m) { impl_scan_ops<launch_cpu>(m); }

}  // namespace linrec
