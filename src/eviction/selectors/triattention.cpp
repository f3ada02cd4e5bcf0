// `triattention` (TriAttention): query-independent scores from calibrated query statistics, one
// keep-set per KV head shared by all layers. Prompt pinned by default.
//
// For query head h of layer l, band f (see eviction/query_stats.h), calibrated E q_f and E|q_f|,
// and a candidate key with pre-RoPE band k_f at position p, with t the position of the next token:
//   amp = |E q_f|·|k_f|,  φ = arg(E q_f · conj k_f),  extra = (E|q_f| − |E q_f|)·|k_f|
//   s_h = mean_{d ∈ {1, 2, 4, …, 65536}} Σ_f amp·cos((t − p + d)·ω_f + φ) + Σ_f extra.
// s_h is z-normalised over the candidates outside the prompt pin (population std, clamped at
// 1e-6; skipped with fewer than two such candidates), maxed over the query heads of the KV head's
// group, and averaged over layers; that per-KV-head score is written for every layer.
//
// Evaluation. amp·e^{iφ} = E q_f · conj(k_f) and k_f = k̃_f·e^{−ipω_f} for the cached post-RoPE
// key k̃, so the mean over d equals Re(E q_f · e^{itω_f} · C_f · conj(k̃_f)) with
// C_f = mean_d e^{idω_f}: the keys need no un-rotation and no per-offset cosine (tests check this
// against the literal formula). In PositionMode::Cache keys are rotated by slot index, so t is the
// cache length (the next token's slot) and distances are slot distances.
//
// Parameters: stats=FILE (required; `kvevict calibrate`).
// Source: TriAttention (arXiv 2604.04921) §3-4; docs/eviction-spec.md §3 row `triattention`; the
// normalisation set, t = tokens seen and the layer-shared keep-set follow the Random Attention
// code (`cache_utils.py`, mode `triattn_ph`, ported from WeianMao/triattention).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <numbers>
#include <vector>

#include "eviction/query_stats.h"
#include "eviction/registry.h"
#include "kernels/rope.h"
#include "util/error.h"
#include "util/field_error.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

using cplx = std::complex<double>;

class TriAttentionSelector final : public Selector {
 public:
  explicit TriAttentionSelector(QueryStats stats) : st_(std::move(stats)) {}

  std::unique_ptr<SelectorState> make_state(const KvShape& shape) const override {
    // The engine calls this once per sequence: the earliest place to reject another model's file.
    if (shape.n_layers != st_.n_layers || shape.n_kv_heads != st_.n_kv_heads || shape.head_dim != st_.head_dim)
      throw Error(fmt::format(
          "triattention: statistics for {} layers x {} KV heads x head_dim {} ({}) do not fit "
          "this model ({} x {} x {})",
          st_.n_layers, st_.n_kv_heads, st_.head_dim, st_.model, shape.n_layers, shape.n_kv_heads, shape.head_dim));
    return nullptr;
  }

  void score(const RoundInput& in, SelectorState*, std::span<float> scores) const override {
    const KvShape& s = in.kv.shape();
    make_state(s);  // same shape check for callers that skip make_state
    if (!in.rope) throw Error("triattention: the round carries no RoPE (RoundInput::rope)");
    const auto& inv_freq = in.rope->inv_freq();
    const int F = st_.n_bands();
    if (static_cast<int>(inv_freq.size()) != F || std::abs(in.rope->theta() / st_.rope_theta - 1.0) > 1e-6)
      throw Error(
          fmt::format("triattention: statistics were calibrated with rope_theta {} ({}), which is not this "
                      "model's RoPE",
                      st_.rope_theta, st_.model));
    // Same theta is not enough: LongRoPE sets, rope_freqs or linear scaling change ω_f.
    for (int f = 0; f < F && !st_.rope_inv_freq.empty(); ++f) {
      const double a = st_.rope_inv_freq[static_cast<size_t>(f)], b = inv_freq[static_cast<size_t>(f)];
      if (std::abs(a - b) > 1e-9 * std::max(std::abs(a), std::abs(b)))
        throw Error(fmt::format(
            "triattention: statistics were calibrated with RoPE frequency {} at band {} ({}), this model runs "
            "{} (another LongRoPE factor set, rope_freqs or linear scaling); calibrate with the same file and "
            "context size",
            a, f, st_.model, b));
    }
    // Per-round constants: e^{itω_f}·C_f.
    const double t =
        in.positions == PositionMode::Logical ? static_cast<double>(in.n_seen) : static_cast<double>(in.kv.length(0));
    std::vector<cplx> phase(static_cast<size_t>(F));
    for (int f = 0; f < F; ++f) {
      const double w = inv_freq[static_cast<size_t>(f)];
      cplx c = 0.0;
      for (int64_t d = 1; d <= kMaxOffset; d *= 2) c += std::polar(1.0, static_cast<double>(d) * w);
      phase[static_cast<size_t>(f)] =
          std::polar(1.0, std::fmod(t * w, 2.0 * std::numbers::pi)) * c / static_cast<double>(kOffsets);
    }
    // Candidates at positions >= pin_extent form the normalisation set (the prompt pin, §2.5).
    const int64_t pin_extent = in.budget > 0 ? std::min(in.prompt_len, in.k_sel() - 1) : in.prompt_len;
    const auto run = [&](int64_t h0, int64_t h1) {
      for (int kvh = static_cast<int>(h0); kvh < h1; ++kvh) score_kv_head(in, kvh, phase, pin_extent, scores);
    };
    if (in.pool)
      in.pool->parallel_for(s.n_kv_heads, run, int64_t{s.n_kv_heads} * in.n_candidates * s.head_dim);
    else
      run(0, s.n_kv_heads);
  }

