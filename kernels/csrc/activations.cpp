// Fused activations on CPU (FusionLens `cpu` provider): GELU (erf / tanh), bias + GELU, and the
// gated units SwiGLU = silu(a) * b and GeGLU = gelu(a) * b, forward and backward.
//
// One pass over memory per call: the eager chain writes and re-reads every intermediate
// (x + bias, gelu(x), silu(a)), these kernels read the inputs once and write the outputs once.
// Rows run in parallel (at::parallel_for, OpenMP); inner loops work on fp32 chunks that fit in L1
// (bf16/fp16 are widened on load and rounded to nearest-even on store) and vectorize through
// `#pragma omp simd`: GELU uses an inline rational erf and an inline exp (common.h), SiLU libmvec expf.
// Outputs are allocated by the caller (Python, `kernels.registry.new_output`) and passed in.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "common.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>


// Let GCC call libmvec's vector exp inside `omp simd` loops. glibc declares these only
// under __FAST_MATH__, which -fno-finite-math-only (needed so NaN/Inf keep their meaning) turns off.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
extern "C" {
float expf(float) __attribute__((__simd__("notinbranch")));
}
#endif

namespace {

using fusionlens::exp_nonpos;

constexpr int64_t kChunk = 1024;  // fp32 elements per L1 buffer
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
constexpr float kBeta = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

// fp32 <-> storage dtype, a span at a time (vectorized bf16 bit ops / F16C), from common.h.
template <typename T>
inline void load_f(const T* src, float* dst, int64_t n) { fusionlens::to_float<T>(src, dst, n); }
template <typename T>
inline void store_f(const float* src, T* dst, int64_t n) { fusionlens::from_float<T>(src, dst, n); }

// Run body(in_f, out_f, len, start) over [0, n) in fp32 chunks. For float storage the body sees
// the tensors' own memory (no copies); otherwise L1 buffers converted on the way in and out.
template <typename T, size_t NI, size_t NO, typename Body>
inline void map_chunks(const std::array<const T*, NI>& in, const std::array<T*, NO>& out,
                       int64_t n, const Body& body) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t s = 0; s < n; s += kChunk) {
      int64_t len = std::min(kChunk, n - s);
      std::array<const float*, NI> fi;
      std::array<float*, NO> fo;
      for (size_t k = 0; k < NI; ++k) fi[k] = in[k] + s;
      for (size_t k = 0; k < NO; ++k) fo[k] = out[k] + s;
      body(fi, fo, len, s);
    }
  } else {
    alignas(64) float ibuf[NI > 0 ? NI : 1][kChunk];
    alignas(64) float obuf[NO][kChunk];
    for (int64_t s = 0; s < n; s += kChunk) {
      int64_t len = std::min(kChunk, n - s);
      std::array<const float*, NI> fi;
      std::array<float*, NO> fo;
      for (size_t k = 0; k < NI; ++k) {
        load_f(in[k] + s, ibuf[k], len);
        fi[k] = ibuf[k];
      }
      for (size_t k = 0; k < NO; ++k) fo[k] = obuf[k];
      body(fi, fo, len, s);
      for (size_t k = 0; k < NO; ++k) store_f(obuf[k], out[k] + s, len);
    }
  }
}

inline uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Integer select (all-ones mask picks a): vectorizes at any -march, unlike a float ?: under the
// default -ftrapping-math.
inline uint32_t select_bits(uint32_t mask, uint32_t a, uint32_t b) { return (a & mask) | (b & ~mask); }

constexpr uint32_t kOneBits = 0x3f800000u;  // 1.0f
constexpr uint32_t kErfSatBits = 0x40b504f3u;  // 4 sqrt(2) = 5.656854f: erf(x / sqrt 2) rounds to 1 beyond

// erf(|x| / sqrt 2) for the GELU: a P(a^2) / Q(a^2) with a = min(|x|, 4 sqrt 2), a (6, 6)-term
// rational minimax fit made for these kernels (|error| 4e-8 in exact arithmetic, ~3e-7 after
// float rounding, like ATen's A&S 7.1.26 at 1.5e-7, which costs an exp and a division more).
// Q >= 1. The result is clamped to <= 1 and is exactly 1 from 4 sqrt 2 on (+-inf and NaN
// included), so GELU(-inf) = -inf + inf = NaN as in eager; a NaN x makes the GELU NaN through x.
// Plain multiply-adds (contracted to FMA where the target has it) and integer clamps only.
inline float erf_abs_scaled(float x) {
  const uint32_t ab = bits_of(x) & 0x7fffffffu;
  const uint32_t sat = 0u - static_cast<uint32_t>(ab >= kErfSatBits);
  const float a = float_of(ab < kErfSatBits ? ab : kErfSatBits);
  const float a2 = a * a;
  float p = 4.533083400e-08f;
  p = p * a2 + 1.260004006e-05f;
  p = p * a2 + 3.319819656e-04f;
  p = p * a2 + 9.313984517e-03f;
  p = p * a2 + 6.720817696e-02f;
  p = p * a2 + 7.978844278e-01f;
  float q = 1.191676001e-06f;
  q = q * a2 + 7.261164011e-05f;
  q = q * a2 + 1.867185030e-03f;
  q = q * a2 + 2.849126954e-02f;
  q = q * a2 + 2.508987347e-01f;
  q = q * a2 + 1.0f;
  const uint32_t rb = bits_of(a * p / q);
  return float_of(select_bits(sat, kOneBits, rb < kOneBits ? rb : kOneBits));
}

