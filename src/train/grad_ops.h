#pragma once
// Reverse-mode building blocks for training through a llama layer on small models (float64):
// the forward value and the backward (vector-Jacobian product) of each operation the
// RestoreKV trainer needs (arXiv 2608.01247: restore embeddings and LoRA fitted by
// self-distillation, the gradient flowing through the transformer): linear maps, RMSNorm, RoPE,
// causal attention of query rows over cached keys and values, SwiGLU, and the KL divergence of
// next-token distributions. Every backward takes dy (the loss gradient of the output) and ADDS
// the gradients of its inputs into the given buffers (so a value used twice accumulates).
// Row-major; shapes in the comments. Tested against central finite differences
// (tests/train/test_train_ops.cpp). Internal.
#include <vector>

namespace kvslim::grad {

/// y[n][out] = x[n][in] W^T, W [out][in].
void linear(const double* x, const double* W, int n, int in, int out, double* y);
/// dx += dy W, dW += dy^T x (either may be nullptr to skip).
void linear_backward(const double* x, const double* W, const double* dy, int n, int in, int out, double* dx,
                     double* dW);

/// y[n][d] = x * w / sqrt(mean(x^2) + eps), per row.
void rmsnorm(const double* x, const double* w, int n, int d, double eps, double* y);
/// dx += d y / d x applied to dy (w constant).
void rmsnorm_backward(const double* x, const double* w, const double* dy, int n, int d, double eps, double* dx);

/// Rotates pairs (2i, 2i+1) (llama layout; neox: (i, i + hd/2)) of each of `heads` vectors of hd
/// values of row t by angle pos[t] * inv_freq[i]; in place. x: [n][heads][hd].
void rope(double* x, const int* pos, const double* inv_freq, int n, int heads, int hd, bool neox);
/// The backward of rope is the rotation by minus the angle (orthogonal map): in place on dy.
void rope_backward(double* dy, const int* pos, const double* inv_freq, int n, int heads, int hd, bool neox);

/// One query head: rows q [m][hd] attend to keys k [P][hd] and values v [P][hd]; row r sees
/// entries [0, visible[r]); o[m][hd] = softmax(q k^T / sqrt(hd)) v. `p` (out, [m][P]) keeps the
/// probabilities for the backward (0 where not visible).
void attention(const double* q, const double* k, const double* v, const int* visible, int m, int P, int hd,
               double* o, double* p);
/// dq += ..., dk += ..., dv += ... (any may be nullptr) from do [m][hd] and the forward's p.
void attention_backward(const double* q, const double* k, const double* v, const double* p, const double* dout,
                        int m, int P, int hd, double* dq, double* dk, double* dv);

/// h = silu(g) * u elementwise (n values).
void swiglu(const double* g, const double* u, int n, double* h);
void swiglu_backward(const double* g, const double* u, const double* dh, int n, double* dg, double* du);

/// KL(p || softmax(z)) for one row of V logits, p = softmax(teacher logits) given as
/// probabilities; returns the divergence (nats) and ADDS its gradient with respect to z, scaled
/// by `scale`, into dz (softmax(z) - p).
double kl_softmax(const double* p, const double* z, int V, double scale, double* dz);

}  // namespace kvslim::grad
