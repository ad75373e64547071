// Row kernels of kernels/csrc/norms.cpp, compiled once per instruction set.
//
// NO include guard on purpose: norms.cpp includes this file several times (through per_isa.h),
// each time inside its own namespace, after `#pragma GCC target(...)` and with FL_ISA set (512:
// AVX-512, 256: AVX2+FMA+F16C, 0: the build's baseline), and picks one copy at run time from the
// CPU's features. So the same source is fast on any x86-64 without -march=native. Everything it needs
// is included by norms.cpp before; this file includes only its vector helpers, norms_vec_impl.h
// (same rules), into the same namespace.
//
// Reductions use four native-width vector accumulators (GCC vector extensions), so they run at load
// throughput instead of the latency of one add chain, and without -ffast-math (each lane is an
// ordinary sequential sum; the lanes are combined in a fixed order).

#include "norms_vec_impl.h"

// sum(x), x a row of float or of a 16-bit type (converted in registers)
template <typename S>
inline float row_sum(const S* x, int64_t n) {
  vf a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t j = 0;
  if constexpr (kPairs<S>) {
    for (; j + 4 * kW <= n; j += 4 * kW) {
      vf e0, o0, e1, o1;
      ld_pair(x + j, e0, o0), ld_pair(x + j + 2 * kW, e1, o1);
      a0 += e0, a1 += o0, a2 += e1, a3 += o1;
    }
  }
  for (; j + 4 * kW <= n; j += 4 * kW) {
    a0 += ldv(x + j), a1 += ldv(x + j + kW), a2 += ldv(x + j + 2 * kW), a3 += ldv(x + j + 3 * kW);
  }
  for (; j + kW <= n; j += kW) a0 += ldv(x + j);
  float t = hsum((a0 + a1) + (a2 + a3));
  for (; j < n; ++j) t += ld1(x + j);
  return t;
}

// sum((x - mu)^2), and sum(x - mu) into *dev: the corrected two-pass algorithm (Chan, Golub and
// LeVeque) turns the second into the first pass's rounding of mu (mean = mu + dev / n), which at
// a large common offset (values 5 +- 0.01) otherwise costs x - mu, and so every output, several
// times eager's error (found by tests/kernels/fuzz.py). Free: the loads are shared.
template <typename S>
inline float row_sq_dev(const S* x, int64_t n, float mu, float* dev) {
  vf a0 = {}, a1 = {}, a2 = {}, a3 = {}, s0 = {};
  int64_t j = 0;
  if constexpr (kPairs<S>) {
    for (; j + 4 * kW <= n; j += 4 * kW) {
      vf x0, x1, x2, x3;
      ld_pair(x + j, x0, x1), ld_pair(x + j + 2 * kW, x2, x3);
      const vf d0 = x0 - mu, d1 = x1 - mu, d2 = x2 - mu, d3 = x3 - mu;
      a0 += d0 * d0, a1 += d1 * d1, a2 += d2 * d2, a3 += d3 * d3;
      s0 += (d0 + d1) + (d2 + d3);
    }
  }
  for (; j + 4 * kW <= n; j += 4 * kW) {
    const vf d0 = ldv(x + j) - mu, d1 = ldv(x + j + kW) - mu, d2 = ldv(x + j + 2 * kW) - mu,
             d3 = ldv(x + j + 3 * kW) - mu;
    a0 += d0 * d0, a1 += d1 * d1, a2 += d2 * d2, a3 += d3 * d3;
    s0 += (d0 + d1) + (d2 + d3);
  }
  for (; j + kW <= n; j += kW) {
    const vf d = ldv(x + j) - mu;
    a0 += d * d, s0 += d;
  }
  float t = hsum((a0 + a1) + (a2 + a3)), u = hsum(s0);
  for (; j < n; ++j) {
    const float d = ld1(x + j) - mu;
    t += d * d, u += d;
  }
  *dev = u;
  return t;
}

// s = x + r (written to s, which may alias neither), returns sum(s^2). Used when no rounding
// through a 16-bit type is needed between the add and the norm (float).
inline float row_add_sumsq(const float* x, const float* r, float* s, int64_t n) {
  vf a0 = {}, a1 = {};
  int64_t j = 0;
  for (; j + 2 * kW <= n; j += 2 * kW) {
    const vf s0 = ld(x + j) + ld(r + j), s1 = ld(x + j + kW) + ld(r + j + kW);
    std::memcpy(s + j, &s0, sizeof(s0));
    std::memcpy(s + j + kW, &s1, sizeof(s1));
    a0 += s0 * s0, a1 += s1 * s1;
  }
  float t = hsum(a0 + a1);
  for (; j < n; ++j) {
    s[j] = x[j] + r[j];
    t += s[j] * s[j];
  }
  return t;
}

