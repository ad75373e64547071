// The per-chunk loops of kernels/csrc/optim.cpp (AdamW, the two LAMB stages, sum of squares),
// included there once per instruction set (AVX-512, AVX2+FMA, the build's baseline) inside
// `#pragma GCC target` and a namespace of its own (see per_isa.h), so they vectorize at full
// width on any x86-64 without -march=native. No include guard: included several times on
// purpose. Needs optim.cpp's AdamScalars / LambScalars / ChunkOps declared before the includes.
//
// No -ffast-math: the sums (LAMB's ||p||^2 and ||update||^2, multi_sumsq) are `omp simd`
// reductions, which GCC may reassociate into vector lanes without it; the lanes are combined in a
// fixed order, so a step does not depend on the thread count. AdamW's lerp and addcmul use an
// FMA where ATen's vectorized CPU kernels do (the AVX2 and AVX-512 copies, with FMA hardware);
// the baseline copy (CPUs without FMA) writes them as a multiply and an add, as ATen's default
// kernels do there, instead of std::fma (a library call without FMA hardware: ~25 ns/element).
// The AdamW loop is compiled without implicit FMA contraction (GCC's default fuses p * decay +
// update, which ATen's fused kernel rounds twice), so its vector copies are ATen's bit for bit.
// Every loop here must vectorize (check with `objdump -d` or -fopt-info-vec-missed after a change):
// a run-time flag tested inside, or c10's 16-bit conversions (elem_impl.h), have each left one scalar.

