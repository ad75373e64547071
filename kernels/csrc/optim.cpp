// Multi-tensor AdamW and LAMB steps for FusionLens (CPU): every parameter of one dtype in one call.
//
// All tensors of a call are cut into chunks of up to kChunk elements; one parallel loop runs over
// the chunks of all tensors (so 150 small and large tensors share the threads evenly), and each
// chunk is one vectorizable pass that reads g, p, m, v and writes p, m, v (28 bytes per fp32
// element; AdamW is memory-bound). Tensors of a call share a dtype and are dense with identical
// strides (the Python side guarantees it), so they are walked as flat arrays.
//
// Ops (torch.ops.fusionlens.*):
//   adamw_step_(params!, grads, exp_avgs!, exp_avg_sqs!, max_exp_avg_sqs!, steps!, lr, beta1,
//               beta2, eps, weight_decay, amsgrad, maximize)
//       torch.optim.AdamW's single-tensor algorithm; steps (fp32 scalars) are incremented here.
//   lamb_step_(params!, grads, exp_avgs!, exp_avg_sqs!, steps!, lr, beta1, beta2, eps,
//              weight_decay, grad_divisor, bias_correction, adam_w_mode, grad_averaging,
//              use_nvlamb)   grad_divisor: a one-element CPU tensor (the clipping divisor)
//       apex FusedLAMB: stage 1 updates m, v and reduces ||p||^2 and ||update||^2 per chunk
//       (fp32 within a chunk, fp64 across), stage 2 recomputes the update from m, v, p and applies p -= lr * ratio * update
//       with ratio = ||p|| / ||update|| (1 when either is 0, and when weight_decay == 0 unless
//       use_nvlamb). Recomputing costs no more traffic than storing the update, and needs no
//       scratch memory and leaves the grads untouched.
//   multi_sumsq(tensors) -> float64 [n]: per-tensor sum of squares (global grad-norm clipping).
//
// The chunk loops live in optim_impl.h, compiled once per instruction set (AVX-512, AVX2+FMA,
// the build's baseline) and picked at run time (common.h cpu_isa; FUSIONLENS_CPU_ISA lowers it),
// so neither -march=native nor -ffast-math is needed.
#include "common.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

namespace fl_optim {

template <typename T>
using opmath_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// AdamW's per-chunk scalars, rounded to the math type M from the double values torch computes.
template <typename M>
struct AdamScalars {
  M decay, w1, b2, w2, eps, step_size, bc2_sqrt;
  bool lerp_low, maximize;
};

// LAMB's scalars shared by all tensors of a step (the bias corrections are per tensor).
template <typename M>
struct LambScalars {
  M clip, b1, b2, b3, w2, eps;  // clip: the grad-norm clipping divisor; g / clip as the reference divides
  M wd_hi, wd_lo;  // weight decay as hi + lo (lo = wd - hi): x + wd * p as two fused multiply-adds
                   // keeps wd's own rounding (fp32(0.1) is 1.5e-8 off) out of x + wd * p where it
                   // nearly cancels (fuzz seed 702654); the same in fp64 math cost 12% at 1 thread
  bool l2_mode;  // wd * p added to g (L2) instead of to the update (adam_w_mode): only that term
                 // is computed, so a NaN/Inf param never turns the other mode's 0 * p into NaN
};

// One ISA copy's chunk loops (optim_impl.h) for parameters of type T.
template <typename T>
struct ChunkOps {
  using M = opmath_t<T>;
  void (*adamw)(T* p, const T* g, T* m, T* v, T* vmax, int64_t len, const AdamScalars<M>& s);
  void (*adamw_amsgrad)(T* p, const T* g, T* m, T* v, T* vmax, int64_t len, const AdamScalars<M>& s);
  // LAMB's stages, indexed by l2_mode (a template parameter of the loops: a branch inside kept
  // GCC from vectorizing stage 1 at all, which then ran scalar in every ISA copy)
  void (*lamb1[2])(const T* p, const T* g, T* m, T* v, int64_t len, const LambScalars<M>& s, M ib1, M ib2,
                   double* sum_p, double* sum_u);
  void (*lamb2[2])(T* p, const T* m, const T* v, int64_t len, const LambScalars<M>& s, M ib1, M ib2, M step_lr);
  double (*sumsq)(const T* x, int64_t len);
};

#define FL_ISA_IMPL "optim_impl.h"
#include "per_isa.h"

// The chunk loops of the best copy this CPU runs (FUSIONLENS_CPU_ISA lowers it).
template <typename T>
ChunkOps<T> ops_for() { return FL_ISA_PICK(chunk_ops<T>()); }

}  // namespace fl_optim

