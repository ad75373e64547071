// The row loops of kernels/csrc/rope.cpp, included there once per instruction set (AVX-512,
// AVX2+FMA, the build's baseline) inside `#pragma GCC target` and a namespace of its own (see
// per_isa.h), so the rotation vectorizes at full width on any x86-64 without -march=native.
// No include guard: included several times on purpose. Needs common.h and rope.cpp's RopeArgs.
// Plain `omp simd` multiply-add loops (contracted to FMA where the copy has it): no reduction,
// nothing that needed -ffast-math.

#include "convert_impl.h"

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

// Rows [r0, r1) of the flattened [B, H, S] index space ([B, S, H] when heads_inner).
template <typename T>
void rope_rows(const RopeArgs& a, int64_t r0, int64_t r1) {
  const int64_t D = a.D, h = D / 2;
  const T* xp = static_cast<const T*>(a.x);
  T* op = static_cast<T*>(a.out);
  std::vector<float> buf(std::is_same_v<T, float> ? 0 : 2 * D);
  for (int64_t r = r0; r < r1; ++r) {
    int64_t b_i, h_i, s_i;
    if (a.heads_inner) {
      h_i = r % a.H;
      const int64_t bs = r / a.H;
      s_i = bs % a.S;
      b_i = bs / a.S;
    } else {
      s_i = r % a.S;
      const int64_t bh = r / a.S;
      h_i = bh % a.H;
      b_i = bh / a.H;
    }
    const T* xr = xp + b_i * a.sb + h_i * a.sh + s_i * a.ss;
    T* orow = op + b_i * a.ob + h_i * a.oh + s_i * a.os;
    const float* c = a.cos + b_i * a.cb + s_i * D;
    const float* sn = a.sin + b_i * a.cb + s_i * D;
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
