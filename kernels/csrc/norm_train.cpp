// fusionlens::norm_train: LayerNorm/RMSNorm (optionally after the residual add) with its autograd
// node in C++. The Python autograd.Function in kernels/norm_function.py cost ~75 us a step more
// than ATen's C++ node (benchmarks/results/kernels_norms_cpu.md). Same kernels (norms.cpp, through
// norms.h), same outputs; the allocation policy (NaN poisoning in tests, the output pool or
// huge-page advice for large outputs) is decided in Python (kernels/registry.py, kernels/_alloc.py)
// and passed in.
// Its own translation unit: the autograd headers are not parsed with the per-ISA loops, and the
// two compile in parallel.
#include "norms.h"
#include "pool.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace fusionlens {
namespace {

struct AllocPolicy {
  bool poison;
  int64_t hugepage_min_bytes, hugepage_bytes;  // hugepage_bytes 0: no advice
  int64_t pool_min_bytes;                      // 0: the pool is off
};

// A contiguous output, as kernels/_alloc.py allocates one: from the pool when large, else with
// madvise(MADV_HUGEPAGE) on its aligned interior when large; NaN-filled when poisoning.
at::Tensor new_out(at::IntArrayRef shape, const at::TensorOptions& opt, const AllocPolicy& p) {
  const int64_t nbytes = c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(opt.dtype().toScalarType()));
  const bool pooled = p.pool_min_bytes > 0 && nbytes >= p.pool_min_bytes;
  at::Tensor t = pooled ? empty_pooled(shape, opt.dtype().toScalarType()) : at::empty(shape, opt);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (!pooled && p.hugepage_bytes > 0 && nbytes >= p.hugepage_min_bytes) {
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

// The row kernels run through the dispatcher, as torch.ops.fusionlens.{layer,rms}_norm_{fwd,bwd},
// not as direct calls: a profiler then shows them inside norm_train and inside its backward node,
// and a TorchDispatchMode (the capture's FLOPs/bytes pass) sees them with their arguments. Below
// autograd: they write outputs allocated here and need no graph. About a microsecond a call.
template <class Fn>
c10::TypedOperatorHandle<Fn> row_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

struct TrainFwd {
  at::Tensor sum, y;         // [..., N] (sum: [0] without a residual)
  at::Tensor mean, rstd;     // [M] fp32 (mean: LayerNorm only)
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
  // llama casting with an fp32 weight on 16-bit x promotes, as eager: y = w * round(x * rstd) in fp32
  const bool promoted = rms && llama_cast && weight.defined() && weight.scalar_type() == at::kFloat &&
                        x.scalar_type() != at::kFloat;
  at::Tensor y = new_out({m, n}, promoted ? f32 : opt, p);
  at::Tensor s = r2.defined() ? new_out({m, n}, opt, p) : at::empty({0}, opt);
  o.rstd = new_out({m}, f32, p);
  if (!rms) o.mean = new_out({m}, f32, p);
  const at::Tensor w_eff = effective_weight(weight, offset, rms, llama_cast);
  const at::Tensor b32 = bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();
  if (x2.numel()) {
    static const auto rms_fwd = row_op<decltype(rms_norm_fwd)>("fusionlens::rms_norm_fwd");
    static const auto ln_fwd = row_op<decltype(layer_norm_fwd)>("fusionlens::layer_norm_fwd");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    if (rms) rms_fwd.call(x2, opt_t(r2), opt_t(w_eff), eps, llama_cast, y, s, o.rstd);
    else ln_fwd.call(x2, opt_t(r2), opt_t(w_eff), opt_t(b32), eps, y, s, o.mean, o.rstd);
  }
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
                               int64_t hp_bytes, int64_t pool_min) {
    const at::Tensor residual = value_or_undefined(res), weight = value_or_undefined(w), bias = value_or_undefined(b);
    TrainFwd o = train_forward(x, residual, weight, bias, eps, offset, rms, llama_cast, {poison, hp_min, hp_bytes, pool_min});
    std::vector<int64_t> edges{0, -1, -1, -1};
    int64_t next = 1;
    for (int i = 1; i < 4; ++i) {
      if ((i == 1 ? residual : i == 2 ? weight : bias).defined()) edges[i] = next++;
    }
    ctx->saved_data["edges"] = edges;
    ctx->set_materialize_grads(false);
    // What ATen's LayerNorm saves: the input (x, or the sum output, whose grad_fn is this node),
    // weight, bias and the fp32 stats. The backward rebuilds the rows and the effective weight.
    ctx->save_for_backward({residual.defined() ? o.sum : x, weight, bias, o.mean, o.rstd});
    ctx->saved_data["eps_offset"] = std::vector<double>{eps, offset};
    ctx->saved_data["flags"] = std::vector<bool>{rms, llama_cast, residual.defined(), poison};
    ctx->saved_data["hp"] = std::vector<int64_t>{hp_min, hp_bytes, pool_min};
    // Without a residual the first output is an empty placeholder that Python drops; it is not
    // marked non-differentiable: compiled autograd takes no C++ node with such outputs.
    return {o.sum, o.y};
  }

  // Grads under vmap (autograd.grad(is_grads_batched=True), autograd.functional's vectorize=True):
  // the row kernels have no batching rules.
  static bool batched(const at::Tensor& t) {
    return t.defined() && t.key_set().has_any(c10::DispatchKeySet({c10::DispatchKey::Batched, c10::DispatchKey::FuncTorchBatched}));
  }

  // create_graph=True or batched grads: kernels/norm_function.py's eager_grads (registered from Python as
  // fusionlens::norm_eager_grads, a composite op) differentiates the reference at the saved x (or
  // sum) with a graph, so a second derivative keeps this norm's term.
  static variable_list eager_backward(AutogradContext* ctx, const variable_list& saved, const variable_list& grads) {
    const auto flags = ctx->saved_data["flags"].toBoolList();
    const bool rms = flags[0], llama_cast = flags[1], fused_add = flags[2];
    const auto eps_offset = ctx->saved_data["eps_offset"].toDoubleVector();
    const auto edges = ctx->saved_data["edges"].toIntVector();
    const auto need = [&](int i) { return edges[i] >= 0 && ctx->needs_input_grad(edges[i]); };
    const auto op = c10::Dispatcher::singleton().findSchema({"fusionlens::norm_eager_grads", ""});
    TORCH_CHECK(op.has_value(), "norm_train: a backward with create_graph=True needs fusionlens::norm_eager_grads, "
                "registered by importing kernels.norm_function");
    using Opt = c10::optional<at::Tensor>;
    const auto eager = op->typed<c10::List<Opt>(const at::Tensor&, const Opt&, const Opt&, const Opt&, const Opt&,
                                                 double, double, bool, bool, bool, bool, bool)>();
    const at::Tensor dsum = fused_add ? grads[0] : at::Tensor();
    const auto got = eager.call(saved[0], opt_t(saved[1]), opt_t(saved[2]), opt_t(grads[1]), opt_t(dsum),
                                eps_offset[0], eps_offset[1], rms, llama_cast, need(0) || need(1), need(2), need(3));
    const auto at_ = [&](size_t i) { const Opt g = got.get(i); return g.has_value() ? *g : at::Tensor(); };
    variable_list out(12);  // one per forward argument
    if (need(0)) out[0] = at_(0);
    if (need(1)) out[1] = at_(0);
    if (need(2)) out[2] = at_(1);
    if (need(3)) out[3] = at_(2);
    return out;
  }

  // The Python backward of kernels/norm_function.py, line for line. Its kernels are called
  // directly (no autograd graph); with create_graph=True or batched grads they come from the
  // reference composition instead (eager_backward).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (at::GradMode::is_enabled() || batched(grads[0]) || batched(grads[1])) return eager_backward(ctx, saved, grads);
    const at::Tensor &input = saved[0], &weight = saved[1], &bias = saved[2], &mean = saved[3], &rstd = saved[4];
    const auto flags = ctx->saved_data["flags"].toBoolList();
    const bool rms = flags[0], llama_cast = flags[1], fused_add = flags[2];
    const auto shape = input.sizes();
    const int64_t n = shape.back(), m = c10::multiply_integers(shape.begin(), shape.end() - 1);
    const at::Tensor src = input.reshape({m, n}).contiguous();  // a view unless x was strided
    const at::Tensor w_eff = effective_weight(weight, ctx->saved_data["eps_offset"].toDoubleVector()[1], rms, llama_cast);
    const auto hp = ctx->saved_data["hp"].toIntVector();
    const AllocPolicy p{flags[3], hp[0], hp[1], hp[2]};
    const at::Tensor dsum = fused_add ? grads[0] : at::Tensor(), dy = grads[1];
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
        static const auto rms_bwd = row_op<decltype(rms_norm_bwd)>("fusionlens::rms_norm_bwd");
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        rms_bwd.call(dy2, src, opt_t(w_eff), rstd, opt_t(da2), llama_cast, dx, dw);
      } else {
        static const auto ln_bwd = row_op<decltype(layer_norm_bwd)>("fusionlens::layer_norm_bwd");
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        ln_bwd.call(dy2, src, opt_t(w_eff), mean, rstd, opt_t(da2), dx, dw, db);
      }
      dx = dx.view(shape);
    }
    variable_list out(12);  // one per forward argument
    if (need_x) out[0] = dx;
    if (need_r) out[1] = dx;
    if (need_w) out[2] = dw.to(weight.scalar_type());
    if (need_b) out[3] = db.to(bias.scalar_type());
    return out;
  }
};

