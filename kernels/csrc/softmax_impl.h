// The fp32 row loops of kernels/csrc/softmax.cpp, included there once per instruction set
// (AVX-512, AVX2+FMA, the build's baseline) inside `#pragma GCC target` and a namespace of its
// own, so the same source vectorizes at full width on any x86-64 without -march=native.
// No include guard: included several times on purpose. Needs common.h (exp_nonpos) and
// softmax.cpp's `RowOps` declared before the includes. Plain `omp simd` loops (max and sum
// reductions, no float ?: selects, no std::fma), so GCC vectorizes them without -ffast-math.

// ---- row primitives on fp32 (plain pointer loops: what the vectorizer handles best) --------
// max(x * sc (+ mr)): a read-only pass (the output is first written by exp_sum, as ATen does).
inline float logit_max(const float* __restrict x, const float* __restrict mr, int64_t n, float sc) {
  float m = -std::numeric_limits<float>::infinity();
  if (mr != nullptr) {
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) {
      float v = x[j] * sc + mr[j];
      m = v > m ? v : m;
    }
  } else {
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) {
      float v = x[j] * sc;
      m = v > m ? v : m;
    }
  }
  return m;
}

// s = exp(x * sc (+ mr) - m); returns sum(s). x may be s itself.
inline float exp_sum(const float* x, float* s, const float* __restrict mr, int64_t n, float sc, float m) {
  float sum = 0.0f;
  if (mr != nullptr) {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      float v = fusionlens::exp_nonpos<FL_ISA>(x[j] * sc + mr[j] - m);
      s[j] = v;
      sum += v;
    }
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      float v = fusionlens::exp_nonpos<FL_ISA>(x[j] * sc - m);
      s[j] = v;
      sum += v;
    }
  }
  return sum;
}

inline void mul_inplace(float* __restrict s, int64_t n, float c) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) s[j] *= c;
}

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < n; ++j) acc += a[j] * b[j];
  return acc;
}

// out = sc * y * (g - d); out may alias g (same index read before written).
inline void softmax_grad_row(const float* g, const float* __restrict y, float* out, int64_t n,
                             float sc, float d) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = sc * y[j] * (g[j] - d);
}

RowOps row_ops() { return {&logit_max, &exp_sum, &mul_inplace, &dot, &softmax_grad_row}; }
