// linrec::selective_scan, _selective_scan_train and selective_scan_backward on CPU and CUDA, for
// eager calls and compiled graphs alike: a plain C++ test that the arguments pass every check of
// torch_linrec/selective/checks.py and that the C++ kernels take them, then the kernels
// (linrec::_selective_scan_fwd / _selective_scan_bwd: csrc/selective/cpu, csrc/selective/cuda).
// Every other call goes to the Python implementation (linrec::_selective_scan_python and
// _selective_scan_backward_python, torch_linrec/selective/ops.py): the full checks, which raise
// ValueError naming the argument, and the Triton kernels (time-invariant B or C on CUDA, problems
// too small to fill the GPU, an extension built without CUDA).
//
// Why C++: the Python implementation was about a third of an eager forward+backward's host time
// (bench/NOTES.md item 35), which at the Mamba-370m layer came close to its GPU time.
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ATen.h>

#include <initializer_list>
#include <optional>
#include <tuple>
#include <vector>

namespace linrec {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using Grads = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

// Where the CUDA C++ kernels run (torch_linrec/selective/ops.py has the reasons): N <= 256 and
// at least this many (batch x channel, state) pairs, else the Triton kernels fill the GPU better.
constexpr int64_t kCudaMaxStates = 256;
constexpr int64_t kCudaMinStates = 32768;

using FwdSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                  const Tensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                                                  bool, const OptTensor&, int64_t, bool);
using BwdSig = std::vector<Tensor>(const Tensor&, const OptTensor&, const Tensor&, const Tensor&, const Tensor&,
                                   const Tensor&, const Tensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                                   bool, const OptTensor&, int64_t, const OptTensor&);
using PyFwdSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                    const Tensor&, const OptTensor&, const OptTensor&,
                                                    const OptTensor&, bool, const OptTensor&, bool);
using PyBwdSig = Grads(const Tensor&, const OptTensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const OptTensor&, const OptTensor&, const OptTensor&, bool, const OptTensor&,
                       const OptTensor&);

template <typename Sig>
c10::TypedOperatorHandle<Sig> find(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}
const c10::TypedOperatorHandle<FwdSig>& kernel_fwd() {
  static const auto op = find<FwdSig>("linrec::_selective_scan_fwd");
  return op;
}
const c10::TypedOperatorHandle<BwdSig>& kernel_bwd() {
  static const auto op = find<BwdSig>("linrec::_selective_scan_bwd");
  return op;
}
const c10::TypedOperatorHandle<PyFwdSig>& python_fwd() {
  static const auto op = find<PyFwdSig>("linrec::_selective_scan_python");
  return op;
}
const c10::TypedOperatorHandle<PyBwdSig>& python_bwd() {
  static const auto op = find<PyBwdSig>("linrec::_selective_scan_backward_python");
  return op;
}

at::ScalarType compute_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

bool is_like(const Tensor& t, at::IntArrayRef shape, at::ScalarType dtype, const at::Device& device) {
  return t.sizes().equals(shape) && t.scalar_type() == dtype && t.device() == device;
}

bool is_like(const OptTensor& t, at::IntArrayRef shape, at::ScalarType dtype, const at::Device& device) {
  return !t || is_like(*t, shape, dtype, device);
}

// B or C: (D, N), (B, N, L) or (B, G, N, L) with G dividing D, in u's dtype or the compute dtype.
bool valid_bc(const Tensor& t, int64_t batch, int64_t dim, int64_t len, int64_t n, at::ScalarType dtype,
              at::ScalarType ct, const at::Device& device) {
  if ((t.scalar_type() != dtype && t.scalar_type() != ct) || t.device() != device) return false;
  const auto s = t.sizes();
  if (s.size() == 2) return s[0] == dim && s[1] == n;
  if (s.size() == 3) return s[0] == batch && s[1] == n && s[2] == len;
  return s.size() == 4 && s[0] == batch && s[1] >= 1 && dim % s[1] == 0 && s[2] == n && s[3] == len;
}