// s = x + r rounded through T (eager's `x + residual` in T), written to sum_out as T and to s as
// float, in one pass over the 16-bit rows with the conversions in registers; returns sum(s^2)
// (free: the RMSNorm needs it, the LayerNorm ignores it). It replaced five passes through L1 (x
// and r widened into buffers, added, rounded out, read back) and RMSNorm's sixth (the squares).
// SPLIT (bf16): by even/odd pairs (ld_pair), s in split_pairs order, the order ln_out_row and
// rms_out_row read a float row in when they write bf16. The rounded sums' floats are their bf16
// bits with the low half cleared, so one rounding gives the stored word and s. Unguarded
// (round_hi<false>): the sum of two bf16 values is a NaN with zero low bits.
template <typename T, bool SPLIT = false>
inline float row_add_round_sumsq(const T* x, const T* r, T* sum_out, float* s, int64_t n) {
  vf a0 = {}, a1 = {};
  int64_t j = 0;
  for (; j + 2 * kW <= n; j += 2 * kW) {
    vf s0, s1;
    if constexpr (SPLIT) {
      vf xe, xo, re, ro;
      ld_pair(x + j, xe, xo), ld_pair(r + j, re, ro);
      const vu he = round_hi<false>(xe + re) & 0xffff0000u, ho = round_hi<false>(xo + ro) & 0xffff0000u;
      const vu bits = (he >> 16) | ho;
      std::memcpy(sum_out + j, &bits, sizeof(bits));
      std::memcpy(&s0, &he, sizeof(s0));
      std::memcpy(&s1, &ho, sizeof(s1));
    } else {
      const vf v0 = ldv(x + j) + ldv(r + j), v1 = ldv(x + j + kW) + ldv(r + j + kW);
      stv(sum_out + j, v0);
      stv(sum_out + j + kW, v1);
      s0 = round_v<T>(v0), s1 = round_v<T>(v1);
    }
    st(s + j, s0);
    st(s + j + kW, s1);
    a0 += s0 * s0, a1 += s1 * s1;
  }
  float t = hsum(a0 + a1);
  for (; j < n; ++j) {
    st1(sum_out + j, ld1(x + j) + ld1(r + j));
    s[j] = ld1(sum_out + j);
    t += s[j] * s[j];
  }
  return t;
}

// sum(x^2), x a row of float or of a 16-bit type (converted in registers)
template <typename S>
inline float row_sumsq(const S* x, int64_t n) {
  vf a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t j = 0;
  if constexpr (kPairs<S>) {
    for (; j + 4 * kW <= n; j += 4 * kW) {
      vf x0, x1, x2, x3;
      ld_pair(x + j, x0, x1), ld_pair(x + j + 2 * kW, x2, x3);
      a0 += x0 * x0, a1 += x1 * x1, a2 += x2 * x2, a3 += x3 * x3;
    }
  }
  for (; j + 4 * kW <= n; j += 4 * kW) {
    const vf x0 = ldv(x + j), x1 = ldv(x + j + kW), x2 = ldv(x + j + 2 * kW), x3 = ldv(x + j + 3 * kW);
    a0 += x0 * x0, a1 += x1 * x1, a2 += x2 * x2, a3 += x3 * x3;
  }
  for (; j + kW <= n; j += kW) {
    const vf x0 = ldv(x + j);
    a0 += x0 * x0;
  }
  float t = hsum((a0 + a1) + (a2 + a3));
  for (; j < n; ++j) t += ld1(x + j) * ld1(x + j);
  return t;
}

// g = dy * w (stored, rounded once), returns {sum(g * (x - mu)), sum(g), sum(x - mu)}: the last is
// n times the saved mean's own rounding error (ln_bwd). bf16 rows go by pairs: w is then the split
// weight and g comes out split.
template <typename S>
inline void row_ln_bwd_sums(const S* dy, const float* w, const S* x, float mu, float* g, int64_t n,
                            float* s_gx, float* s_g, float* s_dev) {
  vf a0 = {}, a1 = {}, b0 = {}, b1 = {}, e0 = {};
  int64_t j = 0;
  if constexpr (kPairs<S>) {  // w and g in split order
    for (; j + 2 * kW <= n; j += 2 * kW) {
      vf d0, d1, x0, x1;
      ld_pair(dy + j, d0, d1), ld_pair(x + j, x0, x1);
      const vf g0 = d0 * ld(w + j), g1 = d1 * ld(w + j + kW), h0 = x0 - mu, h1 = x1 - mu;
      st(g + j, g0), st(g + j + kW, g1);
      a0 += g0 * h0, a1 += g1 * h1;
      b0 += g0, b1 += g1;
      e0 += h0 + h1;
    }
  }
  for (; j + 2 * kW <= n; j += 2 * kW) {
    const vf g0 = ldv(dy + j) * ld(w + j), g1 = ldv(dy + j + kW) * ld(w + j + kW);
    const vf h0 = ldv(x + j) - mu, h1 = ldv(x + j + kW) - mu;
    std::memcpy(g + j, &g0, sizeof(g0));
    std::memcpy(g + j + kW, &g1, sizeof(g1));
    a0 += g0 * h0, a1 += g1 * h1;
    b0 += g0, b1 += g1;
    e0 += h0 + h1;
  }
  float ta = hsum(a0 + a1), tb = hsum(b0 + b1), te = hsum(e0);
  for (; j < n; ++j) {
    const float h = ld1(x + j) - mu;
    g[j] = ld1(dy + j) * w[j];
    ta += g[j] * h;
    tb += g[j];
    te += h;
  }
  *s_gx = ta, *s_g = tb, *s_dev = te;
}

