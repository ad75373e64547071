// The span loops of kernels/csrc/activations.cpp, included there once per instruction set
// (AVX-512, AVX2+FMA, the build's baseline) inside `#pragma GCC target` and a namespace of its
// own, so the same source vectorizes at full width on any x86-64 without -march=native.
// No include guard: included several times on purpose. Needs common.h (exp_nonpos), and the
// Kind codes and constants declared by activations.cpp before the includes.
//
// Every loop is an `omp simd` loop over plain pointers with no float `?:` (selects are done on
// integer bits), no std::fma and no library call (exp is common.h's inline exp_nonpos), so GCC
// vectorizes it at any -march without -ffast-math. The per-element helpers are FL_INLINE (common.h):
// an out-of-line call in a simd loop makes it scalar, and GCC's size heuristics did that to
// sigmoid once exp_nonpos was forced inline.

#include "elem_impl.h"  // load<float>(p, i), store(p, i, v) on float / bf16 / fp16 storage

using fusionlens::float_bits;  // a float's bits and back (common.h)
using fusionlens::float_from_bits;

// Integer select (all-ones mask picks a): vectorizes at any -march, unlike a float ?: under the
// default -ftrapping-math.
FL_INLINE uint32_t select_bits(uint32_t mask, uint32_t a, uint32_t b) { return (a & mask) | (b & ~mask); }

constexpr uint32_t kOneBits = 0x3f800000u;  // 1.0f
constexpr uint32_t kErfSatBits = 0x40b504f3u;  // 4 sqrt(2) = 5.656854f: erf(x / sqrt 2) rounds to 1 beyond

// erf(|x| / sqrt 2) for the GELU: a P(a^2) / Q(a^2) with a = min(|x|, 4 sqrt 2), a (6, 6)-term
// rational minimax fit made for these kernels (|error| 4e-8 in exact arithmetic, ~3e-7 after
// float rounding, like ATen's A&S 7.1.26 at 1.5e-7, which costs an exp and a division more).
// Q >= 1. The result is clamped to <= 1 and is exactly 1 from 4 sqrt 2 on (+-inf and NaN
// included), so GELU(-inf) = -inf + inf = NaN as in eager; a NaN x makes the GELU NaN through x.
// Plain multiply-adds (contracted to FMA where the target has it) and integer clamps only.
FL_INLINE float erf_abs_scaled(float x) {
  const uint32_t ab = float_bits(x) & 0x7fffffffu;
  const uint32_t sat = 0u - static_cast<uint32_t>(ab >= kErfSatBits);
  const float a = float_from_bits(ab < kErfSatBits ? ab : kErfSatBits);
  const float a2 = a * a;
  float p = 4.533083400e-08f;
  p = p * a2 + 1.260004006e-05f;
  p = p * a2 + 3.319819656e-04f;
  p = p * a2 + 9.313984517e-03f;
  p = p * a2 + 6.720817696e-02f;
  p = p * a2 + 7.978844278e-01f;
  float q = 1.191676001e-06f;
  q = q * a2 + 7.261164011e-05f;
  q = q * a2 + 1.867185030e-03f;
  q = q * a2 + 2.849126954e-02f;
  q = q * a2 + 2.508987347e-01f;
  q = q * a2 + 1.0f;
  const uint32_t rb = float_bits(a * p / q);
  return float_from_bits(select_bits(sat, kOneBits, rb < kOneBits ? rb : kOneBits));
}

// exp(-|z|), the one exp of a sigmoid: -|z| is one OR of the sign bit. Split from the rest (the
// *_e forms below take it as e) so that the span loops can compute it for a block first (see
// "Two passes" below). The inline exp is 17% faster than libmvec's expf, same ~2 ulp. PAIRS: the
// polynomial's form (common.h exp_nonpos; SiLU's loops run faster with pairs, GELU (tanh)'s not).
template <bool PAIRS>
FL_INLINE float exp_neg_abs(float z) {
  return fusionlens::exp_nonpos<FL_ISA, PAIRS>(float_from_bits(float_bits(z) | 0x80000000u));
}

