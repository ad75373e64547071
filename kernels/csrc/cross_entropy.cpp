// Fused cross-entropy for FusionLens (CPU): log-softmax + NLL (+ label smoothing) per row.
//
// Ops (torch.ops.fusionlens.*), logits [N, V] with a unit stride along V (any row stride):
//   ce_forward(logits, target, ignore_index, label_smoothing, loss_rows!, lse!)
//       per-row loss (fp32 [N]; ignored rows get 0) and log-sum-exp as the pair (max, log sum
//       exp(x - max)) (fp32 [N, 2]): one fp32 lse rounds to ulp(lse), which at logits ~30-100
//       costs the gradient 30-60 ulps; the pair keeps softmax = exp(x - max) / sum as
//       accurate as eager's log_softmax (found by tests/kernels/fuzz.py).
//   ce_backward(logits, target, lse, grad_rows, ignore_index, label_smoothing, grad!)
//       grad[i, :] = grad_rows[i] * (softmax(x_i) - (1 - eps) onehot(t_i) - eps / V); an ignored
//       row gets 0, or NaN when its softmax is NaN (a NaN or +Inf logit, or all -Inf), as eager's.
//   ce_fused_(logits!, target, ignore_index, label_smoothing, grad_scale, loss_rows!)
//       forward and backward of one chunk at once: writes the loss per row and overwrites the
//       logits with grad_scale * dloss/dlogits (the chunked fused linear + cross-entropy).
//
// Per row: max and sum(x) in one pass, sum(exp(x - max)) in a second pass from cache, the
// gradient in a third. Traffic: forward reads N*V once; backward reads once and writes once
// (ATen's log_softmax + nll_loss writes and re-reads an [N, V] fp32 log-prob tensor, and its
// backward materialises two more). All arithmetic in fp32 (bf16/fp16 are converted per row).
// The row loops live in cross_entropy_impl.h, compiled once per instruction set (AVX-512,
// AVX2+FMA, the build's baseline) and picked at run time (common.h cpu_isa; FUSIONLENS_CPU_ISA
// lowers it); they need neither -march=native nor -ffast-math.
#include "common.h"

#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fl_ce {

struct RowStats {
  float max;      // the row's max (NaN lanes ignored)
  float log_sum;  // log(sum(exp(x - max))): lse = max + log_sum
  float loss;
};

// One ISA copy's row operations (cross_entropy_impl.h) on rows of T; `buf`/`buf2` hold V floats
// (unused for float rows).
template <typename T>
struct RowOps {
  RowStats (*forward)(const T* x, float* buf, int64_t V, int64_t t, float eps);
  void (*backward)(const T* x, T* grad, float* buf, float* buf2, int64_t V, int64_t t, float max, float log_sum,
                   float eps, float g);
  float (*fused)(T* x, float* buf, int64_t V, int64_t t, float eps, float grad_scale);
  bool (*softmax_nan)(const T* x, float* buf, int64_t V);  // a NaN or +Inf, or all -Inf: NaN softmax
};

#define FL_ISA_IMPL "cross_entropy_impl.h"
#include "per_isa.h"

// The row operations of the best copy this CPU runs (FUSIONLENS_CPU_ISA lowers it).
template <typename T>
RowOps<T> row_ops_for() { return FL_ISA_PICK(row_ops<T>()); }

}  // namespace fl_ce

namespace {

using fl_ce::RowStats;

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

void check_rows(const at::Tensor& x, int64_t N, const char* what, int64_t per_row = 1) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.numel() == N * per_row,
              "cross_entropy: ", what, " must be a contiguous float32 tensor of ", N * per_row, " elements");
}

// An ignored row's gradient: 0, or NaN where eager's softmax * 0 is NaN.
template <typename T>
void fill_ignored(T* dst, int64_t V, bool nan) {
  if (!nan) {
    std::memset(static_cast<void*>(dst), 0, V * sizeof(T));
    return;
  }
  const T q = static_cast<T>(std::numeric_limits<float>::quiet_NaN());
  for (int64_t j = 0; j < V; ++j) dst[j] = q;
}

// Rows per task: at least ~32K elements of work per task.
inline int64_t grain(int64_t V) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(V, 1)); }

void ce_forward(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                double label_smoothing, at::Tensor& loss_rows, at::Tensor& lse) {
  check_inputs(logits, target, ignore_index);
  const int64_t N = logits.size(0), V = logits.size(1);
  check_rows(loss_rows, N, "loss_rows");
  check_rows(lse, N, "lse", 2);
  if (N == 0) return;
  const float eps = static_cast<float>(label_smoothing);
  const int64_t ld = logits.stride(0);
  const int64_t* t = target.data_ptr<int64_t>();
  float* loss = loss_rows.data_ptr<float>();
  float* lse_p = lse.data_ptr<float>();
  dispatch_float_types(logits.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* x = logits.const_data_ptr<scalar_t>();
    const auto ops = fl_ce::row_ops_for<scalar_t>();
    at::parallel_for(0, N, grain(V), [&](int64_t begin, int64_t end) {
      std::vector<float> buf(std::is_same_v<scalar_t, float> ? 0 : V);
      for (int64_t i = begin; i < end; ++i) {
        const bool ignored = t[i] == ignore_index;
        const RowStats st = ops.forward(x + i * ld, buf.data(), V, ignored ? 0 : t[i], eps);
        lse_p[2 * i] = st.max;
        lse_p[2 * i + 1] = st.log_sum;
        loss[i] = ignored ? 0.0f : st.loss;
      }
    });
  });
}

void ce_backward(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                 const at::Tensor& grad_rows, int64_t ignore_index, double label_smoothing,
                 at::Tensor& grad) {
  check_inputs(logits, target, ignore_index);
  const int64_t N = logits.size(0), V = logits.size(1);
  check_rows(lse, N, "lse", 2);
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
    const auto ops = fl_ce::row_ops_for<scalar_t>();
    at::parallel_for(0, N, grain(V), [&](int64_t begin, int64_t end) {
      const bool f32 = std::is_same_v<scalar_t, float>;
      std::vector<float> in_buf(f32 ? 0 : V), out_buf(f32 ? 0 : V);
      for (int64_t i = begin; i < end; ++i) {
        scalar_t* dst = out + i * V;
        const float m = lse_p[2 * i], log_sum = lse_p[2 * i + 1];
        if (t[i] == ignore_index) {
          fill_ignored(dst, V, !(std::isfinite(m) && std::isfinite(log_sum)));
          continue;
        }
        ops.backward(x + i * ld, dst, in_buf.data(), out_buf.data(), V, t[i], m, log_sum, eps, g[i]);
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
    const auto ops = fl_ce::row_ops_for<scalar_t>();
    at::parallel_for(0, N, grain(V), [&](int64_t begin, int64_t end) {
      std::vector<float> buf(std::is_same_v<scalar_t, float> ? 0 : V);
      for (int64_t i = begin; i < end; ++i) {
        scalar_t* dst = x + i * V;
        if (t[i] == ignore_index) {  // one max/sum pass decides 0 or NaN (no exp)
          loss[i] = 0.0f;
          fill_ignored(dst, V, ops.softmax_nan(dst, buf.data(), V));
          continue;
        }
        loss[i] = ops.fused(dst, buf.data(), V, t[i], eps, scale);
      }
    });
  });
}

// Which ISA copy the cross-entropy kernels run now ("avx512", "avx2" or "base").
std::string cross_entropy_isa() { return fusionlens::cpu_isa_name(fusionlens::cpu_isa()); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusionlens, m) {
  m.def("cross_entropy_isa() -> str", &cross_entropy_isa);
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
