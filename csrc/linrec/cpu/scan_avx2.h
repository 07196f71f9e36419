// AVX2 kernels of the CPU scan (csrc/linrec/cpu/scan_cpu.cpp runs them where the CPU has AVX2,
// FMA and F16C; the extension itself is built for the baseline x86-64, so every function here
// carries its own target attribute).
//
// Two kernels, for the two layouts where one operand access can cover 8 values:
// - walk: the (N, L) layout, every operand contiguous along L (stride +1 or -1; an input may also
//   be constant along L). One sequence at a time, 8 steps per vector (16 for bfloat16, as 8 pairs): an
//   in-register scan (3 shift-and-combine levels of the affine maps (c, x)) gives each lane its
//   local state and coefficient product, then y = X + C h carries the state in. The carried state
//   is the only serial dependency: one FMA per vector. The pair walk runs the same operations on
//   two sequences at once, one per 128-bit half, so the carry between a vector's halves becomes a
//   carry between two vectors (in-half shuffles only): 1.4-1.5x faster (bench/NOTES.md, item 59;
//   its loops: scan_avx2_pairs.h).
// - rows (scan_avx2_rows.h): the (B, L, D) layout, channels contiguous. One block of channels
//   walks L; each step streams one contiguous run per operand through 8-channel vectors, with the
//   block's states in an L1-resident array (at most kMaxRowBlock channels).
// Both advance a state over steps [t0, t1) of the recurrence: the forward scan, or the backward one
// g_u = c_{u-1} g_{u-1} + dy_u with dx_u = g_u, dc_u = g_u y_{u+1} (y_L = initial). With `prod`
// (a chunk summary for the chained split) they multiply prod by every step's coefficient
// (advance_product) and write nothing.
#pragma once
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LINREC_HAVE_AVX2 1
#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#define LINREC_AVX2 __attribute__((target("avx2,fma,f16c")))
// The walk's per-vector steps: always inlined into their loops (GCC left pair_step out of line in
// one instance of a loop, with its state on the stack: 2x slower).
#define LINREC_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline))

namespace linrec {
namespace avx2 {

// A chunk summary's coefficient product advanced by c, with a product below the smallest normal
// float flushed to zero (NaN and inf kept): once subnormal, every multiply of a decaying product
// took a microcode assist on Intel (float32 1 x 4096 x 1024 split in 3 chunks, c in (0.5, 1):
// forward 1.8 -> 7.4 ms, the ~56 subnormal steps of each channel's product; bench/NOTES.md item 77).
// The flushed part of the carried state, prod x state, is below FLT_MIN x |state|.
LINREC_AVX2 inline __m256 advance_product(__m256 prod, __m256 c) {
  const __m256 p = _mm256_mul_ps(prod, c);
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.f), p);
  return _mm256_and_ps(p, _mm256_cmp_ps(magnitude, _mm256_set1_ps(std::numeric_limits<float>::min()), _CMP_NLT_UQ));
}
LINREC_AVX2 inline float advance_product(float prod, float c) {
  const float p = prod * c;
  return std::fabs(p) < std::numeric_limits<float>::min() ? 0.f : p;
}

// Whether this CPU runs the kernels below.
inline bool supported() {
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok;
}

constexpr int64_t kMaxRowBlock = 4096;  // channels of one rows-kernel block (16 KiB of states)

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
// Each lane rounded to nearest even bfloat16 in its high half (u + 0x7fff + the kept part's
// lowest bit), with no NaN test: a NaN whose low 16 bits are zero keeps its high half, still a NaN.
LINREC_AVX2 inline __m256i bf16_round_high(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd);
}
// The bfloat16 bits of each lane (in its low 16 bits), NaN as c10::BFloat16 gives it (0x7fc0).
LINREC_AVX2 inline __m256i bf16_bits(__m256 v) {
  const __m256i r = _mm256_srli_epi32(bf16_round_high(v), 16);
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc0)),
                                              _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