// sigmoid(z) = 1 / (1 + exp(-z)) from e = exp(-|z|): 1 / (1 + e) for z >= 0 or e / (1 + e)
// (picked by the sign bit). No overflow; sigmoid(+inf) = 1, sigmoid(-inf) = 0; NaN stays NaN. The
// numerator's select: AVX-512, an integer ?: on the sign (a compare into a mask register and one
// vblendmps, where the mask form took a shift, two xors, a copy and a ternlog: forward 1.01-1.09x on
// the Zen 4, same bits; act_ab.py, 9 rounds, 2026-12-04); below, b ^ ((a ^ b) & mask) on an
// arithmetic-shift mask (the ?: measured 0.88-1.07x on AVX2, inside that A/B's noise).
FL_INLINE float sigmoid_e(float z, float e) {
#if FL_ISA >= 512
  const bool neg = static_cast<int32_t>(float_bits(z)) < 0;
  return float_from_bits(neg ? float_bits(e) : kOneBits) / (1.0f + e);
#else
  const uint32_t neg = static_cast<uint32_t>(static_cast<int32_t>(float_bits(z)) >> 31);
  return float_from_bits(kOneBits ^ ((float_bits(e) ^ kOneBits) & neg)) / (1.0f + e);
#endif
}

// sigmoid(z) and sigmoid(-z) = 1 - sigmoid(z) from e = exp(-|z|) and one division, for the
// gradients: with d = 1 / (1 + e), the larger is d and the smaller e * d (neither as a
// difference). Two sigmoids cost a second division (the exp was shared, the numerators not):
// SwiGLU and GELU (tanh) backward were division bound on AVX2, where vdivps ymm issues once per ~5
// cycles. e * d rounds twice (<= 1.5 ulp against sigmoid_e's 0.5). The two selects are plain
// integer ?: on the sign (a compare and two blends on AVX2, where the mask form took an and, an
// andnot and an or each): backward 1.02-1.08x, same bits (act_ab.py, 2026-12-04; the same form in
// sigmoid_e's forward measured 0.88-1.07x and stays a mask).
FL_INLINE void sigmoid_pair_e(float z, float e, float& s, float& sc) {
  const float d = 1.0f / (1.0f + e);
  const uint32_t db = float_bits(d), eb = float_bits(e * d);
  const bool neg = static_cast<int32_t>(float_bits(z)) < 0;
  s = float_from_bits(neg ? eb : db);
  sc = float_from_bits(neg ? db : eb);
}

// GELU (tanh)'s sigmoid argument 2u = x (2 sqrt(2/pi) + 2 sqrt(2/pi) 0.044715 x^2): a multiply,
// a multiply-add and a multiply (the constants folded once, in double), where
// 2 beta (kappa x x^2 + x) took four operations.
constexpr float kTanhC1 = static_cast<float>(2.0 * 0.79788456080286535588);
constexpr float kTanhC3 = static_cast<float>(2.0 * 0.79788456080286535588 * 0.044715);
FL_INLINE float gelu_tanh_arg(float x, float x2) { return x * (kTanhC3 * x2 + kTanhC1); }

// ---- the activations, in fp32 ------------------------------------------------------------------
// GELU (erf) = x (1 + erf(x / sqrt 2)) / 2 = (x + |x| erf(|x| / sqrt 2)) / 2.
// GELU (tanh) is x * sigmoid(2u): 0.5 (1 + tanh(u)) = sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3);
// this form has no 1 + tanh cancellation for negative x and needs one exp.
//
// Each kind's one exp, `pre`, is split from the rest: pre_fwd<K>(x) is what act_e<K> needs (SiLU
// and GELU (tanh): the sigmoid's exp(-|z|); GELU (erf): none), pre_grad<K>(x) what act_and_grad_e<K>
// needs (the same, and for GELU (erf) the density's exp(-x^2 / 2)). act_e<K>(x, pre_fwd<K>(x)) is
// act(x), bit for bit the single-pass form.
template <int64_t K>
FL_INLINE float sigmoid_arg(float x) {  // SiLU: x; GELU (tanh): 2u
  if constexpr (K == kSilu) return x;
  else return gelu_tanh_arg(x, x * x);
}

