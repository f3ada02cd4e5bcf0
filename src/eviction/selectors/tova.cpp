// `tova` (Token Omission Via Attention): keep the candidates the newest query attends to most.
// Score of a candidate = its attention probability under the newest post-RoPE query, the softmax
// taken over every live slot (what the model itself attended when it decoded that token),
// averaged over the query heads of the KV head's group (tova_scope=group, the spec's default) or
// over all query heads of the layer (tova_scope=layer, as the TOVA paper does; every KV head of
// the layer then gets the same scores and so keeps the same slots).
// Parameters: tova_scope=group|layer.
// Source: TOVA (arXiv 2401.06104) §3; docs/eviction-spec.md §3 row `tova`.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "eviction/query_window.h"
#include "eviction/registry.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

class TovaSelector final : public Selector {
 public:
  explicit TovaSelector(bool layer_scope) : layer_scope_(layer_scope) {}
  SelectorNeeds needs() const override { return {.queries = true}; }
  std::unique_ptr<SelectorState> make_state(const KvShape& shape) const override {
    return std::make_unique<QueryWindowState>(shape.n_layers, 1);  // the newest query only
  }

  void score(const RoundInput& in, SelectorState* state, std::span<float> scores) const override {
    const QueryWindowState& w = as_query_window(state, "tova");
    const KvShape& s = in.kv.shape();
    const auto run = [&](int64_t l0, int64_t l1) {
      for (int layer = static_cast<int>(l0); layer < l1; ++layer) score_layer(in, w, layer, scores);
    };
    if (in.pool)
      in.pool->parallel_for(s.n_layers, run, int64_t{s.n_layers} * s.n_kv_heads * in.n_candidates * s.head_dim);
    else
      run(0, s.n_layers);
  }

 private:
  void score_layer(const RoundInput& in, const QueryWindowState& w, int layer, std::span<float> scores) const {
    if (w.count(layer) == 0)
      throw Error(fmt::format("tova: layer {} has observed no query before an eviction round", layer));
    const KvShape& s = in.kv.shape();
    const int group = w.group_size(), hd = s.head_dim;
    const int64_t n = in.n_candidates, n_slots = in.kv.length(layer);
    const float* q = w.query(layer, w.count(layer) - 1);
    // mean[kv][i]: mean over the group's heads of each candidate's probability.
    std::vector<float> probs(static_cast<size_t>(n_slots));
    std::vector<double> mean(static_cast<size_t>(s.n_kv_heads * n), 0.0);
    for (int h = 0; h < w.n_heads(); ++h) {
      const int kvh = h / group;
      softmax_scores(q + int64_t{h} * hd, in.kv.keys(layer, kvh), n_slots, hd, probs.data());
      for (int64_t i = 0; i < n; ++i) mean[static_cast<size_t>(kvh * n + i)] += probs[static_cast<size_t>(i)] / group;
    }
    if (layer_scope_) {
      // Slot i holds the same position in every KV head under this scope (all heads always keep
      // the same slots); check it, since a mismatch would average unrelated tokens.
      for (int kvh = 1; kvh < s.n_kv_heads; ++kvh)
        if (!std::equal(in.kv.positions(layer, 0), in.kv.positions(layer, 0) + n, in.kv.positions(layer, kvh)))
          throw Error(
              fmt::format("tova_scope=layer: KV heads 0 and {} of layer {} hold different positions", kvh, layer));
      for (int64_t i = 0; i < n; ++i) {
        double m = 0.0;
        for (int kvh = 0; kvh < s.n_kv_heads; ++kvh) m += mean[static_cast<size_t>(kvh * n + i)];
        for (int kvh = 0; kvh < s.n_kv_heads; ++kvh) mean[static_cast<size_t>(kvh * n + i)] = m / s.n_kv_heads;
      }
    }
    for (int kvh = 0; kvh < s.n_kv_heads; ++kvh)
      for (int64_t i = 0; i < n; ++i)
        scores[static_cast<size_t>((int64_t{layer} * s.n_kv_heads + kvh) * n + i)] =
            static_cast<float>(mean[static_cast<size_t>(kvh * n + i)]);
  }

  bool layer_scope_;
};

}  // namespace

const PolicyInfo& policy_tova() {
  static const PolicyInfo info{
      .name = "tova",
      .summary = "TOVA: keep what the newest query attends to (group mean; tova_scope=layer for the layer mean).",
      .source = "arXiv 2401.06104 §3; docs/eviction-spec.md §3",
      .evicts = true,
      .protect_prompt = false,
      .sinks = 0,
      .make = [](const SelectorParams& params) {
        return std::make_unique<TovaSelector>(params.get_string("tova_scope", "group", {"group", "layer"}) == "layer");
      }};
  return info;
}

}  // namespace kvevict