LINREC_AVX2 inline void store8(c10::BFloat16* p, __m256 v) {
  const __m256i r = bf16_bits(v);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
// 16 bfloat16 values as two float vectors, split by parity: a holds the even elements 0, 2, .., 14,
// b the odd ones (each a 32-bit word's low and high halves: a shift and a mask, no shuffle).
LINREC_AVX2 inline void load16(const c10::BFloat16* p, __m256& a, __m256& b) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  a = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  b = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
// The inverse of load16, rounded by bf16_round_high with no NaN test (c10::BFloat16 would give
// 0x7fc0): the walk stores only results of arithmetic on bfloat16 inputs and NaN-free or quiet-NaN
// states (walk_state), and x86 arithmetic returns one of its NaN operands, quieted, or the default
// NaN 0xffc00000: every NaN it stores has its low 16 bits zero.
LINREC_AVX2 inline void store16(c10::BFloat16* p, __m256 a, __m256 b) {
  const __m256i w = _mm256_blend_epi16(_mm256_srli_epi32(bf16_round_high(a), 16), bf16_round_high(b), 0xaa);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), w);
}
LINREC_AVX2 inline void store8(c10::Half* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

// store8 by a non-temporal store (past the caches, no read for ownership): p 32-byte aligned.
// Ordered by an sfence (stream_fence) before other threads read the stores.
LINREC_AVX2 inline void stream8(float* p, __m256 v) { _mm256_stream_ps(p, v); }
LINREC_AVX2 inline void stream_fence() { _mm_sfence(); }

// 4 values of each of two sequences as one float vector: a's in the low half, b's in the high one
// (the pair walk's layout), and back.
LINREC_AVX2 inline __m256 load4x2(const float* a, const float* b) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(a)), _mm_loadu_ps(b), 1);
}
LINREC_AVX2 inline __m128i load_halves(const void* a, const void* b) {  // 8 bytes at a, 8 at b
  const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a));
  return _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(lo), reinterpret_cast<const double*>(b)));
}
LINREC_AVX2 inline __m256 load4x2(const c10::BFloat16* a, const c10::BFloat16* b) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load_halves(a, b)), 16));
}
LINREC_AVX2 inline __m256 load4x2(const c10::Half* a, const c10::Half* b) { return _mm256_cvtph_ps(load_halves(a, b)); }
// 8 bfloat16 values of each of two sequences (a's in the low half, b's in the high one), split by
// parity as load16 does: even holds elements 0, 2, 4, 6 of each, odd elements 1, 3, 5, 7.
LINREC_AVX2 inline void load8x2(const c10::BFloat16* a, const c10::BFloat16* b, __m256& even, __m256& odd) {
  const __m256i w = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(b), reinterpret_cast<const __m128i*>(a));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
