// The pair walk of the CPU scan (see scan_avx2.h, whose Walk::pair_step, loads, stores and target
// attribute it uses): two (N, L) sequences of one length side by side, one per 128-bit half.
#pragma once
#include "scan_avx2.h"

#ifdef LINREC_HAVE_AVX2
namespace linrec {
namespace avx2 {

// ---------------------------------------------------------------------------------------------
// The pair walk's body: two sequences of one length side by side (Walk::pair_step, pair_step16),
// over steps [t0, t1), t1 - t0 a multiple of kPairSteps; h: each one's entering state, then its state after t1. The
// caller runs their first and last steps alone (walk_forward, walk_backward), where the partial
// vectors are.

// Both halves' states of a pair vector.
LINREC_AVX2 inline void pair_states(__m256 h, float* out) {
  out[0] = _mm256_cvtss_f32(h);
  out[1] = _mm_cvtss_f32(_mm256_extractf128_ps(h, 1));
}
LINREC_AVX2 inline __m256 pair_broadcast(const float* h) {
  return _mm256_insertf128_ps(_mm256_set1_ps(walk_state(h[0])), _mm_set1_ps(walk_state(h[1])), 1);
}

// Steps per iteration of the pair walk (bfloat16: step16's 16, as its one-sequence walk).
template <typename T>
constexpr int64_t kPairSteps = std::is_same_v<T, c10::BFloat16> ? 16 : 8;

// kC: a read input may be constant along L (tested per load; the loops without any are separate
// instances, so that theirs test nothing).
template <int S, typename T, bool kC>
LINREC_AVX2 void walk_forward_pair_loop(WalkIn<S, T> ca, WalkIn<S, T> xa, T* ya, WalkIn<S, T> cb, WalkIn<S, T> xb,
                                        T* yb, int64_t t0, int64_t t1, float* h_io) {
  using W = Walk<S>;
  __m256 h = pair_broadcast(h_io);
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    for (int64_t u = t0; u < t1; u += 16) {
      __m256 ca0, cb0, xa0, xb0, ca1, cb1, xa1, xb1;
      ca.template pair8<kC>(cb, u, ca0, cb0);
      xa.template pair8<kC>(xb, u, xa0, xb0);
      ca.template pair8<kC>(cb, u + 8, ca1, cb1);
      xa.template pair8<kC>(xb, u + 8, xa1, xb1);
      W::pair_step16(ca0, xa0, cb0, xb0, ca1, xa1, cb1, xb1, h);
      store8x2(ya + W::at(u), yb + W::at(u), xa0, xb0);
      store8x2(ya + W::at(u + 8), yb + W::at(u + 8), xa1, xb1);
    }
    return pair_states(h, h_io);
  }
  for (int64_t u = t0; u < t1; u += 8) {
    __m256 x0 = xa.template pair4<kC>(xb, u), x1 = xa.template pair4<kC>(xb, u + 4);
    W::pair_step(ca.template pair4<kC>(cb, u), x0, ca.template pair4<kC>(cb, u + 4), x1, h);
    store4x2(ya + W::at4(u), yb + W::at4(u), x0);
    store4x2(ya + W::at4(u + 4), yb + W::at4(u + 4), x1);
  }
  pair_states(h, h_io);
}

template <int S, typename T>
LINREC_AVX2 void walk_forward_pair(WalkIn<S, T> ca, WalkIn<S, T> xa, T* ya, WalkIn<S, T> cb, WalkIn<S, T> xb, T* yb,
                                   int64_t t0, int64_t t1, float* h_io) {
  if (ca.constant || xa.constant)
    walk_forward_pair_loop<S, T, true>(ca, xa, ya, cb, xb, yb, t0, t1, h_io);
  else
    walk_forward_pair_loop<S, T, false>(ca, xa, ya, cb, xb, yb, t0, t1, h_io);
}

// Backward (walk_backward's recurrence): needs t0 >= 1 (c_{u-1}) and t1 < L (y_{u+1}).
template <int S, typename T, bool kC>
LINREC_AVX2 void walk_backward_pair_loop(WalkIn<S, T> ca, WalkIn<S, T> dya, WalkIn<S, T> ya, T* dxa, T* dca,
                                         WalkIn<S, T> cb, WalkIn<S, T> dyb, WalkIn<S, T> yb, T* dxb, T* dcb,
                                         int64_t t0, int64_t t1, float* h_io) {
  using W = Walk<S>;
  __m256 h = pair_broadcast(h_io);
  // Loads before stores, the next iteration's c_{u-1} among them (walk_backward says why).
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    __m256 ca0, cb0, ca1, cb1;
    if (t0 < t1) {
      ca.template pair8<kC>(cb, t0 - 1, ca0, cb0);
      ca.template pair8<kC>(cb, t0 + 7, ca1, cb1);
    }
    for (int64_t u = t0; u < t1; u += 16) {
      __m256 ga0, gb0, ga1, gb1, ya0, yb0, ya1, yb1, c_a0 = ca0, c_b0 = cb0, c_a1 = ca1, c_b1 = cb1;
      dya.template pair8<kC>(dyb, u, ga0, gb0);
      dya.template pair8<kC>(dyb, u + 8, ga1, gb1);
      ya.template pair8<kC>(yb, u + 1, ya0, yb0);
      ya.template pair8<kC>(yb, u + 9, ya1, yb1);
      if (u + 16 < t1) {
        ca.template pair8<kC>(cb, u + 15, ca0, cb0);
        ca.template pair8<kC>(cb, u + 23, ca1, cb1);
      }
      W::pair_step16(c_a0, ga0, c_b0, gb0, c_a1, ga1, c_b1, gb1, h);
      store8x2(dxa + W::at(u), dxb + W::at(u), ga0, gb0);
      store8x2(dxa + W::at(u + 8), dxb + W::at(u + 8), ga1, gb1);
      store8x2(dca + W::at(u), dcb + W::at(u), _mm256_mul_ps(ga0, ya0), _mm256_mul_ps(gb0, yb0));
      store8x2(dca + W::at(u + 8), dcb + W::at(u + 8), _mm256_mul_ps(ga1, ya1), _mm256_mul_ps(gb1, yb1));
    }
    return pair_states(h, h_io);
  }
  __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
  if (t0 < t1) c0 = ca.template pair4<kC>(cb, t0 - 1), c1 = ca.template pair4<kC>(cb, t0 + 3);
  for (int64_t u = t0; u < t1; u += 8) {
    const __m256 c0_u = c0, c1_u = c1;
    __m256 g0 = dya.template pair4<kC>(dyb, u), g1 = dya.template pair4<kC>(dyb, u + 4);
    const __m256 y0 = ya.template pair4<kC>(yb, u + 1), y1 = ya.template pair4<kC>(yb, u + 5);
    if (u + 8 < t1) c0 = ca.template pair4<kC>(cb, u + 7), c1 = ca.template pair4<kC>(cb, u + 11);
    W::pair_step(c0_u, g0, c1_u, g1, h);
    store4x2(dxa + W::at4(u), dxb + W::at4(u), g0);
    store4x2(dxa + W::at4(u + 4), dxb + W::at4(u + 4), g1);
    store4x2(dca + W::at4(u), dcb + W::at4(u), _mm256_mul_ps(g0, y0));
    store4x2(dca + W::at4(u + 4), dcb + W::at4(u + 4), _mm256_mul_ps(g1, y1));
  }
  pair_states(h, h_io);
}

template <int S, typename T>
LINREC_AVX2 void walk_backward_pair(WalkIn<S, T> ca, WalkIn<S, T> dya, WalkIn<S, T> ya, T* dxa, T* dca,
                                    WalkIn<S, T> cb, WalkIn<S, T> dyb, WalkIn<S, T> yb, T* dxb, T* dcb, int64_t t0,
                                    int64_t t1, float* h_io) {
  if (ca.constant || dya.constant || ya.constant)
    walk_backward_pair_loop<S, T, true>(ca, dya, ya, dxa, dca, cb, dyb, yb, dxb, dcb, t0, t1, h_io);
  else
    walk_backward_pair_loop<S, T, false>(ca, dya, ya, dxa, dca, cb, dyb, yb, dxb, dcb, t0, t1, h_io);
}

}  // namespace avx2
}  // namespace linrec
#endif