namespace {

using fl_optim::opmath_t;

constexpr int64_t kChunk = 32768;

struct Chunk {
  int32_t tensor;
  int64_t begin, end;
};

std::vector<Chunk> make_chunks(const std::vector<at::Tensor>& ts) {
  std::vector<Chunk> out;
  for (size_t i = 0; i < ts.size(); ++i) {
    const int64_t n = ts[i].numel();
    for (int64_t b = 0; b < n; b += kChunk) out.push_back({static_cast<int32_t>(i), b, std::min(n, b + kChunk)});
  }
  return out;
}

// Runs fn(begin, end) over the chunks: in parallel only when there is enough work to pay for
// waking the threads (~256K elements); small steps (tests, tiny models) stay on one thread.
template <typename F>
void for_chunks(const std::vector<Chunk>& chunks, const F& fn) {
  const int64_t nc = static_cast<int64_t>(chunks.size());
  int64_t total = 0;
  for (const Chunk& c : chunks) total += c.end - c.begin;
  if (total < (int64_t{1} << 18)) {
    fn(int64_t{0}, nc);
  } else {
    at::parallel_for(0, nc, 1, fn);
  }
}

template <typename F>
void dispatch_param_types(at::ScalarType dt, const char* name, const F& f) {
  switch (dt) {
    case at::kFloat: f(float{}); break;
    case at::kDouble: f(double{}); break;
    case at::kBFloat16: f(c10::BFloat16{}); break;
    case at::kHalf: f(c10::Half{}); break;
    default: TORCH_CHECK(false, name, ": unsupported parameter dtype ", dt);
  }
}

void check_lists(const char* name, const at::TensorList params,
                 std::initializer_list<std::pair<const char*, at::TensorList>> others) {
  const auto dt = params.empty() ? at::kFloat : params[0].scalar_type();
  for (const auto& p : params) {
    TORCH_CHECK(p.device().is_cpu() && p.scalar_type() == dt && p.is_non_overlapping_and_dense(),
                name, ": params must be dense CPU tensors of one dtype");
  }
  for (const auto& [what, list] : others) {
    TORCH_CHECK(list.size() == params.size(), name, ": ", what, " has ", list.size(),
                " tensors for ", params.size(), " params");
    for (size_t i = 0; i < list.size(); ++i) {
      TORCH_CHECK(list[i].scalar_type() == dt && list[i].sizes() == params[i].sizes() &&
                      list[i].strides() == params[i].strides() && list[i].device().is_cpu(),
                  name, ": ", what, "[", i, "] must match its param's dtype, shape and strides");
    }
  }
}

// Increment the step counters (fp32, or fp64 when torch's default dtype was fp64); return each tensor's new step.
std::vector<double> bump_steps(const char* name, at::TensorList steps, size_t n) {
  TORCH_CHECK(steps.size() == n, name, ": ", steps.size(), " steps for ", n, " params");
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& s = steps[i];
    TORCH_CHECK(s.numel() == 1 && s.device().is_cpu() &&
                    (s.scalar_type() == at::kFloat || s.scalar_type() == at::kDouble),
                name, ": steps must be float32/float64 CPU scalars");
    if (s.scalar_type() == at::kFloat) {
      float* v = s.data_ptr<float>();
      *v += 1.0f;
      out[i] = *v;
    } else {
      double* v = s.data_ptr<double>();
      *v += 1.0;
      out[i] = *v;
    }
  }
  return out;
}

