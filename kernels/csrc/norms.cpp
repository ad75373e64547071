// Fused LayerNorm / RMSNorm (optionally with a residual add in front) for CPU, forward and backward.
//
// One pass of row work per call: each row (the last dim, N) is read into cache once, reduced
// (two-pass mean/variance or sum of squares from L1/L2, fp32 accumulation for every dtype, four
// vector accumulators), and written once (non-temporal stores for outputs > 16 MiB). Rows are
// split across threads with at::parallel_for (OpenMP). Weight/bias gradients are summed per
// thread chunk in fp32 blocks of rows flushed into double partial rows, then the partials are
// reduced over chunks, in parallel over columns (common.h flush_block).
//
// The row kernels live in norms_impl.h, compiled here once per instruction set (AVX-512,
// AVX2+FMA+F16C, the build's baseline) with `#pragma GCC target`; the copy for this CPU is picked
// at run time (__builtin_cpu_supports), so the build is fast without -march=native and the same
// source runs on any x86-64. The default is the AVX2 copy for fp32/fp16 and the AVX-512 copy for
// bf16 (measured on Zen 4, see pick_isa); FUSIONLENS_CPU_ISA=avx512|avx2|base (read per call)
// picks another, for tests and measurements; a copy the CPU cannot run is never picked.
//
// The *_fwd/*_bwd ops write outputs Python allocates (kernels/norm_function.py, poisonable in
// tests); the training op with its C++ autograd node (norm_train) is in norm_train.cpp and calls
// these four through norms.h.
// Shapes: x, residual, y, sum_out, dy, dx, dadd: [M, N] contiguous; weight, bias, dw, db: [N]
// float32; mean, rstd: [M] float32. An undefined/empty optional tensor means "absent".
#include "common.h"

#include "norms.h"

#include <cmath>
#include <limits>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif


namespace fusionlens {

// Raw arguments of the row kernels (pointers into contiguous tensors; null = absent).
struct LnFwd {
  const void *x, *res;
  void *sum, *y;
  const float *w, *b;
  float *mean, *rstd;
  int64_t m, n;
  double eps;
  bool stream;
};
struct LnBwd {
  const void *dy, *x, *dadd;
  void* dx;
  const float *w, *mean, *rstd;
  float *dw, *db;
  int64_t m, n;
  bool stream;
};
struct RmsFwd {
  const void *x, *res;
  void *sum, *y;
  const float* w;
  float* rstd;
  int64_t m, n;
  double eps;
  bool llama_cast, stream;
};
struct RmsBwd {
  const void *dy, *x, *dadd;
  void* dx;
  const float *w, *rstd;
  float* dw;
  int64_t m, n;
  bool llama_cast, stream;
};

#define FL_ISA_IMPL "norms_impl.h"
#include "per_isa.h"

namespace {

using fusionlens::CpuIsa;

// The copy the norm ops run for dtype t: FUSIONLENS_CPU_ISA if set (read per call: tests switch
// it), else the AVX2 copy for float32 and float16 and the AVX-512 copy for bfloat16; never above
// what the CPU has. Measured on Zen 4 (benchmarks/results/kernels_norms_cpu.md), interleaved, per-copy
// buffers, both orders: float32 and float16 ran 0.7-1.5x faster on the 256-bit copy (median about
// 1.0; 512-bit ops are split in two there and fp32 rows are memory bound), bfloat16 1.0-1.33x
// faster on the 512-bit copy (its loops convert bf16 in registers and are bound by instruction
// count, which 16 lanes halve).
CpuIsa pick_isa(at::ScalarType t) {
  return fusionlens::cpu_isa(t == at::kBFloat16 ? CpuIsa::avx512 : CpuIsa::avx2);
}

#if FL_MULTI_ISA
#define FL_DISPATCH_ISA(fn, T, args)                        \
  switch (pick_isa(c10::CppTypeToScalarType<T>::value)) {   \
    case CpuIsa::avx512: isa_avx512::fn<T>(args); break;    \
    case CpuIsa::avx2: isa_avx2::fn<T>(args); break;        \
    default: isa_base::fn<T>(args); break;                  \
  }
#else
#define FL_DISPATCH_ISA(fn, T, args) isa_base::fn<T>(args);
#endif

struct Rows {
  int64_t m, n;
};

Rows check_rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "fusionlens norms: x must be a contiguous 2D tensor");
  return {x.size(0), x.size(1)};
}

bool present(const c10::optional<at::Tensor>& t) { return t.has_value() && t->defined() && t->numel() > 0; }

const void* data_or_null(const c10::optional<at::Tensor>& t, const at::Tensor& like) {
  if (!present(t)) return nullptr;
  TORCH_CHECK(t->scalar_type() == like.scalar_type() && t->is_contiguous() && t->sizes() == like.sizes(),
              "fusionlens norms: residual/dadd must be contiguous and match x");
  return t->data_ptr();
}

const float* f32_or_null(const c10::optional<at::Tensor>& t, int64_t n) {
  if (!present(t)) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == n,
              "fusionlens norms: weight/bias must be contiguous float32 [N]");
  return t->data_ptr<float>();
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

void check_out(const at::Tensor& t, at::ScalarType dtype, int64_t numel, const char* what) {
  TORCH_CHECK(t.scalar_type() == dtype && t.is_contiguous() && t.numel() == numel, "fusionlens norms: ", what,
              " must be contiguous, ", numel, " elements of ", dtype);
}

bool stream_for(const at::Tensor& x) { return stream_output(x.numel(), x.element_size()); }

