// Vector and row helpers of the norm kernels (kernels/csrc/norms_impl.h), compiled once per
// instruction set with them: native-width float vectors, 16-bit <-> float conversions in
// registers, row conversions, non-temporal copies, per-thread scratch, next-row prefetch.
//
// NO include guard on purpose: norms_impl.h includes it at its top, inside each per-ISA namespace
// (see per_isa.h), with FL_ISA set (512, 256 or 0). It includes only vec_impl.h.

#include "vec_impl.h"  // kW, vf, ld, st

// kW elements of T <-> one float vector, converted in registers, so a 16-bit row is read and
// written by the loops that use it (no separate conversion pass through a float buffer). bf16:
// round to nearest even, NaN kept NaN, bit for bit as float_to_bf16_bits; fp16: F16C.
typedef uint32_t vu __attribute__((vector_size(kW * sizeof(uint32_t))));
typedef uint16_t vh __attribute__((vector_size(kW * sizeof(uint16_t))));

template <typename T>
inline vf ldv(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return ld(p);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    vf f;
#if FL_ISA >= 512
    const __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
#elif FL_ISA >= 256
    const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
#else
    vh h;
    std::memcpy(&h, p, sizeof(h));
    const vu u = __builtin_convertvector(h, vu) << 16;
#endif
    std::memcpy(&f, &u, sizeof(f));
    return f;
  } else {
    vf f;
#if FL_ISA >= 512
    const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    std::memcpy(&f, &v, sizeof(f));
#elif FL_ISA >= 256
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    std::memcpy(&f, &v, sizeof(f));
#else
    for (int k = 0; k < kW; ++k) f[k] = static_cast<float>(p[k]);
#endif
    return f;
  }
}

template <typename T>
inline void stv(T* p, vf v) {
  if constexpr (std::is_same_v<T, float>) {
    st(p, v);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    vu u;
    std::memcpy(&u, &v, sizeof(u));
    const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const vu nan = reinterpret_cast<vu>((u & 0x7fffffffu) > 0x7f800000u);  // all ones where NaN
    const vu bits = (rounded & ~nan) | (((u >> 16) | 0x40u) & nan);  // each < 2^16
#if FL_ISA >= 512
    __m512i b;
    std::memcpy(&b, &bits, sizeof(b));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(b));
#elif FL_ISA >= 256
    __m256i b;
    std::memcpy(&b, &bits, sizeof(b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
#else
    const vh h = __builtin_convertvector(bits, vh);
    std::memcpy(p, &h, sizeof(h));
#endif
  } else {
    float t[kW];
    std::memcpy(t, &v, sizeof(v));
#if FL_ISA >= 512
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(_mm512_loadu_ps(t), _MM_FROUND_TO_NEAREST_INT));
#elif FL_ISA >= 256
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(_mm256_loadu_ps(t), _MM_FROUND_TO_NEAREST_INT));
#else
    for (int k = 0; k < kW; ++k) p[k] = static_cast<c10::Half>(t[k]);
#endif
  }
}

// One element, as ldv/stv round it.
template <typename T>
inline float ld1(const T* p) {
  return static_cast<float>(*p);
}

template <typename T>
inline void st1(T* p, float v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    *reinterpret_cast<uint16_t*>(p) = float_to_bf16_bits(v);
  } else {
    *p = static_cast<T>(v);
  }
}

// Lanes summed as a tree (log2(kW) dependent adds, in a fixed order) even without -ffast-math.
inline float hsum(vf v) {
  float t[kW];
  std::memcpy(t, &v, sizeof(v));
  for (int h = kW / 2; h > 0; h /= 2)
    for (int k = 0; k < h; ++k) t[k] += t[k + h];
  return t[0];
}

