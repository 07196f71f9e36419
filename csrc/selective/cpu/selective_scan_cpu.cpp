// CPU kernels of the selective scan (linrec::selective_scan): the internal ops
// linrec::_selective_scan_fwd and linrec::_selective_scan_bwd on CPU, called by the op's CPU
// implementation in torch_linrec/selective/ops.py after its argument checks, with A, D,
// delta_bias and initial_state already in the compute dtype (float32, float64 for float64) and B, C
// in u's dtype as (D, N) (time-invariant) or (batch, G, N, L) (input-dependent, G groups of
// channels; stride 0 where broadcast).
//
// Math (Gu & Dao 2023; torch_linrec/selective/reference.py): per batch b and channel d,
//   h[n,l] = exp(dt[l] A[n]) h[n,l-1] + dt[l] B[n,l] u[l],   y[l] = sum_n C[n,l] h[n,l] + D u[l].
// The backward walks l downwards with g[n] = dLoss/dh[n,l], recomputing the states stored by a
// forward pass of the same (b, d) (L x N values per thread; the inputs are read twice, no (B, D, L, N)
// tensor is kept):
//   g[n] += C[n,l] gy[l];  dB[n,l] += g dt u;  dC[n,l] += gy h[n,l];  dA[n] += g dt a h[n,l-1];
//   ddt[l] = sum_n g (A a h[n,l-1] + B u);  du[l] = sum_n g dt B + D gy;  then g[n] *= a (a = exp(dt A)).
// Parallel over channels: a thread owns a range of d for every b, so the per-channel gradients
// (A, D, delta_bias, time-invariant B and C) need no reduction; input-dependent dB, dC are summed
// over channels through one buffer per thread.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

