// `recency` and `streaming` (StreamingLLM): score = position, so the newest K_sel candidates are
// kept; `streaming` adds 4 attention sinks by default (pinned by the schedule).
// Source: StreamingLLM (arXiv 2309.17453) §3.2; docs/eviction-spec.md §3 rows `recency`, `streaming`.
#include "eviction/registry.h"

namespace kvevict {
namespace {

class RecencySelector final : public PerHeadSelector {
 public:
  void score_head(const RoundInput& in, const SelectorState*, int layer, int kv_head,
                  std::span<float> out) const override {
    // Slots are chronological, so the slot index orders candidates by age exactly (a float
    // position could tie beyond 2^24 tokens; the slot index stays below the capacity).
    (void)in, (void)layer, (void)kv_head;
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(i);
  }
};

}  // namespace

const PolicyInfo& policy_recency() {
  static const PolicyInfo info{
      .name = "recency",
      .summary = "Sliding window: keep the newest K_sel candidates (no sinks, prompt not pinned).",
      .source = "docs/eviction-spec.md §3",
      .evicts = true,
      .protect_prompt = false,
      .sinks = 0,
      .make = [](const SelectorParams&) { return std::make_unique<RecencySelector>(); }};
  return info;
}

const PolicyInfo& policy_streaming() {
  static const PolicyInfo info{
      .name = "streaming",
      .summary = "StreamingLLM: the first S sink tokens (default 4) plus the newest candidates.",
      .source = "arXiv 2309.17453 §3.2; docs/eviction-spec.md §3, §5",
      .evicts = true,
      .protect_prompt = false,
      .sinks = 4,
      .make = [](const SelectorParams&) { return std::make_unique<RecencySelector>(); },
      .min_sinks = 1,
      .min_sinks_reason = "keeps no attention sinks, which is policy 'recency' (use that, or at least 1 sink)"};
  return info;
}

}  // namespace kvevict
