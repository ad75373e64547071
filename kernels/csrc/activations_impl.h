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

// sigmoid(z) = 1 / (1 + exp(-z)) with the inline exp of a non-positive argument: e = exp(-|z|),
// then 1 / (1 + e) for z >= 0 or e / (1 + e) (picked by the sign bit). No overflow;
// sigmoid(+inf) = 1, sigmoid(-inf) = 0; NaN stays NaN. -|z| is one OR of the sign bit and the
// numerator's select is b ^ ((a ^ b) & mask) on an arithmetic-shift mask (one AVX-512 ternlog).
FL_INLINE float sigmoid(float z) {
  const uint32_t zb = float_bits(z);
  const float e = fusionlens::exp_nonpos<FL_ISA>(float_from_bits(zb | 0x80000000u));
  const uint32_t neg = static_cast<uint32_t>(static_cast<int32_t>(zb) >> 31);
  return float_from_bits(kOneBits ^ ((float_bits(e) ^ kOneBits) & neg)) / (1.0f + e);
}

// sigmoid(z) and sigmoid(-z) = 1 - sigmoid(z) from one exp and one division, for the gradients:
// with e = exp(-|z|) and d = 1 / (1 + e), the larger is d and the smaller e * d (neither as a
// difference). Two sigmoid() calls cost a second division (the exp was shared, the numerators
// not): SwiGLU and GELU (tanh) backward were division bound on AVX2, where vdivps ymm issues once
// per ~5 cycles. e * d rounds twice (<= 1.5 ulp against sigmoid()'s 0.5).
FL_INLINE void sigmoid_pair(float z, float& s, float& sc) {
  const uint32_t zb = float_bits(z);
  const float e = fusionlens::exp_nonpos<FL_ISA>(float_from_bits(zb | 0x80000000u));
  const float d = 1.0f / (1.0f + e);
  const uint32_t db = float_bits(d), eb = float_bits(e * d);
  const uint32_t neg = static_cast<uint32_t>(static_cast<int32_t>(zb) >> 31);
  s = float_from_bits(select_bits(neg, eb, db));
  sc = float_from_bits(select_bits(neg, db, eb));
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
template <int64_t K>
FL_INLINE float act(float x) {
  if constexpr (K == kSilu) {
    return x * sigmoid(x);  // inline exp: 17% faster than libmvec's expf, same ~2 ulp
  } else if constexpr (K == kGeluErf) {
    return 0.5f * (x + std::fabs(x) * erf_abs_scaled(x));
  } else {
    return x * sigmoid(gelu_tanh_arg(x, x * x));
  }
}

// act(x) and act'(x) together (shared transcendental).
template <int64_t K>
FL_INLINE void act_and_grad(float x, float& y, float& dy) {
  if constexpr (K == kSilu) {
    float s, sc;
    sigmoid_pair(x, s, sc);
    y = x * s;
    dy = s * (1.0f + x * sc);  // 1 - s as sigmoid(-x): no cancellation (see below)
  } else if constexpr (K == kGeluErf) {
    const float cdf = 0.5f + 0.5f * std::copysign(erf_abs_scaled(x), x);
    y = x * cdf;
    dy = cdf + x * kInvSqrt2Pi * fusionlens::exp_nonpos<FL_ISA>(-0.5f * x * x);
  } else {
    // d/dx x s(2u) = s + x * 2 s (1 - s) * du/dx, du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
    // 1 - s is sigmoid(-2u) (sigmoid_pair: the same exp and division): computed as 1 - s it was 0 or
    // 2^-24 wherever s rounds near 1 (x > ~4), a one-signed error of up to 2e-6 in every such
    // element's derivative that a bias gradient summed over 1089 rows to 3x eager's error (fuzz
    // seed 744072). ATen's 1 - tanh^2 cancels too, only less.
    const float x2 = x * x;
    const float z = gelu_tanh_arg(x, x2);
    float s, sc;
    sigmoid_pair(z, s, sc);
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

// y = act(x [+ b])
template <int64_t K, typename T, bool B>
FL_INLINE void act_loop(const T* __restrict x, const float* __restrict b, T* __restrict y, int64_t n) {
  const int64_t h = n / 2;
  int64_t i0 = 0;
  if constexpr (kWords<T>) {
    i0 = 2 * h;
#pragma omp simd
    for (int64_t w = 0; w < h; ++w) {
      const uint32_t u = word(x, w);
      put(y, w, act<K>(plus_bias<B>(lo(u), b, w)), act<K>(plus_bias<B>(hi(u), b, h + w)));
    }
  }
#pragma omp simd
  for (int64_t i = i0; i < n; ++i) store(y, i, act<K>(plus_bias<B>(load<float>(x, i), b, i)));
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
  const int64_t h = n / 2;
  int64_t i0 = 0;
  if constexpr (kWords<T>) {
    i0 = 2 * h;
#pragma omp simd
    for (int64_t w = 0; w < h; ++w) {
      const uint32_t u = word(x, w), ug = word(g, w);
      float yl, dl, yh, dh;
      act_and_grad<K>(plus_bias<B>(lo(u), b, w), yl, dl);
      act_and_grad<K>(plus_bias<B>(hi(u), b, h + w), yh, dh);
      const float vl = lo(ug) * dl, vh = hi(ug) * dh;
      put(gx, w, vl, vh);
      if constexpr (ACC) acc[w] += vl, acc[h + w] += vh;
    }
  }
#pragma omp simd
  for (int64_t i = i0; i < n; ++i) {
    float y, dy;
    act_and_grad<K>(plus_bias<B>(load<float>(x, i), b, i), y, dy);
    const float v = load<float>(g, i) * dy;
    store(gx, i, v);
    if constexpr (ACC) acc[i] += v;
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
  int64_t i0 = 0;
  if constexpr (kWords<T>) {
    i0 = n & ~int64_t{1};
#pragma omp simd
    for (int64_t w = 0; w < n / 2; ++w) {
      const uint32_t ua = word(a, w), ub = word(b, w);
      put(y, w, act<K>(lo(ua)) * lo(ub), act<K>(hi(ua)) * hi(ub));
    }
  }
#pragma omp simd
  for (int64_t i = i0; i < n; ++i) store(y, i, act<K>(load<float>(a, i)) * load<float>(b, i));
}

// ga = g * b * act'(a), gb = g * act(a)
template <int64_t K, typename T>
void glu_grad_span(const T* __restrict g, const T* __restrict a, const T* __restrict b,
                   T* __restrict ga, T* __restrict gb, int64_t n) {
  int64_t i0 = 0;
  if constexpr (kWords<T>) {
    i0 = n & ~int64_t{1};
#pragma omp simd
    for (int64_t w = 0; w < n / 2; ++w) {
      const uint32_t ug = word(g, w), ua = word(a, w), ub = word(b, w);
      float yl, dl, yh, dh;
      act_and_grad<K>(lo(ua), yl, dl);
      act_and_grad<K>(hi(ua), yh, dh);
      put(ga, w, lo(ug) * lo(ub) * dl, hi(ug) * hi(ub) * dh);
      put(gb, w, lo(ug) * yl, hi(ug) * yh);
    }
  }
#pragma omp simd
  for (int64_t i = i0; i < n; ++i) {
    float y, dy;
    act_and_grad<K>(load<float>(a, i), y, dy);
    const float gi = load<float>(g, i);
    store(ga, i, gi * load<float>(b, i) * dy);
    store(gb, i, gi * y);
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