 private:
  static constexpr int64_t kMaxOffset = 65536;  ///< offsets d = 2^0 .. 2^16
  static constexpr int kOffsets = 17;

  void score_kv_head(const RoundInput& in, int kvh, const std::vector<cplx>& phase, int64_t pin_extent,
                     std::span<float> scores) const {
    const KvShape& s = in.kv.shape();
    const int64_t n = in.n_candidates;
    const int F = st_.n_bands(), hd = s.head_dim, group = st_.n_heads / st_.n_kv_heads;
    const int32_t* pos0 = in.kv.positions(0, kvh);
    for (int l = 1; l < s.n_layers; ++l)
      if (!std::equal(pos0, pos0 + n, in.kv.positions(l, kvh)))
        throw Error(
            fmt::format("triattention: layer {} KV head {} holds other positions than layer 0; its keep-set "
                        "is shared across layers and needs identical slots",
                        l, kvh));
    std::vector<double> total(static_cast<size_t>(n), 0.0), best(static_cast<size_t>(n)), sh(static_cast<size_t>(n));
    std::vector<double> kabs(static_cast<size_t>(n * F));
    std::vector<cplx> coef(static_cast<size_t>(F));
    std::vector<double> extra(static_cast<size_t>(F));
    // Band f is (k[re[f]], k[im[f]]): adjacent pairs or NEOX halves (kernels/rope.h).
    std::vector<int> re(static_cast<size_t>(F)), im(static_cast<size_t>(F));
    for (int f = 0; f < F; ++f)
      re[static_cast<size_t>(f)] = in.rope->band_re(f), im[static_cast<size_t>(f)] = in.rope->band_im(f);
    for (int l = 0; l < s.n_layers; ++l) {
      const float* keys = in.kv.keys(l, kvh);
      for (int64_t i = 0; i < n; ++i)
        for (int f = 0; f < F; ++f)
          kabs[static_cast<size_t>(i * F + f)] = std::hypot(double{keys[i * hd + re[static_cast<size_t>(f)]]},
                                                            double{keys[i * hd + im[static_cast<size_t>(f)]]});
      std::fill(best.begin(), best.end(), -INFINITY);
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int f = 0; f < F; ++f) {
          const size_t k = st_.index(l, h, f);
          const cplx mean(st_.mean_re[k], st_.mean_im[k]);
          coef[static_cast<size_t>(f)] = mean * phase[static_cast<size_t>(f)];
          extra[static_cast<size_t>(f)] = st_.mean_abs[k] - std::abs(mean);
        }
        for (int64_t i = 0; i < n; ++i) {
          const float* k = keys + i * hd;
          double v = 0.0;
          for (int f = 0; f < F; ++f)  // Re(coef · conj(k̃_f)) + extra·|k_f|
            v += coef[static_cast<size_t>(f)].real() * k[re[static_cast<size_t>(f)]] +
                coef[static_cast<size_t>(f)].imag() * k[im[static_cast<size_t>(f)]] +
                extra[static_cast<size_t>(f)] * kabs[static_cast<size_t>(i * F + f)];
          sh[static_cast<size_t>(i)] = v;
        }
        z_normalise(sh, pos0, pin_extent);
        for (int64_t i = 0; i < n; ++i)
          best[static_cast<size_t>(i)] = std::max(best[static_cast<size_t>(i)], sh[static_cast<size_t>(i)]);
      }
      for (int64_t i = 0; i < n; ++i) total[static_cast<size_t>(i)] += best[static_cast<size_t>(i)];
    }
    for (int l = 0; l < s.n_layers; ++l)
      for (int64_t i = 0; i < n; ++i)
        scores[static_cast<size_t>((int64_t{l} * s.n_kv_heads + kvh) * n + i)] =
            static_cast<float>(total[static_cast<size_t>(i)] / s.n_layers);
  }

  /// v = (v − mean) / max(std, 1e-6) with mean and population std over the entries whose position
  /// is >= pin_extent; unchanged when fewer than two such entries exist.
  static void z_normalise(std::vector<double>& v, const int32_t* pos, int64_t pin_extent) {
    double sum = 0.0;
    int64_t m = 0;
    for (size_t i = 0; i < v.size(); ++i)
      if (pos[i] >= pin_extent) sum += v[i], ++m;
    if (m < 2) return;
    const double mu = sum / static_cast<double>(m);
    double var = 0.0;
    for (size_t i = 0; i < v.size(); ++i)
      if (pos[i] >= pin_extent) var += (v[i] - mu) * (v[i] - mu);
    const double sd = std::max(1e-6, std::sqrt(var / static_cast<double>(m)));
    for (double& x : v) x = (x - mu) / sd;
  }

  QueryStats st_;
};

}  // namespace

const PolicyInfo& policy_triattention() {
  static const PolicyInfo info{
      .name = "triattention",
      .summary =
          "TriAttention: trigonometric future-attention score from calibrated query centres; one "
          "keep-set per KV head shared by all layers (needs --param stats=FILE).",
      .source = "arXiv 2604.04921 §3-4; docs/eviction-spec.md §3",
      .evicts = true,
      .protect_prompt = true,
      .sinks = 0,
      .make = [](const SelectorParams& params) {
        const std::string path = params.get_string("stats", "");
        if (path.empty())
          throw FieldError(Field::Param, "policy 'triattention' needs ",
                           " stats=FILE (query statistics written by `kvevict calibrate`)");
        QueryStats st = load_query_stats(path);
        return std::make_unique<TriAttentionSelector>(std::move(st));
      }};
  return info;
}

}  // namespace kvevict
