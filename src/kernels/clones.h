#pragma once
// KVSLIM_TARGET_CLONES: GCC function multi-versioning (one copy per SIMD level, chosen by an ifunc
// resolver when the program loads) for the few float kernels compiled that way. ThreadSanitizer
// builds get the generic copy only: the resolver runs before the sanitizer's runtime is set up, and
// its instrumented entry crashed every TSan binary at load (`kvslim --version` included).
#if defined(__SANITIZE_THREAD__)
#define KVSLIM_TARGET_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVSLIM_TARGET_CLONES
#endif
#endif
#ifndef KVSLIM_TARGET_CLONES
#define KVSLIM_TARGET_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