// AdamW follows torch's operation order and uses FMAs where ATen's CPU kernels do (lerp,
// addcmul); no -ffast-math. Not bit-exact (ATen's vectorized sqrt and division need not round
// like the compiler's), but within fp32 rounding per step.
void adamw_step_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                 at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs, at::TensorList steps,
                 double lr, double beta1, double beta2, double eps, double weight_decay,
                 bool amsgrad, bool maximize) {
  check_lists("adamw_step_", params, {{"grads", grads}, {"exp_avgs", exp_avgs}, {"exp_avg_sqs", exp_avg_sqs}});
  if (amsgrad) check_lists("adamw_step_", params, {{"max_exp_avg_sqs", max_exp_avg_sqs}});
  if (params.empty()) return;
  const std::vector<double> step = bump_steps("adamw_step_", steps, params.size());
  const std::vector<at::Tensor> ps(params.begin(), params.end());
  const std::vector<Chunk> chunks = make_chunks(ps);
  dispatch_param_types(params[0].scalar_type(), "adamw_step_", [&](auto tag) {
    using T = decltype(tag);
    using M = opmath_t<T>;
    const size_t n = params.size();
    // Per-tensor scalars, computed in double like torch's python code, then rounded to M.
    std::vector<M> step_size(n), bc2_sqrt(n);
    for (size_t i = 0; i < n; ++i) {
      step_size[i] = static_cast<M>(lr / (1.0 - std::pow(beta1, step[i])));
      bc2_sqrt[i] = static_cast<M>(std::sqrt(1.0 - std::pow(beta2, step[i])));
    }
    const fl_optim::AdamScalars<M> base{static_cast<M>(1.0 - lr * weight_decay), static_cast<M>(1.0 - beta1),
                                        static_cast<M>(beta2), static_cast<M>(1.0 - beta2), static_cast<M>(eps),
                                        M(0), M(1), (1.0 - beta1) < 0.5, maximize};
    const fl_optim::ChunkOps<T> ops = fl_optim::ops_for<T>();
    const auto chunk_fn = amsgrad ? ops.adamw_amsgrad : ops.adamw;
    for_chunks(chunks, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        const Chunk& ch = chunks[c];
        const int i = ch.tensor;
        T* p = params[i].data_ptr<T>() + ch.begin;
        const T* g = grads[i].const_data_ptr<T>() + ch.begin;
        T* m = exp_avgs[i].data_ptr<T>() + ch.begin;
        T* v = exp_avg_sqs[i].data_ptr<T>() + ch.begin;
        T* vmax = amsgrad ? max_exp_avg_sqs[i].data_ptr<T>() + ch.begin : nullptr;
        fl_optim::AdamScalars<M> sc = base;
        sc.step_size = step_size[i];
        sc.bc2_sqrt = bc2_sqrt[i];
        chunk_fn(p, g, m, v, vmax, ch.end - ch.begin, sc);
      }
    });
  });
}


void lamb_step_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                at::TensorList exp_avg_sqs, at::TensorList steps, double lr, double beta1,
                double beta2, double eps, double weight_decay, const at::Tensor& grad_divisor,
                bool bias_correction, bool adam_w_mode, bool grad_averaging, bool use_nvlamb) {
  check_lists("lamb_step_", params, {{"grads", grads}, {"exp_avgs", exp_avgs}, {"exp_avg_sqs", exp_avg_sqs}});
  // A tensor (as the Triton step's): the divisor computed from the grads (device_grad_divisor) goes
  // in without a host read in Python, so a compiled step stays one graph. Read here, on the CPU.
  TORCH_CHECK(grad_divisor.numel() == 1 && grad_divisor.device().is_cpu(),
              "lamb_step_: grad_divisor must be a one-element CPU tensor");
  const double divisor = grad_divisor.item<double>();
  if (params.empty()) return;
  const std::vector<double> step = bump_steps("lamb_step_", steps, params.size());
  const std::vector<at::Tensor> ps(params.begin(), params.end());
  const std::vector<Chunk> chunks = make_chunks(ps);
  const int64_t nc = static_cast<int64_t>(chunks.size());
  std::vector<double> sum_p(nc), sum_u(nc);
  dispatch_param_types(params[0].scalar_type(), "lamb_step_", [&](auto tag) {
    using T = decltype(tag);
    using M = opmath_t<T>;
    const size_t n = params.size();
    std::vector<M> inv_bc1(n), inv_bc2(n);
    for (size_t i = 0; i < n; ++i) {
      inv_bc1[i] = bias_correction ? static_cast<M>(1.0 / (1.0 - std::pow(beta1, step[i]))) : M(1);
      inv_bc2[i] = bias_correction ? static_cast<M>(1.0 / (1.0 - std::pow(beta2, step[i]))) : M(1);
    }
    const fl_optim::LambScalars<M> sc{static_cast<M>(divisor), static_cast<M>(beta1), static_cast<M>(beta2),
                                      grad_averaging ? static_cast<M>(1.0 - beta1) : M(1),
                                      static_cast<M>(1.0 - beta2), static_cast<M>(eps), static_cast<M>(weight_decay),
                                      static_cast<M>(weight_decay - static_cast<double>(static_cast<M>(weight_decay))),
                                      !adam_w_mode};
    const fl_optim::ChunkOps<T> ops = fl_optim::ops_for<T>();
    // Stage 1: m, v and the per-chunk squared norms of p and of the update.
    for_chunks(chunks, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        const Chunk& ch = chunks[c];
        const int i = ch.tensor;
        ops.lamb1[sc.l2_mode](params[i].const_data_ptr<T>() + ch.begin, grads[i].const_data_ptr<T>() + ch.begin,
                  exp_avgs[i].data_ptr<T>() + ch.begin, exp_avg_sqs[i].data_ptr<T>() + ch.begin,
                  ch.end - ch.begin, sc, inv_bc1[i], inv_bc2[i], &sum_p[c], &sum_u[c]);
      }
    });
    // Per-tensor trust ratio (chunks of a tensor are consecutive; summed in order: deterministic).
    std::vector<M> step_lr(n);
    for (int64_t c = 0, i = 0; i < static_cast<int64_t>(n); ++i) {
      double tp = 0.0, tu = 0.0;
      for (; c < nc && chunks[c].tensor == i; ++c) {
        tp += sum_p[c];
        tu += sum_u[c];
      }
      const double pn = std::sqrt(tp), un = std::sqrt(tu);
      const bool trust = use_nvlamb || weight_decay != 0.0;
      const double ratio = (trust && pn > 0.0 && un > 0.0) ? pn / un : 1.0;
      step_lr[i] = static_cast<M>(lr * ratio);
    }
    // Stage 2: recompute the update from m, v, p and apply it.
    for_chunks(chunks, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        const Chunk& ch = chunks[c];
        const int i = ch.tensor;
        ops.lamb2[sc.l2_mode](params[i].data_ptr<T>() + ch.begin, exp_avgs[i].const_data_ptr<T>() + ch.begin,
                  exp_avg_sqs[i].const_data_ptr<T>() + ch.begin, ch.end - ch.begin, sc, inv_bc1[i],
                  inv_bc2[i], step_lr[i]);
      }
    });
  });
}

