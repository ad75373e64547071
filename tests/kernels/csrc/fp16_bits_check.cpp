// Exhaustive check of common.h's branch-free fp16 conversions against c10's bit routines: every
// one of the 2^16 halves to float, every one of the 2^32 floats to half. Prints the mismatch
// counts (and the first few inputs) and exits 1 on any. Built and run by test_fp16_bits.py.
#include "common.h"

#include <cstdio>

int main() {
  long bad_load = 0, bad_store = 0;
  for (uint32_t h = 0; h < 65536u; ++h) {
    const uint32_t want = fusionlens::float_bits(c10::detail::fp16_ieee_to_fp32_value(static_cast<uint16_t>(h)));
    const uint32_t got = fusionlens::float_bits(fusionlens::fp16_bits_to_float(static_cast<uint16_t>(h)));
    if (want != got && bad_load++ < 5) std::printf("load 0x%04x: c10 0x%08x, ours 0x%08x\n", h, want, got);
  }
  for (uint64_t u = 0; u < (uint64_t{1} << 32); ++u) {
    const float f = fusionlens::float_from_bits(static_cast<uint32_t>(u));
    const uint16_t want = c10::detail::fp16_ieee_from_fp32_value(f);
    const uint16_t got = fusionlens::float_to_fp16_bits_c10(f);
    if (want != got && bad_store++ < 5) std::printf("store 0x%08x: c10 0x%04x, ours 0x%04x\n", static_cast<uint32_t>(u), want, got);
  }
  std::printf("mismatches: load %ld of 65536, store %ld of 4294967296\n", bad_load, bad_store);
  return bad_load || bad_store ? 1 : 0;
}