// sum(dy * w * x); dy may be float on 16-bit rows (llama casting's promoted output). bf16 dy and
// x go by pairs, with w the split weight.
template <typename G, typename S>
inline float row_dot3(const G* dy, const float* w, const S* x, int64_t n) {
  vf a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t j = 0;
  if constexpr (kPairs<G> && kPairs<S>) {  // w split
    for (; j + 2 * kW <= n; j += 2 * kW) {
      vf d0, d1, x0, x1;
      ld_pair(dy + j, d0, d1), ld_pair(x + j, x0, x1);
      a0 += d0 * ld(w + j) * x0, a1 += d1 * ld(w + j + kW) * x1;
    }
  }
  for (; j + 4 * kW <= n; j += 4 * kW) {
    a0 += ldv(dy + j) * ld(w + j) * ldv(x + j);
    a1 += ldv(dy + j + kW) * ld(w + j + kW) * ldv(x + j + kW);
    a2 += ldv(dy + j + 2 * kW) * ld(w + j + 2 * kW) * ldv(x + j + 2 * kW);
    a3 += ldv(dy + j + 3 * kW) * ld(w + j + 3 * kW) * ldv(x + j + 3 * kW);
  }
  for (; j + kW <= n; j += kW) a0 += ldv(dy + j) * ld(w + j) * ldv(x + j);
  float t = hsum((a0 + a1) + (a2 + a3));
  for (; j < n; ++j) t += ld1(dy + j) * w[j] * ld1(x + j);
  return t;
}

// Row i of x (+ residual, rounded through T like eager `x + residual`) as float; writes the sum
// row when a residual is given. With a residual, ss_out (when given) receives sum(s^2): the add
// and the RMS reduction in one pass; otherwise ss_out is left alone. SPLIT (bf16 with a residual,
// for a bf16 output): the float row comes in split_pairs order (row_add_round_sumsq).
template <typename T, bool SPLIT = false>
inline const float* input_row(const T* x, const T* res, T* sum_out, int64_t i, int64_t n, float* buf,
                              bool stream, float* ss_out) {
  if (!res) return as_f32<T>(x + i * n, buf, n);
  if constexpr (std::is_same_v<T, float>) {
    const float* xr = x + i * n;
    const float* rr = res + i * n;
    float* s = stream ? buf : sum_out + i * n;  // streamed: computed in buf, then streamed out
    const float ss = row_add_sumsq(xr, rr, s, n);
    if (ss_out) *ss_out = ss;
    if (stream) stream_copy(sum_out + i * n, s, n * 4);
    return s;
  } else {  // the rounded sum: the output, and what eager's norm reads
    const float ss = row_add_round_sumsq<T, SPLIT>(x + i * n, res + i * n, sum_out + i * n, buf, n);
    if (ss_out) *ss_out = ss;
    return buf;
  }
}

// ---------------------------------------------------------------- LayerNorm
// The mean in two parts, mu + d: mu a float near the mean (the first pass's, or the saved one)
// and d = sum(x - mu) / n the rest of it, kept apart so that x_hat = (x - mu) r - d r rounds once
// (a contracted multiply-add) and x - mu is exact where x is near mu (Sterbenz). Rounding mu + d
// into one float instead costs up to half an ulp of the mean in every x - mean: at a large common
// offset (values 5 +- 0.01, rstd ~260) that was the whole of the weight gradient's error, 2.4x
// eager's (tests/kernels/fuzz.py seed 14027533). dr = d r; both passes below take it.
//
// y = ((x - mu) * r - dr) * w + b over columns [0, n) of a row: x of type S (float, or T read and
// converted in registers), y stored as D (T, or a float tile), while the next row (nx, and the
// residual nr) is prefetched, and the next output row ny for writing. A bf16 row into a bf16 row
// goes by even/odd pairs (ld_pair), with ws, bs the weight and bias split to match (split_pairs),
// and so does a float row into a bf16 row: that is always input_row's split sum row;
// GUARD: the bf16 rounding keeps any NaN payload (round_hi).
template <bool GUARD, typename S, typename D, typename T>
inline void ln_out_row(const S* x, D* y, const float* w, const float* b, const float* ws, const float* bs,
                       float mu, float r, float dr, int64_t n, const T* nx, const T* nr, D* ny) {
  for (int64_t j0 = 0; j0 < n; j0 += kPrefetchSpan) {
    const int64_t j1 = std::min(n, j0 + kPrefetchSpan);
    prefetch_cols<T>(nx, j0, j1 - j0);
    prefetch_cols<T>(nr, j0, j1 - j0);
    if constexpr (std::is_same_v<D, float>) prefetch_cols_w(ny, j0, j1 - j0);  // see prefetch_cols_w
    int64_t j = j0;
    if constexpr (kPairs<S> && std::is_same_v<S, D>) {  // j0 is a multiple of 2 kW: whole pairs blocks
      for (; j + 2 * kW <= j1; j += 2 * kW) {
        vf e, o;
        ld_pair(x + j, e, o);
        st_pair<GUARD>(y + j, ((e - mu) * r - dr) * ld(ws + j) + ld(bs + j),
                       ((o - mu) * r - dr) * ld(ws + j + kW) + ld(bs + j + kW));
      }
    } else if constexpr (std::is_same_v<S, float> && kPairs<D>) {  // x: input_row<T, true>'s split row
      for (; j + 2 * kW <= j1; j += 2 * kW) {
        st_pair<GUARD>(y + j, ((ld(x + j) - mu) * r - dr) * ld(ws + j) + ld(bs + j),
                       ((ld(x + j + kW) - mu) * r - dr) * ld(ws + j + kW) + ld(bs + j + kW));
      }
    }
    for (; j + kW <= j1; j += kW) stv(y + j, ((ldv(x + j) - mu) * r - dr) * ld(w + j) + ld(b + j));
    for (; j < j1; ++j) st1(y + j, ((ld1(x + j) - mu) * r - dr) * w[j] + b[j]);
  }
}