// The forward alone: below autograd (inference mode), and under no_grad or when no input requires grad.
std::tuple<at::Tensor, at::Tensor> norm_train_cpu(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                  const c10::optional<at::Tensor>& weight,
                                                  const c10::optional<at::Tensor>& bias, double eps, double offset,
                                                  bool rms, bool llama_cast, bool poison, int64_t hp_min,
                                                  int64_t hp_bytes, int64_t pool_min) {
  TrainFwd o = train_forward(x, value_or_undefined(residual), value_or_undefined(weight), value_or_undefined(bias),
                             eps, offset, rms, llama_cast, {poison, hp_min, hp_bytes, pool_min});
  return {o.sum, o.y};
}

std::tuple<at::Tensor, at::Tensor> norm_train_autograd(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                       const c10::optional<at::Tensor>& weight,
                                                       const c10::optional<at::Tensor>& bias, double eps,
                                                       double offset, bool rms, bool llama_cast, bool poison,
                                                       int64_t hp_min, int64_t hp_bytes, int64_t pool_min) {
  const auto grad = [](const c10::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); };
  if (!at::GradMode::is_enabled() || !(x.requires_grad() || grad(residual) || grad(weight) || grad(bias))) {
    return norm_train_cpu(x, residual, weight, bias, eps, offset, rms, llama_cast, poison, hp_min, hp_bytes, pool_min);
  }
  auto out = NormTrain::apply(x, residual, weight, bias, eps, offset, rms, llama_cast, poison, hp_min, hp_bytes, pool_min);
  return {out[0], out[1]};
}

}  // namespace
}  // namespace fusionlens

TORCH_LIBRARY_FRAGMENT(fusionlens, m) {
  // (sum [0] without a residual, y); rms: RMSNorm (weight_eff = offset + weight), else LayerNorm.
  m.def("norm_train(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, float eps, float offset, bool rms, "
        "bool llama_cast, bool poison=False, int hugepage_min_bytes=0, int hugepage_bytes=0, int pool_min_bytes=0) "
        "-> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(fusionlens, CPU, m) {
  m.impl("norm_train", &fusionlens::norm_train_cpu);
}

TORCH_LIBRARY_IMPL(fusionlens, Autograd, m) {
  m.impl("norm_train", &fusionlens::norm_train_autograd);
}
