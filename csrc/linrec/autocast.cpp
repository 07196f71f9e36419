// Autocast of linrec::scan and linrec::scan_triton: PyTorch's "promote" policy (as for torch.cat or
// torch.stack). Inside torch.autocast the op runs in the widest floating dtype of x, coeffs and
// initial -- torch.promote_types over them -- and is never cast down to the autocast dtype: a decay
// near 1 such as 0.999 rounds to 1.0 in bfloat16, which changes the recurrence, and reduced dtypes
// already accumulate in float32 inside the kernels. So bfloat16 x with float32 coeffs runs in float32
// and returns float32, as `x * coeffs` would. Outside autocast the op stays strict (one dtype; the
// Python API torch_linrec.scan applies the same promotion itself). In C++ so that calls under
// autocast pay no Python host time.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>

#include "ops.h"

namespace linrec {
namespace {

at::Tensor cast(const at::Tensor& t, at::ScalarType dtype) { return t.scalar_type() == dtype ? t : t.to(dtype); }

template <const c10::TypedOperatorHandle<ScanSig>& (*kOp)()>
at::Tensor scan_autocast(const at::Tensor& x, const at::Tensor& coeffs, const std::optional<at::Tensor>& initial,
                         int64_t dim, bool reverse, OptConfig config, OptConfig backward_config) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  at::ScalarType dtype = x.scalar_type();
  for (const at::Tensor* t : {&coeffs, initial ? &*initial : nullptr})
    if (t != nullptr && at::isFloatingType(t->scalar_type()) && at::isFloatingType(dtype))
      dtype = c10::promoteTypes(dtype, t->scalar_type());
  std::optional<at::Tensor> h0;
  if (initial) h0 = cast(*initial, dtype);
  return kOp().call(cast(x, dtype), cast(coeffs, dtype), h0, dim, reverse, config, backward_config);
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, AutocastCPU, m) { m.impl("scan", &scan_autocast<scan_op>); }
TORCH_LIBRARY_IMPL(linrec, AutocastCUDA, m) { m.impl("scan", &scan_autocast<scan_op>); }

}  // namespace linrec