template <typename T>
void ln_fwd(const LnFwd& a) {
  const int64_t m = a.m, n = a.n;
  const T* xp = static_cast<const T*>(a.x);
  const T* rp = static_cast<const T*>(a.res);
  T* sp = static_cast<T*>(a.sum);
  T* yp = static_cast<T*>(a.y);
  const float inv_n = 1.0f / static_cast<float>(n);
  const bool stream = a.stream;
  const std::vector<float> ones(a.w ? 0 : n, 1.f), zeros(a.b ? 0 : n, 0.f);
  const float* wv = a.w ? a.w : ones.data();
  const float* bv = a.b ? a.b : zeros.data();
  std::vector<float> split(kPairs<T> ? 2 * n : 0);  // w, b as ld_pair reads them
  if constexpr (kPairs<T>) split_pairs(wv, split.data(), n), split_pairs(bv, split.data() + n, n);
  const float* ws = kPairs<T> ? split.data() : wv;
  const float* bs = kPairs<T> ? split.data() + n : bv;
  const bool guard = !(nan_free(a.w, n) && nan_free(a.b, n) && !std::isnan(a.eps));
  at::parallel_for(0, m, row_grain(n), [&](int64_t begin, int64_t end) {
    // Per thread: the sum row as float (with a residual), the streamed y row (as T).
    constexpr bool f32 = std::is_same_v<T, float>;
    Scratch<T> sc(f32 ? 2 * n : n, !f32 && stream ? n : 0);
    T* tile;
    if constexpr (f32) tile = sc.f.data() + n; else tile = sc.t.data();
    for (int64_t i = begin; i < end; ++i) {
      const int64_t ip = i + kPrefetchRows;
      const T* nx = ip < end ? xp + ip * n : nullptr;
      const T* nr = ip < end && rp ? rp + ip * n : nullptr;
      T* yr = yp + i * n;
      T* y = stream ? tile : yr;
      T* ny = !stream && nx ? yr + kPrefetchRows * n : nullptr;
      float mu, r;
      auto stats_and_out = [&](const auto* xr) {  // xr: the row as T, or the sum row as float
        const float mu0 = row_sum(xr, n) * inv_n;
        float dev;
        const float sq = row_sq_dev(xr, n, mu0, &dev);
        const float d = dev * inv_n;  // the mean is mu0 + d; the variance about it: sq - dev^2 / n
        mu = mu0 + d;  // saved (rounded; the backward finds its own d again)
        // (max(v, 0) in this order keeps a NaN variance NaN, as the plain two-pass sum did)
        r = 1.0f / std::sqrt(std::max(sq - dev * dev * inv_n, 0.0f) * inv_n + static_cast<float>(a.eps));
        if (guard) ln_out_row<true>(xr, y, wv, bv, ws, bs, mu0, r, d * r, n, nx, nr, ny);
        else ln_out_row<false>(xr, y, wv, bv, ws, bs, mu0, r, d * r, n, nx, nr, ny);
        if (stream) stream_copy(yr, tile, n * static_cast<int64_t>(sizeof(T)));
      };
      if (rp) {
        stats_and_out(input_row<T, kPairs<T>>(xp, rp, sp, i, n, sc.f.data(), stream, nullptr));
      } else {
        stats_and_out(xp + i * n);
      }
      a.mean[i] = mu;
      a.rstd[i] = r;
    }
    if (stream || rp) fence();
  });
}

