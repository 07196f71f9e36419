// Tensors -> StridedLayout (common/strided.h): the batch dims of every slot sorted innermost
// first by the reference tensor's strides and coalesced where every slot allows it.
#pragma once
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <vector>

#include "errors.h"
#include "strided.h"

namespace linrec {

// The tensor of each slot (nullptr when unused) and whether it is batch-shaped (the reference's
// shape without `dim`) rather than of the reference's shape.
template <int N>
struct SlotTensors {
  std::array<const at::Tensor*, N> t{};
  std::array<bool, N> batch{};
};

// Fills `p` (every field of StridedLayout) for a walk along `dim` of `ref`'s shape; `reverse`
// points each scan-shaped slot at its last step with a negated stride.
template <int N>
void fill_layout(StridedLayout<N>& p, const SlotTensors<N>& slots, const at::Tensor& ref, int64_t dim,
                 bool reverse, const char* op) {
  const int64_t ndim = ref.dim();
  p.len = ref.size(dim);
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < ndim; ++i)
    if (i != dim && ref.size(i) != 1) dims.push_back(i);
  std::stable_sort(dims.begin(), dims.end(),
                   [&](int64_t a, int64_t b) { return std::abs(ref.stride(a)) < std::abs(ref.stride(b)); });
  auto stride_of = [&](int slot, int64_t d) -> int64_t {
    const at::Tensor& t = *slots.t[slot];
    return slots.batch[slot] ? t.stride(d < dim ? d : d - 1) : t.stride(d);
  };
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, N>> strides;
  for (int64_t d : dims) {
    std::array<int64_t, N> s{};
    for (int slot = 0; slot < N; ++slot)
      if (slots.t[slot]) s[slot] = stride_of(slot, d);
    if (!sizes.empty()) {  // coalesce with the previous (inner) dim where every slot allows it
      bool ok = true;
      for (int slot = 0; slot < N; ++slot)
        if (slots.t[slot] && s[slot] != strides.back()[slot] * sizes.back()) ok = false;
      if (ok) {
        sizes.back() *= ref.size(d);
        continue;
      }
    }
    sizes.push_back(ref.size(d));
    strides.push_back(s);
  }
  // The fake kernels reject the same layouts (torch_linrec/linrec/checks.py: batch_dims_after_coalescing).
  TORCH_CHECK_VALUE(static_cast<int>(sizes.size()) <= kMaxBatchDims, op, ": the layout of x needs ",
                    num(static_cast<int64_t>(sizes.size())), " batch dims after coalescing, at most ",
                    num(kMaxBatchDims), " are supported; call .contiguous() on the inputs");
  p.nbatch = static_cast<int>(sizes.size());
  p.num_seq = 1;
  for (int i = 0; i < p.nbatch; ++i) {
    p.bsize[i] = sizes[i];
    p.num_seq *= sizes[i];
    for (int slot = 0; slot < N; ++slot) p.bstride[slot][i] = strides[i][slot];
  }
  for (int slot = 0; slot < N; ++slot) {
    const at::Tensor* t = slots.t[slot];
    if (!t) continue;
    char* base = static_cast<char*>(t->data_ptr());
    if (!slots.batch[slot]) {
      int64_t ls = t->stride(dim);
      if (reverse && p.len > 0) {
        base += (p.len - 1) * ls * static_cast<int64_t>(t->element_size());
        ls = -ls;
      }
      p.lstride[slot] = ls;
    }
    p.ptr[slot] = base;
  }
}

}  // namespace linrec
