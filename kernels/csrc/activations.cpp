// Fused activations on CPU (FusionLens `cpu` provider): GELU (erf / tanh), bias + GELU, and the
// gated units SwiGLU = silu(a) * b and GeGLU = gelu(a) * b, forward and backward.
//
// One pass over memory per call: the eager chain writes and re-reads every intermediate
// (x + bias, gelu(x), silu(a)), these kernels read the inputs once and write the outputs once.
// Rows run in parallel (at::parallel_for, OpenMP); inner loops compute in fp32 and read and write
// the storage type inside the same loop (bf16 widened on load, rounded to nearest even on store;
// fp16 through F16C-converted L1 blocks where the CPU has F16C). The span loops live in
// activations_impl.h, compiled below once per instruction set (AVX-512, AVX2+FMA, the build's
// baseline) and picked at run time (common.h cpu_isa, FUSIONLENS_CPU_ISA lowers it), so their
// speed does not depend on -march=native. GELU (erf) uses an inline rational erf, GELU (tanh)
// x * sigmoid(2u) and SiLU x * sigmoid(x), both with common.h's inline exp.
// Outputs are allocated by the caller (Python, `kernels.registry.new_output`) and passed in.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>


namespace fl_act {

enum Kind : int64_t { kSilu = 0, kGeluErf = 1, kGeluTanh = 2 };
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
constexpr float kBeta = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

// bf16 spans run by 32-bit words (activations_impl.h): they read a row's bias, and add to its
// bias-gradient row, with the even columns at [0, n/2) and the odd ones at [n/2, 2 (n/2)) (an odd
// n's last column stays last), so that each word's two operands are two contiguous loads.
template <typename T>
inline constexpr bool kWordOrder = std::is_same_v<T, c10::BFloat16>;

inline void split_words(const float* in, float* out, int64_t n) {
  const int64_t h = n / 2;
  for (int64_t k = 0; k < h; ++k) out[k] = in[2 * k], out[h + k] = in[2 * k + 1];
  if (n % 2) out[n - 1] = in[n - 1];
}

inline void unsplit_words(const float* in, float* out, int64_t n) {
  const int64_t h = n / 2;
  for (int64_t k = 0; k < h; ++k) out[2 * k] = in[k], out[2 * k + 1] = in[h + k];
  if (n % 2) out[n - 1] = in[n - 1];
}

// One ISA copy's span loops (activations_impl.h) for one activation kind and storage type T;
// the bias (b in act / act_grad) and the bias-gradient row (acc) are fp32, full rows, and for bf16
// in word order (split_words).
template <typename T>
struct Spans {
  void (*act)(const T* x, const float* b, T* y, int64_t n);
  void (*act_grad)(const T* g, const T* x, const float* b, T* gx, float* acc, int64_t n);
  void (*glu)(const T* a, const T* b, T* y, int64_t n);
  void (*glu_grad)(const T* g, const T* a, const T* b, T* ga, T* gb, int64_t n);
};

#define FL_ISA_IMPL "activations_impl.h"
#include "per_isa.h"

// The span loops of the best copy this CPU runs (FUSIONLENS_CPU_ISA lowers it).
template <int64_t K, typename T>
Spans<T> spans_for() {
  using KC = std::integral_constant<int64_t, K>;
  return FL_ISA_PICK(spans<T>(KC{}));
}

}  // namespace fl_act

namespace {

using fl_act::kGeluErf;
using fl_act::kGeluTanh;
using fl_act::kSilu;

constexpr int64_t kGrain = 16384;  // elements per parallel task, at least

// The fp32 copy of a bias (read once per call, not per row), in the spans' order (split_words).
template <typename T>
std::vector<float> bias_f32(const at::Tensor& bias) {
  const int64_t n = bias.numel();
  std::vector<float> bf(n);
  fusionlens::to_float<T>(bias.data_ptr<T>(), bf.data(), n);
  if constexpr (fl_act::kWordOrder<T>) {
    std::vector<float> split(n);
    fl_act::split_words(bf.data(), split.data(), n);
    return split;
  }
  return bf;
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), what, ": dtype mismatch");
  TORCH_CHECK(a.sizes() == b.sizes(), what, ": shape mismatch");
  TORCH_CHECK(b.is_contiguous(), what, ": expected a contiguous tensor");
}