// ---------------------------------------------------------------- LayerNorm backward
// One row at a time, like ATen's kernel: pass 1 streams x and dy from memory and reduces them (g =
// dy * w kept in L1), pass 2 reads x, dy, g and the chunk's dw/db partials from L1 (at N = 768:
// 5 rows of 3 KB + 2 partials) and writes dx, while it prefetches the next row. (Blocks of 4 rows,
// as both backwards had before, saved loads of the partials but their 4 x 4 rows spilled L1 to L2
// at N = 768: measured 1.4-2x slower at 4096x768, see kernels_norms_cpu.md.)
// Pass 2 of one row. xhat = (x - mu) * r - dr (the mean in two parts, see ln_out_row);
// dx = r * (g - c2 - xhat * c1) [+ da];
// pw += dy * xhat; pb += dy. x, dy, da: rows of T (converted in registers); dx: T, or a float
// tile to be streamed out; nx, ndy: rows to prefetch (null: none). bf16 rows go by pairs, with g,
// pw and pb in split order; GUARD: the dx stores keep any NaN payload (round_hi).
template <typename T, typename D, bool A, bool GUARD>
inline void ln_bwd_row(const T* x, const T* dy, const float* g, const T* da, D* dx, float* pw, float* pb,
                       float mu, float r, float dr, float c1, float c2, int64_t n, const T* nx, const T* ndy,
                       D* ndx) {
  for (int64_t j0 = 0; j0 < n; j0 += kPrefetchSpan) {
    const int64_t j1 = std::min(n, j0 + kPrefetchSpan);
    prefetch_cols<T>(nx, j0, j1 - j0);
    prefetch_cols<T>(ndy, j0, j1 - j0);
    if constexpr (std::is_same_v<D, float>) prefetch_cols_w(ndx, j0, j1 - j0);  // see prefetch_cols_w
    int64_t j = j0;
    if constexpr (kPairs<T> && std::is_same_v<D, T>) {
      for (; j + 2 * kW <= j1; j += 2 * kW) {
        vf x0, x1, d0, d1;
        ld_pair(x + j, x0, x1), ld_pair(dy + j, d0, d1);
        const vf h0 = (x0 - mu) * r - dr, h1 = (x1 - mu) * r - dr;
        vf o0 = r * (ld(g + j) - c2 - h0 * c1), o1 = r * (ld(g + j + kW) - c2 - h1 * c1);
        if constexpr (A) {
          vf a0, a1;
          ld_pair(da + j, a0, a1);
          o0 += a0, o1 += a1;
        }
        st_pair<GUARD>(dx + j, o0, o1);
        st(pw + j, ld(pw + j) + d0 * h0), st(pw + j + kW, ld(pw + j + kW) + d1 * h1);
        st(pb + j, ld(pb + j) + d0), st(pb + j + kW, ld(pb + j + kW) + d1);
      }
    }
    for (; j + kW <= j1; j += kW) {
      const vf xh = (ldv(x + j) - mu) * r - dr, d = ldv(dy + j);
      vf o = r * (ld(g + j) - c2 - xh * c1);
      if constexpr (A) o += ldv(da + j);
      stv(dx + j, o);
      st(pw + j, ld(pw + j) + d * xh);
      st(pb + j, ld(pb + j) + d);
    }
    for (; j < j1; ++j) {
      const float xh = (ld1(x + j) - mu) * r - dr, d = ld1(dy + j);
      float o = r * (g[j] - c2 - xh * c1);
      if constexpr (A) o += ld1(da + j);
      st1(dx + j, o);
      pw[j] += d * xh;
      pb[j] += d;
    }
  }
}

template <typename T>
void ln_bwd(const LnBwd& a) {
  const int64_t m = a.m, n = a.n;
  const T* xp = static_cast<const T*>(a.x);
  const T* dyp = static_cast<const T*>(a.dy);
  const T* dap = static_cast<const T*>(a.dadd);
  T* dxp = static_cast<T*>(a.dx);
  const float inv_n = 1.0f / static_cast<float>(n);
  const int64_t nchunks = chunks_for(m, n), block_rows = grad_block_rows(n);
  std::vector<double> dw_part(a.dw ? nchunks * n : 0, 0.0), db_part(a.db ? nchunks * n : 0, 0.0);
  const std::vector<float> ones(a.w ? 0 : n, 1.f);
  const float* wv = a.w ? a.w : ones.data();
  std::vector<float> split(kPairs<T> ? n : 0);  // w as ld_pair reads it; g, pw, pb follow
  if constexpr (kPairs<T>) split_pairs(wv, split.data(), n);
  const float* ws = kPairs<T> ? split.data() : wv;
  const bool nan_w = !nan_free(a.w, n);
  const bool stream = a.stream;
  at::parallel_for(0, nchunks, 1, [&](int64_t cbegin, int64_t cend) {
    // Per thread: g = dy * w, the streamed dx tile (as T), scratch partials for grads nobody asked for.
    constexpr bool f32 = std::is_same_v<T, float>;
    Scratch<T> sc(f32 ? 4 * n : 3 * n, !f32 && stream ? n : 0);
    float *g = sc.f.data(), *pw = g + n, *pb = g + 2 * n;  // pw, pb: block sums
    T* tile;
    if constexpr (f32) tile = g + 3 * n; else tile = sc.t.data();
    for (int64_t c = cbegin; c < cend; ++c) {
      const int64_t i0 = c * m / nchunks, i1 = (c + 1) * m / nchunks;
      for (int64_t i = i0; i < i1; ++i) {
        if (i > i0 && (i - i0) % block_rows == 0) {
          if (a.dw) flush_block(pw, dw_part.data() + c * n, n);
          if (a.db) flush_block(pb, db_part.data() + c * n, n);
        }
        const T *x = xp + i * n, *dy = dyp + i * n, *da = dap ? dap + i * n : nullptr;
        const float mu = a.mean[i], r = a.rstd[i];
        // g = dy * w is stored (rounded once) and reused, so that sum(g)/N - g is exactly 0
        // where it should be (e.g. N = 1) even when the compiler contracts into FMAs.
        float s_gx, s_g, s_dev;
        row_ln_bwd_sums(dy, ws, x, mu, g, n, &s_gx, &s_g, &s_dev);
        // The saved mean is mu + d (ln_out_row): sum(g (x - mu - d)) = s_gx - d s_g (only where d is
        // not 0: an infinite s_g times 0 would make NaN of a row that is not one).
        const float d = s_dev * inv_n, dr = d * r;
        const float c1 = (d != 0.0f ? s_gx - d * s_g : s_gx) * r * inv_n, c2 = s_g * inv_n;
        const int64_t ip = i + kPrefetchRows;
        const T* nx = ip < i1 ? xp + ip * n : nullptr;
        const T* ndy = ip < i1 ? dyp + ip * n : nullptr;
        T* dx = stream ? tile : dxp + i * n;
        T* ndx = !stream && nx ? dxp + ip * n : nullptr;
        // A NaN that can carry its payload's low bits into dx: from w, or from eps through mu / r.
        const bool guard = nan_w || std::isnan(mu) || std::isnan(r);
        auto run = [&](auto has_da, auto guarded) {
          ln_bwd_row<T, T, decltype(has_da)::value, decltype(guarded)::value>(x, dy, g, da, dx, pw, pb, mu, r, dr,
                                                                              c1, c2, n, nx, ndy, ndx);
        };
        with_flags(da != nullptr, guard, run);
        if (stream) stream_copy(dxp + i * n, tile, n * static_cast<int64_t>(sizeof(T)));
      }
      if (a.dw) flush_block(pw, dw_part.data() + c * n, n);
      if (a.db) flush_block(pb, db_part.data() + c * n, n);
    }
    if (stream) fence();
  });
  if (a.dw) reduce_partials_to(dw_part.data(), nchunks, n, a.dw, kPairs<T>);
  if (a.db) reduce_partials_to(db_part.data(), nchunks, n, a.db, kPairs<T>);
}

