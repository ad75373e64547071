// Fused LayerNorm / RMSNorm (optionally with a residual add in front) for CPU, forward and backward.
//
// One pass of row work per call: each row (the last dim, N) is read into cache once, reduced
// (two-pass mean/variance or sum of squares from L1/L2, fp32 accumulation for every dtype, four
// vector accumulators), and written once (non-temporal stores for outputs > 16 MiB). Rows are
// split across threads with at::parallel_for (OpenMP). Weight/bias gradients are summed per
// thread chunk into fp32 partial rows, then the partials are reduced over chunks, in parallel
// over columns.
//
// The row kernels live in norms_impl.h, compiled here once per instruction set (AVX-512,
// AVX2+FMA+F16C, the build's baseline) with `#pragma GCC target`; the copy for this CPU is picked
// at run time (__builtin_cpu_supports), so the build is fast without -march=native and the same
// source runs on any x86-64. The default is the AVX2 copy for fp32/fp16 and the AVX-512 copy for
// bf16 (measured on Zen 4, see pick_isa); FUSIONLENS_CPU_ISA=avx512|avx2|base (read per call)
// picks another, for tests and measurements; a copy the CPU cannot run is never picked.
//
// The *_fwd/*_bwd ops write outputs Python allocates (kernels/norm_function.py, poisonable in
// tests); norm_train allocates its own, with the poisoning and huge-page policy passed from Python.
// Shapes: x, residual, y, sum_out, dy, dx, dadd: [M, N] contiguous; weight, bias, dw, db: [N]
// float32; mean, rstd: [M] float32. An undefined/empty optional tensor means "absent".
#include "common.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
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
  check_out(y, x.scalar_type(), m * n, "y");
  if (res) check_out(sum_out, x.scalar_type(), m * n, "sum_out");
  check_out(rstd, at::kFloat, m, "rstd");
  const RmsFwd a{x.data_ptr(), res, res ? sum_out.data_ptr() : nullptr, y.data_ptr(), f32_or_null(weight, n),
                 rstd.data_ptr<float>(), m, n, eps, llama_cast, stream_for(x)};
  dispatch_dtype(x.scalar_type(), "rms_norm_fwd", [&](auto tag) {
    using T = decltype(tag);
    FL_DISPATCH_ISA(rms_fwd, T, a)
  });
}

void rms_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                  const at::Tensor& rstd, const c10::optional<at::Tensor>& dadd, bool llama_cast, at::Tensor dx,
                  at::Tensor dw) {
  const auto [m, n] = check_rows(x);
  TORCH_CHECK(dy.is_contiguous() && dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type(),
              "rms_norm_bwd: dy must match x");
  check_out(dx, x.scalar_type(), m * n, "dx");
  check_out(rstd, at::kFloat, m, "rstd");
  const RmsBwd a{dy.data_ptr(), x.data_ptr(), data_or_null(dadd, x), dx.data_ptr(), f32_or_null(weight, n),
                 rstd.data_ptr<float>(), grad_buffer(dw, n), m, n, llama_cast, stream_for(x)};
  dispatch_dtype(x.scalar_type(), "rms_norm_bwd", [&](auto tag) {
    using T = decltype(tag);
    FL_DISPATCH_ISA(rms_bwd, T, a)
  });
}

// ---------------------------------------------------------------- training op (C++ autograd node)
// fusionlens::norm_train runs LayerNorm/RMSNorm (optionally after the residual add) with its
// autograd node in C++: the Python autograd.Function in kernels/norm_function.py cost ~75 us a
// step more than ATen's C++ node (benchmarks/results/kernels_norms_cpu.md). Same kernels, same
// outputs; the allocation policy (NaN poisoning in tests, huge-page advice for large outputs) is
// decided in Python (kernels/registry.py, kernels/_alloc.py) and passed in.
struct AllocPolicy {
  bool poison;
  int64_t hugepage_min_bytes, hugepage_bytes;  // hugepage_bytes 0: no advice
};

// A contiguous output: madvise(MADV_HUGEPAGE) on its aligned interior when large (as
// kernels/_alloc.py does), NaN-filled when poisoning.
at::Tensor new_out(at::IntArrayRef shape, const at::TensorOptions& opt, const AllocPolicy& p) {
  at::Tensor t = at::empty(shape, opt);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const int64_t nbytes = t.numel() * static_cast<int64_t>(t.element_size());
  if (p.hugepage_bytes > 0 && nbytes >= p.hugepage_min_bytes) {
    const uintptr_t ptr = reinterpret_cast<uintptr_t>(t.data_ptr()), page = p.hugepage_bytes;
    const uintptr_t start = (ptr + page - 1) / page * page, end = (ptr + nbytes) / page * page;
    if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);  // advice only
  }
