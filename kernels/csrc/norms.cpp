// Fused LayerNorm / RMSNorm (optionally with a residual add in front) for CPU, forward and backward.
//
// One pass of row work per call: each row (the last dim, N) is read into cache once, reduced
// (two-pass mean/variance or sum of squares, fp32 accumulation for every dtype), and written
// once. Rows are split across threads with at::parallel_for (OpenMP); the inner loops are plain
// float loops that GCC vectorizes (-O3 -march=native). Weight/bias gradients are summed per
// thread chunk into fp32 partial rows, then the partials are reduced over chunks, in parallel
// over columns.
//
// Python allocates every output (kernels/norms.py) and passes it in, so tests can poison them.
// Shapes: x, residual, y, sum_out, dy, dx, dadd: [M, N] contiguous; weight, bias, dw, db: [N]
// float32; mean, rstd: [M] float32. An undefined/empty optional tensor means "absent".
#include "common.h"

#include <cmath>

namespace fusionlens {
namespace {

struct Rows {
  int64_t m, n;
};

Rows check_rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "fusionlens norms: x must be a contiguous 2D tensor");
  return {x.size(0), x.size(1)};
}

bool present(const c10::optional<at::Tensor>& t) { return t.has_value() && t->defined() && t->numel() > 0; }

const float* f32_or_null(const c10::optional<at::Tensor>& t, int64_t n) {
  if (!present(t)) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == n,
              "fusionlens norms: weight/bias must be contiguous float32 [N]");
  return t->data_ptr<float>();
}

// Loads row i of x (+ residual, rounded through T like eager `x + residual`) as float; writes
// the sum row when a residual is given. Returns the float row.
template <typename T>
const float* load_input_row(const T* x, const T* res, T* sum_out, int64_t i, int64_t n, float* buf,
                            float* buf2) {
  const float* xr = row_as_float<T>(x + i * n, buf, n);
  if (!res) return xr;
  const float* rr = row_as_float<T>(res + i * n, buf2, n);
  // float: the sum row is computed in place in sum_out; else in buf (xr may be buf: same index).
  float* s = out_row<T>(sum_out + i * n, buf);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) s[j] = xr[j] + rr[j];
  round_through<T>(s, sum_out + i * n, n);  // the rounded sum is the output and what eager's norm reads
  return s;
}

template <typename T>
void layer_norm_fwd_impl(const at::Tensor& x, const c10::optional<at::Tensor>& residual, const float* w,
                         const float* b, double eps, at::Tensor& y, at::Tensor& sum_out, at::Tensor& mean,
                         at::Tensor& rstd) {
  const auto [m, n] = check_rows(x);
  const T* xp = x.data_ptr<T>();
  const T* rp = present(residual) ? residual->data_ptr<T>() : nullptr;
  T* sp = rp ? sum_out.data_ptr<T>() : nullptr;
  T* yp = y.data_ptr<T>();
  float* mp = mean.data_ptr<float>();
  float* rsp = rstd.data_ptr<float>();
  const float inv_n = 1.0f / static_cast<float>(n);
  const bool stream = stream_output(m * n, sizeof(T));
  const std::vector<float> ones(w ? 0 : n, 1.f), zeros(b ? 0 : n, 0.f);
  const float* wv = w ? w : ones.data();
  const float* bv = b ? b : zeros.data();
  at::parallel_for(0, m, row_grain(n), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(2 * n + kTile);
    std::vector<T> tbuf(std::is_same_v<T, float> && !stream ? 0 : kTile);
    for (int64_t i = begin; i < end; ++i) {
      const float* xr = load_input_row<T>(xp, rp, sp, i, n, buf.data(), buf.data() + n);
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < n; ++j) s += xr[j];
      const float mu = s * inv_n;
      float v = 0.f;
#pragma omp simd reduction(+ : v)
      for (int64_t j = 0; j < n; ++j) v += (xr[j] - mu) * (xr[j] - mu);
      const float r = 1.0f / std::sqrt(v * inv_n + static_cast<float>(eps));
      mp[i] = mu;
      rsp[i] = r;
      // Output in column tiles: the tile, its x/w/b slices and (streamed) output stay in L1.
      for (int64_t j0 = 0; j0 < n; j0 += kTile) {
        const int64_t len = std::min(kTile, n - j0);
        const float *xt = xr + j0, *wt = wv + j0, *bt = bv + j0;
        float* yt = out_row<T>(yp + i * n + j0, buf.data() + 2 * n, stream);
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) yt[j] = (xt[j] - mu) * r * wt[j] + bt[j];
        commit_row<T>(yt, yp + i * n + j0, len, stream, tbuf.data());
      }
    }
    if (stream) stream_fence();
  });
}