// ---- act(x [+ bias]) ---------------------------------------------------------------------------
template <typename T, int64_t K>
void act_fwd_impl(const at::Tensor& x, const c10::optional<at::Tensor>& bias, at::Tensor& out) {
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t numel = x.numel();
  const fl_act::Spans<T> sp = fl_act::spans_for<K, T>();
  if (!bias.has_value()) {
    at::parallel_for(0, numel, kGrain, [&](int64_t b, int64_t e) { sp.act(xp + b, nullptr, op + b, e - b); });
    return;
  }
  const int64_t n = x.size(-1), rows = numel / n;
  const std::vector<float> bf = bias_f32<T>(*bias);
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) sp.act(xp + r * n, bf.data(), op + r * n, n);
  });
}

// grad_x = grad * act'(x [+ bias]); grad_bias = sum over rows of grad_x (partial sums per
// thread, then reduced), so the bias gradient costs no extra pass over memory. Rows are summed in
// blocks of grad_block_rows(n) first (common.h flush_block).

template <typename T, int64_t K>
void act_bwd_impl(const at::Tensor& grad, const at::Tensor& x, const c10::optional<at::Tensor>& bias,
                  at::Tensor& grad_x, const c10::optional<at::Tensor>& grad_bias) {
  const T* gp = grad.data_ptr<T>();
  const T* xp = x.data_ptr<T>();
  T* gxp = grad_x.data_ptr<T>();
  const int64_t numel = x.numel();
  const fl_act::Spans<T> sp = fl_act::spans_for<K, T>();
  if (!bias.has_value()) {
    at::parallel_for(0, numel, kGrain, [&](int64_t b, int64_t e) {
      sp.act_grad(gp + b, xp + b, nullptr, gxp + b, nullptr, e - b);
    });
    return;
  }
  const int64_t n = x.size(-1), rows = numel / n;
  const std::vector<float> bf = bias_f32<T>(*bias);
  const int64_t nthreads = at::get_num_threads();
  const int64_t block_rows = fusionlens::grad_block_rows(n);
  std::vector<double> partial(grad_bias.has_value() ? nthreads * n : 0, 0.0);
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / n), [&](int64_t b, int64_t e) {
    double* acc = partial.empty() ? nullptr : partial.data() + at::get_thread_num() * n;
    std::vector<float> block(acc != nullptr ? n : 0, 0.0f);  // this block's sums
    float* bsum = acc != nullptr ? block.data() : nullptr;
    for (int64_t r = b; r < e; ++r) {
      sp.act_grad(gp + r * n, xp + r * n, bf.data(), gxp + r * n, bsum, n);
      if (bsum != nullptr && ((r - b + 1) % block_rows == 0 || r + 1 == e)) {
        fusionlens::flush_block(bsum, acc, n);
      }
    }
  });
  if (grad_bias.has_value()) {
    std::vector<float> total(n);
    fusionlens::reduce_partials(partial.data(), nthreads, n, total.data());
    if constexpr (fl_act::kWordOrder<T>) {
      std::vector<float> ordered(n);
      fl_act::unsplit_words(total.data(), ordered.data(), n);
      total.swap(ordered);
    }
    fusionlens::from_float<T>(total.data(), grad_bias->data_ptr<T>(), n);
  }
}

// ---- act(a) * b ------------------------------------------------------------------------------
// a and b are contiguous, or [rows, n] with a unit last stride and a row stride of their own (the
// gate and up halves of a fused projection, `h.chunk(2, -1)`), read in place: no copies.
// Outputs and grad are contiguous. `glu_rows`: rows, row length, a's and b's row strides.
struct GluRows {
  int64_t rows, n, sa, sb;
};

GluRows glu_rows(const at::Tensor& a, const at::Tensor& b) {
  const int64_t n = a.dim() ? a.size(-1) : 1;
  if (a.is_contiguous() && b.is_contiguous()) return {n ? a.numel() / n : 0, n, n, n};
  return {a.size(0), n, a.stride(0), b.stride(0)};  // 2-D (check_rows)
}

