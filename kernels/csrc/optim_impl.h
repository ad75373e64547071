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

template <typename M>
FL_INLINE M fmadd(M a, M b, M c) {
#if FL_ISA >= 256
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// One chunk of torch.optim.AdamW's single-tensor step (vmax: AMSGrad's running max, AMSGRAD only).
// AMSGRAD is a template parameter so the loop has no conditional store and vectorizes.
template <typename T, typename M, bool AMSGRAD>
void adamw_chunk(T* p, const T* g, T* m, T* v, T* vmax, int64_t len, const AdamScalars<M>& s) {
  const M sign = s.maximize ? M(-1) : M(1);
  const M decay = s.decay, w1 = s.w1, b2 = s.b2, w2 = s.w2, e = s.eps, ss = s.step_size, bc2s = s.bc2_sqrt;
  const bool lerp_low = s.lerp_low;
#pragma omp simd
  for (int64_t k = 0; k < len; ++k) {
    const M gk = sign * static_cast<M>(g[k]);
    const M pk = static_cast<M>(p[k]) * decay;
    const M mk0 = static_cast<M>(m[k]);
    // torch.lerp's two-sided formula (exact at weight 0 and 1), as ATen's vectorized kernel
    const M mk = lerp_low ? fmadd(w1, gk - mk0, mk0) : fmadd(w1 - M(1), gk - mk0, gk);
    const M vk = fmadd(w2 * gk, gk, static_cast<M>(v[k]) * b2);
    M vd = vk;
    if constexpr (AMSGRAD) {
      // torch.maximum's NaN rule (a NaN on either side wins), as torch.optim.AdamW's loop: std::max
      // would keep the old max past a NaN moment, and the state dict would differ from torch's.
      const M vm = static_cast<M>(vmax[k]);
      vd = (vk > vm || vk != vk) ? vk : vm;
      vmax[k] = static_cast<T>(vd);
    }
    const M denom = std::sqrt(vd) / bc2s + e;
    p[k] = static_cast<T>(pk + ((-ss) * mk) / denom);
    m[k] = static_cast<T>(mk);
    v[k] = static_cast<T>(vk);
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
// torch.norm's cascade sum 7e-8). With the division by the clipping divisor and the hi + lo decay
// the step costs 7% (4M fp32 params, 1 thread) to 28% (35.4M) more: docs/kernels.md.
template <typename T, typename M>
void lamb_stage1(const T* p, const T* g, T* m, T* v, int64_t len, const LambScalars<M>& s, M ib1, M ib2,
                 double* sum_p, double* sum_u) {
  const M clip = s.clip, b1 = s.b1, b2 = s.b2, b3 = s.b3, w2 = s.w2, e = s.eps;
  const M hi = s.wd_hi, lo = s.wd_lo;
  const bool l2_mode = s.l2_mode;
  double sp = 0, su = 0;
#pragma omp simd reduction(+ : sp, su)
  for (int64_t k = 0; k < len; ++k) {
    const M pk = static_cast<M>(p[k]);
    const M gc = static_cast<M>(g[k]) / clip;  // a division, as eager's: bit-equal clipped grads
    const M gk = l2_mode ? add_decay(gc, hi, lo, pk) : gc;
    const M mk = b1 * static_cast<M>(m[k]) + b3 * gk;
    const M vk = b2 * static_cast<M>(v[k]) + w2 * gk * gk;
    const T mt = static_cast<T>(mk), vt = static_cast<T>(vk);
    m[k] = mt;
    v[k] = vt;
    const M r = (static_cast<M>(mt) * ib1) / (std::sqrt(static_cast<M>(vt) * ib2) + e);
    const M u = l2_mode ? r : add_decay(r, hi, lo, pk);
    sp += static_cast<double>(pk) * static_cast<double>(pk);
    su += static_cast<double>(u) * static_cast<double>(u);
  }
  *sum_p = sp;
  *sum_u = su;
}

// LAMB stage 2 on one chunk: recompute the update from m, v, p and apply p -= step_lr * update.
template <typename T, typename M>
void lamb_stage2(T* p, const T* m, const T* v, int64_t len, const LambScalars<M>& s, M ib1, M ib2, M step_lr) {
  const M e = s.eps, hi = s.wd_hi, lo = s.wd_lo;
  const bool l2_mode = s.l2_mode;
#pragma omp simd
  for (int64_t k = 0; k < len; ++k) {
    const M pk = static_cast<M>(p[k]);
    const M r = (static_cast<M>(m[k]) * ib1) / (std::sqrt(static_cast<M>(v[k]) * ib2) + e);
    const M u = l2_mode ? r : add_decay(r, hi, lo, pk);
    p[k] = static_cast<T>(pk - step_lr * u);
  }
}

// sum(x^2) of one chunk in fp64 (elements widened through the math type, as torch's norm does).
template <typename T, typename M>
double sumsq_chunk(const T* x, int64_t len) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < len; ++k) {
    const double xk = static_cast<double>(static_cast<M>(x[k]));
    s += xk * xk;
  }
  return s;
}

template <typename T>
ChunkOps<T> chunk_ops() {
  using M = opmath_t<T>;
  return {&adamw_chunk<T, M, false>, &adamw_chunk<T, M, true>, &lamb_stage1<T, M>, &lamb_stage2<T, M>,
          &sumsq_chunk<T, M>};
}