template <typename T>
void layer_norm_bwd_impl(const at::Tensor& dy, const at::Tensor& x, const float* w, const at::Tensor& mean,
                         const at::Tensor& rstd, const c10::optional<at::Tensor>& dadd, at::Tensor& dx,
                         float* dw, float* db) {
  const auto [m, n] = check_rows(x);
  const T* xp = x.data_ptr<T>();
  const T* dyp = dy.data_ptr<T>();
  const T* dap = present(dadd) ? dadd->data_ptr<T>() : nullptr;
  T* dxp = dx.data_ptr<T>();
  const float* mp = mean.data_ptr<float>();
  const float* rsp = rstd.data_ptr<float>();
  const float inv_n = 1.0f / static_cast<float>(n);
  const int64_t nchunks = chunks_for(m, n);
  std::vector<float> dw_part(dw ? nchunks * n : 0, 0.f), db_part(db ? nchunks * n : 0, 0.f);
  const std::vector<float> ones(w ? 0 : n, 1.f), zeros(dap ? 0 : n, 0.f);
  const float* wv = w ? w : ones.data();
  const bool stream = stream_output(m * n, sizeof(T));
  at::parallel_for(0, nchunks, 1, [&](int64_t cbegin, int64_t cend) {
    // Per thread: float rows (16-bit inputs) and scratch partials for grads nobody asked for.
    std::vector<T> tbuf(std::is_same_v<T, float> && !stream ? 0 : n);
    std::vector<float> buf(7 * n, 0.f);
    float *xb = buf.data(), *dyb = xb + n, *ob = dyb + n, *ab = ob + n, *sw = ab + n, *sb = sw + n;
    float* gb = sb + n;
    for (int64_t c = cbegin; c < cend; ++c) {
      float* pw = dw ? dw_part.data() + c * n : sw;
      float* pb = db ? db_part.data() + c * n : sb;
      for (int64_t i = c * m / nchunks; i < (c + 1) * m / nchunks; ++i) {
        const float* xr = row_as_float<T>(xp + i * n, xb, n);
        const float* dyr = row_as_float<T>(dyp + i * n, dyb, n);
        const float* ar = dap ? row_as_float<T>(dap + i * n, ab, n) : zeros.data();
        const float mu = mp[i], r = rsp[i];
        // g = dy * w is stored (rounded once) and reused, so that sum(g)/N - g is exactly 0
        // where it should be (e.g. N = 1) even when the compiler contracts into FMAs.
        float s_gx = 0.f, s_g = 0.f;  // sum(g * xhat), sum(g)
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) gb[j] = dyr[j] * wv[j];
#pragma omp simd reduction(+ : s_gx, s_g)
        for (int64_t j = 0; j < n; ++j) {
          s_gx += gb[j] * (xr[j] - mu) * r;
          s_g += gb[j];
        }
        const float c1 = s_gx * inv_n, c2 = s_g * inv_n;
        float* dxr = out_row<T>(dxp + i * n, ob, stream);
        // one pass: dx, and this chunk's weight/bias gradient partials
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          const float xhat = (xr[j] - mu) * r;
          dxr[j] = r * (gb[j] - c2 - xhat * c1) + ar[j];
          pw[j] += dyr[j] * xhat;
          pb[j] += dyr[j];
        }
        commit_row<T>(dxr, dxp + i * n, n, stream, tbuf.data());
      }
    }
    if (stream) stream_fence();
  });
  if (dw) reduce_partials(dw_part.data(), nchunks, n, dw);
  if (db) reduce_partials(db_part.data(), nchunks, n, db);
}