LINREC_AVX2 inline void store_halves(void* a, void* b, __m128i v) {  // v's low 8 bytes at a, high 8 at b
  _mm_storel_epi64(reinterpret_cast<__m128i*>(a), v);
  _mm_storeh_pd(reinterpret_cast<double*>(b), _mm_castsi128_pd(v));
}
LINREC_AVX2 inline void store4x2(float* a, float* b, __m256 v) {
  _mm_storeu_ps(a, _mm256_castps256_ps128(v));
  _mm_storeu_ps(b, _mm256_extractf128_ps(v, 1));
}
LINREC_AVX2 inline void store4x2(c10::BFloat16* a, c10::BFloat16* b, __m256 v) {
  const __m256i r = bf16_bits(v);
  store_halves(a, b, _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08)));
}
LINREC_AVX2 inline void store4x2(c10::Half* a, c10::Half* b, __m256 v) {
  store_halves(a, b, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
// The inverse of load8x2, rounded as store16.
LINREC_AVX2 inline void store8x2(c10::BFloat16* a, c10::BFloat16* b, __m256 even, __m256 odd) {
  const __m256i w = _mm256_blend_epi16(_mm256_srli_epi32(bf16_round_high(even), 16), bf16_round_high(odd), 0xaa);
  _mm256_storeu2_m128i(reinterpret_cast<__m128i*>(b), reinterpret_cast<__m128i*>(a), w);
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
  // K steps of each half take zero (the byte shift's own fill), or `fill`.
  template <int K>
  LINREC_AVX2 static __m256 shift_in_half(__m256 v) {
    const __m256i w = _mm256_castps_si256(v);
    return _mm256_castsi256_ps(S > 0 ? _mm256_slli_si256(w, 4 * K) : _mm256_srli_si256(w, 4 * K));
  }
  // Each step takes the value of the step one earlier (kLater) or one later (!kLater) in walk order
  // across the whole vector; the step left without one takes `fill` (a scalar).
  template <bool kLater>
  LINREC_AVX2 static __m256 shift_step(__m256 v, float fill) {
    // lane i <- lane i - 1 (walk steps later in higher lanes for S > 0), or i + 1
    constexpr bool kUp = kLater == (S > 0);
    const __m256i idx = kUp ? _mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6) : _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 7);
    return _mm256_blend_ps(_mm256_permutevar8x32_ps(v, idx), _mm256_set1_ps(fill), kUp ? 0x01 : 0x80);
  }

  template <int K>
  LINREC_AVX2 static __m256 shift_in_half(__m256 v, __m256 fill) {
    constexpr int mask = S > 0 ? (K == 1 ? 0x11 : 0x33) : (K == 1 ? 0x88 : 0xcc);
    return _mm256_blend_ps(shift_in_half<K>(v), fill, mask);
  }

  // The carry between the two halves of a vector whose halves hold consecutive runs of 4 walk
  // steps, each scanned locally ((c, x): coefficient product and state from a zero state). The
  // first run's totals go out through memory and come back as broadcast loads: the load ports are
  // idle, the shuffle pipes are the walk's bottleneck (3 cross-half shuffles per carry before).
  // tc, tx: the first run's totals (c, x) in the second half's lanes, (1, 0) in the first's;
  // lc, lx: the totals of all 8 steps in every lane.
  LINREC_AVX2_INLINE static void carry_halves(__m256 c, __m256 x, __m256& tc, __m256& tx, __m256& lc, __m256& lx) {
    alignas(32) float cb[8], xb[8];
    _mm256_store_ps(cb, c);
    _mm256_store_ps(xb, x);
    constexpr int kMid = S > 0 ? 3 : 4, kSecond = S > 0 ? 0xf0 : 0x0f;
    const __m256 c1 = _mm256_broadcast_ss(cb + kMid), x1 = _mm256_broadcast_ss(xb + kMid);
    const __m256 c2 = _mm256_broadcast_ss(cb + kLast), x2 = _mm256_broadcast_ss(xb + kLast);
    tc = _mm256_blend_ps(_mm256_set1_ps(1.f), c1, kSecond);
    tx = _mm256_blend_ps(_mm256_setzero_ps(), x1, kSecond);
    lc = _mm256_mul_ps(c2, c1);
    lx = _mm256_fmadd_ps(c2, x1, x2);
  }

  // One vector: h (broadcast) -> each step's state; h and prod advance past its 8 steps. The
  // in-register scan: two levels inside each half, then the first half's total carried into the
  // second.
  LINREC_AVX2_INLINE static __m256 step(__m256 c, __m256 x, __m256& h, __m256* prod) {
    __m256 tc, tx, lc, lx;
    x_scan4(c, x);
    carry_halves(c, x, tc, tx, lc, lx);
    x = _mm256_fmadd_ps(c, tx, x);
    c = _mm256_mul_ps(c, tc);
    const __m256 y = _mm256_fmadd_ps(c, h, x);
    h = _mm256_fmadd_ps(lc, h, lx);
    if (prod) *prod = advance_product(*prod, lc);
    return y;
  }

  // 16 steps in load16's order: lane i of (a, b) holds one pair of consecutive steps (walking up,
  // a's step first; walking down, b's), the pairs in walk order as the steps of an 8-step vector.
  // Each pair is combined into its second step, the 8 pair totals are scanned as in step(), and
  // each pair's first step takes the state before the pair. a and b become each step's state; h
  // and prod advance past all 16.
  LINREC_AVX2_INLINE static void step16(__m256 ca, __m256& xa, __m256 cb, __m256& xb, __m256& h, __m256* prod) {
    __m256& c1 = S > 0 ? ca : cb;  // the first step of each pair
    __m256& x1 = S > 0 ? xa : xb;
    __m256& c2 = S > 0 ? cb : ca;
    __m256& x2 = S > 0 ? xb : xa;
    x2 = _mm256_fmadd_ps(c2, x1, x2);
    c2 = _mm256_mul_ps(c2, c1);
    x_scan4(c2, x2);
    __m256 tc, tx, lc, lx;
    carry_halves(c2, x2, tc, tx, lc, lx);
    x2 = _mm256_fmadd_ps(c2, tx, x2);
    c2 = _mm256_mul_ps(c2, tc);
    x2 = _mm256_fmadd_ps(c2, h, x2);
    // the state before each pair: the previous pair's, h before the first half, the first half's
    // last state before the second
    x1 = _mm256_fmadd_ps(c1, shift_in_half<1>(x2, _mm256_fmadd_ps(tc, h, tx)), x1);
    h = _mm256_fmadd_ps(lc, h, lx);
    if (prod) *prod = advance_product(*prod, lc);
  }

  // The two in-half levels of the in-register scan: a local scan of each 4 steps.
  LINREC_AVX2_INLINE static void x_scan4(__m256& c, __m256& x) {
    const __m256 one = _mm256_set1_ps(1.f);
    x = _mm256_fmadd_ps(c, shift_in_half<1>(x), x);
    c = _mm256_mul_ps(c, shift_in_half<1>(c, one));
    x = _mm256_fmadd_ps(c, shift_in_half<2>(x), x);
    c = _mm256_mul_ps(c, shift_in_half<2>(c, one));
  }

  // Offset of the 16 steps u .. u+15.
  static int64_t at16(int64_t u) { return S > 0 ? u : -u - 15; }

  // The pair walk: two sequences side by side, one per 128-bit half, 4 steps per half (step u + i
  // in lane i of its half walking up, 3 - i walking down, as in the halves of an 8-step vector).
  static int64_t at4(int64_t u) { return S > 0 ? u : -u - 3; }

  // The last walk step of each half, in all of that half's lanes.
  LINREC_AVX2_INLINE static __m256 last_in_half(__m256 v) { return _mm256_permute_ps(v, S > 0 ? 0xff : 0x00); }

  // 8 steps of each of the pair: (c0, x0) the first 4, (c1, x1) the next 4; x0, x1 become each
  // step's state, h (each half's state, in all its lanes) advances past them. The operations of
  // step() on the same 8 steps, in the same order, so a sequence gets the same bits in a pair as
  // alone; but the carried state's dependency is one FMA and one in-half shuffle per 8 steps of
  // two sequences, with no cross-half shuffle or trip through memory.
  LINREC_AVX2_INLINE static void pair_step(__m256 c0, __m256& x0, __m256 c1, __m256& x1, __m256& h) {
    x_scan4(c0, x0);
    x_scan4(c1, x1);
    x1 = _mm256_fmadd_ps(c1, last_in_half(x0), x1);
    c1 = _mm256_mul_ps(c1, last_in_half(c0));
    x0 = _mm256_fmadd_ps(c0, h, x0);
    x1 = _mm256_fmadd_ps(c1, h, x1);
    h = last_in_half(x1);
  }

  // 16 steps of each of the pair in load8x2's order, as step16 takes them: (ca0, xa0, cb0, xb0) the
  // first 8 steps of each (4 pairs of steps per half), (ca1, ..) the next 8. step16's operations in
  // its order, as pair_step is step()'s. The x become each step's state.
  LINREC_AVX2_INLINE static void pair_step16(__m256 ca0, __m256& xa0, __m256 cb0, __m256& xb0, __m256 ca1, __m256& xa1,
                                      __m256 cb1, __m256& xb1, __m256& h) {
    __m256& c1_0 = S > 0 ? ca0 : cb0;  // the first step of each pair
    __m256& x1_0 = S > 0 ? xa0 : xb0;
    __m256& c2_0 = S > 0 ? cb0 : ca0;
    __m256& x2_0 = S > 0 ? xb0 : xa0;
    __m256& c1_1 = S > 0 ? ca1 : cb1;
    __m256& x1_1 = S > 0 ? xa1 : xb1;
    __m256& c2_1 = S > 0 ? cb1 : ca1;
    __m256& x2_1 = S > 0 ? xb1 : xa1;
    x2_0 = _mm256_fmadd_ps(c2_0, x1_0, x2_0);
    c2_0 = _mm256_mul_ps(c2_0, c1_0);
    x2_1 = _mm256_fmadd_ps(c2_1, x1_1, x2_1);
    c2_1 = _mm256_mul_ps(c2_1, c1_1);
    const __m256 h_in = h;
    pair_step(c2_0, x2_0, c2_1, x2_1, h);  // each pair's second step's state; h past all 16
    x1_0 = _mm256_fmadd_ps(c1_0, shift_in_half<1>(x2_0, h_in), x1_0);
    x1_1 = _mm256_fmadd_ps(c1_1, shift_in_half<1>(x2_1, last_in_half(x2_0)), x1_1);
  }
};