at::Tensor multi_sumsq(at::TensorList tensors) {
  at::Tensor out = at::zeros({static_cast<int64_t>(tensors.size())}, at::kDouble);
  std::vector<at::Tensor> ts;
  for (const auto& t : tensors) {
    TORCH_CHECK(t.device().is_cpu() && t.is_non_overlapping_and_dense(),
                "multi_sumsq: tensors must be dense CPU tensors");
    ts.push_back(t);
  }
  const std::vector<Chunk> chunks = make_chunks(ts);
  const int64_t nc = static_cast<int64_t>(chunks.size());
  std::vector<double> part(nc);
  for_chunks(chunks, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      const Chunk& ch = chunks[c];
      dispatch_param_types(ts[ch.tensor].scalar_type(), "multi_sumsq", [&](auto tag) {
        using T = decltype(tag);
        part[c] = fl_optim::ops_for<T>().sumsq(ts[ch.tensor].const_data_ptr<T>() + ch.begin, ch.end - ch.begin);
      });
    }
  });
  double* o = out.data_ptr<double>();
  for (int64_t c = 0; c < nc; ++c) o[chunks[c].tensor] += part[c];
  return out;
}

// Shape and dtype only, for torch.compile's fake tensors: [len(tensors)] fp64.
at::Tensor multi_sumsq_meta(at::TensorList tensors) {
  return at::empty({static_cast<int64_t>(tensors.size())}, at::TensorOptions().dtype(at::kDouble).device(at::kMeta));
}

// Which ISA copy the optimizer kernels run now ("avx512", "avx2" or "base").
std::string optim_isa() { return fusionlens::cpu_isa_name(fusionlens::cpu_isa()); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusionlens, m) {
  m.def("optim_isa() -> str", &optim_isa);
  m.def("adamw_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
        "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs, Tensor(e!)[] steps, float lr, "
        "float beta1, float beta2, float eps, float weight_decay, bool amsgrad, bool maximize) -> ()");
  m.def("lamb_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
        "Tensor(c!)[] exp_avg_sqs, Tensor(e!)[] steps, float lr, float beta1, float beta2, "
        "float eps, float weight_decay, Tensor grad_divisor, bool bias_correction, "
        "bool adam_w_mode, bool grad_averaging, bool use_nvlamb) -> ()");
  m.def("multi_sumsq(Tensor[] tensors) -> Tensor");
  m.impl("adamw_step_", c10::DispatchKey::CPU, TORCH_FN(adamw_step_));
  m.impl("lamb_step_", c10::DispatchKey::CPU, TORCH_FN(lamb_step_));
  m.impl("multi_sumsq", c10::DispatchKey::CPU, TORCH_FN(multi_sumsq));
  m.impl("multi_sumsq", c10::DispatchKey::Meta, TORCH_FN(multi_sumsq_meta));
}
