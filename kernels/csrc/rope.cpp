// Rotary position embedding on CPU (FusionLens `cpu` provider), rotate-half layout as in Hugging
// Face's `apply_rotary_pos_emb`: out = x * cos + rotate_half(x) * sin, rotate_half(x) =
// cat(-x2, x1) with x1, x2 the two halves of the head dim. Forward and backward (the transpose
// rotation: grad_x1 = g1 * c1 + g2 * s2, grad_x2 = g2 * c2 - g1 * s1).
//
// x is [batch, heads, seq, head_dim] with any strides whose last one is 1, so the usual
// `view(B, S, H, D).transpose(1, 2)` input is read in place, without the copy eager's
// elementwise ops would make, and rows are walked in x's memory order; the output takes x's
// layout, as eager's does (kernels/rope.py allocates it); cos/sin are fp32 [cos_batch, seq, head_dim] with cos_batch 1 or
// batch (broadcast over heads). Eager writes four full-size intermediates (x*cos, the rotated
// halves, the cat, *sin) and reads them back; this reads x once and writes the output once.
// The row loop lives in rope_impl.h, compiled once per instruction set (AVX-512, AVX2+FMA, the
// build's baseline) and picked at run time (common.h cpu_isa; FUSIONLENS_CPU_ISA lowers it).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "common.h"

#include <algorithm>
#include <memory>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif


namespace fl_rope {

// What one call works on: x [B, H, S, D] (any strides, unit last), out [B, H, S, D] (its own
// strides, unit last), cos/sin fp32 [cos_batch, S, D] (cb: their batch stride, 0 when shared).
// heads_inner: rows are walked (b, s, h) instead of (b, h, s), x's memory order for the usual
// `view(B, S, H, D).transpose(1, 2)` input.
struct RopeArgs {
  const void* x;
  void* out;
  const float *cos, *sin;
  const float *wcos, *wsin;  // bf16 rows: cos / sin in word order (split_trig), or null
  int64_t H, S, D, sb, sh, ss, ob, oh, os, cb;
  bool backward, heads_inner;
};
using RowsFn = void (*)(const RopeArgs&, int64_t r0, int64_t r1);
using SplitFn = void (*)(const float* src, float* dst, int64_t rows, int64_t D);

#define FL_ISA_IMPL "rope_impl.h"
#include "per_isa.h"

// The row loop of the best copy this CPU runs (FUSIONLENS_CPU_ISA lowers it).
template <typename T>
RowsFn rows_for() { return FL_ISA_PICK(rows_fn<T>()); }
inline SplitFn split_for() { return FL_ISA_PICK(split_fn()); }

}  // namespace fl_rope

namespace {

// Rows (of D) a thread takes at a time, for the rotation and the tables' split alike.
int64_t row_grain(int64_t D) { return std::max<int64_t>(1, 8192 / D); }

// cos / sin in the word order bf16 rows are rotated in (rope_impl.h split_trig_rows), in an
// uninitialised buffer (a zeroed std::vector spent a memset on every call), rows split across
// the threads as the rotation's are (per-batch tables are 1/H of the rows rotated).
std::unique_ptr<float[]> split_trig(const at::Tensor& t, int64_t D) {
  std::unique_ptr<float[]> out(new float[t.numel()]);
  const fl_rope::SplitFn split = fl_rope::split_for();
  const float* src = t.data_ptr<float>();
  float* dst = out.get();
  at::parallel_for(0, t.numel() / D, row_grain(D),
                   [&](int64_t r0, int64_t r1) { split(src + r0 * D, dst + r0 * D, r1 - r0, D); });
  return out;
}

template <typename T>
void rope_impl(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out,
               bool backward) {
  const int64_t H = x.size(1), S = x.size(2), D = x.size(3);
  const bool heads_inner = H > 1 && S > 1 && x.stride(1) < x.stride(2);
  const bool words = std::is_same_v<T, c10::BFloat16> && D % 4 == 0;
  const std::unique_ptr<float[]> wc = words ? split_trig(cos, D) : nullptr;
  const std::unique_ptr<float[]> ws = words ? split_trig(sin, D) : nullptr;
  const fl_rope::RopeArgs a{x.data_ptr<T>(), out.data_ptr<T>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                            wc.get(), ws.get(), H, S, D, x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1),
                            out.stride(2), cos.size(0) == 1 ? 0 : S * D, backward, heads_inner};
  const fl_rope::RowsFn rows = fl_rope::rows_for<T>();
  at::parallel_for(0, x.size(0) * x.size(1) * S, row_grain(D),
                   [&](int64_t b0, int64_t e0) { rows(a, b0, e0); });
}

void rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor out,
                bool backward) {
  TORCH_CHECK(x.dim() == 4, "rope: x must be [batch, heads, seq, head_dim]");
  TORCH_CHECK(x.size(3) % 2 == 0, "rope: head_dim must be even");
  TORCH_CHECK(x.size(3) <= 1 || x.stride(3) == 1, "rope: x's last dim must be contiguous");
  TORCH_CHECK(out.sizes() == x.sizes() && (x.size(3) <= 1 || out.stride(3) == 1) &&
              out.scalar_type() == x.scalar_type(), "rope: out must be x's shape and dtype, last dim contiguous");
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

// Which ISA copy the rope kernels run now ("avx512", "avx2" or "base").
std::string rope_isa() { return fusionlens::cpu_isa_name(fusionlens::cpu_isa()); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusionlens, m) {
  m.def("rope_isa() -> str", &rope_isa);
  m.def("rope_apply(Tensor x, Tensor cos, Tensor sin, Tensor(a!) out, bool backward) -> ()");
}

TORCH_LIBRARY_IMPL(fusionlens, CPU, m) {
  m.impl("rope_apply", &rope_apply);
}
