// The per-row loops of kernels/csrc/cross_entropy.cpp, included there once per instruction set
// (AVX-512, AVX2+FMA, the build's baseline) inside `#pragma GCC target` and a namespace of its
// own (see per_isa.h), so they vectorize at full width on any x86-64 without -march=native.
// No include guard: included several times on purpose. Needs common.h (exp_nonpos) and
// cross_entropy.cpp's RowStats / RowOps declared before the includes.
//
// Without -ffast-math GCC keeps a sum's order, so the reductions are written in vector form:
// max(x) and sum(x) with four native-width accumulators each (GCC vector extensions: one pass at
// load throughput, not at the latency of one add chain), sum(exp(x - max)) as an `omp simd`
// reduction (the exp's ~20 operations per vector hide the add latency). The lanes are combined in
// a fixed order, so results do not depend on the thread count. exp is common.h's exp_nonpos (the
// arguments x - max and x - lse are <= 0): integer selects and multiply-adds only, so it
// vectorizes in every copy (the old fast_expf needed std::floor, a library call below SSE4.1).
// The row functions are `flatten`: GCC's size heuristics otherwise left exp_nonpos as a scalar
// call inside the AVX2 and baseline loops (seen in objdump), which cannot vectorize.

#include "convert_impl.h"

#include "vec_impl.h"  // kW, vf, ld, st
#include "elem_impl.h"  // word / lo / hi / put: bf16 by 32-bit words

// max(m, v) per lane, NaN lanes of v ignored (as the scalar `v > m ? v : m`).
FL_INLINE vf vmax(vf m, vf v) { return v > m ? v : m; }

// max and sum of a row (n >= 0; max of an empty row is -inf).
inline void row_max_sum(const float* x, int64_t n, float* max_out, float* sum_out) {
  const float ninf = -std::numeric_limits<float>::infinity();
  vf m0 = vf{} + ninf, m1 = m0, m2 = m0, m3 = m0;
  vf s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t j = 0;
  for (; j + 4 * kW <= n; j += 4 * kW) {
    const vf a = ld(x + j), b = ld(x + j + kW), c = ld(x + j + 2 * kW), d = ld(x + j + 3 * kW);
    m0 = vmax(m0, a), m1 = vmax(m1, b), m2 = vmax(m2, c), m3 = vmax(m3, d);
    s0 += a, s1 += b, s2 += c, s3 += d;
  }
  for (; j + kW <= n; j += kW) {
    const vf a = ld(x + j);
    m0 = vmax(m0, a), s0 += a;
  }
  const vf m = vmax(vmax(m0, m1), vmax(m2, m3)), s = (s0 + s1) + (s2 + s3);
  float mt = ninf, lanes[kW];
  for (int k = 0; k < kW; ++k) mt = m[k] > mt ? m[k] : mt;
  std::memcpy(lanes, &s, sizeof(s));
  for (int h = kW / 2; h > 0; h /= 2)  // lanes summed as a tree, in a fixed order
    for (int k = 0; k < h; ++k) lanes[k] += lanes[k + h];
  float st = lanes[0];
  for (; j < n; ++j) {
    mt = x[j] > mt ? x[j] : mt;
    st += x[j];
  }
  *max_out = mt;
  *sum_out = st;
}

// sum(exp(x - m)), m >= every x (a NaN x makes it NaN; m = -inf, an all -inf row, gives NaN).
__attribute__((flatten)) inline float row_exp_sum(const float* __restrict x, int64_t n, float m) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += fusionlens::exp_nonpos<FL_ISA>(x[j] - m);
  return s;
}

// Loss and log-sum-exp of one float row; eps = label smoothing.
__attribute__((flatten)) inline RowStats row_forward(const float* x, int64_t V, int64_t t, float eps) {
  float m, sum_x;
  row_max_sum(x, V, &m, &sum_x);
  // A NaN anywhere makes s NaN (exp(NaN) = NaN), so the loss is NaN, as in the reference.
  const float log_sum = std::log(row_exp_sum(x, V, m));
  // lse - (1 - eps) x_t - eps mean(x), ordered so that no term is rounded at lse's magnitude:
  // a confident row's loss (~1e-6) is then not lost in ulp(lse).
  float loss = (m - x[t]) + log_sum;
  if (eps != 0.0f) loss += eps * (x[t] - sum_x / static_cast<float>(V));
  return {m, log_sum, loss};
}

// True when the row's softmax is NaN (a NaN or +Inf logit, or every logit -Inf): max/sum only.
inline bool row_softmax_nan(const float* x, int64_t V) {
  float m, sum_x;
  row_max_sum(x, V, &m, &sum_x);
  return std::isnan(sum_x) || std::isinf(m);
}