// RMSNorm. llama_cast: y = round(round(x * rstd) * w) (HF LlamaRMSNorm: normalize in fp32, cast to
// the input dtype, then multiply by the weight); otherwise y = round(x * rstd * w) (Gemma: all
// fp32, one cast). w already holds (offset + weight) as float.
template <typename T>
void rms_norm_fwd_impl(const at::Tensor& x, const c10::optional<at::Tensor>& residual, const float* w, double eps,
                       bool llama_cast, at::Tensor& y, at::Tensor& sum_out, at::Tensor& rstd) {
  const auto [m, n] = check_rows(x);
  const T* xp = x.data_ptr<T>();
  const T* rp = present(residual) ? residual->data_ptr<T>() : nullptr;
  T* sp = rp ? sum_out.data_ptr<T>() : nullptr;
  T* yp = y.data_ptr<T>();
  float* rsp = rstd.data_ptr<float>();
  const float inv_n = 1.0f / static_cast<float>(n);
  const bool stream = stream_output(m * n, sizeof(T));
  const bool round_n = llama_cast && !std::is_same_v<T, float>;
  const std::vector<float> ones(w ? 0 : n, 1.f);
  const float* wv = w ? w : ones.data();
  at::parallel_for(0, m, row_grain(n), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(2 * n + kTile);
    std::vector<T> tbuf(std::is_same_v<T, float> ? 0 : kTile);
    for (int64_t i = begin; i < end; ++i) {
      const float* xr = load_input_row<T>(xp, rp, sp, i, n, buf.data(), buf.data() + n);
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int64_t j = 0; j < n; ++j) ss += xr[j] * xr[j];
      const float r = 1.0f / std::sqrt(ss * inv_n + static_cast<float>(eps));
      rsp[i] = r;
      for (int64_t j0 = 0; j0 < n; j0 += kTile) {
        const int64_t len = std::min(kTile, n - j0);
        const float *xt = xr + j0, *wt = wv + j0;
        float* yt = out_row<T>(yp + i * n + j0, buf.data() + 2 * n, stream);
        if (round_n) {  // HF llama: round the normalized value to T before the weight
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) yt[j] = xt[j] * r;
          round_through<T>(yt, tbuf.data(), len);
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) yt[j] *= wt[j];
        } else {
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) yt[j] = xt[j] * r * wt[j];
        }
        commit_row<T>(yt, yp + i * n + j0, len, stream, tbuf.data());
      }
    }
    if (stream) stream_fence();
  });
}

template <typename T>
void rms_norm_bwd_impl(const at::Tensor& dy, const at::Tensor& x, const float* w, const at::Tensor& rstd,
                       const c10::optional<at::Tensor>& dadd, bool llama_cast, at::Tensor& dx, float* dw) {
  const auto [m, n] = check_rows(x);
  const T* xp = x.data_ptr<T>();
  const T* dyp = dy.data_ptr<T>();
  const T* dap = present(dadd) ? dadd->data_ptr<T>() : nullptr;
  T* dxp = dx.data_ptr<T>();
  const float* rsp = rstd.data_ptr<float>();
  const float inv_n = 1.0f / static_cast<float>(n);
  const int64_t nchunks = chunks_for(m, n);
  std::vector<float> dw_part(dw ? nchunks * n : 0, 0.f);
  const bool round_n = llama_cast && !std::is_same_v<T, float>;
  const std::vector<float> ones(w ? 0 : n, 1.f), zeros(dap ? 0 : n, 0.f);
  const float* wv = w ? w : ones.data();
  const bool stream = stream_output(m * n, sizeof(T));
  at::parallel_for(0, nchunks, 1, [&](int64_t cbegin, int64_t cend) {
    std::vector<T> tbuf(std::is_same_v<T, float> && !stream ? 0 : n);
    std::vector<float> buf(6 * n, 0.f);
    std::vector<T> scratch(round_n ? n : 0);
    float *xb = buf.data(), *dyb = xb + n, *nb = dyb + n, *ob = nb + n, *ab = ob + n, *sw = ab + n;
    for (int64_t c = cbegin; c < cend; ++c) {
      float* pw = dw ? dw_part.data() + c * n : sw;
      for (int64_t i = c * m / nchunks; i < (c + 1) * m / nchunks; ++i) {
        const float* xr = row_as_float<T>(xp + i * n, xb, n);
        const float* dyr = row_as_float<T>(dyp + i * n, dyb, n);
        const float* ar = dap ? row_as_float<T>(dap + i * n, ab, n) : zeros.data();
        const float r = rsp[i];
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < n; ++j) s += dyr[j] * wv[j] * xr[j];
        const float c1 = s * r * r * inv_n;  // mean(dn * n_hat) / rstd, with n_hat = x * rstd
        float* dxr = out_row<T>(dxp + i * n, ob, stream);
        if (!round_n) {  // one pass: dx and the weight-gradient partial (n_hat = x * rstd)
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) {
            dxr[j] = r * (dyr[j] * wv[j] - xr[j] * c1) + ar[j];
            pw[j] += dyr[j] * xr[j] * r;
          }
        } else {  // HF llama: the weight saw n_hat rounded to the input dtype
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) {
            dxr[j] = r * (dyr[j] * wv[j] - xr[j] * c1) + ar[j];
            nb[j] = xr[j] * r;
          }
          round_through<T>(nb, scratch.data(), n);
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) pw[j] += dyr[j] * nb[j];
        }
        commit_row<T>(dxr, dxp + i * n, n, stream, tbuf.data());
      }
    }
    if (stream) stream_fence();
  });
  if (dw) reduce_partials(dw_part.data(), nchunks, n, dw);
}