// ---------------------------------------------------------------- RMSNorm
// y = x * r [rounded through T when RN] * w over columns [0, n): x a row of S (a 16-bit row read in
// registers, or a float row), y stored as D (T or float), while the next row nx and the next
// output row ny (or none) are prefetched (as ln_out_row). FIN: the row is finite (so is x * r):
// the rounding skips its NaN guard. A bf16 row into a bf16 row goes by even/odd pairs with ws the
// weight split to match, as ln_out_row, and so does a float row (input_row's split sum row) into a
// bf16 row; GUARD: their stores keep any NaN payload.
template <typename T, bool RN, bool FIN, bool GUARD, typename S, typename D>
inline void rms_out_row(const S* x, D* y, const float* w, const float* ws, float r, int64_t n, const S* nx,
                        D* ny) {
  for (int64_t j0 = 0; j0 < n; j0 += kPrefetchSpan) {
    const int64_t j1 = std::min(n, j0 + kPrefetchSpan);
    prefetch_cols<S>(nx, j0, j1 - j0);
    if constexpr (std::is_same_v<D, float>) prefetch_cols_w(ny, j0, j1 - j0);  // see prefetch_cols_w
    int64_t j = j0;
    if constexpr ((kPairs<S> && std::is_same_v<S, D>) || (std::is_same_v<S, float> && kPairs<D>)) {
      for (; j + 2 * kW <= j1; j += 2 * kW) {
        vf e, o;
        if constexpr (kPairs<S>) ld_pair(x + j, e, o);
        else e = ld(x + j), o = ld(x + j + kW);
        e *= r, o *= r;
        if constexpr (RN) {
          e = FIN ? round_v_finite<T>(e) : round_v<T>(e);
          o = FIN ? round_v_finite<T>(o) : round_v<T>(o);
        }
        st_pair<GUARD>(y + j, e * ld(ws + j), o * ld(ws + j + kW));
      }
    }
    for (; j + kW <= j1; j += kW) {
      vf v = ldv(x + j) * r;
      if constexpr (RN) v = FIN ? round_v_finite<T>(v) : round_v<T>(v);
      stv(y + j, v * ld(w + j));
    }
    for (; j < j1; ++j) {
      float v = ld1(x + j) * r;
      if constexpr (RN) {
        T t;
        st1(&t, v);
        v = ld1(&t);
      }
      st1(y + j, v * w[j]);
    }
  }
}

// A row whose rstd r is finite and positive holds only finite values (a NaN gives r = NaN, an Inf
// r = 0, an all-zero row with eps = 0 r = Inf), and so does x * r.
inline bool finite_row(float r) { return r > 0.f && r <= std::numeric_limits<float>::max(); }

// rms_out_row for a row with rstd r: llama's rounding through T (round_n) unguarded on finite rows.
template <typename T, bool GUARD, typename S, typename D>
inline void rms_out_g(bool round_n, float r, const S* x, D* y, const float* w, const float* ws, int64_t n,
                      const S* nx, D* ny) {
  if (!round_n) rms_out_row<T, false, true, GUARD>(x, y, w, ws, r, n, nx, ny);
  else if (finite_row(r)) rms_out_row<T, true, true, GUARD>(x, y, w, ws, r, n, nx, ny);
  else rms_out_row<T, true, false, GUARD>(x, y, w, ws, r, n, nx, ny);
}

template <typename T, typename S, typename D>
inline void rms_out(bool guard, bool round_n, float r, const S* x, D* y, const float* w, const float* ws,
                    int64_t n, const S* nx, D* ny) {
  if (guard) rms_out_g<T, true>(round_n, r, x, y, w, ws, n, nx, ny);
  else rms_out_g<T, false>(round_n, r, x, y, w, ws, n, nx, ny);
}

