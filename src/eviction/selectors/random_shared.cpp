// `random-shared`: Random Attention with one uniform draw per (sequence, layer, round) shared by
// every KV head of the layer, so all KV heads keep the same slots. The control for cross-head
// redundancy: same signal and protection as `random`, minimal union across heads. Prompt pinned.
// Stream: (seed, sequence, round, layer, "shared"), never the per-head streams of `random`.
// Source: Random Attention (arXiv 2609.03430), cross-head redundancy ablation (0.871 vs 0.874 on
// Qwen3-4B MATH500; code mode `random_unified`); docs/eviction-spec.md §3 row `random-shared`.
#include "eviction/registry.h"
#include "util/rng.h"

namespace kvevict {
namespace {

constexpr uint64_t kSharedStreamTag = 0x534841524544ull;  // "SHARED"

class RandomSharedSelector final : public PerHeadSelector {
 public:
  void score_head(const RoundInput& in, const SelectorState*, int layer, int /*kv_head*/,
                  std::span<float> out) const override {
    // Every KV head regenerates the layer's one draw from the same stream: identical scores.
    Rng rng(stream_id(
        {in.seed, in.sequence_id, static_cast<uint64_t>(in.round), static_cast<uint64_t>(layer), kSharedStreamTag}));
    for (float& s : out) s = static_cast<float>(rng.uniform());
  }
};

}  // namespace

const PolicyInfo& policy_random_shared() {
  static const PolicyInfo info{
      .name = "random-shared",
      .summary = "Random Attention with one draw per layer shared by all KV heads (prompt pinned).",
      .source = "arXiv 2609.03430 (cross-head ablation); docs/eviction-spec.md §3",
      .evicts = true,
      .protect_prompt = true,
      .sinks = 0,
      .make = [](const SelectorParams&) { return std::make_unique<RandomSharedSelector>(); }};
  return info;
}

}  // namespace kvevict
