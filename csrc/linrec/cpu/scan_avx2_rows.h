// The AVX2 rows kernel of the CPU scan (see scan_avx2.h, whose loads, stores and target attribute
// it uses): the (B, L, D) layout, a block of contiguous channels walking L.
#pragma once
#include "scan_avx2.h"

#ifdef LINREC_HAVE_AVX2
namespace linrec {
namespace avx2 {

// ---------------------------------------------------------------------------------------------
// rows: (B, L, D), a block of n contiguous channels; ls* are the step strides (elements, signed).
// Each step rounds c h and then adds x, as the strided path does (built for the baseline x86-64,
// without FMA), so that the two agree to the bit: a broadcast input takes the strided path, the
// same values materialised this one.

// a * b rounded, never contracted with a following add into an FMA (the empty asm hides the
// product from the optimiser).
LINREC_AVX2 inline __m256 mul_rounded(__m256 a, __m256 b) {
  __m256 m = _mm256_mul_ps(a, b);
  asm("" : "+x"(m));
  return m;
}
LINREC_AVX2 inline float mul_rounded(float a, float b) {
  float m = a * b;
  asm("" : "+x"(m));
  return m;
}

// kStream (float only): the outputs by non-temporal stores (rows 32-byte aligned; the caller's choice).
template <bool kStream, typename T>
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
      const __m256 hv = _mm256_add_ps(mul_rounded(cv, _mm256_loadu_ps(h + d)), load8(xt + d));
      _mm256_storeu_ps(h + d, hv);
      if (prod)
        _mm256_storeu_ps(prod + d, advance_product(_mm256_loadu_ps(prod + d), cv));
      else if constexpr (kStream)
        stream8(yt + d, hv);
      else
        store8(yt + d, hv);
    }
    for (int64_t d = nv; d < n; ++d) {
      const float cs = static_cast<float>(ct[d]);
      h[d] = mul_rounded(cs, h[d]) + static_cast<float>(xt[d]);
      if (prod)
        prod[d] = advance_product(prod[d], cs);
      else
        yt[d] = static_cast<T>(h[d]);
    }
  }
  if (kStream && !prod) stream_fence();
}

// init: the initial state of each channel (y_L), or nullptr for zeros; its channel stride cs0.
template <bool kStream, typename T>
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
      const __m256 g = _mm256_add_ps(mul_rounded(cv, _mm256_loadu_ps(h + d)), load8(gt + d));
      _mm256_storeu_ps(h + d, g);
      if (prod) {
        _mm256_storeu_ps(prod + d, advance_product(_mm256_loadu_ps(prod + d), cv));
        continue;
      }
      const __m256 yv = yn ? load8(yn + d) : (init ? _mm256_loadu_ps(init + d) : _mm256_setzero_ps());
      if constexpr (kStream) {
        stream8(dxt + d, g);
        stream8(dct + d, _mm256_mul_ps(g, yv));
      } else {
        store8(dxt + d, g);
        store8(dct + d, _mm256_mul_ps(g, yv));
      }
    }
    for (int64_t d = nv; d < n; ++d) {
      const float cs = cp ? static_cast<float>(cp[d]) : 0.f;
      h[d] = mul_rounded(cs, h[d]) + static_cast<float>(gt[d]);
      if (prod) {
        prod[d] = advance_product(prod[d], cs);
        continue;
      }
      const float yv = yn ? static_cast<float>(yn[d]) : (init ? init[d] : 0.f);
      dxt[d] = static_cast<T>(h[d]);
      dct[d] = static_cast<T>(h[d] * yv);
    }
  }
  if (kStream && !prod) stream_fence();
}

}  // namespace avx2
}  // namespace linrec
#endif