// llama_cast: y = round(round(x * rstd) * w) (HF LlamaRMSNorm: normalize in fp32, cast to the
// input dtype, then multiply by the weight); otherwise y = round(x * rstd * w) (Gemma: all fp32,
// one cast). w already holds (offset + weight) as float. Y = float on 16-bit rows is llama
// casting with an fp32 weight, where eager promotes: y = round(x * rstd) * w, kept in fp32.
template <typename T, typename Y = T>
void rms_fwd(const RmsFwd& a) {
  const int64_t m = a.m, n = a.n;
  const T* xp = static_cast<const T*>(a.x);
  const T* rp = static_cast<const T*>(a.res);
  T* sp = static_cast<T*>(a.sum);
  Y* yp = static_cast<Y*>(a.y);
  const float inv_n = 1.0f / static_cast<float>(n);
  const bool stream = a.stream;
  const bool round_n = a.llama_cast && !std::is_same_v<T, float>;
  const std::vector<float> ones(a.w ? 0 : n, 1.f);
  const float* wv = a.w ? a.w : ones.data();
  std::vector<float> split(kPairs<T> ? n : 0);  // w as ld_pair reads it
  if constexpr (kPairs<T>) split_pairs(wv, split.data(), n);
  const float* ws = kPairs<T> ? split.data() : wv;
  const bool guard = !(nan_free(a.w, n) && !std::isnan(a.eps));
  const auto rstd = [&](float ss) { return 1.0f / std::sqrt(ss * inv_n + static_cast<float>(a.eps)); };
  at::parallel_for(0, m, row_grain(n), [&](int64_t begin, int64_t end) {
    // Per thread: the sum row as float (with a residual), the streamed y row (as Y).
    constexpr bool yf = std::is_same_v<Y, float>;
    Scratch<T> sc(n + (yf && stream ? n : 0), !yf && stream ? n : 0);
    Y* tile;
    if constexpr (yf) tile = sc.f.data() + n; else tile = sc.t.data();
    for (int64_t i = begin; i < end; ++i) {
      const bool next = i + kPrefetchRows < end;
      Y* yr = yp + i * n;
      Y* y = stream ? tile : yr;
      Y* ny = !stream && next ? yr + kPrefetchRows * n : nullptr;
      float r;
      if (!rp) {  // x itself (a 16-bit row is read in registers twice, no float copy)
        const T* x = xp + i * n;
        r = rstd(row_sumsq(x, n));
        rms_out<T>(guard, round_n, r, x, y, wv, ws, n, next ? x + kPrefetchRows * n : nullptr, ny);
      } else {  // the add computed sum(s^2) already
        float ss = 0.f;
        const float* s = input_row<T, kPairs<T> && std::is_same_v<Y, T>>(xp, rp, sp, i, n, sc.f.data(), stream, &ss);
        r = rstd(ss);
        rms_out<T>(guard, round_n, r, s, y, wv, ws, n, static_cast<const float*>(nullptr), ny);
      }
      a.rstd[i] = r;
      if (stream) stream_copy(yr, tile, n * static_cast<int64_t>(sizeof(Y)));
    }
    if (stream || rp) fence();
  });
}

// ---------------------------------------------------------------- RMSNorm backward
// One row at a time with the next row prefetched, as the LayerNorm backward (measured there: 4-row
// blocks spilled L1 at N = 768). dx = r * (dy * w - x * c1) [+ da]; pw += dy * x * r, or with NH
// (HF llama casting of 16-bit rows) pw += dy * n_hat with n_hat = x * r rounded through T, as the
// weight saw it in the forward; FIN: the row is finite (finite_row), the rounding skips its NaN guard.
template <typename T, bool A, bool NH, bool FIN, bool GUARD, typename D, typename G>
inline void rms_bwd_row(const T* x, const G* dy, const T* da, const float* w, D* dx, float* pw, float r,
                        float c1, int64_t n, const T* nx, const G* ndy, D* ndx) {
  for (int64_t j0 = 0; j0 < n; j0 += kPrefetchSpan) {
    const int64_t j1 = std::min(n, j0 + kPrefetchSpan);
    prefetch_cols<T>(nx, j0, j1 - j0);
    prefetch_cols<G>(ndy, j0, j1 - j0);
    if constexpr (std::is_same_v<D, float>) prefetch_cols_w(ndx, j0, j1 - j0);  // see prefetch_cols_w
    int64_t j = j0;
    if constexpr (kPairs<T> && std::is_same_v<G, T> && std::is_same_v<D, T>) {  // w, pw split
      for (; j + 2 * kW <= j1; j += 2 * kW) {
        vf x0, x1, d0, d1;
        ld_pair(x + j, x0, x1), ld_pair(dy + j, d0, d1);
        vf o0 = r * (d0 * ld(w + j) - x0 * c1), o1 = r * (d1 * ld(w + j + kW) - x1 * c1);
        if constexpr (A) {
          vf a0, a1;
          ld_pair(da + j, a0, a1);
          o0 += a0, o1 += a1;
        }
        st_pair<GUARD>(dx + j, o0, o1);
        if constexpr (NH) {
          st(pw + j, ld(pw + j) + d0 * (FIN ? round_v_finite<T>(x0 * r) : round_v<T>(x0 * r)));
          st(pw + j + kW, ld(pw + j + kW) + d1 * (FIN ? round_v_finite<T>(x1 * r) : round_v<T>(x1 * r)));
        } else {
          st(pw + j, ld(pw + j) + d0 * x0 * r), st(pw + j + kW, ld(pw + j + kW) + d1 * x1 * r);
        }
      }
    }
    for (; j + kW <= j1; j += kW) {
      const vf d = ldv(dy + j), xv = ldv(x + j);
      vf o = r * (d * ld(w + j) - xv * c1);
      if constexpr (A) o += ldv(da + j);
      stv(dx + j, o);
      if constexpr (NH) {
        st(pw + j, ld(pw + j) + d * (FIN ? round_v_finite<T>(xv * r) : round_v<T>(xv * r)));
      } else {
        st(pw + j, ld(pw + j) + d * xv * r);
      }
    }
    for (; j < j1; ++j) {
      const float d = ld1(dy + j), xv = ld1(x + j);
      float o = r * (d * w[j] - xv * c1);
      if constexpr (A) o += ld1(da + j);
      st1(dx + j, o);
      if constexpr (NH) {
        T t;
        st1(&t, xv * r);
        pw[j] += d * ld1(&t);
      } else {
        pw[j] += d * xv * r;
      }
    }
  }
}