// sigmoid(z) = 1 / (1 + exp(-z)) with the inline exp of a non-positive argument: e = exp(-|z|),
// then 1 / (1 + e) for z >= 0 or e / (1 + e) (picked by the sign bit). No overflow;
// sigmoid(+inf) = 1, sigmoid(-inf) = 0; NaN stays NaN.
inline float sigmoid(float z) {
  const uint32_t zb = bits_of(z);
  const float e = exp_nonpos(-float_of(zb & 0x7fffffffu));
  const uint32_t neg = 0u - (zb >> 31);
  return float_of(select_bits(neg, bits_of(e), kOneBits)) / (1.0f + e);
}

// ---- the activations, in fp32 (same algebra as ATen, so NaN/Inf land where eager's do) ------
enum Kind : int64_t { kSilu = 0, kGeluErf = 1, kGeluTanh = 2 };

// GELU (erf) = x (1 + erf(x / sqrt 2)) / 2 = (x + |x| erf(|x| / sqrt 2)) / 2.
// GELU (tanh) is x * sigmoid(2u): 0.5 (1 + tanh(u)) = sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3);
// this form has no 1 + tanh cancellation for negative x and needs one exp.
template <int64_t K>
inline float act(float x) {
  if constexpr (K == kSilu) {
    return x / (1.0f + expf(-x));
  } else if constexpr (K == kGeluErf) {
    return 0.5f * (x + std::fabs(x) * erf_abs_scaled(x));
  } else {
    return x * sigmoid(2.0f * kBeta * (kKappa * x * (x * x) + x));
  }
}

// act(x) and act'(x) together (shared transcendental).
template <int64_t K>
inline void act_and_grad(float x, float& y, float& dy) {
  if constexpr (K == kSilu) {
    float s = 1.0f / (1.0f + expf(-x));
    y = x * s;
    dy = s * (1.0f + x * (1.0f - s));
  } else if constexpr (K == kGeluErf) {
    const float cdf = 0.5f + 0.5f * std::copysign(erf_abs_scaled(x), x);
    y = x * cdf;
    dy = cdf + x * kInvSqrt2Pi * exp_nonpos(-0.5f * x * x);
  } else {
    // d/dx x s(2u) = s + x * 2 s (1 - s) * du/dx, du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
    const float x2 = x * x;
    const float s = sigmoid(2.0f * kBeta * (kKappa * x * x2 + x));
    y = x * s;
    dy = s + 2.0f * x * s * (1.0f - s) * kBeta * (3.0f * kKappa * x2 + 1.0f);
  }
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
  if (!bias.has_value()) {
    at::parallel_for(0, numel, 16 * kChunk, [&](int64_t b, int64_t e) {
      map_chunks<T, 1, 1>({xp + b}, {op + b}, e - b, [&](auto& in, auto& o, int64_t len, int64_t) {
        const float* xi = in[0];
        float* yo = o[0];
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) yo[i] = act<K>(xi[i]);
      });
    });
    return;
  }
  const int64_t n = x.size(-1), rows = numel / n;
  std::vector<float> bf(n);
  load_f(bias->data_ptr<T>(), bf.data(), n);
  const float* bp = bf.data();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16 * kChunk / n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      map_chunks<T, 1, 1>({xp + r * n}, {op + r * n}, n, [&](auto& in, auto& o, int64_t len, int64_t s) {
        const float* xi = in[0];
        const float* bi = bp + s;
        float* yo = o[0];
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) yo[i] = act<K>(xi[i] + bi[i]);
      });
    }
  });
}