// A walk's entering state (or coefficient product), with a NaN replaced by the quiet NaN 0x7fc00000
// (low 16 bits zero, as store16 needs).
inline float walk_state(float h) { return h != h ? __builtin_nanf("") : h; }

// A read operand of the walk, at its step 0: contiguous along L in the walk's direction, or
// constant along L (stride 0, a broadcast input).
template <int S, typename T>
struct WalkIn {
  const T* p;
  bool constant;

  float value(int64_t t) const { return static_cast<float>(p[constant ? 0 : t * S]); }
  LINREC_AVX2 __m256 vec8(int64_t u) const {
    return constant ? _mm256_set1_ps(static_cast<float>(*p)) : load8(p + Walk<S>::at(u));
  }
  // Steps u .. u+3 of this sequence (low half) and of b (high half). kMaybeConst = false: the caller
  // has checked that the input is not constant (a loop without the test).
  template <bool kMaybeConst>
  LINREC_AVX2 __m256 pair4(const WalkIn& b, int64_t u) const {
    if (kMaybeConst && constant)
      return _mm256_insertf128_ps(_mm256_set1_ps(static_cast<float>(*p)), _mm_set1_ps(static_cast<float>(*b.p)), 1);
    return load4x2(p + Walk<S>::at4(u), b.p + Walk<S>::at4(u));
  }
  // Steps u .. u+7 of this sequence (low half) and of b (high half), bfloat16 split by parity.
  template <bool kMaybeConst>
  LINREC_AVX2 void pair8(const WalkIn& b, int64_t u, __m256& even, __m256& odd) const {
    if (kMaybeConst && constant)
      even = odd = _mm256_insertf128_ps(_mm256_set1_ps(static_cast<float>(*p)), _mm_set1_ps(static_cast<float>(*b.p)), 1);
    else
      load8x2(p + Walk<S>::at(u), b.p + Walk<S>::at(u), even, odd);
  }
  LINREC_AVX2 void vec16(int64_t u, __m256& a, __m256& b) const {
    if (constant)
      a = b = _mm256_set1_ps(static_cast<float>(*p));
    else
      load16(p + Walk<S>::at16(u), a, b);
  }
};

