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
//              use_nvlamb)
//       apex FusedLAMB: stage 1 updates m, v and reduces ||p||^2 and ||update||^2 per chunk
//       (fp32 within a chunk, fp64 across), stage 2 recomputes the update from m, v, p and applies p -= lr * ratio * update
//       with ratio = ||p|| / ||update|| (1 when either is 0, and when weight_decay == 0 unless
//       use_nvlamb). Recomputing costs no more traffic than storing the update, and needs no
//       scratch memory and leaves the grads untouched.
//   multi_sumsq(tensors) -> float64 [n]: per-tensor sum of squares (global grad-norm clipping).
#include "common.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

namespace {

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

template <typename T>
using opmath_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

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
// addcmul). It is not bit-exact (the build's -ffast-math may contract or use reciprocals, and
// ATen's vectorized sqrt is not always correctly rounded), but within fp32 rounding per step.
// One chunk of AdamW; AMSGRAD is a template parameter so the loop has no conditional store and
// vectorizes. The ternaries on loop-invariant flags are if-converted.
template <typename T, typename M, bool AMSGRAD>
inline void adamw_chunk(T* p, const T* g, T* m, T* v, T* vmax, int64_t len, M decay, M w1, M b2,
                        M w2, M e, M ss, M bc2s, bool lerp_low, bool maximize) {
  const M sign = maximize ? M(-1) : M(1);
#pragma omp simd
  for (int64_t k = 0; k < len; ++k) {
    const M gk = sign * static_cast<M>(g[k]);
    const M pk = static_cast<M>(p[k]) * decay;
    const M mk0 = static_cast<M>(m[k]);
    // torch.lerp's two-sided formula (exact at weight 0 and 1), as ATen's vectorized FMA
    const M mk = lerp_low ? std::fma(w1, gk - mk0, mk0) : std::fma(w1 - M(1), gk - mk0, gk);
    const M vk = std::fma(w2 * gk, gk, static_cast<M>(v[k]) * b2);
    M vd = vk;
    if constexpr (AMSGRAD) {
      vd = std::max(static_cast<M>(vmax[k]), vk);
      vmax[k] = static_cast<T>(vd);
    }
    const M denom = std::sqrt(vd) / bc2s + e;
    p[k] = static_cast<T>(pk + ((-ss) * mk) / denom);
    m[k] = static_cast<T>(mk);
    v[k] = static_cast<T>(vk);
  }
}

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
    const M decay = static_cast<M>(1.0 - lr * weight_decay);
    const M w1 = static_cast<M>(1.0 - beta1), b2 = static_cast<M>(beta2), w2 = static_cast<M>(1.0 - beta2);
    const M e = static_cast<M>(eps);
    const bool lerp_low = (1.0 - beta1) < 0.5;
    for_chunks(chunks, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        const Chunk& ch = chunks[c];
        const int i = ch.tensor;
        T* p = params[i].data_ptr<T>() + ch.begin;
        const T* g = grads[i].const_data_ptr<T>() + ch.begin;
        T* m = exp_avgs[i].data_ptr<T>() + ch.begin;
        T* v = exp_avg_sqs[i].data_ptr<T>() + ch.begin;
        T* vmax = amsgrad ? max_exp_avg_sqs[i].data_ptr<T>() + ch.begin : nullptr;
        const M ss = step_size[i], bc2s = bc2_sqrt[i];
        const int64_t len = ch.end - ch.begin;
        if (amsgrad) {
          adamw_chunk<T, M, true>(p, g, m, v, vmax, len, decay, w1, b2, w2, e, ss, bc2s, lerp_low, maximize);
        } else {
          adamw_chunk<T, M, false>(p, g, m, v, vmax, len, decay, w1, b2, w2, e, ss, bc2s, lerp_low, maximize);
        }
      }
    });
  });
}


