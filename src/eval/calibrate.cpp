#include "eval/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "eviction/selector.h"
#include "kernels/rope.h"
#include "model/forward.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

/// Sums of the pre-RoPE query bands per (layer, head, band) over every observed query token.
class QuerySums final : public SelectorState {
 public:
  QuerySums(const ModelConfig& c, const Rope& rope)
      : c_(c), rope_(rope), re_(size()), im_(size()), abs_(size()), q_(static_cast<size_t>(c.head_dim)) {}

  void observe(const AttentionObservation& obs) override {
    const int hd = c_.head_dim, F = hd / 2;
    for (int h = 0; h < obs.n_heads; ++h) {
      std::copy(obs.queries + int64_t{h} * hd, obs.queries + int64_t{h + 1} * hd, q_.begin());
      rope_.rotate(q_.data(), -obs.position);  // post-RoPE -> pre-RoPE
      for (int f = 0; f < F; ++f) {
        const size_t k = index(obs.layer, h, f);
        const double re = q_[static_cast<size_t>(rope_.band_re(f))], im = q_[static_cast<size_t>(rope_.band_im(f))];
        re_[k] += re;  // band f of kernels/rope.h (adjacent pair or NEOX halves)
        im_[k] += im;
        abs_[k] += std::hypot(re, im);
      }
    }
  }

  /// Means over `count` tokens into `s` (shape fields already set).
  void means(QueryStats& s, int64_t count) const {
    const double inv = 1.0 / static_cast<double>(count);
    s.mean_re.resize(re_.size());
    s.mean_im.resize(re_.size());
    s.mean_abs.resize(re_.size());
    for (size_t k = 0; k < re_.size(); ++k) {
      s.mean_re[k] = re_[k] * inv;
      s.mean_im[k] = im_[k] * inv;
      s.mean_abs[k] = abs_[k] * inv;
    }
  }

 private:
  size_t size() const {
    return static_cast<size_t>(c_.n_layers) * static_cast<size_t>(c_.n_heads) * static_cast<size_t>(c_.head_dim / 2);
  }
  size_t index(int layer, int head, int band) const {
    return (static_cast<size_t>(layer) * static_cast<size_t>(c_.n_heads) + static_cast<size_t>(head)) *
        static_cast<size_t>(c_.head_dim / 2) +
        static_cast<size_t>(band);
  }
  const ModelConfig& c_;
  const Rope& rope_;
  std::vector<double> re_, im_, abs_;
  std::vector<float> q_;
};

}  // namespace

QueryStats calibrate_query_stats(const Model& model, std::span<const int32_t> tokens, int64_t ctx,
                                 ThreadPool& pool, const std::function<void(int64_t, int64_t)>& on_chunk) {
  const ModelConfig& c = model.config();
  if (ctx == 0) ctx = c.context_length;
  if (ctx < 2) throw Error(fmt::format("calibration chunk size {} must be >= 2 tokens", ctx));
  if (tokens.size() < 2) throw Error(fmt::format("calibration needs at least 2 tokens, got {}", tokens.size()));
  const Rope rope(c.rope);
  QuerySums sums(c, rope);
  const KvShape shape{c.n_layers, c.n_kv_heads, c.head_dim};
  ForwardBuffers buf;
  std::vector<float> logits;
  std::vector<int32_t> chunk;
  const auto n = static_cast<int64_t>(tokens.size());
  for (int64_t start = 0; start < n; start += ctx) {
    chunk.assign(tokens.begin() + start, tokens.begin() + std::min(n, start + ctx));
    if (start > 0 && model.tokenizer().add_bos()) chunk[0] = model.tokenizer().bos_id();
    SequenceKv kv(shape, static_cast<int64_t>(chunk.size()));
    const ForwardSegment seg{&kv, chunk, 0, PositionMode::Logical, &sums, /*want_probs=*/false, /*is_prefill=*/true};
    model_forward(
        {.model = model, .rope = rope, .pool = pool, .buf = buf, .wanted = LogitsWanted::None, .allow_blas = true}, seg,
        logits);
    if (on_chunk) on_chunk(std::min(n, start + ctx), n);
  }
  QueryStats s;
  s.n_layers = c.n_layers;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.rope_theta = c.rope_theta;
  s.rope_inv_freq = rope.inv_freq();
  s.tokens = n;
  sums.means(s, n);
  return s;
}

}  // namespace kvevict
