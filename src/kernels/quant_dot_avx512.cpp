// The avx512 level of the canonical dot products: quant_dot_simd.inc compiled for avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq.
// Chosen at run time only on CPUs that have these features (see qdot::detected_level).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kernels/packed_weights.h"
#include "kernels/quant_dot.h"
#include "kernels/weight_prefetch.h"
#include "kvslim/error.h"

// Headers come first so that nothing they define is compiled for avx512.
#ifdef __clang__  // clang ignores the GCC target pragma (see quant_dot_avx2.cpp)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")
// GCC 12 warns about the deliberately undefined pass-through operand inside _mm512_cvtepi32_ps.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define KV_NS avx512
#define KV_AVX512 1
#define KV_VNNI 1
#include "kernels/quant_dot_simd.inc"
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
