// The row loops of kernels/csrc/rope.cpp, included there once per instruction set (AVX-512,
// AVX2+FMA, the build's baseline) inside `#pragma GCC target` and a namespace of its own (see
// per_isa.h), so the rotation vectorizes at full width on any x86-64 without -march=native.
// No include guard: included several times on purpose. Needs common.h and rope.cpp's RopeArgs.
// Plain `omp simd` multiply-add loops (contracted to FMA where the copy has it): no reduction,
// nothing that needed -ffast-math.

#include "convert_impl.h"
#include "elem_impl.h"  // word / lo / hi / put: bf16 by 32-bit words

// One row of head_dim = 2 * h: o1 = x1 * c1 - x2 * s1, o2 = x2 * c2 + x1 * s2.
inline void rotate_fwd(const float* __restrict x1, const float* __restrict x2, const float* __restrict c,
                       const float* __restrict s, float* __restrict o1, float* __restrict o2, int64_t h) {
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    o1[j] = x1[j] * c[j] - x2[j] * s[j];
    o2[j] = x2[j] * c[h + j] + x1[j] * s[h + j];
  }
}

// The transposed rotation (backward): o1 = g1 * c1 + g2 * s2, o2 = g2 * c2 - g1 * s1.
inline void rotate_bwd(const float* __restrict g1, const float* __restrict g2, const float* __restrict c,
                       const float* __restrict s, float* __restrict o1, float* __restrict o2, int64_t h) {
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    o1[j] = g1[j] * c[j] + g2[j] * s[h + j];
    o2[j] = g2[j] * c[h + j] - g1[j] * s[j];
  }
}

// The rotations of one bf16 row by 32-bit words (elem_impl.h), with wc / ws the row's cos / sin in
// word order (rope.cpp split_trig: for each half, the even columns then the odd ones, q = D / 4
// words a half). No widening into a float buffer and rounding back out of it: 4x12x512x64 q and k,
// 1 AVX2 thread, 1.77 -> 0.97 ms (with the row counters below).
inline void rotate_words(const Bf16* x, const float* __restrict wc, const float* __restrict ws, Bf16* o,
                         int64_t D, bool backward) {
  const int64_t h = D / 2, q = D / 4;
  const Bf16 *x1 = x, *x2 = x + h;
  Bf16 *o1 = o, *o2 = o + h;
  const float *c1e = wc, *c1o = wc + q, *c2e = wc + 2 * q, *c2o = wc + 3 * q;
  const float *s1e = ws, *s1o = ws + q, *s2e = ws + 2 * q, *s2o = ws + 3 * q;
  if (backward) {
#pragma omp simd
    for (int64_t w = 0; w < q; ++w) {
      const uint32_t u1 = word(x1, w), u2 = word(x2, w);
      put(o1, w, lo(u1) * c1e[w] + lo(u2) * s2e[w], hi(u1) * c1o[w] + hi(u2) * s2o[w]);
      put(o2, w, lo(u2) * c2e[w] - lo(u1) * s1e[w], hi(u2) * c2o[w] - hi(u1) * s1o[w]);
    }
  } else {
#pragma omp simd
    for (int64_t w = 0; w < q; ++w) {
      const uint32_t u1 = word(x1, w), u2 = word(x2, w);
      put(o1, w, lo(u1) * c1e[w] - lo(u2) * s1e[w], hi(u1) * c1o[w] - hi(u2) * s1o[w]);
      put(o2, w, lo(u2) * c2e[w] + lo(u1) * s2e[w], hi(u2) * c2o[w] + hi(u1) * s2o[w]);
    }
  }
}

// cos / sin rows of D (D % 4 == 0) in the order bf16 rows are rotated by words (rotate_words):
// per half, its even columns then its odd ones. A NaN becomes 0x7FC00000 (a NaN with zero low
// bits), so that the words' unguarded bf16 rounding keeps every NaN a NaN (elem_impl.h put). One
// simd loop per row (stride-2 loads, an integer select): the scalar loop with std::isnan it
// replaced was a third of a bf16 4x12x512x64 rotation with per-batch tables (1 AVX2 thread).
FL_INLINE float quiet_nan_bits(float v) {
  const uint32_t u = fusionlens::float_bits(v);
  const uint32_t nan = 0u - static_cast<uint32_t>(fusionlens::nan_bits(u));
  return fusionlens::float_from_bits((0x7fc00000u & nan) | (u & ~nan));
}

inline void split_trig_rows(const float* __restrict src, float* __restrict dst, int64_t rows, int64_t D) {
  const int64_t h = D / 2, q = D / 4;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = src + r * D;
    float* o = dst + r * D;
#pragma omp simd
    for (int64_t w = 0; w < q; ++w) {
      o[w] = quiet_nan_bits(c[2 * w]);
      o[q + w] = quiet_nan_bits(c[2 * w + 1]);
      o[2 * q + w] = quiet_nan_bits(c[h + 2 * w]);
      o[3 * q + w] = quiet_nan_bits(c[h + 2 * w + 1]);
    }
  }
}

inline SplitFn split_fn() { return &split_trig_rows; }

// Rows [r0, r1) of the flattened [B, H, S] index space ([B, S, H] when heads_inner).
template <typename T>
void rope_rows(const RopeArgs& a, int64_t r0, int64_t r1) {
  const int64_t D = a.D, h = D / 2;
  const T* xp = static_cast<const T*>(a.x);
  T* op = static_cast<T*>(a.out);
  std::vector<float> buf(std::is_same_v<T, float> ? 0 : 2 * D);
  // (b, h, s) of row r: divided out once, then counted up (four 64-bit divisions a row cost about
  // as much as rotating a 64-element bf16 row).
  const int64_t inner = a.heads_inner ? a.H : a.S, outer = a.heads_inner ? a.S : a.H;
  int64_t i_in = r0 % inner - 1, i_out = (r0 / inner) % outer, b_i = r0 / inner / outer;
  for (int64_t r = r0; r < r1; ++r) {
    if (++i_in == inner) {  // the next row's (b, h, s)
      i_in = 0;
      if (++i_out == outer) i_out = 0, ++b_i;
    }
    const int64_t h_i = a.heads_inner ? i_in : i_out, s_i = a.heads_inner ? i_out : i_in;
    const T* xr = xp + b_i * a.sb + h_i * a.sh + s_i * a.ss;
    T* orow = op + b_i * a.ob + h_i * a.oh + s_i * a.os;
    const int64_t trig = b_i * a.cb + s_i * D;  // this row's cos / sin
    if constexpr (kWords<T>) {
      if (a.wcos) {
        rotate_words(xr, a.wcos + trig, a.wsin + trig, orow, D, a.backward);
        continue;
      }
    }
    const float *c = a.cos + trig, *sn = a.sin + trig;
    if constexpr (std::is_same_v<T, float>) {
      if (a.backward) rotate_bwd(xr, xr + h, c, sn, orow, orow + h, h);
      else rotate_fwd(xr, xr + h, c, sn, orow, orow + h, h);
    } else {
      float* in = buf.data();
      float* o = buf.data() + D;
      load_f32<T>(xr, in, D);
      if (a.backward) rotate_bwd(in, in + h, c, sn, o, o + h, h);
      else rotate_fwd(in, in + h, c, sn, o, o + h, h);
      store_f32<T>(o, orow, D);
    }
  }
}

template <typename T>
RowsFn rows_fn() { return &rope_rows<T>; }
