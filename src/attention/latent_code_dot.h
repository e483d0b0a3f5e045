#pragma once
// Products of float vectors with quantized latent codes read as stored (2, 4 or 8 bits, see
// LatentCodes in src/kv/latent.h), without dequantizing them: what attention over a
// latent segment needs (attention/attention_latent.cpp).
//
// A quantized coordinate is c_ji = o_i + f_i * w_j * (q_ji - qmax), q_ji in [0, 2^bits - 1],
// qmax = (2^bits - 1) / 2, with o_i, f_i = (center_i, step_i) and w_j = 2^(e_j / 4) per channel,
// (0, basis scale_i) and w_j = the entry's f16 scale per token. Writing d_ji = q_ji - 2^(bits-1)
// (an exact small integer, centred so that no large offset cancels in float) and
// q_ji - qmax = d_ji + 1/2:
//
//   scores  x . c_j      = x . o + w_j (a . d_j + A),      a_i = x_i f_i,  A = (1/2) sum_i a_i
//   values  sum_j p_j c_j = o sum_j p_j + f * (u + t / 2),  u_i = sum_j p_j w_j d_ji,  t = sum_j p_j w_j
//
// These kernels compute w_j (a . d_j + A) and (u, t); the callers fold in o and f. Each has a scalar reference and an AVX2 path (also compiled for AVX-512, with the
// same 8-lane code and twice the registers), picked per call by qdot::level(), so KVSLIM_SIMD and
// qdot::set_level force a lower level here as in the other kernels. Levels agree to float
// rounding (different summation orders), not bit for bit.
#include <cstddef>
#include <cstdint>

#include "kv/latent.h"

namespace kvslim::latent_dot {

/// The raw rows of one quantized latent side (LatentCodes with bits 2, 4 or 8).
struct CodeRows {
  const uint8_t* base = nullptr;  ///< row 0 (LatentCodes::row(0))
  size_t stride = 0;              ///< bytes per row (LatentCodes::row_bytes())
  int bits = 8;                   ///< 2, 4 or 8
  int rank = 0;                   ///< codes per row
  bool channel = true;            ///< true: exponent byte prefix (per channel); false: f16 scale (per token)
  const float* widen = nullptr;   ///< 2^(e/4) by exponent byte e (kv/latent_widen.h), set by code_rows
};

/// The rows of `C` (throws kvslim::Error unless C's bits are 2, 4 or 8).
CodeRows code_rows(const LatentCodes& C);

/// w_j of row `r`: 2^(e/4) per channel, the f16 scale per token.
float row_weight(const CodeRows& c, const uint8_t* r);

/// For `rows` query rows and the n entries idx[0, n) (any order, in range):
///   S[r * lds + k] = w_{idx[k]} (a[r * rank ...] . d_{idx[k]} + A[r]),
/// the score x . c_j less x . o, which is the same for every entry (softmax ignores it; adding it
/// would only round the differences that matter). a: [rows][c.rank]; A: [rows]; S: rows of at
/// least n floats, lds apart.
void code_scores(const CodeRows& c, const int32_t* idx, size_t n, const float* a, const float* A, int rows, float* S,
                 size_t lds);

/// For `rows` rows of weights P[r * ldp + k] over the entries idx[0, n):
///   u[r * rank + i] += sum_k P[r, k] w_{idx[k]} d_{idx[k], i},   t[r] += sum_k P[r, k] w_{idx[k]}.
/// u: [rows][c.rank], t: [rows], both accumulated into (zero them first for a fresh sum).
void code_accumulate(const CodeRows& c, const int32_t* idx, size_t n, const float* P, size_t ldp, int rows,
                     float* u, float* t);

/// Expansion of `rows` latent sums through a dense basis (LatentBasis::decode for several rows at
/// once): out[r * out_stride + d] = mean[d] + sum_i u[r * rank + i] proj[i * hd + d], d < hd.
/// proj: [rank][hd] (LatentBasis::proj); mean: [hd], or null for none; u: [rows][rank].
void basis_expand(const float* proj, const float* mean, int rank, int hd, const float* u, int rows, float* out,
                  int64_t out_stride);

/// x[j] <- exp(x[j] - max_k x[k]) for j < n; returns their sum (0 for n = 0): softmax's
/// unnormalized weights, the largest exactly 1 (the callers fold 1 / sum into the value sums).
/// The AVX2 path evaluates 2^y with y = (x - max) log2(e): 2^round(y) from the exponent bits
/// times a degree-7 polynomial of the remainder (|rem| <= 1/2; relative error within 2e-6 plus
/// 2e-7 |x - max| from rounding the float argument, as std::exp of the float difference has); y
/// below -126 gives 0 (exp < 1.2e-38).
float exp_shifted(float* x, size_t n);

/// The scalar references of the four kernels (what every level is tested against).
void code_scores_scalar(const CodeRows& c, const int32_t* idx, size_t n, const float* a, const float* A, int rows,
                        float* S, size_t lds);
void code_accumulate_scalar(const CodeRows& c, const int32_t* idx, size_t n, const float* P, size_t ldp, int rows,
                            float* u, float* t);
void basis_expand_scalar(const float* proj, const float* mean, int rank, int hd, const float* u, int rows, float* out,
                         int64_t out_stride);
float exp_shifted_scalar(float* x, size_t n);

}  // namespace kvslim::latent_dot