#endif
  if (p.poison) t.fill_(std::numeric_limits<double>::quiet_NaN());
  return t;
}

at::Tensor value_or_undefined(const c10::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

c10::optional<at::Tensor> opt_t(const at::Tensor& t) { return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt; }

// (offset + weight) as contiguous fp32, as kernels/norms.py's Python path: LayerNorm uses weight;
// llama casting rounds offset + weight to weight's dtype first, gemma adds in fp32.
at::Tensor effective_weight(const at::Tensor& w, double offset, bool rms, bool llama_cast) {
  if (!w.defined()) return w;
  if (!rms || offset == 0.0) return w.to(at::kFloat).contiguous();
  return (llama_cast ? w.add(offset).to(at::kFloat) : w.to(at::kFloat).add(offset)).contiguous();
}

struct TrainFwd {
  at::Tensor sum, y;                   // [..., N] (sum: [0] without a residual)
  at::Tensor src, w_eff, mean, rstd;   // what the backward reads: [M, N] input (or sum), fp32 stats
};

TrainFwd train_forward(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                       const at::Tensor& bias, double eps, double offset, bool rms, bool llama_cast,
                       const AllocPolicy& p) {
  TORCH_CHECK(x.dim() >= 1, "fusionlens::norm_train: x must have at least one dimension");
  const int64_t n = x.size(-1);
  int64_t m = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) m *= x.size(d);
  const at::Tensor x2 = x.reshape({m, n}).contiguous();
  const at::Tensor r2 = residual.defined() ? residual.reshape({m, n}).contiguous() : at::Tensor();
  const auto opt = x2.options(), f32 = opt.dtype(at::kFloat);
  TrainFwd o;
  at::Tensor y = new_out({m, n}, opt, p);
  at::Tensor s = r2.defined() ? new_out({m, n}, opt, p) : at::empty({0}, opt);
  o.rstd = new_out({m}, f32, p);
  if (!rms) o.mean = new_out({m}, f32, p);
  o.w_eff = effective_weight(weight, offset, rms, llama_cast);
  const at::Tensor b32 = bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();
  if (x2.numel()) {
    if (rms) rms_norm_fwd(x2, opt_t(r2), opt_t(o.w_eff), eps, llama_cast, y, s, o.rstd);
    else layer_norm_fwd(x2, opt_t(r2), opt_t(o.w_eff), opt_t(b32), eps, y, s, o.mean, o.rstd);
  }
  o.src = r2.defined() ? s : x2;
  o.y = y.view(x.sizes());
  o.sum = r2.defined() ? s.view(x.sizes()) : s;
  return o;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct NormTrain : public torch::autograd::Function<NormTrain> {
  // An absent optional tensor has no autograd edge: edges are numbered over the present tensors
  // (x, then residual, weight, bias when given); "edges" keeps each one's number, or -1.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const c10::optional<at::Tensor>& res,
                               const c10::optional<at::Tensor>& w, const c10::optional<at::Tensor>& b, double eps,
                               double offset, bool rms, bool llama_cast, bool poison, int64_t hp_min,
                               int64_t hp_bytes) {
    const at::Tensor residual = value_or_undefined(res), weight = value_or_undefined(w), bias = value_or_undefined(b);
    TrainFwd o = train_forward(x, residual, weight, bias, eps, offset, rms, llama_cast, {poison, hp_min, hp_bytes});
    std::vector<int64_t> edges{0, -1, -1, -1};
    int64_t next = 1;
    for (int i = 1; i < 4; ++i) {
      if ((i == 1 ? residual : i == 2 ? weight : bias).defined()) edges[i] = next++;
    }
    ctx->saved_data["edges"] = edges;
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({o.src, o.w_eff, o.mean, o.rstd});
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["flags"] = std::vector<bool>{rms, llama_cast, residual.defined(), poison};
    ctx->saved_data["hp"] = std::vector<int64_t>{hp_min, hp_bytes};
    ctx->saved_data["w_dtype"] = weight.defined() ? weight.scalar_type() : at::kFloat;
    ctx->saved_data["b_dtype"] = bias.defined() ? bias.scalar_type() : at::kFloat;
    if (!residual.defined()) ctx->mark_non_differentiable({o.sum});
    return {o.sum, o.y};
  }

  // The Python backward of kernels/norm_function.py, line for line. Its kernels are called
  // directly (no autograd graph): a double backward finds grads without grad_fn, as before.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &src = saved[0], &w_eff = saved[1], &mean = saved[2], &rstd = saved[3];
    const auto flags = ctx->saved_data["flags"].toBoolList();
    const bool rms = flags[0], llama_cast = flags[1], fused_add = flags[2];
    const auto hp = ctx->saved_data["hp"].toIntVector();
    const AllocPolicy p{flags[3], hp[0], hp[1]};
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const at::Tensor dsum = fused_add ? grads[0] : at::Tensor(), dy = grads[1];
    const int64_t m = src.size(0), n = src.size(1);
    const auto edges = ctx->saved_data["edges"].toIntVector();
    const auto need = [&](int i) { return edges[i] >= 0 && ctx->needs_input_grad(edges[i]); };
    const bool need_x = need(0), need_r = need(1), need_w = need(2), need_b = need(3);
    const auto f32 = src.options().dtype(at::kFloat);
    at::Tensor dw = need_w ? new_out({n}, f32, p) : at::empty({0}, f32);
    at::Tensor db = need_b ? new_out({n}, f32, p) : at::empty({0}, f32);
    at::Tensor dx;
    if (!dy.defined()) {  // only the sum was used downstream
      dx = dsum.defined() ? dsum.reshape(shape) : at::Tensor();
      dw.zero_();
      db.zero_();
    } else {
      const at::Tensor dy2 = dy.reshape({m, n}).contiguous();
      const at::Tensor da2 = dsum.defined() ? dsum.reshape({m, n}).contiguous() : at::Tensor();
      dx = new_out({m, n}, src.options(), p);
      if (src.numel() == 0) {
        dw.zero_();
        db.zero_();
      } else if (rms) {
        rms_norm_bwd(dy2, src, opt_t(w_eff), rstd, opt_t(da2), llama_cast, dx, dw);
      } else {
        layer_norm_bwd(dy2, src, opt_t(w_eff), mean, rstd, opt_t(da2), dx, dw, db);
      }
      dx = dx.view(shape);
    }
    variable_list out(11);
    if (need_x) out[0] = dx;
    if (need_r) out[1] = dx;
    if (need_w) out[2] = dw.to(ctx->saved_data["w_dtype"].toScalarType());
    if (need_b) out[3] = db.to(ctx->saved_data["b_dtype"].toScalarType());
    return out;
  }
};