// rms_bwd_row for a row with rstd r, as rms_out picks rms_out_row: llama's rounding of n_hat
// through T (round_n) unguarded on finite rows; GUARD as ln_bwd_row's.
template <typename T, bool A, bool GUARD, typename D, typename G>
inline void rms_bwd_pick(bool round_n, const T* x, const G* dy, const T* da, const float* w, D* dx, float* pw,
                         float r, float c1, int64_t n, const T* nx, const G* ndy, D* ndx) {
  if (!round_n) rms_bwd_row<T, A, false, true, GUARD>(x, dy, da, w, dx, pw, r, c1, n, nx, ndy, ndx);
  else if (finite_row(r)) rms_bwd_row<T, A, true, true, GUARD>(x, dy, da, w, dx, pw, r, c1, n, nx, ndy, ndx);
  else rms_bwd_row<T, A, true, false, GUARD>(x, dy, da, w, dx, pw, r, c1, n, nx, ndy, ndx);
}

// G = float on 16-bit rows: the gradient of rms_fwd<T, float>'s promoted output.
template <typename T, typename G = T>
void rms_bwd(const RmsBwd& a) {
  const int64_t m = a.m, n = a.n;
  const T* xp = static_cast<const T*>(a.x);
  const G* dyp = static_cast<const G*>(a.dy);
  const T* dap = static_cast<const T*>(a.dadd);
  T* dxp = static_cast<T*>(a.dx);
  const float inv_n = 1.0f / static_cast<float>(n);
  const int64_t nchunks = chunks_for(m, n), block_rows = grad_block_rows(n);
  std::vector<double> dw_part(a.dw ? nchunks * n : 0, 0.0);
  const bool round_n = a.llama_cast && !std::is_same_v<T, float>;
  const std::vector<float> ones(a.w ? 0 : n, 1.f);
  const float* wv = a.w ? a.w : ones.data();
  constexpr bool split = kPairs<T> && std::is_same_v<G, T>;  // bf16 rows by pairs: w and pw split
  std::vector<float> wsplit(split ? n : 0);
  if constexpr (split) split_pairs(wv, wsplit.data(), n);
  const float* ws = split ? wsplit.data() : wv;
  const bool nan_w = !nan_free(a.w, n);
  const bool stream = a.stream;
  at::parallel_for(0, nchunks, 1, [&](int64_t cbegin, int64_t cend) {
    // Per thread: the streamed dx tile (as T), a scratch partial for a weight grad nobody asked for.
    constexpr bool f32 = std::is_same_v<T, float>;
    Scratch<T> sc(f32 ? 2 * n : n, !f32 && stream ? n : 0);
    float* pw = sc.f.data();  // the block sum (see grad_block_rows)
    T* tile;
    if constexpr (f32) tile = pw + n; else tile = sc.t.data();
    for (int64_t c = cbegin; c < cend; ++c) {
      const int64_t i0 = c * m / nchunks, i1 = (c + 1) * m / nchunks;
      for (int64_t i = i0; i < i1; ++i) {
        if (a.dw && i > i0 && (i - i0) % block_rows == 0) flush_block(pw, dw_part.data() + c * n, n);
        const T *x = xp + i * n, *da = dap ? dap + i * n : nullptr;
        const G* dy = dyp + i * n;
        const float r = a.rstd[i];
        const float c1 = row_dot3(dy, ws, x, n) * r * r * inv_n;  // mean(dn * n_hat) / rstd
        const int64_t ip = i + kPrefetchRows;
        const T* nx = ip < i1 ? xp + ip * n : nullptr;
        const G* ndy = ip < i1 ? dyp + ip * n : nullptr;
        T* dx = stream ? tile : dxp + i * n;
        T* ndx = !stream && nx ? dxp + ip * n : nullptr;
        const bool guard = nan_w || std::isnan(r);  // as ln_bwd's
        auto run = [&](auto has_da, auto guarded) {
          rms_bwd_pick<T, decltype(has_da)::value, decltype(guarded)::value>(round_n, x, dy, da, ws, dx, pw, r, c1,
                                                                             n, nx, ndy, ndx);
        };
        with_flags(da != nullptr, guard, run);
        if (stream) stream_copy(dxp + i * n, tile, n * static_cast<int64_t>(sizeof(T)));
      }
      if (a.dw) flush_block(pw, dw_part.data() + c * n, n);
    }
    if (stream) fence();
  });
  if (a.dw) reduce_partials_to(dw_part.data(), nchunks, n, a.dw, split);
}

// Llama casting with an fp32 weight on 16-bit rows (eager promotes: fp32 weight * T normed): y and
// dy are float. Named instances, so the per-ISA dispatch macro takes one template argument.
template <typename T>
void rms_fwd_promoted(const RmsFwd& a) {
  rms_fwd<T, float>(a);
}

template <typename T>
void rms_bwd_promoted(const RmsBwd& a) {
  rms_bwd<T, float>(a);
}
