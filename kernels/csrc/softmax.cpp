// Fused softmax on CPU (FusionLens `cpu` provider): softmax(x * scale + mask) along the last
// dim, with an optional additive mask (any shape broadcastable to x, read through its strides,
// never materialised) or a causal mask over the last two dims (query i sees keys
// j <= i + (S_k - S_q)), forward and backward.
//
// Eager runs up to four passes (mul, add, masked_fill, softmax), each writing a full-size
// intermediate; this reads x (and the mask) once and writes the output once. One row per task
// (at::parallel_for, OpenMP), fp32 math in an L1/L2-resident row buffer, `omp simd` loops with
// an inline polynomial exp. The row loops live in softmax_impl.h, compiled once per instruction
// set (AVX-512, AVX2+FMA, the build's baseline) and picked at run time (common.h cpu_isa;
// FUSIONLENS_CPU_ISA lowers it), so their speed does not depend on -march=native. Semantics follow eager exactly where it matters: a row whose every
// element is -inf (fully masked) gives NaN, NaN/+Inf in a row make the row NaN; causal-masked
// positions get 0 (NaN if the row is NaN) and a zero gradient (as masked_fill's backward gives).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>




namespace fl_softmax {

// One ISA copy's row loops (softmax_impl.h).
struct RowOps {
  float (*logit_max)(const float* x, const float* mr, int64_t n, float sc);
  float (*exp_sum)(const float* x, float* s, const float* mr, int64_t n, float sc, float m);
  void (*mul_inplace)(float* s, int64_t n, float c);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*grad_row)(const float* g, const float* y, float* out, int64_t n, float sc, float d);
};

#define FL_ISA_IMPL "softmax_impl.h"
#include "per_isa.h"

// The row loops of the best copy this CPU runs (FUSIONLENS_CPU_ISA lowers it).
RowOps row_ops_for() { return FL_ISA_PICK(row_ops()); }

}  // namespace fl_softmax

namespace {

// fp32 <-> storage dtype, a span at a time (vectorized bf16 bit ops / F16C), from common.h.
template <typename T>
inline void load_f(const T* src, float* dst, int64_t n) { fusionlens::to_float<T>(src, dst, n); }
template <typename T>
inline void store_f(const float* src, T* dst, int64_t n) { fusionlens::from_float<T>(src, dst, n); }

// Where row r's mask values start: r is decomposed into x's leading indices, each times the
// (expanded, possibly zero) mask stride of that dim.
struct MaskIndex {
  std::vector<int64_t> sizes, strides;  // leading dims of x (all but the last)
  int64_t offset(int64_t r) const {
    int64_t off = 0;
    for (int64_t d = int64_t(sizes.size()) - 1; d >= 0; --d) {
      off += (r % sizes[d]) * strides[d];
      r /= sizes[d];
    }
    return off;
  }
};

// Number of keys query row r may see (causal), or n when not causal.
inline int64_t visible(int64_t r, int64_t n, int64_t sq, bool causal) {
  if (!causal) return n;
  int64_t i = r % sq;
  return std::clamp<int64_t>(i + (n - sq) + 1, 0, n);
}

template <typename T, typename M>
void fwd_impl(const at::Tensor& x, const c10::optional<at::Tensor>& mask, at::Tensor& out,
              float scale, bool causal) {
  const int64_t n = x.size(-1), rows = x.numel() / n;
  const int64_t sq = x.dim() >= 2 ? x.size(-2) : 1;
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const M* mp = mask.has_value() ? mask->data_ptr<M>() : nullptr;
  MaskIndex mi;
  if (mp != nullptr) {
    for (int64_t d = 0; d + 1 < x.dim(); ++d) {
      mi.sizes.push_back(x.size(d));
      mi.strides.push_back(mask->stride(d));
    }
  }
  const fl_softmax::RowOps ops = fl_softmax::row_ops_for();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t b, int64_t e) {
    const float sc = scale;
    std::vector<float> rowbuf(std::is_same_v<T, float> ? 0 : n);
    std::vector<float> mbuf(mp != nullptr && !std::is_same_v<M, float> ? n : 0);
    for (int64_t r = b; r < e; ++r) {
      const T* xr = xp + r * n;
      T* orow = op + r * n;
      float* s;  // the row in fp32: the output itself for float, else a buffer
      if constexpr (std::is_same_v<T, float>) s = orow; else s = rowbuf.data();
      const int64_t lim = visible(r, n, sq, causal);
      const float* xf;  // the row's logits as fp32: x itself for float (read once, in the first pass)
      if constexpr (std::is_same_v<T, float>) {
        xf = xr;
      } else {
        load_f(xr, s, lim);
        xf = s;
      }
      const float* mr = nullptr;
      if (mp != nullptr) {
        if constexpr (std::is_same_v<M, float>) {
          mr = mp + mi.offset(r);
        } else {
          load_f(mp + mi.offset(r), mbuf.data(), lim);
          mr = mbuf.data();
        }
      }
      const float m = ops.logit_max(xf, mr, lim, sc);
      const float sum = lim == 0 ? 0.0f : ops.exp_sum(xf, s, mr, lim, sc, m);  // lim 0: 0/0 = NaN, like eager
      const float inv = 1.0f / sum;
      if (lim == 0) {
        for (int64_t j = 0; j < n; ++j) s[j] = std::numeric_limits<float>::quiet_NaN();
      } else {
        ops.mul_inplace(s, lim, inv);
        // hidden keys: exp(-inf - max) / sum is 0, or NaN when the row's sum is NaN (a NaN or
        // +Inf logit), exactly as eager's masked_fill + softmax gives
        const float hidden = std::isnan(inv) ? inv : 0.0f;
        for (int64_t j = lim; j < n; ++j) s[j] = hidden;
      }
      if constexpr (!std::is_same_v<T, float>) store_f(s, orow, n);
    }
  });
}