// g * dloss/dx of one row into out (may alias x: each element is read before it is written).
// softmax = exp(x - max) / sum: x - max is exact near the max, where it matters, and 1/sum folds
// into the row's g (no more operations an element than exp(x - lse) took).
__attribute__((flatten)) inline void row_grad(const float* x, float* out, int64_t V, int64_t t, float m,
                                              float log_sum, float eps, float g) {
  const float smooth = g * eps / static_cast<float>(V);
  const float gs = g * std::exp(-log_sum);
  const float xt = x[t];
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) out[j] = gs * fusionlens::exp_nonpos<FL_ISA>(x[j] - m) - smooth;
  out[t] = gs * fusionlens::exp_nonpos<FL_ISA>(xt - m) - smooth - g * (1.0f - eps);
}

// The three row operations on rows of T (`buf`, `buf2`: V floats each, unused for float).
template <typename T>
RowStats forward_row(const T* xr, float* buf, int64_t V, int64_t t, float eps) {
  if constexpr (std::is_same_v<T, float>) {
    return row_forward(xr, V, t, eps);
  } else {
    load_f32<T>(xr, buf, V);
    return row_forward(buf, V, t, eps);
  }
}

// row_grad of a bf16 row straight from and into bf16 words (no float row in and out of buffers
// that, at V = 32000, do not fit L1). GUARD: round with c10's NaN select, for rows whose stats
// are not finite (a NaN there might carry low bits; from the row's own bf16 data it would not).
template <bool GUARD>
__attribute__((flatten)) inline void row_grad_words(const Bf16* x, Bf16* out, int64_t V, int64_t t, float m,
                                                    float log_sum, float eps, float g) {
  const float smooth = g * eps / static_cast<float>(V);
  const float gs = g * std::exp(-log_sum);
  const float xt = load<float>(x, t);
#pragma omp simd
  for (int64_t w = 0; w < V / 2; ++w) {
    const uint32_t u = word(x, w);
    const float a = gs * fusionlens::exp_nonpos<FL_ISA>(lo(u) - m) - smooth;
    const float b = gs * fusionlens::exp_nonpos<FL_ISA>(hi(u) - m) - smooth;
    if constexpr (GUARD) put_c10(out, w, a, b); else put(out, w, a, b);
  }
  if (V % 2) store(out, V - 1, gs * fusionlens::exp_nonpos<FL_ISA>(load<float>(x, V - 1) - m) - smooth);
  store(out, t, gs * fusionlens::exp_nonpos<FL_ISA>(xt - m) - smooth - g * (1.0f - eps));
}

template <typename T>
void backward_row(const T* xr, T* dst, float* buf, float* buf2, int64_t V, int64_t t, float m, float log_sum,
                  float eps, float g) {
  if constexpr (kWords<T>) {
    if (std::isfinite(m) && std::isfinite(log_sum) && std::isfinite(g)) {
      row_grad_words<false>(xr, dst, V, t, m, log_sum, eps, g);
    } else {
      row_grad_words<true>(xr, dst, V, t, m, log_sum, eps, g);
    }
  } else if constexpr (std::is_same_v<T, float>) {
    row_grad(xr, dst, V, t, m, log_sum, eps, g);
  } else {
    load_f32<T>(xr, buf, V);
    row_grad(buf, buf2, V, t, m, log_sum, eps, g);
    store_f32<T>(buf2, dst, V);
  }
}

template <typename T>
bool softmax_nan_row(const T* xr, float* buf, int64_t V) {
  if constexpr (std::is_same_v<T, float>) {
    return row_softmax_nan(xr, V);
  } else {
    load_f32<T>(xr, buf, V);
    return row_softmax_nan(buf, V);
  }
}

// Forward and backward of one row in place (x is overwritten with grad_scale * dloss/dx).
template <typename T>
float fused_row(T* x, float* buf, int64_t V, int64_t t, float eps, float grad_scale) {
  float* row;
  if constexpr (std::is_same_v<T, float>) {
    row = x;
  } else {
    load_f32<T>(x, buf, V);
    row = buf;
  }
  const RowStats st = row_forward(row, V, t, eps);
  row_grad(row, row, V, t, st.max, st.log_sum, eps, grad_scale);
  if constexpr (!std::is_same_v<T, float>) store_f32<T>(row, x, V);
  return st.loss;
}

template <typename T>
RowOps<T> row_ops() { return {&forward_row<T>, &backward_row<T>, &fused_row<T>, &softmax_nan_row<T>}; }
