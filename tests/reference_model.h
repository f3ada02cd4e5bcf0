// An independent, deliberately naive llama forward pass used as the reference in tests.
//
// It recomputes a whole token sequence from scratch with plain loops and an explicit attention
// mask visible(t, layer, kv_head, pos): no KV cache, no compaction, no thread pool, its own RoPE
// (float angles as llama.cpp computes them, both pair layouts). Only the GGUF reader, the
// loader's parsed configuration and dequantisation are shared with the engine (the first and
// last are tested separately against the `gguf` Python package; the configuration by the
// family parity tests against transformers and llama.cpp).
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "format/gguf.h"
#include "model/model.h"

namespace kvevict::test {

class ReferenceLlama {
 public:
  explicit ReferenceLlama(const Model& m)
      : m_(m), c_(m.config()), factors_(c_.rope.freq_factors), attn_factor_(c_.rope.attn_factor) {}

  /// Uses these per-band frequency divisors [n_rot / 2] and attention factor instead of the
  /// loader's (LongRoPE tests state the expected set and factor themselves).
  ReferenceLlama& with_rope_factors(std::vector<float> factors, double attn_factor) {
    factors_ = std::move(factors);
    attn_factor_ = attn_factor;
    return *this;
  }

  /// Mask: may token t (0-based, its logical position) see the key/value of position p (p <= t)
  /// in (layer, kv_head)?
  using Visible = std::function<bool(int t, int layer, int kv_head, int p)>;

  /// Receives, for query token t in (layer, query head), its attention weights w[0..t] (0 where
  /// masked), as this reference computes them.
  using AttentionHook = std::function<void(int t, int layer, int head, const std::vector<double>& w)>;

  /// Logits [n_vocab] after every token: out[t] = logits predicting token t+1. `hook`, when set,
  /// sees every attention row.
  std::vector<std::vector<float>> run(const std::vector<int32_t>& tokens, const Visible& visible,
                                      const AttentionHook& hook = {}) const {
    const int T = static_cast<int>(tokens.size()), dim = c_.dim, hd = c_.head_dim;
    const int nh = c_.n_heads, nkv = c_.n_kv_heads, group = nh / nkv;
    std::vector<std::vector<float>> x(T, std::vector<float>(dim));
    for (int t = 0; t < T; ++t) x[t] = row(m_.token_embedding(), tokens[t]);
    for (int l = 0; l < c_.n_layers; ++l) {
      const LayerWeights& L = m_.layers()[l];
      std::vector<std::vector<float>> q(T), k(T), v(T);
      for (int t = 0; t < T; ++t) {
        const auto xn = norm(x[t], L.attn_norm);
        q[t] = add(mv(L.wq, xn), L.bq);
        k[t] = add(mv(L.wk, xn), L.bk);
        v[t] = add(mv(L.wv, xn), L.bv);
        for (int h = 0; h < nh; ++h) head_norm(&q[t][h * hd], L.q_norm), rope(&q[t][h * hd], t);
        for (int h = 0; h < nkv; ++h) head_norm(&k[t][h * hd], L.k_norm), rope(&k[t][h * hd], t);
      }
      for (int t = 0; t < T; ++t) {
        std::vector<float> att(nh * hd, 0.0f);
        for (int h = 0; h < nh; ++h) {
          const int g = h / group;
          std::vector<double> w(t + 1, 0.0);
          double mx = -1e300;
          for (int p = 0; p <= t; ++p) {
            if (!visible(t, l, g, p)) continue;
            double s = 0;
            for (int d = 0; d < hd; ++d) s += double(q[t][h * hd + d]) * k[p][g * hd + d];
            w[p] = s / std::sqrt(double(hd));
            mx = std::max(mx, w[p]);
          }
          double sum = 0;
          for (int p = 0; p <= t; ++p) {
            w[p] = visible(t, l, g, p) ? std::exp(w[p] - mx) : 0.0;
            sum += w[p];
          }
          if (hook) {
            std::vector<double> probs(w);
            for (double& pr : probs) pr /= sum;
            hook(t, l, h, probs);
          }
          for (int p = 0; p <= t; ++p)
            for (int d = 0; d < hd; ++d) att[h * hd + d] += float(w[p] / sum * v[p][g * hd + d]);
        }
        const auto o = mv(L.wo, att);
        for (int i = 0; i < dim; ++i) x[t][i] += o[i];
        const auto xn = norm(x[t], L.ffn_norm);
        auto gt = mv(L.w_gate, xn);
        const auto up = mv(L.w_up, xn);
        for (size_t i = 0; i < gt.size(); ++i) gt[i] = gt[i] / (1.0f + std::exp(-gt[i])) * up[i];
        const auto dn = mv(L.w_down, gt);
        for (int i = 0; i < dim; ++i) x[t][i] += dn[i];
      }
    }
    std::vector<std::vector<float>> out(T);
    for (int t = 0; t < T; ++t) out[t] = mv(m_.output(), norm(x[t], m_.output_norm()));
    return out;
  }