// Whether the arguments pass every check of check_selective_scan_args (checks.py), tested without
// building a message; tests/test_selective_scan.py checks that the two agree.
bool valid_args(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                const OptTensor& D, const OptTensor& z, const OptTensor& delta_bias, const OptTensor& initial) {
  if (u.dim() != 3) return false;
  const at::ScalarType dtype = u.scalar_type();
  const at::Device device = u.device();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16 && dtype != at::kDouble) return false;
  if (dtype == at::kDouble && !device.is_cpu()) return false;
  const at::ScalarType ct = compute_type(dtype);
  const int64_t batch = u.size(0), dim = u.size(1), len = u.size(2);
  if (!is_like(delta, u.sizes(), dtype, device) || !is_like(z, u.sizes(), dtype, device)) return false;
  if (A.dim() != 2 || A.size(0) != dim || A.size(1) < 1 || A.scalar_type() != ct || A.device() != device)
    return false;
  const int64_t n = A.size(1);
  return valid_bc(B, batch, dim, len, n, dtype, ct, device) && valid_bc(C, batch, dim, len, n, dtype, ct, device) &&
         is_like(D, {dim}, ct, device) && is_like(delta_bias, {dim}, ct, device) &&
         is_like(initial, {batch, dim, n}, ct, device);
}

// Whether the C++ kernels run this (valid) call: on the CPU always; on CUDA for input-dependent B
// and C, N <= 256 and enough (channel, state) pairs, where the extension has its CUDA kernels.
bool native(const Tensor& u, const Tensor& A, const Tensor& B, const Tensor& C) {
  if (u.device().is_cpu()) return true;
#ifdef LINREC_WITH_CUDA
  const int64_t n = A.size(1);
  return u.device().is_cuda() && B.dim() > 2 && C.dim() > 2 && n <= kCudaMaxStates &&
         u.size(0) * u.size(1) * n >= kCudaMinStates;
#else
  return false;
#endif
}

Tensor cast(const Tensor& t, at::ScalarType dtype) { return t.scalar_type() == dtype ? t : t.to(dtype); }

OptTensor dense(const OptTensor& t, at::ScalarType dtype) {
  if (!t) return std::nullopt;
  return cast(*t, dtype).contiguous();
}

// The arguments as the kernels take them (csrc/module.cpp's schema of _selective_scan_fwd): A, D,
// delta_bias and initial_state contiguous in the compute dtype, (B, N, L) B and C as one group;
// on the CPU, whose kernel reads B and C in u's dtype, mixed dtypes run in the compute dtype.
// (torch_linrec/selective/ops.py's _kernel_args does the same for the Triton kernels.)
struct KernelArgs {
  Tensor u, delta, A, B, C;
  OptTensor D, z, delta_bias, initial;
};

KernelArgs kernel_args(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                       const OptTensor& D, const OptTensor& z, const OptTensor& delta_bias, const OptTensor& initial) {
  const at::ScalarType ct = compute_type(u.scalar_type());
  KernelArgs k{u, delta, A.contiguous(), B.dim() == 3 ? B.unsqueeze(1) : B, C.dim() == 3 ? C.unsqueeze(1) : C,
               dense(D, ct), z, dense(delta_bias, ct), dense(initial, ct)};
  if (u.device().is_cpu() && (B.scalar_type() != u.scalar_type() || C.scalar_type() != u.scalar_type())) {
    k.u = cast(u, ct), k.delta = cast(delta, ct), k.B = cast(k.B, ct), k.C = cast(k.C, ct);
    if (z) k.z = cast(*z, ct);
  }
  return k;
}

std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                           const Tensor& C, const OptTensor& D, const OptTensor& z,
                                           const OptTensor& delta_bias, bool softplus, const OptTensor& initial,
                                           bool save_checkpoints) {
  if (!valid_args(u, delta, A, B, C, D, z, delta_bias, initial) || !native(u, A, B, C))
    return python_fwd().call(u, delta, A, B, C, D, z, delta_bias, softplus, initial, save_checkpoints);
  const KernelArgs k = kernel_args(u, delta, A, B, C, D, z, delta_bias, initial);
  auto [out, last, checkpoints] = kernel_fwd().call(k.u, k.delta, k.A, k.B, k.C, k.D, k.z, k.delta_bias, softplus,
                                                    k.initial, 0, save_checkpoints);
  return {cast(out, u.scalar_type()), last, checkpoints};
}