// The lanes of walk steps 0 .. k-1 of a vector (all bits set), for 0 <= k <= 8.
template <int S>
LINREC_AVX2 inline __m256i step_lanes(int k) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return S > 0 ? _mm256_cmpgt_epi32(_mm256_set1_epi32(k), lane) : _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(7 - k));
}

// The steps of `in` (float32) in the lanes of `mask` from the vector of walk steps u .. u+7, `idle`
// in the others (no memory touched there).
template <int S, typename T>
LINREC_AVX2 inline __m256 masked_steps(const WalkIn<S, T>& in, int64_t u, __m256i mask, float idle) {
  const __m256 v = in.constant ? _mm256_set1_ps(static_cast<float>(*in.p))
                               : _mm256_maskload_ps(reinterpret_cast<const float*>(in.p) + Walk<S>::at(u), mask);
  return _mm256_blendv_ps(_mm256_set1_ps(idle), v, _mm256_castsi256_ps(mask));
}

// float16's steps of `in` in walk lanes [lo, hi) of the vector of walk steps u .. u+7, `idle` in the
// others, no memory touched outside those steps: their bits copied into a 16-byte buffer, then one
// F16C conversion (AVX2 has no 16-bit masked load; step by step, each a software conversion, an fp16
// row of 12 steps ran its backward 1.5x slower; bench/NOTES.md item 79. bfloat16's per-step
// conversion is a shift: a buffer made its forward no faster).
template <int S>
LINREC_AVX2_INLINE inline __m256 half_steps(const WalkIn<S, c10::Half>& in, int64_t u, int lo, int hi, float idle) {
  const __m256i mask = _mm256_andnot_si256(step_lanes<S>(lo), step_lanes<S>(hi));
  __m256 v;
  if (in.constant) {
    v = _mm256_set1_ps(static_cast<float>(*in.p));
  } else {
    alignas(16) uint16_t buf[8] = {};
    const uint16_t* src = reinterpret_cast<const uint16_t*>(in.p + Walk<S>::at(u));
    for (int j = S > 0 ? lo : 8 - hi, end = S > 0 ? hi : 8 - lo; j < end; ++j) buf[j] = src[j];  // memory order
    v = load8(reinterpret_cast<const c10::Half*>(buf));
  }
  return _mm256_blendv_ps(_mm256_set1_ps(idle), v, _mm256_castsi256_ps(mask));
}

