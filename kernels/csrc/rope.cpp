// Rotary position embedding on CPU (FusionLens `cpu` provider), rotate-half layout as in Hugging
// Face's `apply_rotary_pos_emb`: out = x * cos + rotate_half(x) * sin, rotate_half(x) =
// cat(-x2, x1) with x1, x2 the two halves of the head dim. Forward and backward (the transpose
// rotation: grad_x1 = g1 * c1 + g2 * s2, grad_x2 = g2 * c2 - g1 * s1).
//
// x is [batch, heads, seq, head_dim] with any strides whose last one is 1, so the usual
// `view(B, S, H, D).transpose(1, 2)` input is read in place, without the copy eager's
// elementwise ops would make; cos/sin are fp32 [cos_batch, seq, head_dim] with cos_batch 1 or
// batch (broadcast over heads). Eager writes four full-size intermediates (x*cos, the rotated
// halves, the cat, *sin) and reads them back; this reads x once and writes the output once.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "common.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>


namespace {

// fp32 <-> storage dtype, a span at a time (vectorized bf16 bit ops / F16C), from common.h.
template <typename T>
inline void load_f(const T* src, float* dst, int64_t n) { fusionlens::to_float<T>(src, dst, n); }
template <typename T>
inline void store_f(const float* src, T* dst, int64_t n) { fusionlens::from_float<T>(src, dst, n); }

// One row of head_dim = 2 * h, forward or backward (the transposed rotation).
inline void rotate_fwd(const float* __restrict x1, const float* __restrict x2, const float* __restrict c,
                       const float* __restrict s, float* __restrict o1, float* __restrict o2, int64_t h) {
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    o1[j] = x1[j] * c[j] - x2[j] * s[j];
    o2[j] = x2[j] * c[h + j] + x1[j] * s[h + j];
  }
}

inline void rotate_bwd(const float* __restrict g1, const float* __restrict g2, const float* __restrict c,
                       const float* __restrict s, float* __restrict o1, float* __restrict o2, int64_t h) {
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    o1[j] = g1[j] * c[j] + g2[j] * s[h + j];
    o2[j] = g2[j] * c[h + j] - g1[j] * s[j];
  }
}

template <typename T>
void rope_impl(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out,
               bool backward) {
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3), h = D / 2;
  const int64_t sb = x.stride(0), sh = x.stride(1), ss = x.stride(2);
  const int64_t cb = cos.size(0) == 1 ? 0 : S * D;  // cos/sin batch stride (0: shared)
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t rows = B * H * S;
  at::parallel_for(0, rows, std::max<int64_t>(1, 8192 / D), [&](int64_t b0, int64_t e0) {
    std::vector<float> buf(std::is_same_v<T, float> ? 0 : 2 * D);
    for (int64_t r = b0; r < e0; ++r) {
      const int64_t s_i = r % S, bh = r / S, h_i = bh % H, b_i = bh / H;
      const T* xr = xp + b_i * sb + h_i * sh + s_i * ss;
      T* orow = op + r * D;  // out is contiguous [B, H, S, D]
      const float* c = cp + b_i * cb + s_i * D;
      const float* sn = sp + b_i * cb + s_i * D;
      if constexpr (std::is_same_v<T, float>) {
        if (backward) rotate_bwd(xr, xr + h, c, sn, orow, orow + h, h);
        else rotate_fwd(xr, xr + h, c, sn, orow, orow + h, h);
      } else {
        float* in = buf.data();
        float* o = buf.data() + D;
        load_f(xr, in, D);
        if (backward) rotate_bwd(in, in + h, c, sn, o, o + h, h);
        else rotate_fwd(in, in + h, c, sn, o, o + h, h);
        store_f(o, orow, D);
      }
    }
  });
}

void rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor out,
                bool backward) {
  TORCH_CHECK(x.dim() == 4, "rope: x must be [batch, heads, seq, head_dim]");
  TORCH_CHECK(x.size(3) % 2 == 0, "rope: head_dim must be even");
  TORCH_CHECK(x.size(3) <= 1 || x.stride(3) == 1, "rope: x's last dim must be contiguous");
  TORCH_CHECK(out.sizes() == x.sizes() && out.is_contiguous() && out.scalar_type() == x.scalar_type(),
              "rope: out must be contiguous, like x");
  for (const at::Tensor* t : {&cos, &sin}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 3,
                "rope: cos/sin must be contiguous fp32 [cos_batch, seq, head_dim]");
    TORCH_CHECK((t->size(0) == 1 || t->size(0) == x.size(0)) && t->size(1) == x.size(2) &&
                t->size(2) == x.size(3), "rope: cos/sin shape does not match x");
  }
  if (x.numel() == 0) return;
  AT_DISPATCH_SWITCH(x.scalar_type(), "rope_apply",
                     AT_DISPATCH_CASE(at::kFloat, [&] { rope_impl<scalar_t>(x, cos, sin, out, backward); })
                     AT_DISPATCH_CASE(at::kBFloat16, [&] { rope_impl<scalar_t>(x, cos, sin, out, backward); })
                     AT_DISPATCH_CASE(at::kHalf, [&] { rope_impl<scalar_t>(x, cos, sin, out, backward); }));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusionlens, m) {
  m.def("rope_apply(Tensor x, Tensor cos, Tensor sin, Tensor(a!) out, bool backward) -> ()");
}

TORCH_LIBRARY_IMPL(fusionlens, CPU, m) {
  m.impl("rope_apply", &rope_apply);
}