std::tuple<Tensor, Tensor> selective_scan(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                          const Tensor& C, const OptTensor& D, const OptTensor& z,
                                          const OptTensor& delta_bias, bool softplus, const OptTensor& initial) {
  auto [out, last, checkpoints] = forward(u, delta, A, B, C, D, z, delta_bias, softplus, initial, false);
  return {out, last};
}

std::tuple<Tensor, Tensor, Tensor> selective_scan_train(const Tensor& u, const Tensor& delta, const Tensor& A,
                                                        const Tensor& B, const Tensor& C, const OptTensor& D,
                                                        const OptTensor& z, const OptTensor& delta_bias,
                                                        bool softplus, const OptTensor& initial) {
  return forward(u, delta, A, B, C, D, z, delta_bias, softplus, initial, true);
}

Grads selective_scan_backward(const Tensor& grad_out, const OptTensor& grad_last, const Tensor& u, const Tensor& delta,
                              const Tensor& A, const Tensor& B, const Tensor& C, const OptTensor& D, const OptTensor& z,
                              const OptTensor& delta_bias, bool softplus, const OptTensor& initial,
                              const OptTensor& checkpoints) {
  const bool valid = valid_args(u, delta, A, B, C, D, z, delta_bias, initial) &&
                     is_like(grad_out, u.sizes(), u.scalar_type(), u.device()) &&
                     is_like(grad_last, {u.size(0), u.size(1), A.size(1)}, compute_type(u.scalar_type()), u.device());
  // Both CUDA backwards (C++ and Triton) sum dA, dB, dC, dD and ddelta_bias over blocks with atomic
  // adds: raises (or warns) under torch.use_deterministic_algorithms(True), as ATen's ops do.
  if (valid && u.device().is_cuda())
    at::globalContext().alertNotDeterministic("linrec.selective_scan_backward (on CUDA)");
  if (!valid || !native(u, A, B, C))
    return python_bwd().call(grad_out, grad_last, u, delta, A, B, C, D, z, delta_bias, softplus, initial,
                             checkpoints);
  const KernelArgs k = kernel_args(u, delta, A, B, C, D, z, delta_bias, initial);
  const at::ScalarType ct = compute_type(u.scalar_type());
  const std::vector<Tensor> g =
      kernel_bwd().call(cast(grad_out, k.u.scalar_type()), dense(grad_last, ct), k.u, k.delta, k.A, k.B, k.C, k.D,
                        k.z, k.delta_bias, softplus, k.initial, 0, checkpoints);
  // A fresh empty tensor per absent input: outputs must not alias each other.
  auto empty = [&u] { return at::empty({0}, u.options()); };
  auto bc_grad = [](const Tensor& grad, const Tensor& input) {
    return cast(input.dim() == 3 ? grad.squeeze(1) : grad, input.scalar_type());
  };
  return {cast(g[0], u.scalar_type()),
          cast(g[1], delta.scalar_type()),
          cast(g[2], A.scalar_type()),
          bc_grad(g[3], B),
          bc_grad(g[4], C),
          D ? cast(g[5], D->scalar_type()) : empty(),
          z ? cast(g[6], z->scalar_type()) : empty(),
          delta_bias ? cast(g[7], delta_bias->scalar_type()) : empty(),
          initial ? cast(g[8], initial->scalar_type()) : empty()};
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, CPU, m) {
  m.impl("selective_scan", &selective_scan);
  m.impl("_selective_scan_train", &selective_scan_train);
  m.impl("selective_scan_backward", &selective_scan_backward);
}

TORCH_LIBRARY_IMPL(linrec, CUDA, m) {
  m.impl("selective_scan", &selective_scan);
  m.impl("_selective_scan_train", &selective_scan_train);
  m.impl("selective_scan_backward", &selective_scan_backward);
}

}  // namespace linrec