template <typename T, int64_t K>
void glu_fwd_impl(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  const T* ap = a.data_ptr<T>();
  const T* bp = b.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const fl_act::Spans<T> sp = fl_act::spans_for<K, T>();
  const GluRows g = glu_rows(a, b);
  if (g.sa == g.n && g.sb == g.n) {  // one flat run
    at::parallel_for(0, a.numel(), kGrain, [&](int64_t s0, int64_t e0) { sp.glu(ap + s0, bp + s0, op + s0, e0 - s0); });
    return;
  }
  at::parallel_for(0, g.rows, std::max<int64_t>(1, kGrain / g.n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) sp.glu(ap + r * g.sa, bp + r * g.sb, op + r * g.n, g.n);
  });
}

// grad_a = grad * b * act'(a), grad_b = grad * act(a).
// grad_a and grad_b may be row-strided too: the two halves of one [rows, 2n] gradient of a packed
// gate/up input, written in place of a separate pair and their concatenation.
template <typename T, int64_t K>
void glu_bwd_impl(const at::Tensor& grad, const at::Tensor& a, const at::Tensor& b,
                  at::Tensor& grad_a, at::Tensor& grad_b) {
  const T* gp = grad.data_ptr<T>();
  const T* ap = a.data_ptr<T>();
  const T* bp = b.data_ptr<T>();
  T* gap = grad_a.data_ptr<T>();
  T* gbp = grad_b.data_ptr<T>();
  const fl_act::Spans<T> sp = fl_act::spans_for<K, T>();
  const GluRows g = glu_rows(a, b);
  const int64_t sga = grad_a.is_contiguous() ? g.n : grad_a.stride(0);
  const int64_t sgb = grad_b.is_contiguous() ? g.n : grad_b.stride(0);
  if (g.sa == g.n && g.sb == g.n && sga == g.n && sgb == g.n) {
    at::parallel_for(0, a.numel(), kGrain, [&](int64_t s0, int64_t e0) {
      sp.glu_grad(gp + s0, ap + s0, bp + s0, gap + s0, gbp + s0, e0 - s0);
    });
    return;
  }
  at::parallel_for(0, g.rows, std::max<int64_t>(1, kGrain / g.n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      sp.glu_grad(gp + r * g.n, ap + r * g.sa, bp + r * g.sb, gap + r * sga, gbp + r * sgb, g.n);
    }
  });
}

#define FL_DISPATCH_KIND(kind, ...)                                          \
  switch (kind) {                                                            \
    case kSilu: { constexpr int64_t K = kSilu; __VA_ARGS__(); break; }       \
    case kGeluErf: { constexpr int64_t K = kGeluErf; __VA_ARGS__(); break; } \
    case kGeluTanh: { constexpr int64_t K = kGeluTanh; __VA_ARGS__(); break; } \
    default: TORCH_CHECK(false, "unknown activation kind ", kind);          \
  }

#define FL_DISPATCH_DTYPE(st, name, ...)                                                \
  AT_DISPATCH_SWITCH(st, name,                                                          \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)                          \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__)                       \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))

void act_fwd(const at::Tensor& x, const c10::optional<at::Tensor>& bias, at::Tensor out, int64_t kind) {
  TORCH_CHECK(x.is_contiguous(), "act_fwd: x must be contiguous");
  check_same(x, out, "act_fwd out");
  if (x.numel() == 0) return;
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == x.size(-1) && bias->is_contiguous() &&
                bias->scalar_type() == x.scalar_type(), "act_fwd: bias must be contiguous [x.size(-1)] of x's dtype");
  }
  FL_DISPATCH_DTYPE(x.scalar_type(), "act_fwd", [&] {
    FL_DISPATCH_KIND(kind, [&] { act_fwd_impl<scalar_t, K>(x, bias, out); });
  });
}