template <typename F>
void dispatch_dtype(at::ScalarType t, const char* name, F&& f) {
  switch (t) {
    case at::kFloat: f(float{}); break;
    case at::kBFloat16: f(c10::BFloat16{}); break;
    case at::kHalf: f(c10::Half{}); break;
    default: TORCH_CHECK(false, name, ": unsupported dtype ", t, " (float32, bfloat16, float16 only)");
  }
}

float* grad_buffer(at::Tensor& t, int64_t n) {
  if (t.numel() == 0) return nullptr;
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.numel() == n && t.is_contiguous(),
              "fusionlens norms: weight/bias grads must be contiguous float32 [N]");
  return t.data_ptr<float>();
}

void layer_norm_fwd(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                    const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias, double eps,
                    at::Tensor y, at::Tensor sum_out, at::Tensor mean, at::Tensor rstd) {
  const int64_t n = x.size(-1);
  const float* w = f32_or_null(weight, n);
  const float* b = f32_or_null(bias, n);
  dispatch_dtype(x.scalar_type(), "layer_norm_fwd", [&](auto tag) {
    using T = decltype(tag);
    layer_norm_fwd_impl<T>(x, residual, w, b, eps, y, sum_out, mean, rstd);
  });
}

void layer_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                    const at::Tensor& mean, const at::Tensor& rstd, const c10::optional<at::Tensor>& dadd,
                    at::Tensor dx, at::Tensor dw, at::Tensor db) {
  const int64_t n = x.size(-1);
  TORCH_CHECK(dy.is_contiguous() && dy.sizes() == x.sizes(), "layer_norm_bwd: dy must match x");
  const float* w = f32_or_null(weight, n);
  float* dwp = grad_buffer(dw, n);
  float* dbp = grad_buffer(db, n);
  dispatch_dtype(x.scalar_type(), "layer_norm_bwd", [&](auto tag) {
    using T = decltype(tag);
    layer_norm_bwd_impl<T>(dy, x, w, mean, rstd, dadd, dx, dwp, dbp);
  });
}

void rms_norm_fwd(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                  const c10::optional<at::Tensor>& weight, double eps, bool llama_cast, at::Tensor y,
                  at::Tensor sum_out, at::Tensor rstd) {
  const float* w = f32_or_null(weight, x.size(-1));
  dispatch_dtype(x.scalar_type(), "rms_norm_fwd", [&](auto tag) {
    using T = decltype(tag);
    rms_norm_fwd_impl<T>(x, residual, w, eps, llama_cast, y, sum_out, rstd);
  });
}

void rms_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                  const at::Tensor& rstd, const c10::optional<at::Tensor>& dadd, bool llama_cast, at::Tensor dx,
                  at::Tensor dw) {
  const int64_t n = x.size(-1);
  TORCH_CHECK(dy.is_contiguous() && dy.sizes() == x.sizes(), "rms_norm_bwd: dy must match x");
  const float* w = f32_or_null(weight, n);
  float* dwp = grad_buffer(dw, n);
  dispatch_dtype(x.scalar_type(), "rms_norm_bwd", [&](auto tag) {
    using T = decltype(tag);
    rms_norm_bwd_impl<T>(dy, x, w, rstd, dadd, llama_cast, dx, dwp);
  });
}

}  // namespace
}  // namespace fusionlens

TORCH_LIBRARY_FRAGMENT(fusionlens, m) {
  m.def("layer_norm_fwd(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, float eps, "
        "Tensor(a!) y, Tensor(b!) sum_out, Tensor(c!) mean, Tensor(d!) rstd) -> ()");
  m.def("layer_norm_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, Tensor? dadd, "
        "Tensor(a!) dx, Tensor(b!) dw, Tensor(c!) db) -> ()");
  m.def("rms_norm_fwd(Tensor x, Tensor? residual, Tensor? weight, float eps, bool llama_cast, "
        "Tensor(a!) y, Tensor(b!) sum_out, Tensor(c!) rstd) -> ()");
  m.def("rms_norm_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor rstd, Tensor? dadd, bool llama_cast, "
        "Tensor(a!) dx, Tensor(b!) dw) -> ()");
}

TORCH_LIBRARY_IMPL(fusionlens, CPU, m) {
  m.impl("layer_norm_fwd", &fusionlens::layer_norm_fwd);
  m.impl("layer_norm_bwd", &fusionlens::layer_norm_bwd);
  m.impl("rms_norm_fwd", &fusionlens::rms_norm_fwd);
  m.impl("rms_norm_bwd", &fusionlens::rms_norm_bwd);
}
