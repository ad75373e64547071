// Shared helpers for the FusionLens CPU kernels (header only; include from any kernels/csrc/*.cpp).
//
// - Conversions between float and the 16-bit storage types, written as bit operations (bf16) or
//   F16C instructions (fp16) so loops over them vectorize. bf16 rounding is round-to-nearest-even
//   with NaN kept NaN, exactly like c10::BFloat16.
// - Row helpers: view a row as float (a no-op for float, a bulk conversion into a scratch buffer
//   otherwise), and write float results back.
// - `chunks_for`: how many row chunks to split work into for per-thread partial reductions;
//   `flush_block` / kGradBlockRows: the block sums that keep those reductions accurate.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__) || defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fusionlens {

// Per-element helpers that simd loops call (exp_nonpos, the bf16 bit conversions) must be inlined
// or the loop stays scalar with a call per element. GCC's inliner decides by size heuristics that
// depend on the whole translation unit: when the sources stopped including <torch/extension.h>
// (a 4x faster build), it left exp_nonpos out of line in softmax's rows, 11x slower. So: forced.
#if defined(__GNUC__)
#define FL_INLINE __attribute__((always_inline)) inline
#else
#define FL_INLINE inline
#endif

// A float's bits and back (memcpy: no aliasing UB; compiles to nothing or a register move).
FL_INLINE float float_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
FL_INLINE uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

FL_INLINE float bf16_bits_to_float(uint16_t h) { return float_from_bits(static_cast<uint32_t>(h) << 16); }

// The round-to-nearest-even bf16 bits of a non-NaN float's bits u, and whether u is a NaN: the two
// conversions below differ only in the NaN they return.
FL_INLINE uint32_t bf16_rne_bits(uint32_t u) { return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; }
FL_INLINE bool nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// A NaN keeps its sign and payload (quieted).
FL_INLINE uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  return static_cast<uint16_t>(nan_bits(u) ? ((u >> 16) | 0x40u) : bf16_rne_bits(u));
}

// c10::BFloat16's result bit for bit: any NaN becomes 0x7FC0 (state dicts compare equal to torch's).
FL_INLINE uint16_t float_to_bf16_bits_c10(float f) {
  const uint32_t u = float_bits(f);
  return static_cast<uint16_t>(nan_bits(u) ? 0x7fc0u : bf16_rne_bits(u));
}

// fp16 <-> float as c10's bit routines (c10::detail::fp16_ieee_*, which c10::Half uses without
// F16C), bit for bit over every input (checked exhaustively: all 2^16 halves, all 2^32 floats;
// NaN -> sign | 0x7E00), with their two branches written as mask selects: c10's own versions
// leave any loop that calls them scalar in the AVX2 copies ("control flow in loop").
FL_INLINE float fp16_bits_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t two_w = w + w;  // exponent and mantissa at the top
  // Normal (and Inf/NaN): exponent rebiased by 0xE0, then scaled by 2^-112.
  const uint32_t normal = float_bits(float_from_bits((two_w >> 4) + (0xE0u << 23)) * float_from_bits(15u << 23));
  // Subnormal (and zero): the mantissa under exponent 126, minus 0.5.
  const uint32_t subnormal = float_bits(float_from_bits((two_w >> 17) | (126u << 23)) - 0.5f);
  const uint32_t is_sub = 0u - static_cast<uint32_t>(two_w < (1u << 27));
  return float_from_bits((w & 0x80000000u) | (subnormal & is_sub) | (normal & ~is_sub));
}

FL_INLINE uint16_t float_to_fp16_bits_c10(float f) {
  // Round to nearest even by adding a power of two that puts the fp16 ulp at the float's lsb.
  const float base = (std::fabs(f) * float_from_bits(239u << 23)) * float_from_bits(17u << 23);
  const uint32_t w = float_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t bias = std::max(shl1_w & 0xFF000000u, 0x71000000u);
  const uint32_t bits = float_bits(float_from_bits((bias >> 1) + 0x07800000u) + base);
  const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(shl1_w > 0xFF000000u);
  return static_cast<uint16_t>(((w & 0x80000000u) >> 16) | (0x7E00u & is_nan) | (nonsign & ~is_nan));
}

