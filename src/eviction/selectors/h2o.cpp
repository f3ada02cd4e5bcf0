// `h2o` (Heavy-Hitter Oracle): keep the slots that have received the most attention, plus the
// newest candidates. Each slot accumulates the attention probability it receives from every
// query (prefill and decode) since it entered the cache, summed over the query heads of its KV
// head's group; the accumulators move with the slots at each compaction (on_compact). A round
// splits the K_sel slots left after the schedule's pins into heavy hitters and the newest
// candidates, heavy : recent = heavy_ratio : 1 − heavy_ratio (default 1 : 1, heavy count rounded
// down). The only selector that needs attention probabilities (SelectorNeeds::attention).
// Parameters: heavy_ratio in [0, 1] (default 0.5).
// Source: H2O (arXiv 2306.14048) §3 (accumulated attention, heavy + recent split);
// docs/eviction-spec.md §3 row `h2o`.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "eviction/registry.h"
#include "util/error.h"

namespace kvevict {
namespace {

/// Accumulated attention per slot of every (layer, KV head), slot-aligned with the cache.
class H2oState final : public SelectorState {
 public:
  explicit H2oState(const KvShape& s)
      : n_kv_heads_(s.n_kv_heads), acc_(static_cast<size_t>(s.n_layers) * s.n_kv_heads) {}
  std::unique_ptr<SelectorState> clone() const override { return std::make_unique<H2oState>(*this); }

  void observe(const AttentionObservation& obs) override {
    if (!obs.probs) throw Error("h2o: the forward pass delivered no attention probabilities");
    for (int h = 0; h < obs.n_heads; ++h) {
      auto& acc = slot_scores(obs.layer, h / obs.group_size);
      if (static_cast<int64_t>(acc.size()) < obs.n_slots) acc.resize(static_cast<size_t>(obs.n_slots), 0.0);
      const float* p = obs.probs + int64_t{h} * obs.n_slots;
      for (int64_t s = 0; s < obs.n_slots; ++s) acc[static_cast<size_t>(s)] += p[s];
    }
  }

  void on_compact(int layer, int kv_head, std::span<const int32_t> keep) override {
    auto& acc = slot_scores(layer, kv_head);
    std::vector<double> kept(keep.size(), 0.0);
    for (size_t j = 0; j < keep.size(); ++j)
      if (static_cast<size_t>(keep[j]) < acc.size()) kept[j] = acc[static_cast<size_t>(keep[j])];
    acc = std::move(kept);  // slots appended later start from zero
  }

  /// Accumulators of (layer, KV head): [slots observed so far].
  std::vector<double>& slot_scores(int layer, int kv_head) {
    return acc_[static_cast<size_t>(layer * n_kv_heads_ + kv_head)];
  }
  const std::vector<double>& slot_scores(int layer, int kv_head) const {
    return acc_[static_cast<size_t>(layer * n_kv_heads_ + kv_head)];
  }

 private:
  int n_kv_heads_;
  std::vector<std::vector<double>> acc_;
};

class H2oSelector final : public PerHeadSelector {
 public:
  explicit H2oSelector(double heavy_ratio) : heavy_ratio_(heavy_ratio) {}
  SelectorNeeds needs() const override { return {.attention = true}; }
  std::unique_ptr<SelectorState> make_state(const KvShape& shape) const override {
    return std::make_unique<H2oState>(shape);
  }
  void score_head(const RoundInput& in, const SelectorState* state, int layer, int kv_head,
                  std::span<float> out) const override {
    const auto* st = dynamic_cast<const H2oState*>(state);
    if (!st) throw Error("h2o: scoring needs the accumulator state its make_state() creates");
    const auto& acc = st->slot_scores(layer, kv_head);
    const int32_t* pos = in.kv.positions(layer, kv_head);
    const int64_t n = in.n_candidates;
    int64_t pinned = 0;
    for (int64_t i = 0; i < n; ++i) {
      out[static_cast<size_t>(i)] =
          static_cast<size_t>(i) < acc.size() ? static_cast<float>(acc[static_cast<size_t>(i)]) : 0.0f;
      pinned += pos[i] < in.n_pinned;
    }
    const int64_t free = std::max<int64_t>(0, in.k_sel() - pinned);
    const auto heavy = static_cast<int64_t>(std::floor(static_cast<double>(free) * heavy_ratio_));
    // The newest (free - heavy) unpinned candidates outrank every heavy-hitter score.
    int64_t recent = free - heavy;
    for (int64_t i = n - 1; i >= 0 && recent > 0; --i)
      if (pos[i] >= in.n_pinned) {
        out[static_cast<size_t>(i)] = std::numeric_limits<float>::max();
        --recent;
      }
  }

 private:
  double heavy_ratio_;
};

}  // namespace

const PolicyInfo& policy_h2o() {
  static const PolicyInfo info{
      .name = "h2o",
      .summary = "H2O: heavy hitters by attention accumulated since insertion + the newest candidates (1:1).",
      .source = "arXiv 2306.14048 §3; docs/eviction-spec.md §3",
      .evicts = true,
      .protect_prompt = false,
      .sinks = 0,
      .make = [](const SelectorParams& params) {
        return std::make_unique<H2oSelector>(params.get("heavy_ratio", 0.5, 0.0, 1.0));
      }};
  return info;
}

}  // namespace kvevict