template <int64_t K>
FL_INLINE float pre_fwd(float x) {
  if constexpr (K == kGeluErf) return 0.0f;  // act_e reads none
  else return exp_neg_abs<K == kSilu>(sigmoid_arg<K>(x));
}

template <int64_t K>
FL_INLINE float pre_grad(float x) {
  if constexpr (K == kGeluErf) return fusionlens::exp_nonpos<FL_ISA>(-0.5f * x * x);
  else return pre_fwd<K>(x);
}

template <int64_t K>
FL_INLINE float act_e(float x, float e) {
  if constexpr (K == kSilu) {
    return x * sigmoid_e(x, e);
  } else if constexpr (K == kGeluErf) {
    return 0.5f * (x + std::fabs(x) * erf_abs_scaled(x));
  } else {
    return x * sigmoid_e(gelu_tanh_arg(x, x * x), e);
  }
}

// act(x) and act'(x) together (shared transcendental), e = pre_grad<K>(x).
template <int64_t K>
FL_INLINE void act_and_grad_e(float x, float e, float& y, float& dy) {
  if constexpr (K == kSilu) {
    float s, sc;
    sigmoid_pair_e(x, e, s, sc);
    y = x * s;
    dy = s * (1.0f + x * sc);  // 1 - s as sigmoid(-x): no cancellation (see below)
  } else if constexpr (K == kGeluErf) {
    const float cdf = 0.5f + 0.5f * std::copysign(erf_abs_scaled(x), x);
    y = x * cdf;
    dy = cdf + x * kInvSqrt2Pi * e;
  } else {
    // d/dx x s(2u) = s + x * 2 s (1 - s) * du/dx, du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
    // 1 - s is sigmoid(-2u) (sigmoid_pair_e: the same exp and division): computed as 1 - s it was 0
    // or 2^-24 wherever s rounds near 1 (x > ~4), a one-signed error of up to 2e-6 in every such
    // element's derivative that a bias gradient summed over 1089 rows to 3x eager's error (fuzz
    // seed 744072). ATen's 1 - tanh^2 cancels too, only less.
    const float x2 = x * x;
    const float z = gelu_tanh_arg(x, x2);
    float s, sc;
    sigmoid_pair_e(z, e, s, sc);
    y = x * s;
    dy = s + 2.0f * x * s * sc * kBeta * (3.0f * kKappa * x2 + 1.0f);
  }
}

// ---- bf16 by 32-bit words -----------------------------------------------------------------------
// A bf16 span runs first over whole 32-bit words, two elements each (word / lo / hi / put,
// elem_impl.h); an odd last element takes the per-element loop. Spans with a bias get it, and add to the
// bias-gradient row, in word order (activations.cpp split_words: word w's columns at w and n/2 + w).
// 1 thread on the Zen 3 AVX2 VM, 4096x3072, ns an element: SwiGLU forward 1.14 -> 0.97, fwd+bwd
// 3.03 -> 2.31; GELU forward 0.78 -> 0.63, fwd+bwd 2.26 -> 1.93 (the unguarded rounding of put()
// is half of the forward gain); bias + GELU (bias and bias gradient in word order) forward 0.84 ->
// 0.69, fwd+bwd 2.5 -> 2.1.

