#include "eviction/query_window.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "util/error.h"
#include "util/field_error.h"

namespace kvevict {

QueryWindowState::QueryWindowState(int n_layers, int window)
    : window_(window), ring_(static_cast<size_t>(n_layers)), seen_(static_cast<size_t>(n_layers), 0) {
  if (n_layers < 1 || window < 1)
    throw Error(fmt::format("query window: need n_layers >= 1 and window >= 1 (got {}, {})", n_layers, window));
}

void QueryWindowState::observe(const AttentionObservation& obs) {
  if (obs.layer < 0 || obs.layer >= static_cast<int>(ring_.size()))
    throw Error(fmt::format("query window: layer {} outside [0, {})", obs.layer, ring_.size()));
  if (n_heads_ == 0) {
    n_heads_ = obs.n_heads;
    head_dim_ = obs.head_dim;
    group_size_ = obs.group_size;
  } else if (obs.n_heads != n_heads_ || obs.head_dim != head_dim_ || obs.group_size != group_size_) {
    throw Error(fmt::format("query window: observation with {} heads x {} dims (group {}) after {} x {} (group {})",
                            obs.n_heads, obs.head_dim, obs.group_size, n_heads_, head_dim_, group_size_));
  }
  const size_t width = static_cast<size_t>(n_heads_) * static_cast<size_t>(head_dim_);
  auto& ring = ring_[static_cast<size_t>(obs.layer)];
  if (ring.empty()) ring.resize(width * static_cast<size_t>(window_));
  int64_t& seen = seen_[static_cast<size_t>(obs.layer)];
  std::copy(obs.queries, obs.queries + width,
            ring.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(seen % window_) * width));
  ++seen;
}

int QueryWindowState::count(int layer) const {
  return static_cast<int>(std::min<int64_t>(window_, seen_[static_cast<size_t>(layer)]));
}

const float* QueryWindowState::query(int layer, int i) const {
  const int64_t seen = seen_[static_cast<size_t>(layer)];
  const int64_t slot = (seen - count(layer) + i) % window_;  // oldest held query first
  return ring_[static_cast<size_t>(layer)].data() + slot * int64_t{n_heads_} * head_dim_;
}

const QueryWindowState& as_query_window(const SelectorState* state, const char* policy) {
  const auto* w = dynamic_cast<const QueryWindowState*>(state);
  if (!w) throw Error(fmt::format("{}: scoring needs the query window its make_state() creates", policy));
  return *w;
}

void softmax_scores(const float* q, const float* K, int64_t n, int head_dim, float* probs) {
  // float exponentials (the cost of a SnapKV round is n_queries x heads x n of them); the sum is
  // accumulated in double.
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < n; ++s) {
    float dot = 0.0f;
    for (int d = 0; d < head_dim; ++d) dot += q[d] * K[s * head_dim + d];
    probs[s] = dot * scale;
    m = std::max(m, probs[s]);
  }
  double sum = 0.0;
  for (int64_t s = 0; s < n; ++s) sum += (probs[s] = std::exp(probs[s] - m));
  const auto inv = static_cast<float>(1.0 / sum);
  for (int64_t s = 0; s < n; ++s) probs[s] *= inv;
}

void snapkv_scores(const RoundInput& in, const QueryWindowState& window, int layer, int kv_head, int kernel,
                   std::span<float> out) {
  const int n_q = window.count(layer);
  if (n_q == 0) throw Error(fmt::format("snapkv: layer {} has observed no query before an eviction round", layer));
  const int hd = window.head_dim(), group = window.group_size();
  const int64_t n = in.n_candidates;
  const float* keys = in.kv.keys(layer, kv_head);
  std::vector<float> probs(static_cast<size_t>(n));
  std::vector<double> mean(static_cast<size_t>(n), 0.0);
  for (int i = 0; i < n_q; ++i)
    for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
      softmax_scores(window.query(layer, i) + int64_t{h} * hd, keys, n, hd, probs.data());
      for (int64_t s = 0; s < n; ++s) mean[static_cast<size_t>(s)] += probs[static_cast<size_t>(s)];
    }
  // The mean over queries and over the group are both plain means, so one division does both;
  // pooling is linear and commutes with them.
  const double norm = 1.0 / (static_cast<double>(n_q) * group * kernel);
  const int64_t half = kernel / 2;
  for (int64_t s = 0; s < n; ++s) {
    double acc = 0.0;
    for (int64_t j = std::max<int64_t>(0, s - half); j <= std::min(n - 1, s + half); ++j)
      acc += mean[static_cast<size_t>(j)];
    out[static_cast<size_t>(s)] = static_cast<float>(acc * norm);
  }
}

SnapKvParams SnapKvParams::read(const SelectorParams& params) {
  SnapKvParams p;
  p.window = static_cast<int>(params.get_int("window", p.window, 1, kMaxQueryWindow));
  p.kernel = static_cast<int>(params.get_int("kernel", p.kernel, 1, 1023));
  if (p.kernel % 2 == 0)
    throw FieldError(Field::Param, "",
                     fmt::format(" kernel={}: the pooling kernel must be odd (same padding)", p.kernel));
  return p;
}

}  // namespace kvevict
