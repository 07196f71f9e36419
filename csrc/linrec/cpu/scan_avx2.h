// AVX2 kernels of the CPU scan (csrc/linrec/cpu/scan_cpu.cpp runs them where the CPU has AVX2,
// FMA and F16C; the extension itself is built for the baseline x86-64, so every function here
// carries its own target attribute).
//
// Two kernels, for the two layouts where one operand access can cover 8 values:
// - walk: the (N, L) layout, every operand contiguous along L (stride +1 or -1). One sequence at
//   a time, 8 steps per vector: an in-register scan (3 shift-and-combine levels of the affine maps
//   (c, x)) gives each lane its local state and coefficient product, then y = X + C h carries the
//   state in. The carried state is the only serial dependency: one FMA per 8 steps.
// - rows: the (B, L, D) layout, channels contiguous. One block of channels walks L; each step
//   streams one contiguous run per operand through 8-channel vectors, with the block's states in an
//   L1-resident array (at most kMaxRowBlock channels).
// Both advance a state over steps [t0, t1) of the recurrence: the forward scan, or the backward one
// g_u = c_{u-1} g_{u-1} + dy_u with dx_u = g_u, dc_u = g_u y_{u+1} (y_L = initial). With `prod`
// (a chunk summary for the chained split) they multiply prod by every step's coefficient and
// write nothing.
#pragma once
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LINREC_HAVE_AVX2 1
#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#define LINREC_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace linrec {
namespace avx2 {

// Whether this CPU runs the kernels below.
inline bool supported() {
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok;
}

constexpr int64_t kMaxRowBlock = 1024;  // channels of one rows-kernel block (4 KiB of states)

// 8 values to and from float lanes: float, bfloat16 (round to nearest even, NaN kept, as
// c10::BFloat16) and half (F16C).
LINREC_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
LINREC_AVX2 inline __m256 load8(const c10::BFloat16* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
LINREC_AVX2 inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
LINREC_AVX2 inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
LINREC_AVX2 inline void store8(c10::BFloat16* p, __m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
LINREC_AVX2 inline void store8(c10::Half* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

// ---------------------------------------------------------------------------------------------
// walk: (N, L), operands contiguous along L. S = +1 walks up in memory (step u + i in lane i),
// S = -1 walks down (step u + i in lane 7 - i); the last step of a vector is in lane kLast.

template <int S>
struct Walk {
  static constexpr int kLast = S > 0 ? 7 : 0;

  // Lane of walk step i of a vector.
  static int lane(int i) { return S > 0 ? i : 7 - i; }

  // Offset (elements, from the sequence's step 0) of the vector of walk steps u .. u+7.
  static int64_t at(int64_t u) { return S > 0 ? u : -u - 7; }

  // Lanes shifted K walk steps later within each 128-bit half (one in-lane byte shift); the first
  // K steps of each half take `fill`.
  template <int K>
  LINREC_AVX2 static __m256 shift_in_half(__m256 v, __m256 fill) {
    const __m256i w = _mm256_castps_si256(v);
    const __m256 moved = _mm256_castsi256_ps(S > 0 ? _mm256_slli_si256(w, 4 * K) : _mm256_srli_si256(w, 4 * K));
    constexpr int mask = S > 0 ? (K == 1 ? 0x11 : 0x33) : (K == 1 ? 0x88 : 0xcc);
    return _mm256_blend_ps(moved, fill, mask);
  }

  // The last walk step of the first half (lane 3 or 4) in every lane of the second half, `fill`
  // in the first.
  LINREC_AVX2 static __m256 first_half_last(__m256 v, __m256 fill) {
    const __m256 b = _mm256_permute_ps(v, S > 0 ? 0xff : 0x00);
    return S > 0 ? _mm256_permute2f128_ps(b, fill, 0x02) : _mm256_permute2f128_ps(b, fill, 0x31);
  }

  // In-register scan of 8 steps: x becomes each step's state from a zero state, c the product of
  // the coefficients up to it. Two levels inside each half, then the first half's total carried
  // into the second: 8 shuffles, 3 of them across halves.
  LINREC_AVX2 static void scan8(__m256& c, __m256& x) {
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    x = _mm256_fmadd_ps(c, shift_in_half<1>(x, zero), x);
    c = _mm256_mul_ps(c, shift_in_half<1>(c, one));
    x = _mm256_fmadd_ps(c, shift_in_half<2>(x, zero), x);
    c = _mm256_mul_ps(c, shift_in_half<2>(c, one));
    x = _mm256_fmadd_ps(c, first_half_last(x, zero), x);
    c = _mm256_mul_ps(c, first_half_last(c, one));
  }

  // The last walk step (lane kLast) in every lane.
  LINREC_AVX2 static __m256 last(__m256 v) {
    const __m256 b = _mm256_permute_ps(v, S > 0 ? 0xff : 0x00);
    return _mm256_permute2f128_ps(b, b, S > 0 ? 0x11 : 0x00);
  }

  // One vector: h (broadcast) -> each step's state; h and prod advance past its 8 steps.
  LINREC_AVX2 static __m256 step(__m256 c, __m256 x, __m256& h, __m256* prod) {
    scan8(c, x);
    const __m256 y = _mm256_fmadd_ps(c, h, x);
    h = _mm256_fmadd_ps(last(c), h, last(x));
    if (prod) *prod = _mm256_mul_ps(*prod, last(c));
    return y;
  }
};

// Forward over steps [t0, t1) of one sequence: c, x, y point at its step 0.
template <int S, typename T>
LINREC_AVX2 void walk_forward(const T* c, const T* x, T* y, int64_t t0, int64_t t1, float* h_io, float* prod_io) {
  using W = Walk<S>;
  __m256 h = _mm256_set1_ps(*h_io), prod = _mm256_set1_ps(prod_io ? *prod_io : 1.f);
  __m256* pp = prod_io ? &prod : nullptr;
  int64_t u = t0;
  for (; u + 8 <= t1; u += 8) {
    const __m256 v = W::step(load8(c + W::at(u)), load8(x + W::at(u)), h, pp);
    if (!prod_io) store8(y + W::at(u), v);
  }
  if (u < t1) {  // the last m < 8 steps through buffers; idle steps are identities (c = 1, x = 0)
    const int m = static_cast<int>(t1 - u);
    alignas(32) float cb[8], xb[8], yb[8];
    for (int i = 0; i < 8; ++i) cb[i] = 1.f, xb[i] = 0.f;
    for (int i = 0; i < m; ++i) {
      cb[W::lane(i)] = static_cast<float>(c[(u + i) * S]);
      xb[W::lane(i)] = static_cast<float>(x[(u + i) * S]);
    }
    _mm256_store_ps(yb, W::step(_mm256_load_ps(cb), _mm256_load_ps(xb), h, pp));
    if (!prod_io)
      for (int i = 0; i < m; ++i) y[(u + i) * S] = static_cast<T>(yb[W::lane(i)]);
  }
  *h_io = _mm256_cvtss_f32(h);
  if (prod_io) *prod_io = _mm256_cvtss_f32(prod);
}

// Backward over steps [t0, t1) of one sequence of length L (walk order: the reverse of the
// forward scan): dy, c, y, dx, dc point at step 0; y_L = init.
// Up to 8 backward steps from u through buffers (the first step, whose c_{-1} = 0, and the last,
// whose y_L = init, go this way); idle steps are identities.
template <int S, typename T>
LINREC_AVX2 void walk_backward_partial(const T* c, const T* dy, const T* y, T* dx, T* dc, float init, int64_t L,
                                       int64_t u, int m, __m256& h, __m256* prod) {
  using W = Walk<S>;
  alignas(32) float cb[8], gb[8], yb[8];
  for (int i = 0; i < 8; ++i) cb[i] = 1.f, gb[i] = 0.f, yb[i] = 0.f;
  for (int i = 0; i < m; ++i) {
    const int64_t t = u + i;
    cb[W::lane(i)] = t > 0 ? static_cast<float>(c[(t - 1) * S]) : 0.f;
    gb[W::lane(i)] = static_cast<float>(dy[t * S]);
    if (!prod) yb[W::lane(i)] = t + 1 < L ? static_cast<float>(y[(t + 1) * S]) : init;
  }
  const __m256 g = W::step(_mm256_load_ps(cb), _mm256_load_ps(gb), h, prod);
  if (prod) return;
  _mm256_store_ps(gb, g);
  _mm256_store_ps(yb, _mm256_mul_ps(g, _mm256_load_ps(yb)));
  for (int i = 0; i < m; ++i) {
    dx[(u + i) * S] = static_cast<T>(gb[W::lane(i)]);
    dc[(u + i) * S] = static_cast<T>(yb[W::lane(i)]);
  }
}

template <int S, typename T>
LINREC_AVX2 void walk_backward(const T* c, const T* dy, const T* y, T* dx, T* dc, float init, int64_t L, int64_t t0,
                               int64_t t1, float* h_io, float* prod_io) {
  using W = Walk<S>;
  __m256 h = _mm256_set1_ps(*h_io), prod = _mm256_set1_ps(prod_io ? *prod_io : 1.f);
  __m256* pp = prod_io ? &prod : nullptr;
  int64_t u = t0;
  if (u == 0 && u < t1) {
    const int m = static_cast<int>(t1 - u < 8 ? t1 - u : 8);
    walk_backward_partial<S>(c, dy, y, dx, dc, init, L, u, m, h, pp);
    u += m;
  }
  const int64_t body_end = t1 < L - 1 ? t1 : L - 1;  // full vectors read y up to step u + 8 < L
  for (; u + 8 <= body_end; u += 8) {
    const __m256 g = W::step(load8(c + W::at(u - 1)), load8(dy + W::at(u)), h, pp);
    if (prod_io) continue;
    store8(dx + W::at(u), g);
    store8(dc + W::at(u), _mm256_mul_ps(g, load8(y + W::at(u + 1))));
  }
  while (u < t1) {
    const int m = static_cast<int>(t1 - u < 8 ? t1 - u : 8);
    walk_backward_partial<S>(c, dy, y, dx, dc, init, L, u, m, h, pp);
    u += m;
  }
  *h_io = _mm256_cvtss_f32(h);
  if (prod_io) *prod_io = _mm256_cvtss_f32(prod);
}

// ---------------------------------------------------------------------------------------------
// rows: (B, L, D), a block of n contiguous channels; ls* are the step strides (elements, signed).

template <typename T>
LINREC_AVX2 void rows_forward(const T* c, int64_t lsc, const T* x, int64_t lsx, T* y, int64_t lsy, int64_t n,
                              int64_t t0, int64_t t1, float* h, float* prod) {
  const int64_t nv = n / 8 * 8;
  const bool down = lsc < 0;  // rows at descending addresses: channels last to first too
  for (int64_t t = t0; t < t1; ++t) {
    const T* ct = c + t * lsc;
    const T* xt = x + t * lsx;
    T* yt = y + t * lsy;
    for (int64_t k = 0; k < nv; k += 8) {
      const int64_t d = down ? nv - 8 - k : k;
      const __m256 cv = load8(ct + d);
      const __m256 hv = _mm256_fmadd_ps(cv, _mm256_loadu_ps(h + d), load8(xt + d));
      _mm256_storeu_ps(h + d, hv);
      if (prod)
        _mm256_storeu_ps(prod + d, _mm256_mul_ps(_mm256_loadu_ps(prod + d), cv));
      else
        store8(yt + d, hv);
    }
    for (int64_t d = nv; d < n; ++d) {
      const float cs = static_cast<float>(ct[d]);
      h[d] = cs * h[d] + static_cast<float>(xt[d]);
      if (prod)
        prod[d] *= cs;
      else
        yt[d] = static_cast<T>(h[d]);
    }
  }
}

// init: the initial state of each channel (y_L), or nullptr for zeros; its channel stride cs0.
template <typename T>
LINREC_AVX2 void rows_backward(const T* c, int64_t lsc, const T* dy, int64_t lsdy, const T* y, int64_t lsy, T* dx,
                               int64_t lsdx, T* dc, int64_t lsdc, const float* init, int64_t L, int64_t n,
                               int64_t t0, int64_t t1, float* h, float* prod) {
  const int64_t nv = n / 8 * 8;
  const bool down = lsdy < 0;  // rows at descending addresses: channels last to first too
  for (int64_t t = t0; t < t1; ++t) {
    const T* cp = t > 0 ? c + (t - 1) * lsc : nullptr;  // c_{-1} = 0
    const T* gt = dy + t * lsdy;
    const T* yn = t + 1 < L ? y + (t + 1) * lsy : nullptr;
    T* dxt = dx + t * lsdx;
    T* dct = dc + t * lsdc;
    for (int64_t k = 0; k < nv; k += 8) {
      const int64_t d = down ? nv - 8 - k : k;
      const __m256 cv = cp ? load8(cp + d) : _mm256_setzero_ps();
      const __m256 g = _mm256_fmadd_ps(cv, _mm256_loadu_ps(h + d), load8(gt + d));
      _mm256_storeu_ps(h + d, g);
      if (prod) {
        _mm256_storeu_ps(prod + d, _mm256_mul_ps(_mm256_loadu_ps(prod + d), cv));
        continue;
      }
      const __m256 yv = yn ? load8(yn + d) : (init ? _mm256_loadu_ps(init + d) : _mm256_setzero_ps());
      store8(dxt + d, g);
      store8(dct + d, _mm256_mul_ps(g, yv));
    }
    for (int64_t d = nv; d < n; ++d) {
      const float cs = cp ? static_cast<float>(cp[d]) : 0.f;
      h[d] = cs * h[d] + static_cast<float>(gt[d]);
      if (prod) {
        prod[d] *= cs;
        continue;
      }
      const float yv = yn ? static_cast<float>(yn[d]) : (init ? init[d] : 0.f);
      dxt[d] = static_cast<T>(h[d]);
      dct[d] = static_cast<T>(h[d] * yv);
    }
  }
}

}  // namespace avx2
}  // namespace linrec
#endif