template <typename M>
FL_INLINE M fmadd(M a, M b, M c) {
#if FL_ISA >= 256
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

#include "elem_impl.h"  // load<M>(p, k), store(p, k, x) on float / bf16 / fp16 storage

// One chunk of torch.optim.AdamW's single-tensor step (vmax: AMSGrad's running max, AMSGRAD only).
// AMSGRAD and LERP_LOW (which side torch.lerp starts from) are template parameters: a branch or a
// select on a run-time flag in the loop kept the bf16 copies from vectorizing.
template <typename T, typename M, bool AMSGRAD, bool LERP_LOW>
__attribute__((optimize("fp-contract=off")))  // no implicit FMAs: ATen's roundings (file comment)
void adamw_loop(T* p, const T* g, T* m, T* v, T* vmax, int64_t len, const AdamScalars<M>& s) {
  const M sign = s.maximize ? M(-1) : M(1);
  const M decay = s.decay, w1 = s.w1, b2 = s.b2, w2 = s.w2, e = s.eps, ss = s.step_size, bc2s = s.bc2_sqrt;
#pragma omp simd
  for (int64_t k = 0; k < len; ++k) {
    const M gk = sign * load<M>(g, k);
    const M pk = load<M>(p, k) * decay;
    const M mk0 = load<M>(m, k);
    // torch.lerp's two-sided formula (exact at weight 0 and 1), as ATen's vectorized kernel
    const M mk = LERP_LOW ? fmadd(w1, gk - mk0, mk0) : fmadd(w1 - M(1), gk - mk0, gk);
    const M vk = fmadd(w2 * gk, gk, load<M>(v, k) * b2);
    M vd = vk;
    if constexpr (AMSGRAD) {
      // torch.maximum's NaN rule (a NaN on either side wins), as torch.optim.AdamW's loop: std::max
      // would keep the old max past a NaN moment, and the state dict would differ from torch's.
      const M vm = load<M>(vmax, k);
      vd = ((vk > vm) | (vk != vk)) ? vk : vm;  // `|`, not `||`: no branch, so the loop vectorizes
      store(vmax, k, vd);
    }
    const M denom = std::sqrt(vd) / bc2s + e;
    store(p, k, pk + ((-ss) * mk) / denom);
    store(m, k, mk);
    store(v, k, vk);
  }
}

template <typename T, typename M, bool AMSGRAD>
void adamw_chunk(T* p, const T* g, T* m, T* v, T* vmax, int64_t len, const AdamScalars<M>& s) {
  if (s.lerp_low) {
    adamw_loop<T, M, AMSGRAD, true>(p, g, m, v, vmax, len, s);
  } else {
    adamw_loop<T, M, AMSGRAD, false>(p, g, m, v, vmax, len, s);
  }
}

// x + wd * p with wd = hi + lo (LambScalars), rounded about once: two fused multiply-adds where
// the copy has FMA; in fp64 in the base copy (std::fma would be a libm call per element there).
template <typename M>
FL_INLINE M add_decay(M x, M hi, M lo, M p) {
#if FL_ISA >= 256
  return std::fma(lo, p, std::fma(hi, p, x));
#else
  return static_cast<M>(static_cast<double>(x) +
                        (static_cast<double>(hi) + static_cast<double>(lo)) * static_cast<double>(p));
#endif
}

// LAMB stage 1 on one chunk: m, v updated; returns the chunk's sum(p^2) and sum(update^2), the
// update recomputed from the stored (rounded) m and v exactly as stage 2 does. Summed in fp64, in
// the chunk as across chunks (caller): fp32 lanes over a 4K-element tensor put 3e-6 into a trust
// ratio, which a large step (a tiny ||update||) carried to 8e-6 in the params (fuzz seed 700594,
// torch.norm's cascade sum 7e-8). L2 is a template parameter: a run-time mode test in the loop
// kept GCC from vectorizing it at all (2.3-5x slower steps until 2026-12-03; docs/kernels.md).
template <typename T, typename M, bool L2>
void lamb_stage1(const T* p, const T* g, T* m, T* v, int64_t len, const LambScalars<M>& s, M ib1, M ib2,
                 double* sum_p, double* sum_u) {
  const M clip = s.clip, b1 = s.b1, b2 = s.b2, b3 = s.b3, w2 = s.w2, e = s.eps;
  const M hi = s.wd_hi, lo = s.wd_lo;
  double sp = 0, su = 0;
#pragma omp simd reduction(+ : sp, su)
  for (int64_t k = 0; k < len; ++k) {
    const M pk = load<M>(p, k);
    const M gc = load<M>(g, k) / clip;  // a division, as eager's: bit-equal clipped grads
    const M gk = L2 ? add_decay(gc, hi, lo, pk) : gc;
    const M mk = b1 * load<M>(m, k) + b3 * gk;
    const M vk = b2 * load<M>(v, k) + w2 * gk * gk;
    const M mt = store(m, k, mk), vt = store(v, k, vk);  // as stored (rounded to T)
    const M r = (mt * ib1) / (std::sqrt(vt * ib2) + e);
    const M u = L2 ? r : add_decay(r, hi, lo, pk);
    sp += static_cast<double>(pk) * static_cast<double>(pk);
    su += static_cast<double>(u) * static_cast<double>(u);
  }
  *sum_p = sp;
  *sum_u = su;
}

// LAMB stage 2 on one chunk: recompute the update from m, v, p and apply p -= step_lr * update.
template <typename T, typename M, bool L2>
void lamb_stage2(T* p, const T* m, const T* v, int64_t len, const LambScalars<M>& s, M ib1, M ib2, M step_lr) {
  const M e = s.eps, hi = s.wd_hi, lo = s.wd_lo;
#pragma omp simd
  for (int64_t k = 0; k < len; ++k) {
    const M pk = load<M>(p, k);
    const M r = (load<M>(m, k) * ib1) / (std::sqrt(load<M>(v, k) * ib2) + e);
    const M u = L2 ? r : add_decay(r, hi, lo, pk);
    store(p, k, pk - step_lr * u);
  }
}

// sum(x^2) of one chunk in fp64 (elements widened through the math type, as torch's norm does).
template <typename T, typename M>
double sumsq_chunk(const T* x, int64_t len) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < len; ++k) {
    const double xk = static_cast<double>(load<M>(x, k));
    s += xk * xk;
  }
  return s;
}

template <typename T>
ChunkOps<T> chunk_ops() {
  using M = opmath_t<T>;
  return {&adamw_chunk<T, M, false>, &adamw_chunk<T, M, true>, {&lamb_stage1<T, M, false>, &lamb_stage1<T, M, true>},
          {&lamb_stage2<T, M, false>, &lamb_stage2<T, M, true>}, &sumsq_chunk<T, M>};
}
