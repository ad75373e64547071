// Compiles the row/span loops of FL_ISA_IMPL (a header name) once per instruction set, into
// namespaces isa_avx512, isa_avx2 (GCC on x86-64 only, FL_MULTI_ISA) and isa_base, each with
// internal linkage (no PLT calls, no symbol clashes between copies) and with FL_ISA set to 512,
// 256 or 0 for code that branches on the vector width. The caller picks a copy at run time with
// fusionlens::cpu_isa() (common.h). Include it where the copies' namespaces should live, once per
// translation unit, after defining FL_ISA_IMPL; no include guard on purpose.
#ifndef FL_ISA_IMPL
#error "define FL_ISA_IMPL (the per-ISA implementation header) before including per_isa.h"
#endif

#if FL_MULTI_ISA
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
namespace isa_avx512 {
namespace {
#define FL_ISA 512
#include FL_ISA_IMPL
#undef FL_ISA
}  // namespace
}  // namespace isa_avx512
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
namespace isa_avx2 {
namespace {
#define FL_ISA 256
#include FL_ISA_IMPL
#undef FL_ISA
}  // namespace
}  // namespace isa_avx2
#pragma GCC pop_options
#endif
namespace isa_base {
namespace {
#define FL_ISA 0
#include FL_ISA_IMPL
#undef FL_ISA
}  // namespace
}  // namespace isa_base
#undef FL_ISA_IMPL