// ---- spans: what one run of elements does ------------------------------------------------------
// x, g, a, b, y and the gradients are the tensors' own memory in their storage type T (float,
// bf16, fp16), read and written element by element through elem_impl.h's load / store inside the
// one simd loop (fp16 with F16C excepted, below); the bias and the bias-gradient row are fp32.
// Widening bf16 into an fp32 scratch, computing, and rounding back took three passes: on a Zen
// AVX2 core the one-pass loops run bf16 backward 20-25% faster (GELU 1.65-1.8 against 2.1-2.6 ns
// an element, SwiGLU 2.3-2.5 against 2.9-3.7; forward 0-10%).

// x [+ b] at element k of a span's per-element loop, or at the low / high element of word w of
// n / 2 (the bias in word order): B = whether there is a bias, fixed at compile time so that each
// loop below is written once for both.
template <bool B>
FL_INLINE float plus_bias(float v, const float* b, int64_t k) {
  if constexpr (B) return v + b[k];
  else return v;
}

// ---- two passes a block ------------------------------------------------------------------------
// The spans of SiLU and GELU (tanh) run over blocks of kPreBlock words (bf16) or elements: a first
// simd loop puts each element's exp (pre_fwd / pre_grad) into an L1 buffer, a second does the
// rest (the division, the products, the rounding and the stores). In one loop each iteration was
// one ~80-cycle chain of dependent operations (the exp's FMAs, the division, the rounding), longer
// than the out-of-order window covers, so the core waited on it; each pass's chain is about half of
// that. Same operations in the same order: the one-loop results, bit for bit
// (benchmarks/kernels/act_ab.py checks it). 1 AVX2 thread (Zen 3), 4096x3072, kernel-only: bf16
// SwiGLU forward 15.3 -> 11.7 ms, backward 21.7 -> 15.7; fp32 1.2-1.3x; GELU (tanh) 1.1-1.4x
// (docs/kernels.md, "Two passes a block"). GELU (erf) keeps one loop (kTwoPass).
constexpr int64_t kPreBlock = 512;

template <int64_t K, bool GRAD>
FL_INLINE float pre_of(float x) {
  if constexpr (GRAD) return pre_grad<K>(x);
  else return pre_fwd<K>(x);
}

// Which kinds run the two passes: SiLU and GELU (tanh). GELU (erf) keeps one loop: its forward has
// no exp, and its backward's density exp is short beside the rational erf's division (two passes
// ran it 0.87-1.00x, fp32 and bf16 on the AVX2 EPYC).
template <int64_t K>
inline constexpr bool kTwoPass = K != kGeluErf;

// Words (elements) a block of the second pass covers: the whole span in one loop when not kTwoPass.
template <int64_t K>
inline constexpr int64_t kBlock = kTwoPass<K> ? kPreBlock : INT64_MAX;

// The pre value of the block's element j, whose activation input is v: from the first pass's
// buffer, or computed in line (one-loop kinds).
template <int64_t K, bool GRAD>
FL_INLINE float pre_at(const float* pre, int64_t j, float v) {
  if constexpr (kTwoPass<K>) return pre[j];
  else return pre_of<K, GRAD>(v);
}

// pre[j] (and pre[kPreBlock + j], the high elements of words) for j < len from word / element
// w0 + j (i0 + j).
template <int64_t K, bool GRAD, bool B, typename T>
FL_INLINE void pre_words(const T* __restrict x, const float* __restrict b, int64_t h, int64_t w0, int64_t len,
                         float* __restrict pre) {
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) {
    const int64_t w = w0 + j;
    const uint32_t u = word(x, w);
    const float vl = plus_bias<B>(lo(u), b, w), vh = plus_bias<B>(hi(u), b, h + w);
    pre[j] = pre_of<K, GRAD>(vl);
    pre[kPreBlock + j] = pre_of<K, GRAD>(vh);
  }
}

template <int64_t K, bool GRAD, bool B, typename T>
FL_INLINE void pre_elems(const T* __restrict x, const float* __restrict b, int64_t i0, int64_t len,
                         float* __restrict pre) {
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) {
    const float v = plus_bias<B>(load<float>(x, i0 + j), b, i0 + j);
    pre[j] = pre_of<K, GRAD>(v);
  }
}

