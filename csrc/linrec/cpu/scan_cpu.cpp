// CPU kernel of linrec::scan and linrec::scan_backward.
//
// Sequences are processed in groups of up to kGroup neighbours along the innermost
// batch dim: in the (B, L, D) layout the group walks L with D-contiguous rows (vector
// loads), in the (N, L) layout the group interleaves independent recurrences so the
// multiply-add chains overlap. Groups run in parallel with at::parallel_for.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../../common/errors.h"
#include "../ops.h"

namespace linrec {
namespace {

constexpr int64_t kGroup = 16;

template <typename scalar_t, bool kContig>
void scan_group(const ScanParams& p, int64_t outer, int64_t inner0, int64_t n) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t seq0 = outer * (p.nbatch > 0 ? p.bsize[0] : 1) + inner0;
  auto ptr = [&](int slot) { return static_cast<scalar_t*>(p.ptr[slot]) + seq_offset(p, slot, seq0); };
  auto cstride = [&](int slot) -> int64_t {
    if (kContig && slot != kInit && slot != kGradInit) return 1;
    return p.nbatch > 0 ? p.bstride[slot][0] : 0;
  };
  const int64_t L = p.len;
  const scalar_t* c = ptr(kCoeff);
  const scalar_t* h0 = p.ptr[kInit] ? ptr(kInit) : nullptr;
  const int64_t ls_c = p.lstride[kCoeff], cs_c = cstride(kCoeff), cs_h0 = cstride(kInit);
  acc_t h[kGroup];
  if (!p.backward) {
    const scalar_t* x = ptr(kIn);
    scalar_t* y = ptr(kOut);
    const int64_t ls_x = p.lstride[kIn], ls_y = p.lstride[kOut], cs_x = cstride(kIn), cs_y = cstride(kOut);
    for (int64_t g = 0; g < n; ++g) h[g] = h0 ? static_cast<acc_t>(h0[g * cs_h0]) : acc_t(0);
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t g = 0; g < n; ++g) {
        h[g] = static_cast<acc_t>(c[t * ls_c + g * cs_c]) * h[g] + static_cast<acc_t>(x[t * ls_x + g * cs_x]);
        y[t * ls_y + g * cs_y] = static_cast<scalar_t>(h[g]);
      }
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
  const int64_t cs_dy = cstride(kIn), cs_y = cstride(kOut), cs_dx = cstride(kGradIn),
                cs_dc = cstride(kGradCoeff), cs_dh0 = cstride(kGradInit);
  for (int64_t g = 0; g < n; ++g) h[g] = acc_t(0);
  for (int64_t u = 0; u < L; ++u) {
    for (int64_t g = 0; g < n; ++g) {
      const acc_t cprev = u > 0 ? static_cast<acc_t>(c[(u - 1) * ls_c + g * cs_c]) : acc_t(0);
      h[g] = cprev * h[g] + static_cast<acc_t>(dy[u * ls_dy + g * cs_dy]);
      const acc_t ynext = u + 1 < L ? static_cast<acc_t>(y[(u + 1) * ls_y + g * cs_y])
                                    : (h0 ? static_cast<acc_t>(h0[g * cs_h0]) : acc_t(0));
      dx[u * ls_dx + g * cs_dx] = static_cast<scalar_t>(h[g]);
      dc[u * ls_dc + g * cs_dc] = static_cast<scalar_t>(h[g] * ynext);
    }
  }
  for (int64_t g = 0; g < n; ++g)
    dh0[g * cs_dh0] = static_cast<scalar_t>(static_cast<acc_t>(c[(L - 1) * ls_c + g * cs_c]) * h[g]);
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
  const int64_t inner = p.nbatch > 0 ? p.bsize[0] : 1;
  const int64_t outer = p.num_seq / inner;
  const int64_t groups_per_row = (inner + kGroup - 1) / kGroup;
  const bool contig = channels_contiguous(p);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, p.len * kGroup));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "linrec_scan_cpu", [&] {
    at::parallel_for(0, outer * groups_per_row, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t o = i / groups_per_row, inner0 = (i % groups_per_row) * kGroup;
        const int64_t n = std::min(kGroup, inner - inner0);
        if (contig)
          scan_group<scalar_t, true>(p, o, inner0, n);
        else
          scan_group<scalar_t, false>(p, o, inner0, n);
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, CPU, m) { impl_scan_ops<launch_cpu>(m); }

}  // namespace linrec