void act_bwd(const at::Tensor& grad, const at::Tensor& x, const c10::optional<at::Tensor>& bias,
             at::Tensor grad_x, const c10::optional<at::Tensor>& grad_bias, int64_t kind) {
  TORCH_CHECK(x.is_contiguous(), "act_bwd: x must be contiguous");
  check_same(x, grad, "act_bwd grad");
  check_same(x, grad_x, "act_bwd grad_x");
  TORCH_CHECK(!grad_bias.has_value() || bias.has_value(), "act_bwd: grad_bias needs bias");
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == x.size(-1) && bias->is_contiguous() &&
                bias->scalar_type() == x.scalar_type(), "act_bwd: bias must be contiguous [x.size(-1)] of x's dtype");
  }
  if (grad_bias.has_value()) {
    check_same(*bias, *grad_bias, "act_bwd grad_bias");
    if (x.numel() == 0) {
      grad_bias->zero_();
      return;
    }
  }
  if (x.numel() == 0) return;
  FL_DISPATCH_DTYPE(x.scalar_type(), "act_bwd", [&] {
    FL_DISPATCH_KIND(kind, [&] { act_bwd_impl<scalar_t, K>(grad, x, bias, grad_x, grad_bias); });
  });
}

// An input of glu: contiguous, or [rows, n] with a unit last stride and non-overlapping rows.
void check_rows(const at::Tensor& t, const at::Tensor& like, const char* what) {
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), what, ": dtype mismatch");
  TORCH_CHECK(t.sizes() == like.sizes(), what, ": shape mismatch");
  TORCH_CHECK(t.is_contiguous() || (t.dim() == 2 && t.stride(1) == 1 && t.stride(0) >= t.size(1)), what,
              ": expected a contiguous tensor or [rows, n] rows with a unit last stride");
}

void glu_fwd(const at::Tensor& a, const at::Tensor& b, at::Tensor out, int64_t kind) {
  check_rows(a, a, "glu_fwd a");
  check_rows(b, a, "glu_fwd b");
  check_same(a, out, "glu_fwd out");
  if (a.numel() == 0) return;
  FL_DISPATCH_DTYPE(a.scalar_type(), "glu_fwd", [&] {
    FL_DISPATCH_KIND(kind, [&] { glu_fwd_impl<scalar_t, K>(a, b, out); });
  });
}

void glu_bwd(const at::Tensor& grad, const at::Tensor& a, const at::Tensor& b, at::Tensor grad_a,
             at::Tensor grad_b, int64_t kind) {
  check_rows(a, a, "glu_bwd a");
  check_rows(b, a, "glu_bwd b");
  check_same(a, grad, "glu_bwd grad");
  check_rows(grad_a, a, "glu_bwd grad_a");
  check_rows(grad_b, a, "glu_bwd grad_b");
  if (a.numel() == 0) return;
  FL_DISPATCH_DTYPE(a.scalar_type(), "glu_bwd", [&] {
    FL_DISPATCH_KIND(kind, [&] { glu_bwd_impl<scalar_t, K>(grad, a, b, grad_a, grad_b); });
  });
}

// Which ISA copy the activation kernels run now ("avx512", "avx2" or "base").
std::string activations_isa() { return fusionlens::cpu_isa_name(fusionlens::cpu_isa()); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusionlens, m) {
  m.def("activations_isa() -> str", &activations_isa);
  m.def("act_fwd(Tensor x, Tensor? bias, Tensor(a!) out, int kind) -> ()");
  m.def("act_bwd(Tensor grad, Tensor x, Tensor? bias, Tensor(a!) grad_x, Tensor(b!)? grad_bias, int kind) -> ()");
  m.def("glu_fwd(Tensor a, Tensor b, Tensor(a!) out, int kind) -> ()");
  m.def("glu_bwd(Tensor grad, Tensor a, Tensor b, Tensor(a!) grad_a, Tensor(b!) grad_b, int kind) -> ()");
}

TORCH_LIBRARY_IMPL(fusionlens, CPU, m) {
  m.impl("act_fwd", &act_fwd);
  m.impl("act_bwd", &act_bwd);
  m.impl("glu_fwd", &glu_fwd);
  m.impl("glu_bwd", &glu_bwd);
}
