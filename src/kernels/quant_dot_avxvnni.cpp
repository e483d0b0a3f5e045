// The avxvnni level of the canonical dot products: quant_dot_simd.inc compiled for avx2, fma, f16c
// and AVX-VNNI (the VEX-encoded vpdpbusd of Intel Alder Lake / Sierra Forest and later and AMD Zen 5,
// on CPUs with or without AVX-512). Chosen at run time only where CPUID reports these features
// (see qdot::detected_level).
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

// Headers come first so that nothing they define is compiled for avxvnni (see quant_dot_avx2.cpp).
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif
#define KV_NS avxvnni
#define KV_AVX512 0
#define KV_VNNI 1
#include "kernels/quant_dot_simd.inc"
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
