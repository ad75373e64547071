// Fused cross-entropy for FusionLens (CPU): log-softmax + NLL (+ label smoothing) per row.
//
// Ops (torch.ops.fusionlens.*), logits [N, V] with a unit stride along V (any row stride):
//   ce_forward(logits, target, ignore_index, label_smoothing, loss_rows!, lse!)
//       per-row loss and log-sum-exp (fp32 [N]); ignored rows get loss 0.
//   ce_backward(logits, target, lse, grad_rows, ignore_index, label_smoothing, grad!)
//       grad[i, :] = grad_rows[i] * (softmax(x_i) - (1 - eps) onehot(t_i) - eps / V); ignored -> 0.
//   ce_fused_(logits!, target, ignore_index, label_smoothing, grad_scale, loss_rows!)
//       forward and backward of one chunk at once: writes the loss per row and overwrites the
//       logits with grad_scale * dloss/dlogits (the chunked fused linear + cross-entropy).
//
// Per row: max and sum(x) in one pass, sum(exp(x - max)) in a second pass from cache, the
// gradient in a third. Traffic: forward reads N*V once; backward reads once and writes once
// (ATen's log_softmax + nll_loss writes and re-reads an [N, V] fp32 log-prob tensor, and its
// backward materialises two more). All arithmetic in fp32 (bf16/fp16 are converted per row).
#include "common.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

namespace {

using fusionlens::from_float;
using fusionlens::row_as_float;

// exp(x) for x <= 88 (callers pass x - max <= 0): Cephes-style range reduction plus a degree-6
// polynomial (about 1 ulp), written branch-free so the row loops vectorize. x < -87.3 -> 0
// (the true value is subnormal), NaN -> NaN.
inline float fast_expf(float x) {
  const float xc = x < -87.33654f ? -87.33654f : (x > 88.0f ? 88.0f : x);
  const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const float out = y * scale;
  return x < -87.33654f ? 0.0f : (x != x ? x : out);
}

// Calls f(T{}) with T the logits' element type (float, bf16 or fp16; checked before).
template <typename F>
void dispatch_float_types(at::ScalarType dt, const F& f) {
  switch (dt) {
    case at::kFloat: f(float{}); break;
    case at::kBFloat16: f(c10::BFloat16{}); break;
    case at::kHalf: f(c10::Half{}); break;
    default: TORCH_CHECK(false, "cross_entropy: unsupported dtype ", dt);
  }
}

struct RowStats {
  float lse;
  float loss;
};

// Loss and log-sum-exp of one float row. eps = label smoothing.
inline RowStats row_forward(const float* x, int64_t V, int64_t t, float eps) {
  float m = -std::numeric_limits<float>::infinity();
  float sum_x = 0.0f;
#pragma omp simd reduction(max : m) reduction(+ : sum_x)
  for (int64_t j = 0; j < V; ++j) {
    m = x[j] > m ? x[j] : m;
    sum_x += x[j];
  }
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < V; ++j) s += fast_expf(x[j] - m);
  // A NaN anywhere makes s NaN (exp(NaN) = NaN), so the loss is NaN, as in the reference.
  const float lse = m + std::log(s);
  float loss = lse - (1.0f - eps) * x[t];
  if (eps != 0.0f) loss -= eps * (sum_x / static_cast<float>(V));
  return {lse, loss};
}

// g * dloss/dx of one row into out (may alias x).
inline void row_grad(const float* x, float* out, int64_t V, int64_t t, float lse, float eps,
                     float g) {
  const float smooth = g * eps / static_cast<float>(V);
  const float xt = x[t];
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) out[j] = g * fast_expf(x[j] - lse) - smooth;
  out[t] = g * fast_expf(xt - lse) - smooth - g * (1.0f - eps);
}

void check_inputs(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index) {
  TORCH_CHECK(logits.dim() == 2, "cross_entropy: logits must be [N, V], got ", logits.sizes());
  TORCH_CHECK(logits.size(1) == 0 || logits.stride(1) == 1,
              "cross_entropy: logits need a unit stride along the vocab dim");
  TORCH_CHECK(target.dim() == 1 && target.size(0) == logits.size(0),
              "cross_entropy: target must be [N] matching logits ", logits.sizes());
  TORCH_CHECK(target.scalar_type() == at::kLong && target.is_contiguous(),
              "cross_entropy: target must be a contiguous int64 tensor");
  const auto dt = logits.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
              "cross_entropy: the cpu provider takes float32/bfloat16/float16 logits, got ", dt);
  const int64_t V = logits.size(1);
  const int64_t* t = target.data_ptr<int64_t>();
  for (int64_t i = 0; i < target.size(0); ++i) {
    TORCH_CHECK(t[i] == ignore_index || (t[i] >= 0 && t[i] < V), "cross_entropy: target ", t[i],
                " at row ", i, " is out of range [0, ", V, ")");
  }
}

void check_rows(const at::Tensor& x, int64_t N, const char* what) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.numel() == N,
              "cross_entropy: ", what, " must be a contiguous float32 tensor of ", N, " elements");
}

// Rows per task: at least ~32K elements of work per task.
inline int64_t grain(int64_t V) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(V, 1)); }

