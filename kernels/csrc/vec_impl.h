// Native-width float vectors for the per-ISA loops (GCC vector extensions): kW floats per vector
// (16 with AVX-512, 8 with AVX2, 4 at the baseline), unaligned load and store.
//
// NO include guard on purpose: an *_impl.h includes it inside each per-ISA namespace (see
// per_isa.h), with FL_ISA set (512, 256 or 0). It includes nothing itself (needs <cstring>).

#if FL_ISA >= 512
constexpr int kW = 16;  // floats per native vector
#elif FL_ISA >= 256
constexpr int kW = 8;
#else
constexpr int kW = 4;
#endif
typedef float vf __attribute__((vector_size(kW * sizeof(float))));

inline vf ld(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void st(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