// Walk lanes [0, m) of v to float16 steps u .. u+m-1 of `out` (no other memory written): one F16C
// conversion into a buffer, then those steps' bits.
template <int S>
LINREC_AVX2_INLINE inline void half_store(c10::Half* out, int64_t u, int m, __m256 v) {
  alignas(16) c10::Half buf[8];
  store8(buf, v);
  uint16_t* dst = reinterpret_cast<uint16_t*>(out + Walk<S>::at(u));
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(buf);
  for (int j = S > 0 ? 0 : 8 - m, end = S > 0 ? m : 8; j < end; ++j) dst[j] = bits[j];
}

// Forward over steps [t0, t1) of one sequence: y points at its step 0. kProd: a chunk summary
// (prod_io), nothing written; a template flag, so that the plain scan's loop tests nothing per
// vector (with a run-time test the compiler kept the state and the loop counter on the stack).
template <int S, bool kProd, typename T>
LINREC_AVX2 void walk_forward(WalkIn<S, T> c, WalkIn<S, T> x, T* y, int64_t t0, int64_t t1, float* h_io,
                              float* prod_io) {
  using W = Walk<S>;
  __m256 h = _mm256_set1_ps(walk_state(*h_io)), prod = _mm256_set1_ps(kProd ? walk_state(*prod_io) : 1.f);
  __m256* pp = kProd ? &prod : nullptr;
  int64_t u = t0;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    for (; u + 16 <= t1; u += 16) {
      __m256 ca, cb, xa, xb;
      c.vec16(u, ca, cb);
      x.vec16(u, xa, xb);
      W::step16(ca, xa, cb, xb, h, pp);
      if (!kProd) store16(y + W::at16(u), xa, xb);
    }
  }
  for (; u + 8 <= t1; u += 8) {
    const __m256 v = W::step(c.vec8(u), x.vec8(u), h, pp);
    if (!kProd) store8(y + W::at(u), v);
  }
  if constexpr (std::is_same_v<T, float>) {
    if (u < t1) {
      // float32's last m < 8 steps by masked loads and stores (lanes of the steps: the low m walking
      // up, the high m walking down); idle steps are identities (c = 1, x = 0). A row of 17 steps
      // spent ~25 ns in the buffers below (bench/NOTES.md item 77).
      const __m256i mask = step_lanes<S>(static_cast<int>(t1 - u));
      const __m256 v = W::step(masked_steps(c, u, mask, 1.f), masked_steps(x, u, mask, 0.f), h, pp);
      if (!kProd) _mm256_maskstore_ps(reinterpret_cast<float*>(y) + W::at(u), mask, v);
      u = t1;
    }
  }
  if constexpr (std::is_same_v<T, c10::Half>) {
    if (u < t1) {  // float16's last m < 8 steps through a 16-byte buffer (half_steps)
      const int m = static_cast<int>(t1 - u);
      const __m256 v = W::step(half_steps(c, u, 0, m, 1.f), half_steps(x, u, 0, m, 0.f), h, pp);
      if (!kProd) half_store<S>(y, u, m, v);
      u = t1;
    }
  }
  if (u < t1) {  // the last m < 8 steps through buffers; idle steps are identities (c = 1, x = 0)
    const int m = static_cast<int>(t1 - u);
    alignas(32) float cb[8], xb[8], yb[8];
    for (int i = 0; i < 8; ++i) cb[i] = 1.f, xb[i] = 0.f;
    for (int i = 0; i < m; ++i) {
      cb[W::lane(i)] = c.value(u + i);
      xb[W::lane(i)] = x.value(u + i);
    }
    _mm256_store_ps(yb, W::step(_mm256_load_ps(cb), _mm256_load_ps(xb), h, pp));
    if (!kProd)
      for (int i = 0; i < m; ++i) y[(u + i) * S] = static_cast<T>(yb[W::lane(i)]);
  }
  *h_io = _mm256_cvtss_f32(h);
  if (kProd) *prod_io = _mm256_cvtss_f32(prod);
}