void ce_forward(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                double label_smoothing, at::Tensor& loss_rows, at::Tensor& lse) {
  check_inputs(logits, target, ignore_index);
  const int64_t N = logits.size(0), V = logits.size(1);
  check_rows(loss_rows, N, "loss_rows");
  check_rows(lse, N, "lse");
  if (N == 0) return;
  const float eps = static_cast<float>(label_smoothing);
  const int64_t ld = logits.stride(0);
  const int64_t* t = target.data_ptr<int64_t>();
  float* loss = loss_rows.data_ptr<float>();
  float* lse_p = lse.data_ptr<float>();
  dispatch_float_types(logits.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* x = logits.const_data_ptr<scalar_t>();
    at::parallel_for(0, N, grain(V), [&](int64_t begin, int64_t end) {
      std::vector<float> buf(std::is_same_v<scalar_t, float> ? 0 : V);
      for (int64_t i = begin; i < end; ++i) {
        {
          const float* row = row_as_float(x + i * ld, buf.data(), V);
          const bool ignored = t[i] == ignore_index;
          const RowStats st = row_forward(row, V, ignored ? 0 : t[i], eps);
          lse_p[i] = st.lse;
          loss[i] = ignored ? 0.0f : st.loss;
        }
      }
    });
  });
}

void ce_backward(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                 const at::Tensor& grad_rows, int64_t ignore_index, double label_smoothing,
                 at::Tensor& grad) {
  check_inputs(logits, target, ignore_index);
  const int64_t N = logits.size(0), V = logits.size(1);
  check_rows(lse, N, "lse");
  check_rows(grad_rows, N, "grad_rows");
  TORCH_CHECK(grad.is_contiguous() && grad.sizes() == logits.sizes() &&
                  grad.scalar_type() == logits.scalar_type(),
              "cross_entropy: grad must be contiguous with the logits' shape and dtype");
  if (N == 0 || V == 0) return;
  const float eps = static_cast<float>(label_smoothing);
  const int64_t ld = logits.stride(0);
  const int64_t* t = target.data_ptr<int64_t>();
  const float* lse_p = lse.const_data_ptr<float>();
  const float* g = grad_rows.const_data_ptr<float>();
  dispatch_float_types(logits.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* x = logits.const_data_ptr<scalar_t>();
    scalar_t* out = grad.data_ptr<scalar_t>();
    at::parallel_for(0, N, grain(V), [&](int64_t begin, int64_t end) {
      const bool f32 = std::is_same_v<scalar_t, float>;
      std::vector<float> in_buf(f32 ? 0 : V), out_buf(f32 ? 0 : V);
      for (int64_t i = begin; i < end; ++i) {
        {
          scalar_t* dst = out + i * V;
          if (t[i] == ignore_index) {
            std::memset(static_cast<void*>(dst), 0, V * sizeof(scalar_t));
            continue;
          }
          const float* row = row_as_float(x + i * ld, in_buf.data(), V);
          float* o = fusionlens::out_row(dst, out_buf.data());
          row_grad(row, o, V, t[i], lse_p[i], eps, g[i]);
          fusionlens::commit_row(o, dst, V);
        }
      }
    });
  });
}

void ce_fused_(at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
               double label_smoothing, double grad_scale, at::Tensor& loss_rows) {
  check_inputs(logits, target, ignore_index);
  TORCH_CHECK(logits.is_contiguous(), "cross_entropy: ce_fused_ needs contiguous logits");
  const int64_t N = logits.size(0), V = logits.size(1);
  check_rows(loss_rows, N, "loss_rows");
  if (N == 0) return;
  const float eps = static_cast<float>(label_smoothing);
  const float scale = static_cast<float>(grad_scale);
  const int64_t* t = target.data_ptr<int64_t>();
  float* loss = loss_rows.data_ptr<float>();
  dispatch_float_types(logits.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    scalar_t* x = logits.data_ptr<scalar_t>();
    at::parallel_for(0, N, grain(V), [&](int64_t begin, int64_t end) {
      std::vector<float> buf(std::is_same_v<scalar_t, float> ? 0 : V);
      for (int64_t i = begin; i < end; ++i) {
        {
          scalar_t* dst = x + i * V;
          if (t[i] == ignore_index) {
            loss[i] = 0.0f;
            std::memset(static_cast<void*>(dst), 0, V * sizeof(scalar_t));
            continue;
          }
          const float* row = row_as_float(dst, buf.data(), V);
          const RowStats st = row_forward(row, V, t[i], eps);
          loss[i] = st.loss;
          float* o = fusionlens::out_row(dst, buf.data());  // in place: row read before written
          row_grad(row, o, V, t[i], st.lse, eps, scale);
          fusionlens::commit_row(o, dst, V);
        }
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusionlens, m) {
  m.def("ce_forward(Tensor logits, Tensor target, int ignore_index, float label_smoothing, "
        "Tensor(a!) loss_rows, Tensor(b!) lse) -> ()");
  m.def("ce_backward(Tensor logits, Tensor target, Tensor lse, Tensor grad_rows, int ignore_index, "
        "float label_smoothing, Tensor(a!) grad) -> ()");
  m.def("ce_fused_(Tensor(a!) logits, Tensor target, int ignore_index, float label_smoothing, "
        "float grad_scale, Tensor(b!) loss_rows) -> ()");
  m.impl("ce_forward", c10::DispatchKey::CPU, TORCH_FN(ce_forward));
  m.impl("ce_backward", c10::DispatchKey::CPU, TORCH_FN(ce_backward));
  m.impl("ce_fused_", c10::DispatchKey::CPU, TORCH_FN(ce_fused_));
}
