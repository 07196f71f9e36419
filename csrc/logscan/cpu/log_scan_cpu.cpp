// CPU kernel of linrec::log_scan: the linear recurrence of positive states in log space,
//   log_h[l] = logaddexp(log_coeffs[l] + log_h[l-1], log_x[l]),   log_h[-1] = initial (-inf when None),
// i.e. h[l] = coeffs[l] h[l-1] + x[l] for h = exp(log_h) (Feng et al. 2024, "Were RNNs All We Needed?").
// The backward is not a kernel: it is a reverse linear scan (linrec::scan) of softmax-like weights,
// composed in torch_linrec/logscan/ops.py.
//
// Host side: the scan's checks (linrec::check_scan_inputs) and strided layout (common/layout.h);
// sequences are walked in groups of up to kGroup neighbours along the innermost batch dim (in the
// (B, L, D) layout the group reads D-contiguous rows), groups in parallel with at::parallel_for.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

#include "../../common/host_pool.h"
#include "../../common/layout.h"
#include "../../linrec/ops.h"

namespace linrec {
namespace {

// Tensor slots of one log_scan launch: reads log_x, log_coeffs, initial; writes log_h.
enum LogSlot : int { kLogX = 0, kLogCoeff, kLogOut, kLogInit, kNumLogSlots };
using LogScanParams = StridedLayout<kNumLogSlots>;

constexpr int64_t kGroup = 16;

// logaddexp with -inf handled exactly: logaddexp(-inf, -inf) = -inf, logaddexp(-inf, b) = b, and
// equal infinities give themselves (no inf - inf).
template <typename T>
inline T log_add_exp(T a, T b) {
  const T hi = a > b ? a : b;
  const T lo = a > b ? b : a;
  if (hi == lo) return hi + static_cast<T>(M_LN2);
  return hi + std::log1p(std::exp(lo - hi));
}

template <typename scalar_t>
void log_scan_group(const LogScanParams& p, int64_t seq0, int64_t n) {
  using acc_t = at::opmath_type<scalar_t>;
  auto ptr = [&](int slot) { return static_cast<scalar_t*>(p.ptr[slot]) + seq_offset(p, slot, seq0); };
  auto gstride = [&](int slot) -> int64_t { return p.nbatch > 0 ? p.bstride[slot][0] : 0; };
  const scalar_t* lx = ptr(kLogX);
  const scalar_t* lc = ptr(kLogCoeff);
  scalar_t* out = ptr(kLogOut);
  const scalar_t* h0 = p.ptr[kLogInit] ? ptr(kLogInit) : nullptr;
  const int64_t ls_x = p.lstride[kLogX], ls_c = p.lstride[kLogCoeff], ls_o = p.lstride[kLogOut];
  const int64_t gs_x = gstride(kLogX), gs_c = gstride(kLogCoeff), gs_o = gstride(kLogOut), gs_h = gstride(kLogInit);
  acc_t h[kGroup];
  for (int64_t g = 0; g < n; ++g)
    h[g] = h0 ? static_cast<acc_t>(h0[g * gs_h]) : -std::numeric_limits<acc_t>::infinity();
  for (int64_t t = 0; t < p.len; ++t) {
    for (int64_t g = 0; g < n; ++g) {
      h[g] = log_add_exp(static_cast<acc_t>(lc[t * ls_c + g * gs_c]) + h[g], static_cast<acc_t>(lx[t * ls_x + g * gs_x]));
      out[t * ls_o + g * gs_o] = static_cast<scalar_t>(h[g]);
    }
  }
}

void launch_cpu(const LogScanParams& p, at::ScalarType dtype) {
  const int64_t inner = p.nbatch > 0 ? p.bsize[0] : 1;
  const int64_t outer = p.num_seq / inner;
  const int64_t groups_per_row = (inner + kGroup - 1) / kGroup;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, p.len * kGroup));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "linrec_log_scan_cpu", [&] {
    at::parallel_for(0, outer * groups_per_row, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t o = i / groups_per_row, inner0 = (i % groups_per_row) * kGroup;
        log_scan_group<scalar_t>(p, o * inner + inner0, std::min(kGroup, inner - inner0));
      }
    });
  });
}

Tensor log_scan_cpu(const Tensor& log_x, const Tensor& log_coeffs, const std::optional<Tensor>& initial, int64_t dim,
                    bool reverse) {
  const char* op = "linrec.log_scan";
  const int64_t d = check_scan_inputs(op, log_x, log_coeffs, initial, dim, "log_x", "log_coeffs");
  Tensor out = empty_like_pooled(log_x);  // recycled blocks (common/host_pool.h)
  if (out.numel() == 0) return out;
  const Tensor c = log_coeffs.expand(log_x.sizes());
  std::optional<Tensor> h0;
  if (initial) {
    auto batch = log_x.sizes().vec();
    batch.erase(batch.begin() + d);
    h0 = initial->expand(batch);
  }
  SlotTensors<kNumLogSlots> s;
  s.batch[kLogInit] = true;
  s.t[kLogX] = &log_x;
  s.t[kLogCoeff] = &c;
  s.t[kLogOut] = &out;
  if (h0) s.t[kLogInit] = &*h0;
  LogScanParams p{};
  fill_layout(p, s, out, d, reverse, op);
  launch_cpu(p, log_x.scalar_type());
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, CPU, m) { m.impl("log_scan", &log_scan_cpu); }

}  // namespace linrec
