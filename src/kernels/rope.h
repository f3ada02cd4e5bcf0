// Rotary position embedding (RoPE) in the two layouts GGUF models use, with partial rotary,
// per-frequency factors and linear position scaling.
//
// A head vector x[head_dim] is split into head_dim / 2 *bands*. Band f is the pair of
// coordinates (x[a_f], x[b_f]), read as the complex number x[a_f] + i·x[b_f], and RoPE at
// position p multiplies it by exp(i·p·ω_f):
//   - Adjacent (llama.cpp rope mode 0, "NORM", used by `llama`): band f = (2f, 2f+1). The GGUF
//     converter permutes Q/K rows so that this reproduces the HF rotate-half form.
//   - Neox (llama.cpp mode 2, HF `rotate_half`, used by `qwen2`, `qwen3`, `phi3`): band
//     f = (f, f + n_rot/2).
// Only the first n_rot / 2 bands rotate (partial rotary, `rope.dimension_count` < head_dim);
// the remaining bands — the trailing head_dim - n_rot coordinates, paired adjacently — have
// ω_f = 0, so the same band algebra (TriAttention's statistics) covers them unchanged.
// For a rotating band, ω_f = freq_scale · theta^(-2f / n_rot) / freq_factor[f]:
// freq_factor is the `rope_freqs.weight` tensor (Llama-3.1 "llama3" scaling) or the LongRoPE
// factor set in use (`rope_factors_short/long.weight`, Phi-3.5 / Phi-4-mini), freq_scale is
// 1 / `rope.scaling.factor` for linear scaling (positions divided by the factor).
//
// Attention factor a (`rope.scaling.attn_factor`, LongRoPE's magnitude correction): embedding a
// token multiplies cos and sin of every rotated band by a, for queries and keys alike, so the
// rotated part of every q·k score grows by a² and the unrotated tail is unchanged. rotate() stays
// a pure rotation (|x| preserved): it moves an already-embedded vector to another position
// (re-rotation of kept keys, un-rotation in calibration) and must not apply a a second time.
//
// Source: RoFormer (Su et al., arXiv 2104.09864) §3.4; llama.cpp ggml_rope_ext (modes NORM and
// NEOX, n_dims, freq_factors, freq_scale, attn_factor as mscale on cos/sin); GPT-NeoX (arXiv
// 2204.06745) for the half-split layout; LongRoPE (Ding et al., arXiv 2402.13753) §3 for the
// per-frequency rescale factors; HF transformers `_compute_longrope_parameters` for the
// attention factor's place (it scales cos and sin).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace kvevict {

/// Pairing of head coordinates into rotated bands (see the file comment).
enum class RopeStyle { Adjacent, Neox };

/// Everything that fixes a model's RoPE. Filled by the model loader (model/model.h).
struct RopeConfig {
  int head_dim = 0;        ///< coordinates per head
  int n_rot = 0;           ///< rotated coordinates (even, <= head_dim); 0 means head_dim
  float theta = 10000.0f;  ///< base frequency (`rope.freq_base`)
  RopeStyle style = RopeStyle::Adjacent;
  double freq_scale = 1.0;          ///< 1 / linear scaling factor (positions are multiplied by it)
  std::vector<float> freq_factors;  ///< [n_rot / 2] divisors of ω_f, or empty (all 1)
  double attn_factor = 1.0;         ///< multiplies cos/sin when embedding (angles()); > 0
};