// y = act(x [+ b])
template <int64_t K, typename T, bool B>
FL_INLINE void act_loop(const T* __restrict x, const float* __restrict b, T* __restrict y, int64_t n) {
  alignas(64) float pre[kTwoPass<K> ? 2 * kPreBlock : 1];  // one-loop kinds read none
  const int64_t h = n / 2;
  int64_t i0 = 0;
  if constexpr (kWords<T>) {
    i0 = 2 * h;
    for (int64_t w0 = 0, len; w0 < h; w0 += len) {
      len = std::min(kBlock<K>, h - w0);
      if constexpr (kTwoPass<K>) pre_words<K, false, B>(x, b, h, w0, len, pre);
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) {
        const int64_t w = w0 + j;
        const uint32_t u = word(x, w);
        const float vl = plus_bias<B>(lo(u), b, w), vh = plus_bias<B>(hi(u), b, h + w);
        put(y, w, act_e<K>(vl, pre_at<K, false>(pre, j, vl)), act_e<K>(vh, pre_at<K, false>(pre, kPreBlock + j, vh)));
      }
    }
  }
  for (int64_t s = i0, len; s < n; s += len) {
    len = std::min(kBlock<K>, n - s);
    if constexpr (kTwoPass<K>) pre_elems<K, false, B>(x, b, s, len, pre);
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) {
      const float v = plus_bias<B>(load<float>(x, s + j), b, s + j);
      store(y, s + j, act_e<K>(v, pre_at<K, false>(pre, j, v)));
    }
  }
}

template <int64_t K, typename T>
void act_span(const T* __restrict x, const float* __restrict b, T* __restrict y, int64_t n) {
  if (b == nullptr) act_loop<K, T, false>(x, b, y, n);
  else act_loop<K, T, true>(x, b, y, n);
}

// gx = g * act'(x [+ b]); acc += gx (fp32, before rounding to T) when ACC (the bias gradient's
// partial row, in the bias's order; only with a bias).
template <int64_t K, typename T, bool B, bool ACC>
FL_INLINE void act_grad_loop(const T* __restrict g, const T* __restrict x, const float* __restrict b,
                             T* __restrict gx, float* __restrict acc, int64_t n) {
  alignas(64) float pre[kTwoPass<K> ? 2 * kPreBlock : 1];  // one-loop kinds read none
  const int64_t h = n / 2;
  int64_t i0 = 0;
  if constexpr (kWords<T>) {
    i0 = 2 * h;
    for (int64_t w0 = 0, len; w0 < h; w0 += len) {
      len = std::min(kBlock<K>, h - w0);
      if constexpr (kTwoPass<K>) pre_words<K, true, B>(x, b, h, w0, len, pre);
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) {
        const int64_t w = w0 + j;
        const uint32_t u = word(x, w), ug = word(g, w);
        const float xl = plus_bias<B>(lo(u), b, w), xh = plus_bias<B>(hi(u), b, h + w);
        float yl, dl, yh, dh;
        act_and_grad_e<K>(xl, pre_at<K, true>(pre, j, xl), yl, dl);
        act_and_grad_e<K>(xh, pre_at<K, true>(pre, kPreBlock + j, xh), yh, dh);
        const float vl = lo(ug) * dl, vh = hi(ug) * dh;
        put(gx, w, vl, vh);
        if constexpr (ACC) acc[w] += vl, acc[h + w] += vh;
      }
    }
  }
  for (int64_t s = i0, len; s < n; s += len) {
    len = std::min(kBlock<K>, n - s);
    if constexpr (kTwoPass<K>) pre_elems<K, true, B>(x, b, s, len, pre);
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = s + j;
      const float xi = plus_bias<B>(load<float>(x, i), b, i);
      float y, dy;
      act_and_grad_e<K>(xi, pre_at<K, true>(pre, j, xi), y, dy);
      const float v = load<float>(g, i) * dy;
      store(gx, i, v);
      if constexpr (ACC) acc[i] += v;
    }
  }
}