// The forward alone: below autograd (inference mode), and under no_grad or when no input requires grad.
std::tuple<at::Tensor, at::Tensor> norm_train_cpu(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                  const c10::optional<at::Tensor>& weight,
                                                  const c10::optional<at::Tensor>& bias, double eps, double offset,
                                                  bool rms, bool llama_cast, bool poison, int64_t hp_min,
                                                  int64_t hp_bytes) {
  TrainFwd o = train_forward(x, value_or_undefined(residual), value_or_undefined(weight), value_or_undefined(bias),
                             eps, offset, rms, llama_cast, {poison, hp_min, hp_bytes});
  return {o.sum, o.y};
}

std::tuple<at::Tensor, at::Tensor> norm_train_autograd(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                       const c10::optional<at::Tensor>& weight,
                                                       const c10::optional<at::Tensor>& bias, double eps,
                                                       double offset, bool rms, bool llama_cast, bool poison,
                                                       int64_t hp_min, int64_t hp_bytes) {
  const auto grad = [](const c10::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); };
  if (!at::GradMode::is_enabled() || !(x.requires_grad() || grad(residual) || grad(weight) || grad(bias))) {
    return norm_train_cpu(x, residual, weight, bias, eps, offset, rms, llama_cast, poison, hp_min, hp_bytes);
  }
  auto out = NormTrain::apply(x, residual, weight, bias, eps, offset, rms, llama_cast, poison, hp_min, hp_bytes);
  return {out[0], out[1]};
}

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
  // (sum [0] without a residual, y); rms: RMSNorm (weight_eff = offset + weight), else LayerNorm.
  m.def("norm_train(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, float eps, float offset, bool rms, "
        "bool llama_cast, bool poison=False, int hugepage_min_bytes=0, int hugepage_bytes=0) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(fusionlens, CPU, m) {
  m.impl("layer_norm_fwd", &fusionlens::layer_norm_fwd);
  m.impl("layer_norm_bwd", &fusionlens::layer_norm_bwd);
  m.impl("rms_norm_fwd", &fusionlens::rms_norm_fwd);
  m.impl("rms_norm_bwd", &fusionlens::rms_norm_bwd);
  m.impl("norm_train", &fusionlens::norm_train_cpu);
}

TORCH_LIBRARY_IMPL(fusionlens, Autograd, m) {
  m.impl("norm_train", &fusionlens::norm_train_autograd);
}