// Instruction set of kernels compiled once per ISA with `#pragma GCC target` (per_isa.h; every
// family in csrc/): the best this x86-64 CPU runs, lowered by FUSIONLENS_CPU_ISA=avx512|avx2|base
// (read per call, so tests can run every copy); never above what the CPU has.
// FL_MULTI_ISA: the compiler can build such per-ISA copies (GCC on x86-64).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FL_MULTI_ISA 1
#else
#define FL_MULTI_ISA 0
#endif

enum class CpuIsa : int { base = 0, avx2 = 1, avx512 = 2 };

// The best copy this CPU can run at all: it has every feature of that copy's target (per_isa.h).
// Probed once.
inline CpuIsa best_cpu_isa() {
#if FL_MULTI_ISA
  static const CpuIsa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c"))
      return CpuIsa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") &&
        __builtin_cpu_supports("f16c"))
      return CpuIsa::avx2;
    return CpuIsa::base;
  }();
  return best;
#else
  return CpuIsa::base;
#endif
}

// Bulk conversions for the baseline build: the build has no -march flag, so the 16-bit
// conversions below call convert_impl.h's copy for the CPU's best instruction set (AVX-512 or
// AVX2+F16C, read once; FUSIONLENS_CPU_ISA does not apply: it is read per call, too slow per row).
// Without this, bf16 ran 4 lanes wide and fp16 one scalar c10::Half at a time (measured 1.5x / 6x
// slower activation and softmax kernels). GCC on x86-64 only; elsewhere the plain loops below.
#if FL_MULTI_ISA && !defined(__AVX512BW__)
namespace detail {
#define FL_ISA_IMPL "convert_impl.h"
#include "per_isa.h"
}  // namespace detail
#define FL_CONVERT_VIA(NAME, ...)                                                 \
  switch (best_cpu_isa()) {                                                       \
    case CpuIsa::avx512: detail::isa_avx512::NAME(__VA_ARGS__); return;           \
    case CpuIsa::avx2: detail::isa_avx2::NAME(__VA_ARGS__); return;               \
    default: break;                                                               \
  }
#else
#define FL_CONVERT_VIA(NAME, ...)
#endif

// Bulk conversions (vectorizable loops).
template <typename T>
inline void to_float(const T* src, float* dst, int64_t n);