template <int64_t K, typename T>
void act_grad_span(const T* __restrict g, const T* __restrict x, const float* __restrict b,
                   T* __restrict gx, float* __restrict acc, int64_t n) {
  if (b == nullptr) act_grad_loop<K, T, false, false>(g, x, b, gx, acc, n);
  else if (acc == nullptr) act_grad_loop<K, T, true, false>(g, x, b, gx, acc, n);
  else act_grad_loop<K, T, true, true>(g, x, b, gx, acc, n);
}

// y = act(a) * b
template <int64_t K, typename T>
void glu_span(const T* __restrict a, const T* __restrict b, T* __restrict y, int64_t n) {
  alignas(64) float pre[kTwoPass<K> ? 2 * kPreBlock : 1];  // one-loop kinds read none
  const int64_t h = n / 2;
  int64_t i0 = 0;
  if constexpr (kWords<T>) {
    i0 = 2 * h;
    for (int64_t w0 = 0, len; w0 < h; w0 += len) {
      len = std::min(kBlock<K>, h - w0);
      if constexpr (kTwoPass<K>) pre_words<K, false, false>(a, nullptr, h, w0, len, pre);
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) {
        const int64_t w = w0 + j;
        const uint32_t ua = word(a, w), ub = word(b, w);
        const float al = lo(ua), ah = hi(ua);
        put(y, w, act_e<K>(al, pre_at<K, false>(pre, j, al)) * lo(ub),
            act_e<K>(ah, pre_at<K, false>(pre, kPreBlock + j, ah)) * hi(ub));
      }
    }
  }
  for (int64_t s = i0, len; s < n; s += len) {
    len = std::min(kBlock<K>, n - s);
    if constexpr (kTwoPass<K>) pre_elems<K, false, false>(a, nullptr, s, len, pre);
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) {
      const float ai = load<float>(a, s + j);
      store(y, s + j, act_e<K>(ai, pre_at<K, false>(pre, j, ai)) * load<float>(b, s + j));
    }
  }
}

// ga = g * b * act'(a), gb = g * act(a)
template <int64_t K, typename T>
void glu_grad_span(const T* __restrict g, const T* __restrict a, const T* __restrict b,
                   T* __restrict ga, T* __restrict gb, int64_t n) {
  alignas(64) float pre[kTwoPass<K> ? 2 * kPreBlock : 1];  // one-loop kinds read none
  const int64_t h = n / 2;
  int64_t i0 = 0;
  if constexpr (kWords<T>) {
    i0 = 2 * h;
    for (int64_t w0 = 0, len; w0 < h; w0 += len) {
      len = std::min(kBlock<K>, h - w0);
      if constexpr (kTwoPass<K>) pre_words<K, true, false>(a, nullptr, h, w0, len, pre);
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) {
        const int64_t w = w0 + j;
        const uint32_t ug = word(g, w), ua = word(a, w), ub = word(b, w);
        const float al = lo(ua), ah = hi(ua);
        float yl, dl, yh, dh;
        act_and_grad_e<K>(al, pre_at<K, true>(pre, j, al), yl, dl);
        act_and_grad_e<K>(ah, pre_at<K, true>(pre, kPreBlock + j, ah), yh, dh);
        put(ga, w, lo(ug) * lo(ub) * dl, hi(ug) * hi(ub) * dh);
        put(gb, w, lo(ug) * yl, hi(ug) * yh);
      }
    }
  }
  for (int64_t s = i0, len; s < n; s += len) {
    len = std::min(kBlock<K>, n - s);
    if constexpr (kTwoPass<K>) pre_elems<K, true, false>(a, nullptr, s, len, pre);
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = s + j;
      const float ai = load<float>(a, i);
      float y, dy;
      act_and_grad_e<K>(ai, pre_at<K, true>(pre, j, ai), y, dy);
      const float gi = load<float>(g, i);
      store(ga, i, gi * load<float>(b, i) * dy);
      store(gb, i, gi * y);
    }
  }
}