// grad_x = scale * y * (g - sum(g * y)); zero where the causal mask hid the key.
template <typename T>
void bwd_impl(const at::Tensor& grad, const at::Tensor& y, at::Tensor& gx, float scale, bool causal) {
  const int64_t n = y.size(-1), rows = y.numel() / n;
  const int64_t sq = y.dim() >= 2 ? y.size(-2) : 1;
  const T* gp = grad.data_ptr<T>();
  const T* yp = y.data_ptr<T>();
  T* gxp = gx.data_ptr<T>();
  const fl_softmax::RowOps ops = fl_softmax::row_ops_for();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t b, int64_t e) {
    const float sc = scale;
    std::vector<float> gbuf(std::is_same_v<T, float> ? 0 : n), ybuf(std::is_same_v<T, float> ? 0 : n);
    for (int64_t r = b; r < e; ++r) {
      const int64_t lim = visible(r, n, sq, causal);
      const float* g;
      const float* yy;
      float* out;
      if constexpr (std::is_same_v<T, float>) {
        g = gp + r * n;
        yy = yp + r * n;
        out = gxp + r * n;
      } else {
        load_f(gp + r * n, gbuf.data(), lim);
        load_f(yp + r * n, ybuf.data(), lim);
        g = gbuf.data();
        yy = ybuf.data();
        out = gbuf.data();  // in place: g[j] is read before out[j] is written
      }
      ops.grad_row(g, yy, out, lim, sc, ops.dot(g, yy, lim));
      for (int64_t j = lim; j < n; ++j) out[j] = 0.0f;
      if constexpr (!std::is_same_v<T, float>) store_f(out, gxp + r * n, n);
    }
  });
}

#define FL_SOFTMAX_DTYPES(st, name, ...)                                  \
  AT_DISPATCH_SWITCH(st, name, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)  \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__)         \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))

void softmax_fwd(const at::Tensor& x, const c10::optional<at::Tensor>& mask, at::Tensor out,
                 double scale, bool causal) {
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous(), "softmax_fwd: x must be contiguous, at least 1-D");
  TORCH_CHECK(out.sizes() == x.sizes() && out.is_contiguous() && out.scalar_type() == x.scalar_type(),
              "softmax_fwd: out must be contiguous, like x");
  if (mask.has_value()) {
    TORCH_CHECK(mask->sizes() == x.sizes(), "softmax_fwd: pass the mask expanded to x's shape");
    TORCH_CHECK(mask->stride(-1) == 1, "softmax_fwd: the mask's last dim must be contiguous");
    TORCH_CHECK(mask->scalar_type() == at::kFloat || mask->scalar_type() == x.scalar_type(),
                "softmax_fwd: mask must be float32 or x's dtype");
  }
  if (x.numel() == 0) return;
  const float s = static_cast<float>(scale);
  FL_SOFTMAX_DTYPES(x.scalar_type(), "softmax_fwd", [&] {
    if (!mask.has_value() || mask->scalar_type() == at::kFloat) {
      fwd_impl<scalar_t, float>(x, mask, out, s, causal);
    } else {
      fwd_impl<scalar_t, scalar_t>(x, mask, out, s, causal);
    }
  });
}

void softmax_bwd(const at::Tensor& grad, const at::Tensor& y, at::Tensor grad_x, double scale, bool causal) {
  TORCH_CHECK(y.dim() >= 1 && y.is_contiguous() && grad.is_contiguous() && grad_x.is_contiguous(),
              "softmax_bwd: tensors must be contiguous");
  TORCH_CHECK(grad.sizes() == y.sizes() && grad_x.sizes() == y.sizes() &&
              grad.scalar_type() == y.scalar_type() && grad_x.scalar_type() == y.scalar_type(),
              "softmax_bwd: grad, y and grad_x must match");
  if (y.numel() == 0) return;
  FL_SOFTMAX_DTYPES(y.scalar_type(), "softmax_bwd", [&] {
    bwd_impl<scalar_t>(grad, y, grad_x, static_cast<float>(scale), causal);
  });
}

// Which ISA copy the softmax kernels run now ("avx512", "avx2" or "base").
std::string softmax_isa() { return fusionlens::cpu_isa_name(fusionlens::cpu_isa()); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusionlens, m) {
  m.def("softmax_isa() -> str", &softmax_isa);
  m.def("softmax_fwd(Tensor x, Tensor? mask, Tensor(a!) out, float scale, bool causal) -> ()");
  m.def("softmax_bwd(Tensor grad, Tensor y, Tensor(a!) grad_x, float scale, bool causal) -> ()");
}

TORCH_LIBRARY_IMPL(fusionlens, CPU, m) {
  m.impl("softmax_fwd", &softmax_fwd);
  m.impl("softmax_bwd", &softmax_bwd);
}
