// CUDA implementation of the internal ops linrec::_selective_scan_fwd and _selective_scan_bwd,
// called by linrec::selective_scan's host path (csrc/selective/ops.cpp) after its argument test, for input-dependent B and C ((batch, G, N, L), u's dtype or float32) and
// N <= 256, with A, D, delta_bias and initial_state float32 (A contiguous). Prepares what the
// kernels read (B, C transposed to (batch, G, L, N_pad) float32, one launch that also zeroes the
// backward's accumulators), picks the launch shape and turns dB and dC back into B's and C's
// layout and dtypes (one launch).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <vector>

#include "../../common/errors.h"
#include "launch.h"

namespace linrec {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

constexpr int64_t kMaxStates = 256;

// States padded to a power of two, at least 16: the launch shapes' state counts.
int64_t pad_states(int64_t n) {
  int64_t p = 16;
  while (p < n) p *= 2;
  return p;
}

Strided3 strided(const Tensor& t) { return Strided3{t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)}; }

SelectiveDType dtype_of(const Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf: return SelectiveDType::kFloat16;
    case at::kBFloat16: return SelectiveDType::kBFloat16;
    default: return SelectiveDType::kFloat32;
  }
}

// A (batch, G, N, L) tensor as the layout kernels take it.
StateRows state_rows(const Tensor& t) {
  return StateRows{t.data_ptr(), dtype_of(t), t.size(1), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

bool aligned16(const Tensor& t, int64_t stride) {
  return (stride * static_cast<int64_t>(t.element_size())) % 16 == 0;
}

// Unit step stride and 16-byte aligned rows: 16-byte accesses along steps.
bool rows_aligned(const Tensor& t) {
  return t.stride(2) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && aligned16(t, t.stride(0)) &&
         aligned16(t, t.stride(1));
}

// Unit channel stride ((batch, len, dim)-contiguous views) and 16-byte aligned steps.
bool steps_aligned(const Tensor& t) {
  return t.stride(1) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && aligned16(t, t.stride(0)) &&
         aligned16(t, t.stride(2));
}

// How the kernels' tile loader may read the per-step inputs (TileLoads in selective_common.cuh).
int tile_loads(std::initializer_list<const Tensor*> ts) {
  bool steps = true, channels = true;
  for (const Tensor* t : ts) {
    if (t == nullptr) continue;
    steps = steps && rows_aligned(*t);
    channels = channels && steps_aligned(*t);
  }
  return steps ? kStepVectors : channels ? kChannelVectors : kScalarLoads;
}

// Forward: 4 states per thread (H100: 0.34 ms vs 0.40 at 8 and 0.59 at 16 on the Mamba-370m
// shape, bench/NOTES.md); at least N_pad / 16 (16 threads per channel at most: a group of 16 steps
// is reduce-scattered over a channel's threads; at N_pad = 128, 8 states measured 0.405 ms against
// 0.422 at 4 with 32 threads per channel, item 35). `requested` (4, 8 or 16) overrides the default.
int forward_states_per_thread(int64_t np, int64_t requested) {
  const int64_t spt = requested == 4 || requested == 8 || requested == 16 ? requested : 4;
  return static_cast<int>(std::max<int64_t>(spt, np / 16));
}

// Backward: 4 states per thread (16 steps of them live in registers), 8 at N_pad = 256 (a channel
// fits one warp).
int backward_states_per_thread(int64_t np) { return np == kMaxStates ? 8 : 4; }

cudaError_t launch(at::ScalarType dtype, const SelectiveParams& p, const SelectiveLaunch& l, bool backward) {
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  switch (dtype) {
    case at::kFloat:
      return launch_selective<SelectiveDType::kFloat32>(p, l, backward, stream);
    case at::kHalf:
      return launch_selective<SelectiveDType::kFloat16>(p, l, backward, stream);
    case at::kBFloat16:
      return launch_selective<SelectiveDType::kBFloat16>(p, l, backward, stream);
    default:
      TORCH_CHECK_VALUE(false, "linrec.selective_scan: the CUDA kernels take float32, float16 or bfloat16, got ",
                        dt(dtype));
  }
}

void check_launch(cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, "linrec.selective_scan: CUDA launch failed: ", cudaGetErrorString(err));
}

// What both directions read, and the tensors that back it (kept alive by the caller).
struct Prepared {
  SelectiveParams p;
  Tensor B, C;
};

// The backward's accumulators, zeroed by the launch that transposes B and C: dB and dC shaped like
// the step-major B and C, and dA, dD, ddelta_bias (any of them undefined when not computed).
struct Accumulators {
  Tensor dB, dC, dA, dD, dbias;
};

Prepared prepare(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                 const OptTensor& D, const OptTensor& z, const OptTensor& delta_bias, bool softplus,
                 const OptTensor& initial, Accumulators* acc = nullptr) {
  TORCH_CHECK_VALUE(B.dim() == 4 && C.dim() == 4, "linrec.selective_scan: the CUDA kernel takes B and C as "
                    "(B, G, N, L), got ", shape(B.sizes()), " and ", shape(C.sizes()));
  TORCH_CHECK_VALUE(delta.scalar_type() == u.scalar_type() && (!z || z->scalar_type() == u.scalar_type()),
                    "linrec.selective_scan: the CUDA kernel takes delta and z in u's dtype ", dt(u.scalar_type()));
  TORCH_CHECK_VALUE(A.scalar_type() == at::kFloat && A.is_contiguous(),
                    "linrec.selective_scan: the CUDA kernel takes A as a contiguous float32 tensor");
  const int64_t n = A.size(1);
  TORCH_CHECK_VALUE(n <= kMaxStates, "linrec.selective_scan: the CUDA kernel takes N <= ", num(kMaxStates),
                    " states, got A of shape ", shape(A.sizes()));
  Prepared r;
  SelectiveParams& p = r.p;
  p.batch = u.size(0);
  p.dim = u.size(1);
  p.len = u.size(2);
  p.nstate = n;
  p.nstate_pad = pad_states(n);
  p.groups_b = B.size(1);
  p.groups_c = C.size(1);
  p.softplus = softplus;
  p.chunk = selective_tile_steps(p.nstate_pad);
  const auto f32 = A.options().dtype(at::kFloat);
  r.B = at::empty({p.batch, p.groups_b, p.len, p.nstate_pad}, f32);
  r.C = at::empty({p.batch, p.groups_c, p.len, p.nstate_pad}, f32);
  StepMajorArgs sm;
  sm.B = state_rows(B);
  sm.C = state_rows(C);
  sm.B_rows = r.B.data_ptr<float>();
  sm.C_rows = r.C.data_ptr<float>();
  sm.batch = p.batch, sm.len = p.len, sm.nstate = n, sm.nstate_pad = p.nstate_pad;
  if (acc) {
    acc->dB = at::empty_like(r.B);
    acc->dC = at::empty_like(r.C);
    sm.dB_zero = acc->dB.data_ptr<float>();
    sm.dC_zero = acc->dC.data_ptr<float>();
    int f = 0;
    for (Tensor* t : {&acc->dA, &acc->dD, &acc->dbias})
      if (t->defined()) sm.fill[f] = t->data_ptr<float>(), sm.fill_numel[f++] = t->numel();
  }
  check_launch(launch_step_major(sm, at::cuda::getCurrentCUDAStream()));
  p.B = r.B.data_ptr<float>();
  p.C = r.C.data_ptr<float>();
  p.A = A.data_ptr<float>();
  p.u = strided(u);
  p.delta = strided(delta);
  if (z) p.z = strided(*z);
  p.D = D ? D->data_ptr<float>() : nullptr;
  p.delta_bias = delta_bias ? delta_bias->data_ptr<float>() : nullptr;
  p.h0 = initial ? initial->data_ptr<float>() : nullptr;
  return r;
}

// The checkpoints' size: (batch, dim, chunks, N_pad) floats where the sequence has more than one
// chunk, else none (the forward kernel writes the state after every chunk but the last).
// The checkpoints' slots: one state per (row, chunk), the last chunk's unused (the training op's size
// then depends on L through ceil(L / chunk) only, with no guard on L > chunk under dynamic shapes).
int64_t nchunks(const SelectiveParams& p) { return (p.len + p.chunk - 1) / p.chunk; }
int64_t checkpoint_numel(const SelectiveParams& p) { return p.batch * p.dim * nchunks(p) * p.nstate_pad; }

std::tuple<Tensor, Tensor, Tensor> selective_scan_fwd_cuda(const Tensor& u, const Tensor& delta, const Tensor& A,
                                                           const Tensor& B, const Tensor& C, const OptTensor& D,
                                                           const OptTensor& z, const OptTensor& delta_bias,
                                                           bool delta_softplus, const OptTensor& initial,
                                                           int64_t states_per_thread, bool save_checkpoints) {
  const c10::cuda::CUDAGuard guard(u.device());
  Prepared r = prepare(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial);
  SelectiveParams& p = r.p;
  Tensor out = at::empty_like(u);
  Tensor last = at::empty({p.batch, p.dim, p.nstate}, A.options().dtype(at::kFloat));
  Tensor ckpt = at::empty({save_checkpoints ? checkpoint_numel(p) : 0}, A.options().dtype(at::kFloat));
  p.out = strided(out);
  p.last = last.data_ptr<float>();
  p.ckpt = ckpt.numel() ? ckpt.data_ptr<float>() : nullptr;
  SelectiveLaunch l;
  l.states_per_thread = forward_states_per_thread(p.nstate_pad, states_per_thread);
  l.vector_stores = rows_aligned(out);
  l.loads = tile_loads({&u, &delta, z ? &*z : nullptr});
  check_launch(launch(u.scalar_type(), p, l, false));
  return {out, last, ckpt};
}

std::vector<Tensor> selective_scan_bwd_cuda(const Tensor& grad_out, const OptTensor& grad_last, const Tensor& u,
                                            const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                                            const OptTensor& D, const OptTensor& z, const OptTensor& delta_bias,
                                            bool delta_softplus, const OptTensor& initial,
                                            int64_t states_per_thread, const OptTensor& checkpoints) {
  const c10::cuda::CUDAGuard guard(u.device());
  TORCH_CHECK_VALUE(grad_out.scalar_type() == u.scalar_type(), "linrec.selective_scan_backward: the CUDA kernel "
                    "takes grad_out in u's dtype ", dt(u.scalar_type()), ", got ", dt(grad_out.scalar_type()));
  const auto f32 = A.options().dtype(at::kFloat);
  Accumulators acc;
  acc.dA = at::empty(A.sizes(), f32);
  if (D) acc.dD = at::empty({u.size(1)}, f32);
  if (delta_bias) acc.dbias = at::empty({u.size(1)}, f32);
  Prepared r = prepare(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, &acc);
  SelectiveParams& p = r.p;
  // Checkpoints: the forward kernel's states after each chunk but the last, saved by the training
  // forward or recomputed here by the states-only kernel (none to compute for a single chunk).
  const int64_t numel = nchunks(p) > 1 ? checkpoint_numel(p) : 0;
  const bool saved = checkpoints && checkpoints->numel() == checkpoint_numel(p) && numel;
  TORCH_CHECK_VALUE(saved || !checkpoints || checkpoints->numel() == 0 || checkpoints->numel() == checkpoint_numel(p),
                    "linrec.selective_scan_backward: expected checkpoints of ", num(checkpoint_numel(p)),
                    " elements (or none), got ", num(checkpoints->numel()));
  TORCH_CHECK_VALUE(!saved || (checkpoints->scalar_type() == at::kFloat && checkpoints->is_contiguous() &&
                               checkpoints->device() == u.device()),
                    "linrec.selective_scan_backward: checkpoints must be the float32 tensor that "
                    "_selective_scan_train returned");
  Tensor ckpt = saved ? *checkpoints : at::empty({numel}, f32);
  p.ckpt = numel ? ckpt.data_ptr<float>() : nullptr;
  if (!saved && p.ckpt) {
    SelectiveLaunch fl;
    fl.states_per_thread = forward_states_per_thread(p.nstate_pad, 0);  // p.out null: the states-only kernel
    fl.loads = tile_loads({&u, &delta});
    check_launch(launch(u.scalar_type(), p, fl, false));
  }

  Tensor du = at::empty_like(u), ddelta = at::empty_like(delta);
  Tensor dz = z ? at::empty_like(*z) : at::empty({0}, u.options());
  const Tensor dD = D ? acc.dD : at::empty({0}, f32), dbias = delta_bias ? acc.dbias : at::empty({0}, f32);
  Tensor dh0 = at::empty({p.batch, p.dim, p.nstate}, f32);
  p.dout = strided(grad_out);
  p.du = strided(du);
  p.ddelta = strided(ddelta);
  if (z) p.dz = strided(dz);
  p.dlast = grad_last ? grad_last->data_ptr<float>() : nullptr;
  p.dA = acc.dA.data_ptr<float>();
  p.dB = acc.dB.data_ptr<float>();
  p.dC = acc.dC.data_ptr<float>();
  p.dD = D ? dD.data_ptr<float>() : nullptr;
  p.ddelta_bias = delta_bias ? dbias.data_ptr<float>() : nullptr;
  p.dh0 = dh0.data_ptr<float>();
  SelectiveLaunch bl;
  bl.states_per_thread = backward_states_per_thread(p.nstate_pad);
  bl.loads = tile_loads({&u, &delta, &grad_out, z ? &*z : nullptr});
  check_launch(launch(u.scalar_type(), p, bl, true));
  // dB and dC in B's and C's dtypes (what autograd hands back), from the step-major accumulators.
  Tensor dB = at::empty(B.sizes(), B.options()), dC = at::empty(C.sizes(), C.options());
  StatesLastArgs sl;
  sl.dB_rows = acc.dB.data_ptr<float>();
  sl.dC_rows = acc.dC.data_ptr<float>();
  sl.dB = state_rows(dB);
  sl.dC = state_rows(dC);
  sl.batch = p.batch, sl.len = p.len, sl.nstate = p.nstate, sl.nstate_pad = p.nstate_pad;
  check_launch(launch_states_last(sl, at::cuda::getCurrentCUDAStream()));
  return {du, ddelta, acc.dA, dB, dC, dD, dz, dbias, dh0};
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, CUDA, m) {
  m.impl("_selective_scan_fwd", &selective_scan_fwd_cuda);
  m.impl("_selective_scan_bwd", &selective_scan_bwd_cuda);
}

}  // namespace linrec