 private:
  std::vector<float> row(const WeightMatrix& W, int64_t r) const {
    std::vector<float> out(static_cast<size_t>(W.cols));
    dequantize_row(W.type, W.row(r), out.data(), W.cols);
    return out;
  }
  std::vector<float> mv(const WeightMatrix& W, const std::vector<float>& x) const {
    std::vector<float> y(static_cast<size_t>(W.rows));
    for (int64_t r = 0; r < W.rows; ++r) {
      const auto w = row(W, r);
      double s = 0;
      for (int64_t i = 0; i < W.cols; ++i) s += double(w[i]) * x[i];
      y[r] = float(s);
    }
    return y;
  }
  std::vector<float> norm(const std::vector<float>& x, const std::vector<float>& w) const {
    double ss = 0;
    for (float a : x) ss += double(a) * a;
    const double s = 1.0 / std::sqrt(ss / x.size() + c_.rms_eps);
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = float(x[i] * s * w[i]);
    return y;
  }
  static std::vector<float> add(std::vector<float> y, const std::vector<float>& bias) {
    for (size_t i = 0; i < bias.size(); ++i) y[i] += bias[i];
    return y;
  }
  // Per-head RMSNorm (Qwen3 q_norm / k_norm), in double.
  void head_norm(float* x, const std::vector<float>& w) const {
    if (w.empty()) return;
    double ss = 0;
    for (size_t i = 0; i < w.size(); ++i) ss += double(x[i]) * x[i];
    const double s = 1.0 / std::sqrt(ss / w.size() + c_.rms_eps);
    for (size_t i = 0; i < w.size(); ++i) x[i] = float(x[i] * s * w[i]);
  }
  // RoPE as llama.cpp's ggml_rope_ext computes it (float angles): the first n_rot coordinates
  // rotate, pair i is (2i, 2i+1) in mode NORM and (i, i + n_rot/2) in mode NEOX, angle
  // pos · freq_scale · base^(-2i/n_rot) / freq_factor[i], cos and sin times attn_factor (mscale).
  void rope(float* x, int pos) const {
    const RopeConfig& r = c_.rope;
    const int n_rot = r.n_rot > 0 ? r.n_rot : c_.head_dim;
    for (int i = 0; i < n_rot / 2; ++i) {
      float theta = pos * float(r.freq_scale) * std::pow(c_.rope_theta, -2.0f * i / n_rot);
      if (!factors_.empty()) theta /= factors_[static_cast<size_t>(i)];
      const float c = std::cos(theta) * float(attn_factor_), s = std::sin(theta) * float(attn_factor_);
      const int ia = r.style == RopeStyle::Neox ? i : 2 * i,
                ib = r.style == RopeStyle::Neox ? i + n_rot / 2 : 2 * i + 1;
      const float a = x[ia], b = x[ib];
      x[ia] = a * c - b * s;
      x[ib] = a * s + b * c;
    }
  }
  const Model& m_;
  const ModelConfig& c_;
  std::vector<float> factors_;
  double attn_factor_ = 1.0;
};

}  // namespace kvevict::test
