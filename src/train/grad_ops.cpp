// Float64 forward and backward of the operations of a llama layer (see grad_ops.h).
#include "train/grad_ops.h"

#include <algorithm>
#include <cmath>

namespace kvslim::grad {

void linear(const double* x, const double* W, int n, int in, int out, double* y) {
  for (int t = 0; t < n; ++t)
    for (int o = 0; o < out; ++o) {
      double a = 0;
      const double* w = W + static_cast<size_t>(o) * in;
      const double* xr = x + static_cast<size_t>(t) * in;
      for (int i = 0; i < in; ++i) a += w[i] * xr[i];
      y[static_cast<size_t>(t) * out + o] = a;
    }
}

void linear_backward(const double* x, const double* W, const double* dy, int n, int in, int out, double* dx,
                     double* dW) {
  for (int t = 0; t < n; ++t)
    for (int o = 0; o < out; ++o) {
      const double g = dy[static_cast<size_t>(t) * out + o];
      if (g == 0) continue;
      const double* w = W + static_cast<size_t>(o) * in;
      const double* xr = x + static_cast<size_t>(t) * in;
      if (dx)
        for (int i = 0; i < in; ++i) dx[static_cast<size_t>(t) * in + i] += g * w[i];
      if (dW)
        for (int i = 0; i < in; ++i) dW[static_cast<size_t>(o) * in + i] += g * xr[i];
    }
}

void rmsnorm(const double* x, const double* w, int n, int d, double eps, double* y) {
  for (int t = 0; t < n; ++t) {
    const double* xr = x + static_cast<size_t>(t) * d;
    double ss = 0;
    for (int i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const double r = 1.0 / std::sqrt(ss / d + eps);
    for (int i = 0; i < d; ++i) y[static_cast<size_t>(t) * d + i] = xr[i] * r * w[i];
  }
}

void rmsnorm_backward(const double* x, const double* w, const double* dy, int n, int d, double eps, double* dx) {
  // y_i = x_i r w_i, r = (sum x^2 / d + eps)^(-1/2), dr/dx_j = -r^3 x_j / d:
  // dx_j = r w_j dy_j - x_j r^3 / d * sum_i dy_i w_i x_i.
  for (int t = 0; t < n; ++t) {
    const double* xr = x + static_cast<size_t>(t) * d;
    const double* g = dy + static_cast<size_t>(t) * d;
    double ss = 0, dot = 0;
    for (int i = 0; i < d; ++i) {
      ss += xr[i] * xr[i];
      dot += g[i] * w[i] * xr[i];
    }
    const double r = 1.0 / std::sqrt(ss / d + eps);
    for (int j = 0; j < d; ++j) dx[static_cast<size_t>(t) * d + j] += r * w[j] * g[j] - xr[j] * r * r * r / d * dot;
  }
}

namespace {
void rotate(double* x, const int* pos, const double* inv_freq, int n, int heads, int hd, bool neox, double sign) {
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h) {
      double* v = x + (static_cast<size_t>(t) * heads + h) * hd;
      for (int i = 0; i < hd / 2; ++i) {
        const int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
        const double th = sign * pos[t] * inv_freq[i], c = std::cos(th), s = std::sin(th);
        const double x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
}
}  // namespace

void rope(double* x, const int* pos, const double* inv_freq, int n, int heads, int hd, bool neox) {
  rotate(x, pos, inv_freq, n, heads, hd, neox, 1.0);
}

void rope_backward(double* dy, const int* pos, const double* inv_freq, int n, int heads, int hd, bool neox) {
  rotate(dy, pos, inv_freq, n, heads, hd, neox, -1.0);
}

void attention(const double* q, const double* k, const double* v, const int* visible, int m, int P, int hd,
               double* o, double* p) {
  const double sc = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int r = 0; r < m; ++r) {
    const int vis = std::clamp(visible[r], 0, P);
    double* pr = p + static_cast<size_t>(r) * P;
    const double* qr = q + static_cast<size_t>(r) * hd;
    double mx = -INFINITY;
    for (int j = 0; j < P; ++j) {
      if (j >= vis) {
        pr[j] = 0;
        continue;
      }
      double a = 0;
      for (int e = 0; e < hd; ++e) a += qr[e] * k[static_cast<size_t>(j) * hd + e];
      pr[j] = a * sc;
      mx = std::max(mx, pr[j]);
    }
    double z = 0;
    for (int j = 0; j < vis; ++j) z += (pr[j] = std::exp(pr[j] - mx));
    for (int j = 0; j < vis; ++j) pr[j] /= z;
    double* orow = o + static_cast<size_t>(r) * hd;
    std::fill(orow, orow + hd, 0.0);
    for (int j = 0; j < vis; ++j)
      for (int e = 0; e < hd; ++e) orow[e] += pr[j] * v[static_cast<size_t>(j) * hd + e];
  }
}

void attention_backward(const double* q, const double* k, const double* v, const double* p, const double* dout,
                        int m, int P, int hd, double* dq, double* dk, double* dv) {
  const double sc = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> dp(P);
  for (int r = 0; r < m; ++r) {
    const double* pr = p + static_cast<size_t>(r) * P;
    const double* g = dout + static_cast<size_t>(r) * hd;
    // dv_j += p_j do; dp_j = do . v_j; ds_j = p_j (dp_j - sum_i p_i dp_i).
    double mean = 0;
    for (int j = 0; j < P; ++j) {
      if (pr[j] == 0) {
        dp[j] = 0;
        continue;
      }
      double a = 0;
      for (int e = 0; e < hd; ++e) {
        a += g[e] * v[static_cast<size_t>(j) * hd + e];
        if (dv) dv[static_cast<size_t>(j) * hd + e] += pr[j] * g[e];
      }
      dp[j] = a;
      mean += pr[j] * a;
    }
    for (int j = 0; j < P; ++j) {
      if (pr[j] == 0) continue;
      const double ds = pr[j] * (dp[j] - mean) * sc;
      for (int e = 0; e < hd; ++e) {
        if (dq) dq[static_cast<size_t>(r) * hd + e] += ds * k[static_cast<size_t>(j) * hd + e];
        if (dk) dk[static_cast<size_t>(j) * hd + e] += ds * q[static_cast<size_t>(r) * hd + e];
      }
    }
  }
}

void swiglu(const double* g, const double* u, int n, double* h) {
  for (int i = 0; i < n; ++i) h[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
}

void swiglu_backward(const double* g, const double* u, const double* dh, int n, double* dg, double* du) {
  for (int i = 0; i < n; ++i) {
    const double s = 1.0 / (1.0 + std::exp(-g[i]));
    if (dg) dg[i] += dh[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
    if (du) du[i] += dh[i] * g[i] * s;
  }
}

double kl_softmax(const double* p, const double* z, int V, double scale, double* dz) {
  double mx = -INFINITY;
  for (int i = 0; i < V; ++i) mx = std::max(mx, z[i]);
  double sum = 0;
  for (int i = 0; i < V; ++i) sum += std::exp(z[i] - mx);
  const double lse = mx + std::log(sum);
  double kl = 0;
  for (int i = 0; i < V; ++i) {
    if (p[i] > 0) kl += p[i] * (std::log(p[i]) - (z[i] - lse));
    if (dz) dz[i] += scale * (std::exp(z[i] - lse) - p[i]);
  }
  return kl;
}

}  // namespace kvslim::grad