// A float32 y (or dy) for 16-bit x: RMSNorm's llama casting with an fp32 weight, which promotes.
bool promotes(const at::Tensor& x, const at::Tensor& y) {
  return y.scalar_type() == at::kFloat && x.scalar_type() != at::kFloat;
}

}  // namespace

void layer_norm_fwd(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                    const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias, double eps,
                    at::Tensor y, at::Tensor sum_out, at::Tensor mean, at::Tensor rstd) {
  const auto [m, n] = check_rows(x);
  const void* res = data_or_null(residual, x);
  check_out(y, x.scalar_type(), m * n, "y");
  if (res) check_out(sum_out, x.scalar_type(), m * n, "sum_out");
  check_out(mean, at::kFloat, m, "mean");
  check_out(rstd, at::kFloat, m, "rstd");
  const LnFwd a{x.data_ptr(), res, res ? sum_out.data_ptr() : nullptr, y.data_ptr(), f32_or_null(weight, n),
                f32_or_null(bias, n), mean.data_ptr<float>(), rstd.data_ptr<float>(), m, n, eps, stream_for(x)};
  dispatch_dtype(x.scalar_type(), "layer_norm_fwd", [&](auto tag) {
    using T = decltype(tag);
    FL_DISPATCH_ISA(ln_fwd, T, a)
  });
}

void layer_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                    const at::Tensor& mean, const at::Tensor& rstd, const c10::optional<at::Tensor>& dadd,
                    at::Tensor dx, at::Tensor dw, at::Tensor db) {
  const auto [m, n] = check_rows(x);
  TORCH_CHECK(dy.is_contiguous() && dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type(),
              "layer_norm_bwd: dy must match x");
  check_out(dx, x.scalar_type(), m * n, "dx");
  check_out(mean, at::kFloat, m, "mean");
  check_out(rstd, at::kFloat, m, "rstd");
  const LnBwd a{dy.data_ptr(), x.data_ptr(), data_or_null(dadd, x), dx.data_ptr(), f32_or_null(weight, n),
                mean.data_ptr<float>(), rstd.data_ptr<float>(), grad_buffer(dw, n), grad_buffer(db, n), m, n,
                stream_for(x)};
  dispatch_dtype(x.scalar_type(), "layer_norm_bwd", [&](auto tag) {
    using T = decltype(tag);
    FL_DISPATCH_ISA(ln_bwd, T, a)
  });
}

void rms_norm_fwd(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                  const c10::optional<at::Tensor>& weight, double eps, bool llama_cast, at::Tensor y,
                  at::Tensor sum_out, at::Tensor rstd) {
  const auto [m, n] = check_rows(x);
  const void* res = data_or_null(residual, x);
  const bool promoted = promotes(x, y);
  check_out(y, promoted ? at::kFloat : x.scalar_type(), m * n, "y");
  if (res) check_out(sum_out, x.scalar_type(), m * n, "sum_out");
  check_out(rstd, at::kFloat, m, "rstd");
  const RmsFwd a{x.data_ptr(), res, res ? sum_out.data_ptr() : nullptr, y.data_ptr(), f32_or_null(weight, n),
                 rstd.data_ptr<float>(), m, n, eps, llama_cast, stream_for(x)};
  dispatch_dtype(x.scalar_type(), "rms_norm_fwd", [&](auto tag) {
    using T = decltype(tag);
    if (promoted) {
      FL_DISPATCH_ISA(rms_fwd_promoted, T, a)
    } else {
      FL_DISPATCH_ISA(rms_fwd, T, a)
    }
  });
}

void rms_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                  const at::Tensor& rstd, const c10::optional<at::Tensor>& dadd, bool llama_cast, at::Tensor dx,
                  at::Tensor dw) {
  const auto [m, n] = check_rows(x);
  const bool promoted = promotes(x, dy);
  TORCH_CHECK(dy.is_contiguous() && dy.sizes() == x.sizes() && (promoted || dy.scalar_type() == x.scalar_type()),
              "rms_norm_bwd: dy must match x (or be float32 for 16-bit x)");
  check_out(dx, x.scalar_type(), m * n, "dx");
  check_out(rstd, at::kFloat, m, "rstd");
  const RmsBwd a{dy.data_ptr(), x.data_ptr(), data_or_null(dadd, x), dx.data_ptr(), f32_or_null(weight, n),
                 rstd.data_ptr<float>(), grad_buffer(dw, n), m, n, llama_cast, stream_for(x)};
  dispatch_dtype(x.scalar_type(), "rms_norm_bwd", [&](auto tag) {
    using T = decltype(tag);
    if (promoted) {
      FL_DISPATCH_ISA(rms_bwd_promoted, T, a)
    } else {
      FL_DISPATCH_ISA(rms_bwd, T, a)
    }
  });
}

namespace {

// The instruction-set copy the norm ops run on this CPU now for dtype (default float32), after
// FUSIONLENS_CPU_ISA.
std::string norms_isa(c10::optional<at::ScalarType> dtype) {
  return fusionlens::cpu_isa_name(pick_isa(dtype.value_or(at::kFloat)));
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
  m.def("norms_isa(ScalarType? dtype=None) -> str", &fusionlens::norms_isa);
}

TORCH_LIBRARY_IMPL(fusionlens, CPU, m) {
  m.impl("layer_norm_fwd", &fusionlens::layer_norm_fwd);
  m.impl("layer_norm_bwd", &fusionlens::layer_norm_bwd);
  m.impl("rms_norm_fwd", &fusionlens::rms_norm_fwd);
  m.impl("rms_norm_bwd", &fusionlens::rms_norm_bwd);
}