/// Per-band frequencies ω_f of one head, computed in double and applied in double so that
/// rotating by a position delta later (re-rotation) matches a direct rotation to the new
/// position to float precision.
class Rope {
 public:
  Rope() = default;
  /// Full-width adjacent-pair RoPE (the classic llama layout).
  Rope(int head_dim, float theta) : Rope(RopeConfig{head_dim, head_dim, theta, RopeStyle::Adjacent, 1.0, {}, 1.0}) {}
  /// Any RoPE of RopeConfig. Requires 0 < n_rot <= head_dim, both even, and freq_factors
  /// empty or of n_rot / 2 entries (the loader checks these and names the key).
  explicit Rope(const RopeConfig& c) : cfg_(c) {
    if (cfg_.n_rot == 0) cfg_.n_rot = cfg_.head_dim;
    const int F = cfg_.head_dim / 2, R = cfg_.n_rot / 2;
    omega_.assign(static_cast<size_t>(F), 0.0);
    for (int f = 0; f < R; ++f) {
      double w = cfg_.freq_scale * std::pow(static_cast<double>(cfg_.theta), -2.0 * f / cfg_.n_rot);
      if (!cfg_.freq_factors.empty()) w /= static_cast<double>(cfg_.freq_factors[static_cast<size_t>(f)]);
      omega_[static_cast<size_t>(f)] = w;
    }
  }

  int head_dim() const { return cfg_.head_dim; }
  int n_rot() const { return cfg_.n_rot; }           ///< rotated coordinates
  int n_bands() const { return cfg_.head_dim / 2; }  ///< all bands, rotated or not
  int n_rotated_bands() const { return cfg_.n_rot / 2; }
  float theta() const { return cfg_.theta; }
  RopeStyle style() const { return cfg_.style; }
  const RopeConfig& config() const { return cfg_; }
  /// ω_f per band [head_dim / 2] (radians per token); 0 for bands that do not rotate.
  const std::vector<double>& inv_freq() const { return omega_; }

  /// Coordinates (a, b) of band f: x_f = x[a] + i·x[b].
  int band_re(int f) const {
    if (f >= n_rotated_bands()) return 2 * f;  // unrotated tail: n_rot + 2(f - R) = 2f
    return cfg_.style == RopeStyle::Adjacent ? 2 * f : f;
  }
  int band_im(int f) const {
    if (f >= n_rotated_bands()) return 2 * f + 1;
    return cfg_.style == RopeStyle::Adjacent ? 2 * f + 1 : f + cfg_.n_rot / 2;
  }

  double attn_factor() const { return cfg_.attn_factor; }

  /// Embedding coefficients of every rotated band at position `pos`: cs[2f] = a·cos(pos·ω_f),
  /// cs[2f+1] = a·sin(pos·ω_f), a = attn_factor (1 for all but LongRoPE files). cs: [n_rot] doubles.
  void angles(int64_t pos, double* cs) const {
    const double m = cfg_.attn_factor;
    for (int f = 0; f < n_rotated_bands(); ++f) {
      const double a = static_cast<double>(pos) * omega_[static_cast<size_t>(f)];
      cs[2 * f] = m * std::cos(a);
      cs[2 * f + 1] = m * std::sin(a);
    }
  }
  /// Embeds x[head_dim] with the coefficients of `angles()` (trigonometry done once per token):
  /// RoPE at that position, rotated bands scaled by attn_factor.
  void apply(float* x, const double* cs) const {
    for (int f = 0; f < n_rotated_bands(); ++f) rotate_band(x, f, cs[2 * f], cs[2 * f + 1]);
  }
  /// Rotates one head vector x[head_dim] in place by position `pos` (tokens; may be negative,
  /// which un-rotates). A pure rotation: attn_factor is not applied (see the file comment), so
  /// rotate(apply(x, angles(p)), d) == apply(x, angles(p + d)) to rounding.
  void rotate(float* x, int64_t pos) const {
    for (int f = 0; f < n_rotated_bands(); ++f) {
      const double a = static_cast<double>(pos) * omega_[static_cast<size_t>(f)];
      const double cs[2] = {std::cos(a), std::sin(a)};
      rotate_band(x, f, cs[0], cs[1]);
    }
  }

 private:
  void rotate_band(float* x, int f, double c, double s) const {
    const int a = band_re(f), b = band_im(f);
    const double x0 = x[a], x1 = x[b];
    x[a] = static_cast<float>(x0 * c - x1 * s);
    x[b] = static_cast<float>(x0 * s + x1 * c);
  }
  RopeConfig cfg_;
  std::vector<double> omega_;
};

}  // namespace kvevict
