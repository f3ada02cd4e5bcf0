// `snapkv` (SnapKV): keep the candidates the recent queries attend to most. Score = softmax(q·k/√d)
// of each of the last w post-RoPE queries over the candidates only, mean over the w queries, 1-D
// average pooling (kernel 5, same padding), mean over the GQA group. No sinks, no prompt pin unless
// `+prompt` / `--sinks`.
// Parameters: window=w (default 64), kernel=k (odd, default 5).
// Source: SnapKV (arXiv 2404.14469) §4.2-4.3 (the paper says max pooling; the released code, which
// the spec follows, average-pools); docs/eviction-spec.md §3 row `snapkv`.
#include "eviction/query_window.h"
#include "eviction/registry.h"

namespace kvevict {
namespace {

class SnapKvSelector final : public PerHeadSelector {
 public:
  explicit SnapKvSelector(SnapKvParams p) : p_(p) {}
  SelectorNeeds needs() const override { return {.queries = true}; }
  std::unique_ptr<SelectorState> make_state(const KvShape& shape) const override {
    return std::make_unique<QueryWindowState>(shape.n_layers, p_.window);
  }
  void score_head(const RoundInput& in, const SelectorState* state, int layer, int kv_head,
                  std::span<float> out) const override {
    snapkv_scores(in, as_query_window(state, "snapkv"), layer, kv_head, p_.kernel, out);
  }

 private:
  SnapKvParams p_;
};

}  // namespace

const PolicyInfo& policy_snapkv() {
  static const PolicyInfo info{
      .name = "snapkv",
      .summary = "SnapKV: keep what the last w queries attend to (softmax over candidates, avg-pooled, group mean).",
      .source = "arXiv 2404.14469 §4; docs/eviction-spec.md §3",
      .evicts = true,
      .protect_prompt = false,
      .sinks = 0,
      .make = [](const SelectorParams& params) {
        return std::make_unique<SnapKvSelector>(SnapKvParams::read(params));
      }};
  return info;
}

}  // namespace kvevict
