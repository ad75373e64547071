// Per-element loads and stores of float / bf16 / fp16 storage through a math type M (float or
// double), written so that an `omp simd` loop calling them vectorizes in every ISA copy.
//
// NO include guard on purpose: an *_impl.h includes it inside each per-ISA namespace (see
// per_isa.h), with FL_ISA set (512, 256 or 0). Needs common.h.
//
// Loads and stores go through the 16-bit types' uint16 bits: through c10::BFloat16 / c10::Half
// themselves (a NaN branch, a struct store) every 16-bit loop in optim_impl.h ran scalar.
// bf16: a load is a shift; a store rounds to nearest even in branch-free integer arithmetic with
// c10::BFloat16's result (common.h float_to_bf16_bits_c10). fp16: c10's bit routines (the ones
// c10::Half calls without F16C) in the AVX-512 copy, where GCC if-converts their branches into
// mask registers; elsewhere common.h's mask-select rewrites of them (same bits on every input):
// c10's leave the AVX2 loops scalar, and ours run 5-10% slower under AVX-512 (~14% more
// instructions), so each copy takes the one that vectorizes best there.
FL_INLINE float half_bits_to_float(uint16_t h) {
#if FL_ISA >= 512
  return c10::detail::fp16_ieee_to_fp32_value(h);
#else
  return fusionlens::fp16_bits_to_float(h);
#endif
}

FL_INLINE uint16_t float_to_half_bits(float x) {
#if FL_ISA >= 512
  return c10::detail::fp16_ieee_from_fp32_value(x);
#else
  return fusionlens::float_to_fp16_bits_c10(x);
#endif
}

template <typename M, typename T>
FL_INLINE M load(const T* src, int64_t k) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return static_cast<M>(fusionlens::bf16_bits_to_float(reinterpret_cast<const uint16_t*>(src)[k]));
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    return static_cast<M>(half_bits_to_float(reinterpret_cast<const uint16_t*>(src)[k]));
  } else {
    return static_cast<M>(src[k]);
  }
}

// Stores x rounded to T at dst[k]; returns the stored value in M (what a load would give back).
template <typename T, typename M>
FL_INLINE M store(T* dst, int64_t k, M x) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const uint16_t bits = fusionlens::float_to_bf16_bits_c10(static_cast<float>(x));
    reinterpret_cast<uint16_t*>(dst)[k] = bits;
    return static_cast<M>(fusionlens::bf16_bits_to_float(bits));
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    const uint16_t bits = float_to_half_bits(static_cast<float>(x));
    reinterpret_cast<uint16_t*>(dst)[k] = bits;
    return static_cast<M>(half_bits_to_float(bits));
  } else {
    const T t = static_cast<T>(x);
    dst[k] = t;
    return static_cast<M>(t);
  }
}

// bf16 by 32-bit words: two elements a word (element 2w in the low half: x86 is little-endian)
// widen with a shift and an and, and two rounded results merge back into one word with a shift
// and an or, all within 32-bit lanes, where a per-element loop spends a widening load per vector
// in and a lane-crossing pack per vector out (activations_impl.h, rope_impl.h).
using Bf16 = c10::BFloat16;
template <typename T>
inline constexpr bool kWords = std::is_same_v<T, Bf16>;

FL_INLINE uint32_t word(const Bf16* p, int64_t w) {
  uint32_t u;
  std::memcpy(&u, p + 2 * w, sizeof(u));
  return u;
}
FL_INLINE float lo(uint32_t u) { return fusionlens::float_from_bits(u << 16); }
FL_INLINE float hi(uint32_t u) { return fusionlens::float_from_bits(u & 0xffff0000u); }

// Rounds l and h to bf16 (nearest even) into one word. No NaN select: a NaN whose low 16 bits are
// zero cannot carry out of them in the rounding add and stays a NaN (with its own sign and
// payload, where c10 stores 0x7FC0), and every NaN made from bf16 data is one (an input NaN's
// payload, or the default NaN, 0xFFC00000 on x86). Callers keep fp32 operands' NaNs to such
// NaNs (a bf16 bias; rope's tables canonicalized).
FL_INLINE void put(Bf16* p, int64_t w, float l, float h) {
  const uint32_t lb = fusionlens::float_bits(l), hb = fusionlens::float_bits(h);
  const uint32_t lr = lb + 0x7fffu + ((lb >> 16) & 1u), hr = hb + 0x7fffu + ((hb >> 16) & 1u);
  const uint32_t u = (lr >> 16) | (hr & 0xffff0000u);
  std::memcpy(p + 2 * w, &u, sizeof(u));
}

// put() with c10's NaN (0x7FC0) for any NaN, for a NaN that may have low bits.
FL_INLINE void put_c10(Bf16* p, int64_t w, float l, float h) {
  const uint32_t u = static_cast<uint32_t>(fusionlens::float_to_bf16_bits_c10(l)) |
                     (static_cast<uint32_t>(fusionlens::float_to_bf16_bits_c10(h)) << 16);
  std::memcpy(p + 2 * w, &u, sizeof(u));
}