// fp16 with F16C (the AVX2 and AVX-512 copies): vcvtph2ps / vcvtps2ph convert 8 or 16 lanes in one
// instruction, and no simd loop over fp16 bits comes close (the direct spans above ran 2x slower
// than this on AVX2), so fp16 spans widen blocks into fp32 L1 buffers, run the fp32 span, and
// round back (convert_impl.h). Buffers are padded by a cache line: exactly 4 KiB apart, every load
// of one aliases the store to another at the same index (4K aliasing).
#if FL_ISA >= 256
#include "convert_impl.h"  // load_f32 / store_f32 (F16C)

constexpr int64_t kHalfBlock = 1024;  // fp32 elements per buffer
using Half = c10::Half;

// body(in_f32, out_f32, len, start) over [0, n) in blocks, through fp32 buffers.
template <size_t NI, size_t NO, typename Body>
FL_INLINE void via_f32(const Half* const (&in)[NI], Half* const (&out)[NO], int64_t n, const Body& body) {
  alignas(64) float ibuf[NI][kHalfBlock + 16];
  alignas(64) float obuf[NO][kHalfBlock + 16];
  for (int64_t s = 0; s < n; s += kHalfBlock) {
    const int64_t len = std::min(kHalfBlock, n - s);
    for (size_t k = 0; k < NI; ++k) load_f32(in[k] + s, ibuf[k], len);
    body(ibuf, obuf, len, s);
    for (size_t k = 0; k < NO; ++k) store_f32(obuf[k], out[k] + s, len);
  }
}

template <int64_t K>
void act_span_f16c(const Half* x, const float* b, Half* y, int64_t n) {
  via_f32<1, 1>({x}, {y}, n, [&](auto& in, auto& out, int64_t len, int64_t s) {
    act_span<K, float>(in[0], b != nullptr ? b + s : nullptr, out[0], len);
  });
}

template <int64_t K>
void act_grad_span_f16c(const Half* g, const Half* x, const float* b, Half* gx, float* acc, int64_t n) {
  via_f32<2, 1>({g, x}, {gx}, n, [&](auto& in, auto& out, int64_t len, int64_t s) {
    act_grad_span<K, float>(in[0], in[1], b != nullptr ? b + s : nullptr, out[0], acc != nullptr ? acc + s : nullptr,
                            len);
  });
}

template <int64_t K>
void glu_span_f16c(const Half* a, const Half* b, Half* y, int64_t n) {
  via_f32<2, 1>({a, b}, {y}, n, [&](auto& in, auto& out, int64_t len, int64_t) {
    glu_span<K, float>(in[0], in[1], out[0], len);
  });
}

template <int64_t K>
void glu_grad_span_f16c(const Half* g, const Half* a, const Half* b, Half* ga, Half* gb, int64_t n) {
  via_f32<3, 2>({g, a, b}, {ga, gb}, n, [&](auto& in, auto& out, int64_t len, int64_t) {
    glu_grad_span<K, float>(in[0], in[1], in[2], out[0], out[1], len);
  });
}
#endif

// The spans of kind K on storage T (K as a type: FL_ISA_PICK's argument has no top-level comma).
template <typename T, typename KC>
Spans<T> spans(KC) {
  constexpr int64_t K = KC::value;
#if FL_ISA >= 256
  if constexpr (std::is_same_v<T, c10::Half>) {
    return {&act_span_f16c<K>, &act_grad_span_f16c<K>, &glu_span_f16c<K>, &glu_grad_span_f16c<K>};
  } else
#endif
  {
    return {&act_span<K, T>, &act_grad_span<K, T>, &glu_span<K, T>, &glu_grad_span<K, T>};
  }
}