namespace linrec {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// Typed pointer to a tensor's data (T may be const-qualified).
template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

template <typename T>
struct View3 {  // a (batch, D, L) or (batch, D, N) tensor
  T* p = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0;
  T& operator()(int64_t i, int64_t j, int64_t k) const { return p[i * s0 + j * s1 + k * s2]; }
};

template <typename T>
View3<T> view3(const Tensor& t) {
  return View3<T>{ptr<T>(t), t.stride(0), t.stride(1), t.stride(2)};
}

template <typename T>
View3<T> view3(const OptTensor& t) {
  return t ? view3<T>(*t) : View3<T>{};
}

// B or C: element (b, d, n, l) of a (D, N) or (batch, G, N, L) tensor.
template <typename T>
struct BCView {
  const T* p = nullptr;
  bool var = false;
  int64_t sb = 0, sg = 0, sn = 0, sl = 0, dpg = 1;  // dpg: channels per group
  // Offset of (b, d, n=0, l=0).
  int64_t base(int64_t b, int64_t d) const { return var ? b * sb + (d / dpg) * sg : d * sg; }
};

template <typename T>
BCView<T> bc_view(const Tensor& t, int64_t dim) {
  BCView<T> v;
  v.p = ptr<T>(t);
  v.var = t.dim() == 4;
  if (v.var) {
    v.sb = t.stride(0);
    v.sg = t.stride(1);
    v.sn = t.stride(2);
    v.sl = t.stride(3);
    v.dpg = dim / t.size(1);
  } else {
    v.sg = t.stride(0);
    v.sn = t.stride(1);
  }
  return v;
}

template <typename acc_t>
acc_t softplus(acc_t x) {
  return x <= acc_t(20) ? std::log1p(std::exp(x)) : x;
}

template <typename acc_t>
acc_t sigmoid(acc_t x) {
  return acc_t(1) / (acc_t(1) + std::exp(-x));
}

struct Problem {
  int64_t batch, dim, len, nstate;
  bool softplus;
};

Problem problem(const Tensor& u, const Tensor& A, bool delta_softplus) {
  return Problem{u.size(0), u.size(1), u.size(2), A.size(1), delta_softplus};
}

// dt of step l, and its raw value before softplus (for the gradient).
template <typename scalar_t, typename acc_t>
inline acc_t step_dt(const View3<const scalar_t>& delta, const acc_t* bias, int64_t b, int64_t d, int64_t l,
                     bool sp, acc_t* raw) {
  acc_t x = static_cast<acc_t>(delta(b, d, l)) + (bias ? bias[d] : acc_t(0));
  *raw = x;
  return sp ? softplus(x) : x;
}

template <typename scalar_t>
std::tuple<Tensor, Tensor> forward_impl(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                        const Tensor& C, const OptTensor& D, const OptTensor& z,
                                        const OptTensor& delta_bias, bool delta_softplus, const OptTensor& initial) {
  using acc_t = at::opmath_type<scalar_t>;
  const Problem P = problem(u, A, delta_softplus);
  Tensor out = at::empty_like(u);
  Tensor last = at::empty({P.batch, P.dim, P.nstate}, u.options().dtype(A.scalar_type()));
  const auto vu = view3<const scalar_t>(u), vdelta = view3<const scalar_t>(delta);
  const auto vz = view3<const scalar_t>(z);
  const auto vout = view3<scalar_t>(out);
  const auto vlast = view3<acc_t>(last);
  const auto vh0 = view3<const acc_t>(initial);
  const auto vB = bc_view<const scalar_t>(B, P.dim), vC = bc_view<const scalar_t>(C, P.dim);
  const Tensor Ac = A.contiguous();
  const acc_t* a_ptr = ptr<acc_t>(Ac);
  const acc_t* d_ptr = D ? ptr<acc_t>(*D) : nullptr;
  const acc_t* bias = delta_bias ? ptr<acc_t>(*delta_bias) : nullptr;
  at::parallel_for(0, P.dim, 1, [&](int64_t d0, int64_t d1) {
    std::vector<acc_t> h(P.nstate);
    for (int64_t b = 0; b < P.batch; ++b)
      for (int64_t d = d0; d < d1; ++d) {
        const acc_t* a_row = a_ptr + d * P.nstate;
        for (int64_t n = 0; n < P.nstate; ++n) h[n] = initial ? vh0(b, d, n) : acc_t(0);
        const int64_t ob = vB.base(b, d), oc = vC.base(b, d);
        for (int64_t l = 0; l < P.len; ++l) {
          acc_t raw;
          const acc_t dt = step_dt(vdelta, bias, b, d, l, P.softplus, &raw);
          const acc_t uv = static_cast<acc_t>(vu(b, d, l));
          const acc_t du = dt * uv;
          acc_t y = 0;
          for (int64_t n = 0; n < P.nstate; ++n) {
            const acc_t bv = static_cast<acc_t>(vB.p[ob + n * vB.sn + l * vB.sl]);
            const acc_t cv = static_cast<acc_t>(vC.p[oc + n * vC.sn + l * vC.sl]);
            h[n] = std::exp(dt * a_row[n]) * h[n] + du * bv;
            y += cv * h[n];
          }
          if (d_ptr) y += d_ptr[d] * uv;
          if (z) {
            const acc_t zv = static_cast<acc_t>(vz(b, d, l));
            y *= zv * sigmoid(zv);
          }
          vout(b, d, l) = static_cast<scalar_t>(y);
        }
        for (int64_t n = 0; n < P.nstate; ++n) vlast(b, d, n) = h[n];
      }
  });
  return {out, last};
}

// The float32/float64 accumulator of dB or dC: (D, N) for time-invariant, else one (batch, G, N, L)
// slice per thread (summed by the caller).
Tensor bc_grad_buffer(const Tensor& bc, int64_t threads, at::ScalarType acc) {
  if (bc.dim() == 2) return at::zeros(bc.sizes(), bc.options().dtype(acc));
  std::vector<int64_t> shape{threads};
  for (int64_t s : bc.sizes()) shape.push_back(s);
  return at::zeros(shape, bc.options().dtype(acc));
}

template <typename scalar_t>
std::vector<Tensor> backward_impl(const Tensor& grad_out, const OptTensor& grad_last, const Tensor& u,
                                  const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                                  const OptTensor& D, const OptTensor& z, const OptTensor& delta_bias,
                                  bool delta_softplus, const OptTensor& initial) {
  using acc_t = at::opmath_type<scalar_t>;
  const auto acc = A.scalar_type();
  const Problem P = problem(u, A, delta_softplus);
  const int64_t threads = at::get_num_threads();
  Tensor du = at::empty_like(u), ddelta = at::empty_like(delta);
  Tensor dz = z ? at::empty_like(*z) : at::empty({0}, u.options());
  Tensor dA = at::zeros(A.sizes(), A.options());
  Tensor dD = D ? at::zeros(D->sizes(), A.options()) : at::empty({0}, A.options());
  Tensor dbias = delta_bias ? at::zeros(delta_bias->sizes(), A.options()) : at::empty({0}, A.options());
  Tensor dinit = at::empty({P.batch, P.dim, P.nstate}, A.options());
  Tensor dB = bc_grad_buffer(B, threads, acc), dC = bc_grad_buffer(C, threads, acc);
  const auto vu = view3<const scalar_t>(u), vdelta = view3<const scalar_t>(delta);
  const auto vz = view3<const scalar_t>(z), vg = view3<const scalar_t>(grad_out);
  const auto vdu = view3<scalar_t>(du), vddelta = view3<scalar_t>(ddelta);
  const auto vdz = z ? view3<scalar_t>(dz) : View3<scalar_t>{};
  const auto vh0 = view3<const acc_t>(initial), vglast = view3<const acc_t>(grad_last);
  const auto vdinit = view3<acc_t>(dinit);
  const auto vB = bc_view<const scalar_t>(B, P.dim), vC = bc_view<const scalar_t>(C, P.dim);
  const Tensor Ac = A.contiguous();
  const acc_t* a_ptr = ptr<acc_t>(Ac);
  acc_t* dA_ptr = ptr<acc_t>(dA);
  const acc_t* d_ptr = D ? ptr<acc_t>(*D) : nullptr;
  acc_t* dD_ptr = D ? ptr<acc_t>(dD) : nullptr;
  const acc_t* bias = delta_bias ? ptr<acc_t>(*delta_bias) : nullptr;
  acc_t* dbias_ptr = delta_bias ? ptr<acc_t>(dbias) : nullptr;
  acc_t* dB_ptr = ptr<acc_t>(dB);
  acc_t* dC_ptr = ptr<acc_t>(dC);
  // Offsets into a gradient buffer of B/C: the buffer is contiguous, (D, N) or (threads, batch, G, N, L).
  auto grad_base = [&](const Tensor& buf, const BCView<const scalar_t>& v, int64_t tid, int64_t b, int64_t d) {
    if (!v.var) return d * buf.stride(0);
    return tid * buf.stride(0) + b * buf.stride(1) + (d / v.dpg) * buf.stride(2);
  };
  auto grad_sn = [](const Tensor& buf, bool var) { return var ? buf.stride(3) : buf.stride(1); };
  auto grad_sl = [](const Tensor& buf, bool var) { return var ? buf.stride(4) : int64_t(0); };
  const int64_t dB_sn = grad_sn(dB, vB.var), dB_sl = grad_sl(dB, vB.var);
  const int64_t dC_sn = grad_sn(dC, vC.var), dC_sl = grad_sl(dC, vC.var);
  at::parallel_for(0, P.dim, 1, [&](int64_t d0, int64_t d1) {
    const int64_t tid = at::get_thread_num();
    std::vector<acc_t> hs(P.len * P.nstate), g(P.nstate);
    for (int64_t b = 0; b < P.batch; ++b)
      for (int64_t d = d0; d < d1; ++d) {
        const acc_t* a_row = a_ptr + d * P.nstate;
        const int64_t ob = vB.base(b, d), oc = vC.base(b, d);
        const int64_t gb = grad_base(dB, vB, tid, b, d), gc = grad_base(dC, vC, tid, b, d);
        // Forward: every state of this (b, d).
        for (int64_t l = 0; l < P.len; ++l) {
          acc_t raw;
          const acc_t dt = step_dt(vdelta, bias, b, d, l, P.softplus, &raw);
          const acc_t du_l = dt * static_cast<acc_t>(vu(b, d, l));
          for (int64_t n = 0; n < P.nstate; ++n) {
            const acc_t prev = l > 0 ? hs[(l - 1) * P.nstate + n] : (initial ? vh0(b, d, n) : acc_t(0));
            const acc_t bv = static_cast<acc_t>(vB.p[ob + n * vB.sn + l * vB.sl]);
            hs[l * P.nstate + n] = std::exp(dt * a_row[n]) * prev + du_l * bv;
          }
        }
        for (int64_t n = 0; n < P.nstate; ++n) g[n] = grad_last ? vglast(b, d, n) : acc_t(0);
        acc_t dD_acc = 0, dbias_acc = 0;
        for (int64_t l = P.len - 1; l >= 0; --l) {
          acc_t raw;
          const acc_t dt = step_dt(vdelta, bias, b, d, l, P.softplus, &raw);
          const acc_t uv = static_cast<acc_t>(vu(b, d, l));
          const acc_t go = static_cast<acc_t>(vg(b, d, l));
          acc_t gy = go;
          if (z) {
            acc_t y = d_ptr ? d_ptr[d] * uv : acc_t(0);
            for (int64_t n = 0; n < P.nstate; ++n)
              y += static_cast<acc_t>(vC.p[oc + n * vC.sn + l * vC.sl]) * hs[l * P.nstate + n];
            const acc_t zv = static_cast<acc_t>(vz(b, d, l)), sz = sigmoid(zv);
            gy = go * zv * sz;
            vdz(b, d, l) = static_cast<scalar_t>(go * y * sz * (acc_t(1) + zv * (acc_t(1) - sz)));
          }
          acc_t du_acc = d_ptr ? d_ptr[d] * gy : acc_t(0), ddt = 0;
          if (d_ptr) dD_acc += gy * uv;
          for (int64_t n = 0; n < P.nstate; ++n) {
            const acc_t bv = static_cast<acc_t>(vB.p[ob + n * vB.sn + l * vB.sl]);
            const acc_t cv = static_cast<acc_t>(vC.p[oc + n * vC.sn + l * vC.sl]);
            const acc_t h = hs[l * P.nstate + n];
            const acc_t prev = l > 0 ? hs[(l - 1) * P.nstate + n] : (initial ? vh0(b, d, n) : acc_t(0));
            const acc_t a = std::exp(dt * a_row[n]);
            const acc_t gn = g[n] + cv * gy;
            dC_ptr[gc + n * dC_sn + l * dC_sl] += gy * h;
            dB_ptr[gb + n * dB_sn + l * dB_sl] += gn * dt * uv;
            dA_ptr[d * P.nstate + n] += gn * dt * a * prev;
            ddt += gn * (a_row[n] * a * prev + bv * uv);
            du_acc += gn * dt * bv;
            g[n] = gn * a;
          }
          const acc_t dd = P.softplus ? ddt * sigmoid(raw) : ddt;
          dbias_acc += dd;
          vdu(b, d, l) = static_cast<scalar_t>(du_acc);
          vddelta(b, d, l) = static_cast<scalar_t>(dd);
        }
        for (int64_t n = 0; n < P.nstate; ++n) vdinit(b, d, n) = g[n];
        if (dD_ptr) dD_ptr[d] += dD_acc;
        if (dbias_ptr) dbias_ptr[d] += dbias_acc;
      }
  });
  if (B.dim() == 4) dB = dB.sum(0);
  if (C.dim() == 4) dC = dC.sum(0);
  return {du, ddelta, dA, dB, dC, dD, dz, dbias, dinit};
}

// Saves no checkpoints (the CPU backward keeps its own): the third output is empty.
std::tuple<Tensor, Tensor, Tensor> selective_scan_fwd_cpu(const Tensor& u, const Tensor& delta, const Tensor& A,
                                                          const Tensor& B, const Tensor& C, const OptTensor& D,
                                                          const OptTensor& z, const OptTensor& delta_bias,
                                                          bool delta_softplus, const OptTensor& initial,
                                                          int64_t /*states_per_thread: a CUDA launch hint*/,
                                                          bool /*save_checkpoints*/) {
  std::tuple<Tensor, Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, u.scalar_type(), "selective_scan_fwd_cpu", [&] {
    out = forward_impl<scalar_t>(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial);
  });
  return {std::get<0>(out), std::get<1>(out), at::empty({0}, A.options().dtype(at::kFloat))};
}

std::vector<Tensor> selective_scan_bwd_cpu(const Tensor& grad_out, const OptTensor& grad_last, const Tensor& u,
                                           const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                                           const OptTensor& D, const OptTensor& z, const OptTensor& delta_bias,
                                           bool delta_softplus, const OptTensor& initial,
                                           int64_t /*states_per_thread: a CUDA launch hint*/,
                                           const OptTensor& /*checkpoints: none on CPU*/) {
  std::vector<Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, u.scalar_type(), "selective_scan_bwd_cpu", [&] {
    out = backward_impl<scalar_t>(grad_out, grad_last, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, CPU, m) {
  m.impl("_selective_scan_fwd", &selective_scan_fwd_cpu);
  m.impl("_selective_scan_bwd", &selective_scan_bwd_cpu);
}

}  // namespace linrec
