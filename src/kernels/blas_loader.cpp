// OpenBLAS is loaded on the first BLAS call (or the first question about it), not with the
// program: the pthread build starts its worker threads in its constructor, with as many threads as
// OPENBLAS_NUM_THREADS says when it loads. The engine never uses them (its own pool calls BLAS
// single-threaded, kernels/threads.h), and under an address-space limit (ulimit -v) they hung the
// process at exit or failed to start before main (exit 130). Loaded here with
// OPENBLAS_NUM_THREADS=1, it starts none; a command that needs no product (--version aside) never
// loads it. The symbols below are the only ones the engine uses; each forwards to the library.
// Debian's single-threaded build is not an alternative: it returns wrong products when called from
// several threads at once (tests/kernels/test_blas_threads.cpp).
#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "kvslim/threads.h"

#ifndef KVSLIM_OPENBLAS_PATH
#error "KVSLIM_OPENBLAS_PATH (the OpenBLAS shared library to load) is set by CMakeLists.txt"
#endif

namespace {

void* openblas() {
  static void* handle = [] {
    const char* old = std::getenv("OPENBLAS_NUM_THREADS");
    const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    void* h = dlopen(KVSLIM_OPENBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    const char* err = h ? nullptr : dlerror();
    // Child processes (MPI ranks, tools) see the environment as it was.
    if (saved) setenv("OPENBLAS_NUM_THREADS", saved->c_str(), 1);
    else unsetenv("OPENBLAS_NUM_THREADS");
    if (!h) {
      const size_t lim = kvslim::address_space_limit();
      throw kvslim::Error(fmt::format("cannot load OpenBLAS ({}): {}{}", KVSLIM_OPENBLAS_PATH, err ? err : "?",
                                      lim ? fmt::format(" (address-space limit {} MiB, ulimit -v {})", lim >> 20,
                                                        lim >> 10)
                                          : ""));
    }
    return h;
  }();
  return handle;
}

template <class F>
F symbol(F, const char* name) {
  void* p = dlsym(openblas(), name);
  if (!p) throw kvslim::Error(fmt::format("OpenBLAS ({}) has no symbol {}", KVSLIM_OPENBLAS_PATH, name));
  return reinterpret_cast<F>(p);
}

}  // namespace

extern "C" {

void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER Order, OPENBLAS_CONST enum CBLAS_TRANSPOSE TransA,
                 OPENBLAS_CONST enum CBLAS_TRANSPOSE TransB, OPENBLAS_CONST blasint M, OPENBLAS_CONST blasint N,
                 OPENBLAS_CONST blasint K, OPENBLAS_CONST float alpha, OPENBLAS_CONST float* A,
                 OPENBLAS_CONST blasint lda, OPENBLAS_CONST float* B, OPENBLAS_CONST blasint ldb,
                 OPENBLAS_CONST float beta, float* C, OPENBLAS_CONST blasint ldc) {
  static const auto f = symbol(&cblas_sgemm, "cblas_sgemm");
  f(Order, TransA, TransB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void cblas_dgemm(OPENBLAS_CONST enum CBLAS_ORDER Order, OPENBLAS_CONST enum CBLAS_TRANSPOSE TransA,
                 OPENBLAS_CONST enum CBLAS_TRANSPOSE TransB, OPENBLAS_CONST blasint M, OPENBLAS_CONST blasint N,
                 OPENBLAS_CONST blasint K, OPENBLAS_CONST double alpha, OPENBLAS_CONST double* A,
                 OPENBLAS_CONST blasint lda, OPENBLAS_CONST double* B, OPENBLAS_CONST blasint ldb,
                 OPENBLAS_CONST double beta, double* C, OPENBLAS_CONST blasint ldc) {
  static const auto f = symbol(&cblas_dgemm, "cblas_dgemm");
  f(Order, TransA, TransB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void cblas_sgemv(OPENBLAS_CONST enum CBLAS_ORDER order, OPENBLAS_CONST enum CBLAS_TRANSPOSE trans,
                 OPENBLAS_CONST blasint m, OPENBLAS_CONST blasint n, OPENBLAS_CONST float alpha,
                 OPENBLAS_CONST float* a, OPENBLAS_CONST blasint lda, OPENBLAS_CONST float* x,
                 OPENBLAS_CONST blasint incx, OPENBLAS_CONST float beta, float* y, OPENBLAS_CONST blasint incy) {
  static const auto f = symbol(&cblas_sgemv, "cblas_sgemv");
  f(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy);
}

void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w, double* work,
             const int* lwork, int* iwork, const int* liwork, int* info) {
  using F = void (*)(const char*, const char*, const int*, double*, const int*, double*, double*, const int*, int*,
                     const int*, int*);
  static const auto f = symbol(F{}, "dsyevd_");
  f(jobz, uplo, n, a, lda, w, work, lwork, iwork, liwork, info);
}

void openblas_set_num_threads(int num_threads) {
  static const auto f = symbol(&openblas_set_num_threads, "openblas_set_num_threads");
  f(num_threads);
}

int openblas_get_num_threads(void) {
  static const auto f = symbol(&openblas_get_num_threads, "openblas_get_num_threads");
  return f();
}

char* openblas_get_config(void) {
  static const auto f = symbol(&openblas_get_config, "openblas_get_config");
  return f();
}

int openblas_get_parallel(void) {
  static const auto f = symbol(&openblas_get_parallel, "openblas_get_parallel");
  return f();
}

}  // extern "C"
