// fp32 <-> storage-dtype span conversions, compiled once per instruction set through per_isa.h:
// inside the per-ISA namespaces of rope_impl.h and cross_entropy_impl.h (inlined into their
// loops), and inside fusionlens::detail by common.h, whose to_float / from_float call the copy for
// the CPU's best ISA (the build has no -march). fp16 uses F16C (vcvtph2ps / vcvtps2ph) in the AVX2
// and AVX-512 copies; bf16 is bit arithmetic (round to nearest even, NaN kept NaN, as c10::BFloat16).
// No include guard: included once per ISA namespace on purpose. Needs common.h and FL_ISA.

template <typename T>
inline void load_f32(const T* src, float* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = fusionlens::bf16_bits_to_float(s[i]);
  } else {
    int64_t i = 0;
#if FL_ISA >= 256
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
    for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

template <typename T>
inline void store_f32(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (src != dst) std::memcpy(dst, src, n * sizeof(float));
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) d[i] = fusionlens::float_to_bf16_bits(src[i]);
  } else {
    int64_t i = 0;
#if FL_ISA >= 256
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; ++i) dst[i] = static_cast<c10::Half>(src[i]);
  }
}
