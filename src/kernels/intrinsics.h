#pragma once
// <immintrin.h> for the kernels. GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized on its own
// _mm512_undefined_ps; the warning is silenced around the header only, and only under GCC (clang has
// no such warning group and would warn about the unknown name).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