// Up to 8 backward steps from u through buffers, float32 by masked accesses (the first step, whose
// c_{-1} = 0, and the last, whose y_L = init, go this way); idle steps are identities.
template <int S, typename T>
LINREC_AVX2 void walk_backward_partial(WalkIn<S, T> c, WalkIn<S, T> dy, WalkIn<S, T> y, T* dx, T* dc, float init,
                                       int64_t L, int64_t u, int m, __m256& h, __m256* prod) {
  using W = Walk<S>;
  if constexpr (std::is_same_v<T, float>) {
    // float32 by masked loads and stores (as walk_forward's last steps): c_{t-1} from the vector one
    // step earlier (none before step 0), y_{t+1} from the one a step later while t + 1 < L, then
    // init.
    const __m256i mm = step_lanes<S>(m), first = step_lanes<S>(1);
    const __m256i c_lanes = u > 0 ? mm : _mm256_andnot_si256(first, mm);
    __m256 cv = masked_steps(c, u - 1, c_lanes, 1.f);
    if (u == 0) cv = _mm256_blendv_ps(cv, _mm256_setzero_ps(), _mm256_castsi256_ps(first));
    const __m256 g = W::step(cv, masked_steps(dy, u, mm, 0.f), h, prod);
    if (prod) return;
    const int with_next = static_cast<int>(L - 1 - u < m ? L - 1 - u : m);  // steps whose t + 1 < L
    __m256 yv = masked_steps(y, u + 1, step_lanes<S>(with_next), 0.f);
    if (with_next < m)
      yv = _mm256_blendv_ps(yv, _mm256_set1_ps(init),
                            _mm256_castsi256_ps(_mm256_andnot_si256(step_lanes<S>(with_next), mm)));
    _mm256_maskstore_ps(reinterpret_cast<float*>(dx) + W::at(u), mm, g);
    _mm256_maskstore_ps(reinterpret_cast<float*>(dc) + W::at(u), mm, _mm256_mul_ps(g, yv));
    return;
  }
  if constexpr (std::is_same_v<T, c10::Half>) {  // float16 through 16-byte buffers (half_steps), the same lanes
    __m256 cv = half_steps(c, u - 1, u > 0 ? 0 : 1, m, 1.f);
    if (u == 0) cv = _mm256_blendv_ps(cv, _mm256_setzero_ps(), _mm256_castsi256_ps(step_lanes<S>(1)));
    const __m256 g = W::step(cv, half_steps(dy, u, 0, m, 0.f), h, prod);
    if (prod) return;
    const int with_next = static_cast<int>(L - 1 - u < m ? L - 1 - u : m);  // steps whose t + 1 < L
    half_store<S>(dx, u, m, g);
    half_store<S>(dc, u, m, _mm256_mul_ps(g, half_steps(y, u + 1, 0, with_next, init)));
    return;
  }
  alignas(32) float cb[8], gb[8], yb[8];
  for (int i = 0; i < 8; ++i) cb[i] = 1.f, gb[i] = 0.f, yb[i] = 0.f;
  for (int i = 0; i < m; ++i) {
    const int64_t t = u + i;
    cb[W::lane(i)] = t > 0 ? c.value(t - 1) : 0.f;
    gb[W::lane(i)] = dy.value(t);
    if (!prod) yb[W::lane(i)] = t + 1 < L ? y.value(t + 1) : init;
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

// Backward over steps [t0, t1) of one sequence of length L (walk order: the reverse of the
// forward scan): dx, dc point at its step 0; y_L = init. kProd as in walk_forward.
template <int S, bool kProd, typename T>
LINREC_AVX2 void walk_backward(WalkIn<S, T> c, WalkIn<S, T> dy, WalkIn<S, T> y, T* dx, T* dc, float init, int64_t L,
                               int64_t t0, int64_t t1, float* h_io, float* prod_io) {
  using W = Walk<S>;
  __m256 h = _mm256_set1_ps(walk_state(*h_io)), prod = _mm256_set1_ps(kProd ? walk_state(*prod_io) : 1.f);
  __m256* pp = kProd ? &prod : nullptr;
  int64_t u = t0;
  if (u == 0 && u < t1) {
    if (t1 >= 8 && L >= 8) {
      // The first 8 steps as one vector (c_{-1} = 0 shifted in; y_{t+1} up to step 8, or y_L = init
      // shifted in after y_1 .. y_7 for a row of 8): a short row's backward spent ~30 ns per partial
      // vector (bench/NOTES.md item 77).
      const __m256 cv = W::template shift_step<true>(c.vec8(0), 0.f), gv = dy.vec8(0);
      const __m256 yv =
          kProd ? _mm256_setzero_ps() : (L >= 9 ? y.vec8(1) : W::template shift_step<false>(y.vec8(0), init));
      const __m256 g = W::step(cv, gv, h, pp);
      if (!kProd) {
        store8(dx + W::at(0), g);
        store8(dc + W::at(0), _mm256_mul_ps(g, yv));
      }
      u = 8;
    } else {
      const int m = static_cast<int>(t1 - u < 8 ? t1 - u : 8);
      walk_backward_partial<S>(c, dy, y, dx, dc, init, L, u, m, h, pp);
      u += m;
    }
  }
  // Every load of an iteration comes before its stores, and the next iteration's c_{u-1} is loaded
  // before them too: c_{u-1}, y_{u+1} overlap the elements just stored to dx, dc by one step, and
  // where the tensors' addresses agree modulo 4 KiB (large allocations are page-aligned) the CPU
  // takes a later load for one that depends on the stores and waits for them (4K aliasing): 3x
  // slower with the stores first (bench/NOTES.md item 61).
  const int64_t body_end = t1 < L - 1 ? t1 : L - 1;  // full vectors read y up to step u + 8 < L
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    __m256 ca, cb;
    if (u + 16 <= body_end) c.vec16(u - 1, ca, cb);
    for (; u + 16 <= body_end; u += 16) {
      __m256 ga, gb, ya, yb, ca_u = ca, cb_u = cb;
      dy.vec16(u, ga, gb);
      if (!kProd) y.vec16(u + 1, ya, yb);
      if (u + 32 <= body_end) c.vec16(u + 15, ca, cb);
      W::step16(ca_u, ga, cb_u, gb, h, pp);
      if (kProd) continue;
      store16(dx + W::at16(u), ga, gb);
      store16(dc + W::at16(u), _mm256_mul_ps(ga, ya), _mm256_mul_ps(gb, yb));
    }
  }
  __m256 cv = u + 8 <= body_end ? c.vec8(u - 1) : _mm256_setzero_ps();
  for (; u + 8 <= body_end; u += 8) {
    const __m256 cu = cv, gv = dy.vec8(u), yv = kProd ? _mm256_setzero_ps() : y.vec8(u + 1);
    if (u + 16 <= body_end) cv = c.vec8(u + 7);
    const __m256 g = W::step(cu, gv, h, pp);
    if (kProd) continue;
    store8(dx + W::at(u), g);
    store8(dc + W::at(u), _mm256_mul_ps(g, yv));
  }
  if (u >= 1 && u + 8 == t1 && t1 == L) {
    // The last 8 steps as one vector (y_L = init shifted in after y_{u+1} .. y_{L-1}).
    const __m256 cv = c.vec8(u - 1), gv = dy.vec8(u);
    const __m256 yv = kProd ? _mm256_setzero_ps() : W::template shift_step<false>(y.vec8(u), init);
    const __m256 g = W::step(cv, gv, h, pp);
    if (!kProd) {
      store8(dx + W::at(u), g);
      store8(dc + W::at(u), _mm256_mul_ps(g, yv));
    }
    u = t1;
  }
  while (u < t1) {
    const int m = static_cast<int>(t1 - u < 8 ? t1 - u : 8);
    walk_backward_partial<S>(c, dy, y, dx, dc, init, L, u, m, h, pp);
    u += m;
  }
  *h_io = _mm256_cvtss_f32(h);
  if (kProd) *prod_io = _mm256_cvtss_f32(prod);
}

}  // namespace avx2
}  // namespace linrec
#endif
