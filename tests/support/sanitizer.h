#pragma once
// Whether this test binary (and so the kvslim binary of the same build, which the CLI tests run) is
// built with a sanitizer: ASan's and TSan's shadow memory reserves terabytes of address space and
// adds to every resident figure, and their allocators do not move pages on realloc as glibc's does,
// so the tests that limit or measure memory skip those checks there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVSLIM_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define KVSLIM_TEST_SANITIZED 1
#endif
#endif

#ifdef KVSLIM_TEST_SANITIZED
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