// ---------------------------------------------------------------- bf16 in even/odd pairs
// 2 kW bf16 elements as two float vectors, the even-indexed and the odd-indexed ones: one load, a
// shift (the even elements up into the high halves of the 32-bit lanes) and an and (the odd ones
// are there already). st_pair rounds both and merges them with a shift and an or. ldv/stv spend
// a widening load and a shift, and a lane-crossing pack and a store, on each kW elements, which
// made a bf16 LayerNorm forward bound by its conversions (AVX2: ~24 instructions per 8 outputs).
// Reductions do not care about the order; the column operands (weight, bias) are read in the same
// order from a copy split once per call (split_pairs). Every ISA copy, no intrinsics.
template <typename T>
inline constexpr bool kPairs = std::is_same_v<T, c10::BFloat16>;

inline void ld_pair(const c10::BFloat16* p, vf& ev, vf& od) {
  vu u;
  std::memcpy(&u, p, sizeof(u));
  const vu e = u << 16, o = u & 0xffff0000u;
  std::memcpy(&ev, &e, sizeof(ev));
  std::memcpy(&od, &o, sizeof(od));
}

// v's bf16 bits (round to nearest even) in the high half of each lane; the low half is garbage.
// GUARD keeps a NaN NaN whatever its payload; without it, a NaN whose low 16 bits are zero (one
// widened from bf16, or the default NaN arithmetic makes) still rounds to itself, and only such
// NaNs can reach the store when no fp32 operand (weight, bias, eps) is NaN (see nan_free).
template <bool GUARD>
inline vu round_hi(vf v) {
  vu u;
  std::memcpy(&u, &v, sizeof(u));
  const vu r = u + 0x7fffu + ((u >> 16) & 1u);
  if constexpr (!GUARD) return r;
  const vu nan = reinterpret_cast<vu>((u & 0x7fffffffu) > 0x7f800000u);
  return (r & ~nan) | ((u | 0x400000u) & nan);
}

template <bool GUARD>
inline void st_pair(c10::BFloat16* p, vf ev, vf od) {
  const vu bits = (round_hi<GUARD>(ev) >> 16) | (round_hi<GUARD>(od) & 0xffff0000u);
  std::memcpy(p, &bits, sizeof(bits));
}

// Columns of a float row regrouped as ld_pair reads them: each whole block of 2 kW columns becomes
// its kW even columns then its kW odd ones; the remaining columns stay in place.
inline void split_pairs(const float* w, float* out, int64_t n) {
  int64_t j = 0;
  for (; j + 2 * kW <= n; j += 2 * kW) {
    for (int k = 0; k < kW; ++k) out[j + k] = w[j + 2 * k], out[j + kW + k] = w[j + 2 * k + 1];
  }
  for (; j < n; ++j) out[j] = w[j];
}

// split_pairs undone: out[j] is the column whose value in's split order holds (the weight-gradient
// rows a bf16 backward accumulated in split order).
inline void unsplit_pairs(const float* in, float* out, int64_t n) {
  int64_t j = 0;
  for (; j + 2 * kW <= n; j += 2 * kW) {
    for (int k = 0; k < kW; ++k) out[j + 2 * k] = in[j + k], out[j + 2 * k + 1] = in[j + kW + k];
  }
  for (; j < n; ++j) out[j] = in[j];
}

// reduce_partials into out, through split order when `split` (see unsplit_pairs).
inline void reduce_partials_to(const double* partials, int64_t nchunks, int64_t n, float* out, bool split) {
  if (!split) return reduce_partials(partials, nchunks, n, out);
  std::vector<float> tmp(n);
  reduce_partials(partials, nchunks, n, tmp.data());
  unsplit_pairs(tmp.data(), out, n);
}

// f(bool_constant<a>, bool_constant<b>): two run-time flags as template arguments (the backwards'
// residual-gradient and NaN-guard variants of their row loops).
template <typename F>
inline void with_flags(bool a, bool b, F&& f) {
  if (a) b ? f(std::true_type{}, std::true_type{}) : f(std::true_type{}, std::false_type{});
  else b ? f(std::false_type{}, std::true_type{}) : f(std::false_type{}, std::false_type{});
}

// No NaN among n floats (null: none): then bf16 rounding needs no NaN guard (round_hi).
inline bool nan_free(const float* w, int64_t n) {
  if (!w) return true;
  bool bad = false;
  for (int64_t j = 0; j < n; ++j) bad |= w[j] != w[j];
  return !bad;
}

