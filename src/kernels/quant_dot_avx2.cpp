// The avx2 level of the canonical dot products: quant_dot_simd.inc compiled for avx2,fma,f16c.
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

// Headers come first so that nothing they define is compiled for avx2.
// Clang ignores the GCC target pragma (its builds: sanitizers and fuzzing, fuzz/README.md) and takes
// the same features as an attribute on every function in the region.
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define KV_NS avx2
#define KV_AVX512 0
#define KV_VNNI 0
#include "kernels/quant_dot_simd.inc"
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
