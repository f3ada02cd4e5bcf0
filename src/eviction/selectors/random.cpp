// `random` (Random Attention) and `random-unprotected`: i.i.d. U(0,1) scores per candidate, so the
// top-K_sel is a uniform subset without replacement, drawn fresh per (sequence, layer, KV head,
// round) from a stream seeded by (seed, sequence, round, layer, KV head).
// Source: Random Attention (arXiv 2609.03430) §3; docs/eviction-spec.md §3 rows `random`,
// `random-unprotected`; the seeding follows the paper's vLLM port, extended by the KV head.
#include "eviction/registry.h"
#include "util/rng.h"

namespace kvevict {
namespace {

class RandomSelector final : public PerHeadSelector {
 public:
  void score_head(const RoundInput& in, const SelectorState*, int layer, int kv_head,
                  std::span<float> out) const override {
    Rng rng(stream_id({in.seed, in.sequence_id, static_cast<uint64_t>(in.round), static_cast<uint64_t>(layer),
                       static_cast<uint64_t>(kv_head)}));
    for (float& s : out) s = static_cast<float>(rng.uniform());
  }
};

}  // namespace

const PolicyInfo& policy_random() {
  static const PolicyInfo info{
      .name = "random",
      .summary = "Random Attention: keep the prompt, evict the trace uniformly at random per KV head.",
      .source = "arXiv 2609.03430 §3; docs/eviction-spec.md §3",
      .evicts = true,
      .protect_prompt = true,
      .sinks = 0,
      .make = [](const SelectorParams&) { return std::make_unique<RandomSelector>(); }};
  return info;
}

const PolicyInfo& policy_random_unprotected() {
  static const PolicyInfo info{
      .name = "random-unprotected",
      .summary = "Uniform random eviction with the prompt not pinned (the paper's score-alone row).",
      .source = "arXiv 2609.03430 Table 2; docs/eviction-spec.md §3",
      .evicts = true,
      .protect_prompt = false,
      .sinks = 0,
      .make = [](const SelectorParams&) { return std::make_unique<RandomSelector>(); }};
  return info;
}

}  // namespace kvevict