// ---------------------------------------------------------------- conversions and stores
// Bulk conversions of a row (ldv/stv per vector, the same rounding element for element).
template <typename T>
inline void load_f32(const T* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) st(dst + i, ldv(src + i));
  for (; i < n; ++i) dst[i] = ld1(src + i);
}

// A row as float: the row itself for float, else converted into buf.
template <typename T>
inline const float* as_f32(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    load_f32<T>(src, buf, n);
    return buf;
  }
}

// One vector rounded through T in registers (`.to(T).float()`, as stv then ldv round it).
template <typename T>
inline vf round_v(vf v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {  // stv's bits, shifted back into place
    vu u;
    std::memcpy(&u, &v, sizeof(u));
    const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const vu nan = reinterpret_cast<vu>((u & 0x7fffffffu) > 0x7f800000u);
    const vu bits = ((rounded & ~nan) | (((u >> 16) | 0x40u) & nan)) << 16;
    vf f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  } else {
    T t[kW];
    stv(t, v);
    return ldv(t);
  }
}

// round_v for finite lanes only (the caller knows the row is finite): bf16 without the NaN guard.
template <typename T>
inline vf round_v_finite(vf v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    vu u;
    std::memcpy(&u, &v, sizeof(u));
    const vu bits = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    vf f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  } else {
    return round_v<T>(v);
  }
}

// memcpy whose aligned middle uses non-temporal stores (no read-for-ownership of dst lines).
// The caller ends its work with fence().
inline void stream_copy(void* dst, const void* src, int64_t bytes) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
#if defined(__x86_64__)
  int64_t head = static_cast<int64_t>((64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63);
  head = std::min(head, bytes);
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
#if FL_ISA >= 512
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d), _mm512_loadu_si512(s));
#elif FL_ISA >= 256
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32)));
#else
    for (int k = 0; k < 64; k += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + k), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k)));
#endif
  }
#endif
  std::memcpy(d, s, bytes);
}

inline void fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

// Per-thread scratch: float tiles for 16-bit rows and for streamed outputs.
template <typename T>
struct Scratch {
  std::vector<float> f;
  std::vector<T> t;
  Scratch(int64_t floats, int64_t ts) : f(floats), t(ts) {}
};

// ---------------------------------------------------------------- prefetch
// LayerNorm rows are processed in passes: the first streams the row from memory, the later ones
// run from L1/L2. During those the hardware prefetchers see no misses and memory idles, so the
// later passes prefetch the next row (software prefetch into L2, locality 2: into L1 it evicted
// the rows being worked on at N = 4096). Measured (benchmarks/results/kernels_norms_cpu.md, 1
// thread): 1 row ahead beat 0, 2 and 4 rows, and L2 beat L1, at 4096x768 and 4096x4096.
constexpr int64_t kPrefetchRows = 1;
constexpr int64_t kPrefetchSpan = 64;  // columns per batch of prefetches

// Prefetch the bytes of `row` (a T row or null) under columns [j, j + len) of a row of T.
template <typename T>
inline void prefetch_cols(const T* row, int64_t j, int64_t len) {
  if (!row) return;
  const char* p = reinterpret_cast<const char*>(row + j);
  const int64_t bytes = len * static_cast<int64_t>(sizeof(T));
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 2);
}

// The same for the next output row (null: none, e.g. a streamed output), prefetched for writing
// (prefetchw: the lines arrive owned, so the stores of the next row do not wait for the
// read-for-ownership). Float outputs only: 1 thread on the AVX2 EPYC, fp32 LayerNorm 4096x768
// forward 1.18x -> 1.40x ATen and RMSNorm 30% faster; the 16-bit loops are bound by their
// conversions, not by memory, and ran 2% slower with it.
template <typename T>
inline void prefetch_cols_w(T* row, int64_t j, int64_t len) {
  if (!row) return;
  char* p = reinterpret_cast<char*>(row + j);
  const int64_t bytes = len * static_cast<int64_t>(sizeof(T));
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 1, 2);
}