// grad_x = grad * act'(x [+ bias]); grad_bias = sum over rows of grad_x (fp32 partial sums per
// thread, then reduced), so the bias gradient costs no extra pass over memory.
template <typename T, int64_t K>
void act_bwd_impl(const at::Tensor& grad, const at::Tensor& x, const c10::optional<at::Tensor>& bias,
                  at::Tensor& grad_x, const c10::optional<at::Tensor>& grad_bias) {
  const T* gp = grad.data_ptr<T>();
  const T* xp = x.data_ptr<T>();
  T* gxp = grad_x.data_ptr<T>();
  const int64_t numel = x.numel();
  if (!bias.has_value()) {
    at::parallel_for(0, numel, 16 * kChunk, [&](int64_t b, int64_t e) {
      map_chunks<T, 2, 1>({gp + b, xp + b}, {gxp + b}, e - b, [&](auto& in, auto& o, int64_t len, int64_t) {
        const float* g = in[0];
        const float* xi = in[1];
        float* gx = o[0];
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) {
          float y, dy;
          act_and_grad<K>(xi[i], y, dy);
          gx[i] = g[i] * dy;
        }
      });
    });
    return;
  }
  const int64_t n = x.size(-1), rows = numel / n;
  std::vector<float> bf(n);
  load_f(bias->data_ptr<T>(), bf.data(), n);
  const float* bp = bf.data();
  const int64_t nthreads = at::get_num_threads();
  std::vector<float> partial(grad_bias.has_value() ? nthreads * n : 0, 0.0f);
  at::parallel_for(0, rows, std::max<int64_t>(1, 16 * kChunk / n), [&](int64_t b, int64_t e) {
    float* acc = partial.empty() ? nullptr : partial.data() + at::get_thread_num() * n;
    for (int64_t r = b; r < e; ++r) {
      map_chunks<T, 2, 1>({gp + r * n, xp + r * n}, {gxp + r * n}, n,
                          [&](auto& in, auto& o, int64_t len, int64_t s) {
        const float* g = in[0];
        const float* xi = in[1];
        const float* bi = bp + s;
        float* gx = o[0];
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) {
          float y, dy;
          act_and_grad<K>(xi[i] + bi[i], y, dy);
          gx[i] = g[i] * dy;
        }
        if (acc != nullptr) {
          float* a = acc + s;
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) a[i] += gx[i];  // fp32, before rounding to T
        }
      });
    }
  });
  if (grad_bias.has_value()) {
    std::vector<float> total(n, 0.0f);
    for (int64_t t = 0; t < nthreads; ++t) {
      const float* a = partial.data() + t * n;
      for (int64_t i = 0; i < n; ++i) total[i] += a[i];
    }
    store_f(total.data(), grad_bias->data_ptr<T>(), n);
  }
}

// ---- act(a) * b ------------------------------------------------------------------------------
template <typename T, int64_t K>
void glu_fwd_impl(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  const T* ap = a.data_ptr<T>();
  const T* bp = b.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, a.numel(), 16 * kChunk, [&](int64_t s0, int64_t e0) {
    map_chunks<T, 2, 1>({ap + s0, bp + s0}, {op + s0}, e0 - s0, [&](auto& in, auto& o, int64_t len, int64_t) {
      const float* av = in[0];
      const float* bv = in[1];
      float* y = o[0];
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) y[i] = act<K>(av[i]) * bv[i];
    });
  });
}

// grad_a = grad * b * act'(a), grad_b = grad * act(a).
template <typename T, int64_t K>
void glu_bwd_impl(const at::Tensor& grad, const at::Tensor& a, const at::Tensor& b,
                  at::Tensor& grad_a, at::Tensor& grad_b) {
  const T* gp = grad.data_ptr<T>();
  const T* ap = a.data_ptr<T>();
  const T* bp = b.data_ptr<T>();
  T* gap = grad_a.data_ptr<T>();
  T* gbp = grad_b.data_ptr<T>();
  at::parallel_for(0, a.numel(), 16 * kChunk, [&](int64_t s0, int64_t e0) {
    map_chunks<T, 3, 2>({gp + s0, ap + s0, bp + s0}, {gap + s0, gbp + s0}, e0 - s0,
                        [&](auto& in, auto& o, int64_t len, int64_t) {
      const float* g = in[0];
      const float* av = in[1];
      const float* bv = in[2];
      float* ga = o[0];
      float* gb = o[1];
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) {
        float y, dy;
        act_and_grad<K>(av[i], y, dy);
        ga[i] = g[i] * bv[i] * dy;
        gb[i] = g[i] * y;
      }
    });
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

void glu_fwd(const at::Tensor& a, const at::Tensor& b, at::Tensor out, int64_t kind) {
  TORCH_CHECK(a.is_contiguous(), "glu_fwd: a must be contiguous");
  check_same(a, b, "glu_fwd b");
  check_same(a, out, "glu_fwd out");
  if (a.numel() == 0) return;
  FL_DISPATCH_DTYPE(a.scalar_type(), "glu_fwd", [&] {
    FL_DISPATCH_KIND(kind, [&] { glu_fwd_impl<scalar_t, K>(a, b, out); });
  });
}

void glu_bwd(const at::Tensor& grad, const at::Tensor& a, const at::Tensor& b, at::Tensor grad_a,
             at::Tensor grad_b, int64_t kind) {
  TORCH_CHECK(a.is_contiguous(), "glu_bwd: a must be contiguous");
  check_same(a, grad, "glu_bwd grad");
  check_same(a, b, "glu_bwd b");
  check_same(a, grad_a, "glu_bwd grad_a");
  check_same(a, grad_b, "glu_bwd grad_b");
  if (a.numel() == 0) return;
  FL_DISPATCH_DTYPE(a.scalar_type(), "glu_bwd", [&] {
    FL_DISPATCH_KIND(kind, [&] { glu_bwd_impl<scalar_t, K>(grad, a, b, grad_a, grad_b); });
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusionlens, m) {
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
