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

#include "eviction/attention_sums.h"
#include "eviction/registry.h"
#include "util/error.h"

namespace kvevict {
namespace {

class H2oSelector final : public PerHeadSelector {
 public:
  explicit H2oSelector(double heavy_ratio) : heavy_ratio_(heavy_ratio) {}
  SelectorNeeds needs() const override { return {.attention = true}; }
  std::unique_ptr<SelectorState> make_state(const KvShape& shape) const override {
    return std::make_unique<AttentionSumState>(shape);
  }
  void score_head(const RoundInput& in, const SelectorState* state, int layer, int kv_head,
                  std::span<float> out) const override {
    const auto* st = dynamic_cast<const AttentionSumState*>(state);
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
