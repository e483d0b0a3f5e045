// The avxvnni level of the integer-product attention kernels (attention_int.h):
// attention_int_simd.inc compiled for avx2, fma, f16c and avxvnni: the products by AVX-VNNI's vpdpwssd (VEX).
// Chosen at run time by attention_int.cpp from qdot::level().
#include "kernels/intrinsics.h"

#include <cstdint>
#include <cstring>

#include "attention/attention_int.h"

// Headers come first so that nothing they define is compiled for this level.
#ifdef __clang__  // clang ignores the GCC target pragma (see quant_dot_avx2.cpp)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif
#define KV_NS int_avxvnni
#define KV_DOT(acc, a, b) _mm256_dpwssd_avx_epi32((acc), (a), (b))
#include "attention/attention_int_simd.inc"
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