template <>
inline void to_float<float>(const float* src, float* dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

template <>
inline void to_float<c10::BFloat16>(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  FL_CONVERT_VIA(load_f32<c10::BFloat16>, src, dst, n)
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(s[i]);
}

template <>
inline void to_float<c10::Half>(const c10::Half* src, float* dst, int64_t n) {
#if !defined(__F16C__)
  FL_CONVERT_VIA(load_f32<c10::Half>, src, dst, n)
#endif
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <typename T>
inline void from_float(const float* src, T* dst, int64_t n);

template <>
inline void from_float<float>(const float* src, float* dst, int64_t n) {
  if (src != dst) std::memcpy(dst, src, n * sizeof(float));
}

template <>
inline void from_float<c10::BFloat16>(const float* src, c10::BFloat16* dst, int64_t n) {
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  FL_CONVERT_VIA(store_f32<c10::BFloat16>, src, dst, n)
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16_bits(src[i]);
}

template <>
inline void from_float<c10::Half>(const float* src, c10::Half* dst, int64_t n) {
#if !defined(__F16C__)
  FL_CONVERT_VIA(store_f32<c10::Half>, src, dst, n)
#endif
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<c10::Half>(src[i]);
}

// Column tile of the output pass (floats): with its input slices it stays in L1.
constexpr int64_t kTile = 1024;

// exp for arguments <= 0 (softmax's s - max, the GELU density, sigmoid's exp(-|z|)): inline, so
// simd loops make no library call. Cephes' expf polynomial (about 2 ulp); arguments below -87
// (-inf included) give exactly 0, so inf * exp(-inf) stays NaN as in eager; NaN stays NaN.
// Written with integer selects and plain multiply-adds (GCC contracts them to FMA where the target
// has it): no std::fma (a library call without FMA hardware), no std::rint (SSE4.1), no float ?:
// (not if-converted under the default -ftrapping-math), so callers' loops vectorize at any -march.
// Two forms chosen by measurement (benchmarks/kernels/flags_ab.py; -ffast-math used to find
// cheaper ones, these are IEEE-exact rewrites of what it found): n = round(x / ln2) by the
// 1.5 * 2^23 shifter (one add and one subtract; the integer n sits in the sum's low bits) instead
// of float -> int -> float conversions, and (ISA >= 512, the per-ISA copies pass FL_ISA) the clamp
// as an integer ?: so that GCC can drop it and zero-mask the underflowing lanes (about 8% faster
// softmax rows, 12% GELU-tanh at AVX-512). Below AVX-512 that ?: is "control flow in loop" to GCC's
// vectorizer (no mask registers to if-convert it into), which left every exp loop of the AVX2 copy
// scalar (SiLU, GELU-tanh, the gated units, softmax, cross-entropy: 3-8x slower, found
// 2026-12-03), so there the clamp is an and/or mask select.
//
// PAIRS picks the polynomial's form: Horner's (false: a chain of five dependent FMAs) or three
// independent pairs joined by r^2 (true: the same five FMAs, a chain of three, four temporaries
// live at once). Same accuracy (every float in [-87, 0] against the double exp: at most 1.26 ulp
// either way; 0.05% of results differ by one bit). Which is faster depends on the loop around it:
// SiLU's loops (exp and little else) ran 1.01-1.07x faster with pairs, GELU (tanh)'s (more
// constants live) 0.94-0.97x (benchmarks/kernels/act_ab.py, AVX2, 2026-12-04). Only SiLU uses them.
template <int ISA = 0, bool PAIRS = false>
FL_INLINE float exp_nonpos(float x_in) {
  const uint32_t b = float_bits(x_in);
  // As unsigned bits, x in [-87, -0] is [0x80000000, 0xc2ae0000]; (-inf, -87) and -inf are
  // (0xc2ae0000, 0xff800000]; a negative NaN is above, +0, positives and positive NaN below.
  // Below AVX-512 the same set is one float compare (x < -87: NaN compares false; all 2^32 inputs
  // checked) where the unsigned range test took three instructions (AVX2 has no unsigned
  // compare): 1.03-1.1x on the AVX2 activations, 1.02-1.05x on softmax and cross-entropy forwards,
  // same bits (benchmarks/kernels/act_ab.py; 2026-12-04).
  uint32_t under, bc;  // bc: x clamped to -87 (the value is masked off below)
  if constexpr (ISA >= 512) {
    under = static_cast<uint32_t>(b > 0xc2ae0000u) & static_cast<uint32_t>(b <= 0xff800000u);
    bc = under ? 0xc2ae0000u : b;
  } else {
    under = static_cast<uint32_t>(x_in < -87.0f);
    bc = (0xc2ae0000u & (0u - under)) | (b & (under - 1u));
  }
  const uint32_t keep = under - 1u;  // all ones unless the result underflows to 0
  const float x = float_from_bits(bc);
  // t = x / ln2 + 1.5 * 2^23 rounds x / ln2 to the nearest integer n (|n| <= 126 sits in t's low
  // mantissa bits); n = t - 1.5 * 2^23 exactly. x = n ln2 + r, |r| <= ln2 / 2.
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23
  const float t = x * 1.44269504088896341f + kShifter;
  const float n = t - kShifter;
  float r = n * -0.693359375f + x;  // exact: the high part of ln2 has 9 bits, |n| <= 126
  r = n * 2.12194440e-4f + r;
  const float r2 = r * r;
  float p;
  if constexpr (PAIRS) {
    const float p54 = 1.9875691500e-4f * r + 1.3981999507e-3f;
    const float p32 = 8.3334519073e-3f * r + 4.1665795894e-2f;
    const float p10 = 1.6666665459e-1f * r + 5.0000001201e-1f;
    p = (p54 * r2 + p32) * r2 + p10;
  } else {
    p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
  }
  p = p * r2 + (r + 1.0f);
  // 2^n: t's low 23 bits are 2^22 + n; shifted up by 23 only n's bits survive (mod 2^32).
  const float scale = float_from_bits((float_bits(t) << 23) + (127u << 23));
  return float_from_bits(float_bits(p * scale) & keep);
}

// `preferred` is the copy used when FUSIONLENS_CPU_ISA is unset (norms prefer AVX2, see norms.cpp).
inline CpuIsa cpu_isa(CpuIsa preferred = CpuIsa::avx512) {
#if FL_MULTI_ISA
  const CpuIsa best = best_cpu_isa();
  CpuIsa want = preferred;
  if (const char* env = std::getenv("FUSIONLENS_CPU_ISA")) {
    if (!std::strcmp(env, "base")) want = CpuIsa::base;
    else if (!std::strcmp(env, "avx2")) want = CpuIsa::avx2;
    else if (!std::strcmp(env, "avx512")) want = CpuIsa::avx512;
    else TORCH_CHECK(!*env, "FUSIONLENS_CPU_ISA must be avx512, avx2 or base, got '", env, "'");
  }
  return static_cast<int>(want) < static_cast<int>(best) ? want : best;
#else
  return CpuIsa::base;
#endif
}

// The value of `isa_<copy>::call` for the copy cpu_isa() picks: the one run-time dispatch of every
// per-ISA family (its namespaces come from per_isa.h), e.g. `return FL_ISA_PICK(row_ops<T>());`.
// `call` must not contain a top-level comma. The norms pass their own preference (norms.cpp).
#if FL_MULTI_ISA
#define FL_ISA_PICK(call)                                       \
  [&] {                                                         \
    switch (fusionlens::cpu_isa()) {                            \
      case fusionlens::CpuIsa::avx512: return isa_avx512::call; \
      case fusionlens::CpuIsa::avx2: return isa_avx2::call;     \
      default: return isa_base::call;                           \
    }                                                           \
  }()
#else
#define FL_ISA_PICK(call) (isa_base::call)
#endif

inline const char* cpu_isa_name(CpuIsa isa) {
  return isa == CpuIsa::avx512 ? "avx512" : isa == CpuIsa::avx2 ? "avx2" : "base";
}

// Outputs larger than 16 MiB are written with non-temporal stores: they would not stay in cache
// anyway, and streaming skips the read-for-ownership of every destination line (a third of the
// traffic of a read-x/write-y kernel). FUSIONLENS_CPU_STREAM_BYTES overrides the threshold
// (read once; tests set 0 to stream every output).
inline int64_t stream_threshold_bytes() {
  static const int64_t bytes = [] {
    const char* env = std::getenv("FUSIONLENS_CPU_STREAM_BYTES");
    return env ? static_cast<int64_t>(std::atoll(env)) : (int64_t{16} << 20);
  }();
  return bytes;
}

inline bool stream_output(int64_t elements, int64_t elem_size) {
  return elements * elem_size > stream_threshold_bytes();
}

// Rows per parallel task so each task touches at least ~16K elements (amortizes the fork).
inline int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
}

// Number of row chunks for per-chunk partial sums (each chunk owns one [cols] fp32 buffer).
inline int64_t chunks_for(int64_t rows, int64_t cols) {
  const int64_t by_work = std::max<int64_t>(1, rows / row_grain(cols));
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), by_work));
}

