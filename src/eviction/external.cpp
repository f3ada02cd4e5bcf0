#include "eviction/external.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "eviction/attention_sums.h"
#include "eviction/query_window.h"
#include "kernels/rope.h"
#include "util/error.h"
#include "util/rng.h"

namespace kvevict {
namespace {

/// The query window (with each held query's position) and the attention sums, as asked.
class ExternalState final : public SelectorState {
 public:
  ExternalState(const KvShape& shape, const ExternalNeeds& needs) {
    if (needs.queries || needs.queries_pre) {
      window_.emplace(shape.n_layers, needs.window);
      pos_ring_.assign(static_cast<size_t>(shape.n_layers), std::vector<int64_t>(static_cast<size_t>(needs.window), 0));
      seen_.assign(static_cast<size_t>(shape.n_layers), 0);
    }
    if (needs.attention) sums_.emplace(shape);
  }
  void observe(const AttentionObservation& obs) override {
    if (window_) {
      window_->observe(obs);
      auto& ring = pos_ring_[static_cast<size_t>(obs.layer)];
      int64_t& seen = seen_[static_cast<size_t>(obs.layer)];
      ring[static_cast<size_t>(seen % static_cast<int64_t>(ring.size()))] = obs.position;
      ++seen;
    }
    if (sums_) sums_->observe(obs);
  }
  void on_compact(int layer, int kv_head, std::span<const int32_t> keep) override {
    if (sums_) sums_->on_compact(layer, kv_head, keep);
  }
  /// Position of held query i (0 = oldest) of `layer`, as QueryWindowState::query indexes them.
  int64_t query_position(int layer, int i) const {
    const auto& ring = pos_ring_[static_cast<size_t>(layer)];
    const int64_t n = static_cast<int64_t>(ring.size());
    const int64_t seen = seen_[static_cast<size_t>(layer)];
    return ring[static_cast<size_t>((seen - window_->count(layer) + i) % n)];
  }
  std::optional<QueryWindowState> window_;
  std::optional<AttentionSumState> sums_;

 private:
  std::vector<std::vector<int64_t>> pos_ring_;
  std::vector<int64_t> seen_;
};

}  // namespace

ExternalSelector::ExternalSelector(ExternalNeeds needs) : needs_(needs) {
  // Checked before make_state allocates the window's ring (n_layers * window queries).
  if (needs_.window < 1 || needs_.window > kMaxQueryWindow)
    throw Error(fmt::format("selector window {}: must be in [1, {}] (as snapkv's window)", needs_.window,
                            kMaxQueryWindow));
}

SelectorNeeds ExternalSelector::needs() const {
  return {.queries = needs_.queries || needs_.queries_pre, .attention = needs_.attention};
}

std::unique_ptr<SelectorState> ExternalSelector::make_state(const KvShape& shape) const {
  if (!needs_.queries && !needs_.queries_pre && !needs_.attention) return nullptr;
  return std::make_unique<ExternalState>(shape, needs_);
}

void ExternalSelector::score(const RoundInput& in, SelectorState* state, std::span<float> scores) const {
  const KvShape& shape = in.kv.shape();
  const auto* st = dynamic_cast<const ExternalState*>(state);
  if ((needs_.queries || needs_.queries_pre || needs_.attention) && !st)
    throw Error("external selector: scoring needs the state its make_state() creates");
  if (needs_.queries_pre && !in.rope) throw Error("external selector: pre-RoPE queries need the model's RoPE");
  if (needs_.queries_pre && in.positions != PositionMode::Logical)
    throw Error("external selector: pre-RoPE queries need logical positions (position mode 'logical')");
  const int n_heads_total = shape.n_layers * shape.n_kv_heads;
  const int hd = shape.head_dim;
  std::vector<HeadCandidates> heads(static_cast<size_t>(n_heads_total));
  // Per layer: the group's queries gathered [n_kv_heads][n_queries][group][head_dim], and positions.
  std::vector<std::vector<float>> q_post(static_cast<size_t>(shape.n_layers)), q_pre(q_post.size());
  std::vector<std::vector<int64_t>> q_pos(q_post.size());
  for (int l = 0; l < shape.n_layers; ++l) {
    int nq = 0, group = 0;
    if (st && st->window_) {
      const QueryWindowState& w = *st->window_;
      nq = w.count(l);
      group = w.group_size();
      if (nq == 0) throw Error(fmt::format("external selector: layer {} has observed no query", l));
      auto& post = q_post[static_cast<size_t>(l)];
      auto& pos = q_pos[static_cast<size_t>(l)];
      post.resize(static_cast<size_t>(shape.n_kv_heads) * nq * group * hd);
      pos.resize(static_cast<size_t>(nq));
      for (int i = 0; i < nq; ++i) {
        pos[static_cast<size_t>(i)] = st->query_position(l, i);
        const float* q = w.query(l, i);  // [n_heads, head_dim]; head h reads KV head h / group
        for (int h = 0; h < w.n_heads(); ++h) {
          const int kvh = h / group, g = h % group;
          std::memcpy(post.data() + ((static_cast<size_t>(kvh) * nq + i) * group + g) * hd,
                      q + static_cast<size_t>(h) * hd, sizeof(float) * static_cast<size_t>(hd));
        }
      }
      if (needs_.queries_pre) {
        auto& pre = q_pre[static_cast<size_t>(l)];
        pre = post;
        for (int kvh = 0; kvh < shape.n_kv_heads; ++kvh)
          for (int i = 0; i < nq; ++i)
            for (int g = 0; g < group; ++g)
              in.rope->rotate(pre.data() + ((static_cast<size_t>(kvh) * nq + i) * group + g) * hd,
                              -pos[static_cast<size_t>(i)]);
      }
    }
    for (int h = 0; h < shape.n_kv_heads; ++h) {
      HeadCandidates& c = heads[static_cast<size_t>(l * shape.n_kv_heads + h)];
      c.layer = l;
      c.kv_head = h;
      c.n_candidates = in.n_candidates;
      c.head_dim = hd;
      c.keys = in.kv.keys(l, h);
      c.values = in.kv.values(l, h);
      c.positions = in.kv.positions(l, h);
      c.stream = stream_id({in.seed, in.sequence_id, static_cast<uint64_t>(in.round), static_cast<uint64_t>(l),
                            static_cast<uint64_t>(h)});
      if (nq > 0) {
        c.n_queries = nq;
        c.group_size = group;
        const size_t off = static_cast<size_t>(h) * nq * group * hd;
        if (needs_.queries) c.queries = q_post[static_cast<size_t>(l)].data() + off;
        if (needs_.queries_pre) c.queries_pre = q_pre[static_cast<size_t>(l)].data() + off;
        c.query_positions = q_pos[static_cast<size_t>(l)].data();
      }
      if (st && st->sums_) {
        const std::vector<double>& acc = st->sums_->slot_scores(l, h);
        // Slots the forward pass has not yet attended to have received nothing.
        if (static_cast<int64_t>(acc.size()) < in.n_candidates)
          throw Error(fmt::format("external selector: layer {} KV head {} holds sums of {} slots, fewer than the {} "
                                  "candidates",
                                  l, h, acc.size(), in.n_candidates));
        c.attention = acc.data();
      }
    }
  }
  score_round(in, heads, scores);
}

}  // namespace kvevict