void lamb_step_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                at::TensorList exp_avg_sqs, at::TensorList steps, double lr, double beta1,
                double beta2, double eps, double weight_decay, double grad_divisor,
                bool bias_correction, bool adam_w_mode, bool grad_averaging, bool use_nvlamb) {
  check_lists("lamb_step_", params, {{"grads", grads}, {"exp_avgs", exp_avgs}, {"exp_avg_sqs", exp_avg_sqs}});
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
    const M b1 = static_cast<M>(beta1), b2 = static_cast<M>(beta2), w2 = static_cast<M>(1.0 - beta2);
    const M b3 = grad_averaging ? static_cast<M>(1.0 - beta1) : M(1);
    const M e = static_cast<M>(eps), wd = static_cast<M>(weight_decay);
    const M inv_clip = static_cast<M>(1.0 / grad_divisor);
    const M l2 = adam_w_mode ? M(0) : wd, dec = adam_w_mode ? wd : M(0);
    // Stage 1: m, v and the per-chunk squared norms of p and of the update.
    for_chunks(chunks, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        const Chunk& ch = chunks[c];
        const int i = ch.tensor;
        const T* p = params[i].const_data_ptr<T>() + ch.begin;
        const T* g = grads[i].const_data_ptr<T>() + ch.begin;
        T* m = exp_avgs[i].data_ptr<T>() + ch.begin;
        T* v = exp_avg_sqs[i].data_ptr<T>() + ch.begin;
        const M ib1 = inv_bc1[i], ib2 = inv_bc2[i];
        // Per-chunk sums in the math type (16 fp32 lanes over <= 32K elements: ~1e-6 relative),
        // then fp64 across chunks.
        M sp = 0, su = 0;
        const int64_t len = ch.end - ch.begin;
#pragma omp simd reduction(+ : sp, su)
        for (int64_t k = 0; k < len; ++k) {
          const M pk = static_cast<M>(p[k]);
          const M gk = static_cast<M>(g[k]) * inv_clip + l2 * pk;
          const M mk = b1 * static_cast<M>(m[k]) + b3 * gk;
          const M vk = b2 * static_cast<M>(v[k]) + w2 * gk * gk;
          const T mt = static_cast<T>(mk), vt = static_cast<T>(vk);
          m[k] = mt;
          v[k] = vt;
          // the update from the stored (rounded) m, v, exactly as stage 2 recomputes it
          const M u = (static_cast<M>(mt) * ib1) / (std::sqrt(static_cast<M>(vt) * ib2) + e) + dec * pk;
          sp += pk * pk;
          su += u * u;
        }
        sum_p[c] = sp;
        sum_u[c] = su;
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
        T* p = params[i].data_ptr<T>() + ch.begin;
        const T* m = exp_avgs[i].const_data_ptr<T>() + ch.begin;
        const T* v = exp_avg_sqs[i].const_data_ptr<T>() + ch.begin;
        const M ib1 = inv_bc1[i], ib2 = inv_bc2[i], slr = step_lr[i];
        const int64_t len = ch.end - ch.begin;
#pragma omp simd
        for (int64_t k = 0; k < len; ++k) {
          const M pk = static_cast<M>(p[k]);
          const M u = (static_cast<M>(m[k]) * ib1) / (std::sqrt(static_cast<M>(v[k]) * ib2) + e) + dec * pk;
          p[k] = static_cast<T>(pk - slr * u);
        }
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
        const T* x = ts[ch.tensor].const_data_ptr<T>() + ch.begin;
        double s = 0.0;
        const int64_t len = ch.end - ch.begin;
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < len; ++k) {
          const double xk = static_cast<double>(static_cast<opmath_t<T>>(x[k]));
          s += xk * xk;
        }
        part[c] = s;
      });
    }
  });
  double* o = out.data_ptr<double>();
  for (int64_t c = 0; c < nc; ++c) o[chunks[c].tensor] += part[c];
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusionlens, m) {
  m.def("adamw_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
        "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs, Tensor(e!)[] steps, float lr, "
        "float beta1, float beta2, float eps, float weight_decay, bool amsgrad, bool maximize) -> ()");
  m.def("lamb_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
        "Tensor(c!)[] exp_avg_sqs, Tensor(e!)[] steps, float lr, float beta1, float beta2, "
        "float eps, float weight_decay, float grad_divisor, bool bias_correction, "
        "bool adam_w_mode, bool grad_averaging, bool use_nvlamb) -> ()");
  m.def("multi_sumsq(Tensor[] tensors) -> Tensor");
  m.impl("adamw_step_", c10::DispatchKey::CPU, TORCH_FN(adamw_step_));
  m.impl("lamb_step_", c10::DispatchKey::CPU, TORCH_FN(lamb_step_));
  m.impl("multi_sumsq", c10::DispatchKey::CPU, TORCH_FN(multi_sumsq));
}