// Gradient sums over many rows (weight, bias): rows add their terms into an fp32 block sum that
// joins the running partial every kGradBlockRows rows (a two-level cascade), and the partials are
// double. One fp32 chain over thousands of rows had 5-40x eager's pairwise-sum error (found by
// tests/kernels/fuzz.py); fp32 partials still had up to 7.5x it where rows are many and short (a
// bias gradient over 1,584 rows of one column, fuzz seed 933493). A flush is n adds per block.
constexpr int64_t kGradBlockRows = 32;

// Rows per block sum for rows of n columns: kGradBlockRows from n = 512 up, fewer below (one
// below 32), so that a flush costs at most ~16 adds a row where rows are short: there a row's own
// fixed cost dwarfs that, and a 32-row fp32 block still summed to 15x eager's error (an RMSNorm
// weight gradient over 462 rows of one column, whose terms cancelled from ~1 to 0.3: fuzz seed
// 34272919). From 512 columns on nothing changes.
inline int64_t grad_block_rows(int64_t n) {
  return std::clamp<int64_t>(n / 16, 1, kGradBlockRows);
}

// partial[j] += block[j]; block[j] = 0.
inline void flush_block(float* block, double* partial, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    partial[j] += block[j];
    block[j] = 0.f;
  }
}

// Sum partials[c][j] over chunks c (in double) into out[j], rounded once to fp32; parallel over
// columns.
inline void reduce_partials(const double* partials, int64_t nchunks, int64_t cols, float* out) {
  at::parallel_for(0, cols, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      double sum = 0.0;
      for (int64_t c = 0; c < nchunks; ++c) sum += partials[c * cols + j];
      out[j] = static_cast<float>(sum);
    }
  });
}

}  // namespace fusionlens
