// `vase` (VaSE): value-range heavy hitters plus attention-proportional sampling.
// Per (layer, KV head): the first 4 positions (VaSE's sinks) are kept; then the n_large candidates
// with the widest value range (max − min of V over the head dimension); the rest of K_sel is a
// sample without replacement with probability ∝ the SnapKV score. The three tiers are written as
// one ranking (sinks +inf, range tier by range, sample tier by Efraimidis–Spirakis keys
// log(u)/w, whose top m is such a weighted sample), so the shared top-K_sel realises the rule.
// The range tier holds n_large slots with VaSE's own sinks counted in (as in the released code's
// `range_sink_sample_attn`) but not slots the schedule already pins (as in its `_pp` variant).
// u is drawn from the stream (seed, sequence, round, layer, KV head, "VaSE").
// Parameters: n_large (default B/4), window (64), kernel (5) as for `snapkv`.
// Source: VaSE (Chang 2026; code terarachang/VaSE) as ported in the Random Attention code
// (`cache_utils.py`); docs/eviction-spec.md §3 row `vase`; weighted sampling: Efraimidis & Spirakis,
// "Weighted random sampling with a reservoir", IPL 97(5), 2006.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "eviction/query_window.h"
#include "eviction/registry.h"
#include "util/rng.h"

namespace kvevict {
namespace {

constexpr int64_t kVaseSinks = 4;
constexpr uint64_t kVaseStreamTag = 0x56615345ull;  // "VaSE"

class VaseSelector final : public PerHeadSelector {
 public:
  VaseSelector(SnapKvParams p, int64_t n_large) : p_(p), n_large_(n_large) {}
  SelectorNeeds needs() const override { return {.queries = true}; }
  std::unique_ptr<SelectorState> make_state(const KvShape& shape) const override {
    return std::make_unique<QueryWindowState>(shape.n_layers, p_.window);
  }
  void score_head(const RoundInput& in, const SelectorState* state, int layer, int kv_head,
                  std::span<float> out) const override {
    const int64_t n = in.n_candidates;
    const int hd = in.kv.shape().head_dim;
    const int32_t* pos = in.kv.positions(layer, kv_head);
    const float* values = in.kv.values(layer, kv_head);
    // Sample tier: keys log(u)/w with w the SnapKV score, u in (0, 1].
    snapkv_scores(in, as_query_window(state, "vase"), layer, kv_head, p_.kernel, out);
    Rng rng(stream_id({in.seed, in.sequence_id, static_cast<uint64_t>(in.round), static_cast<uint64_t>(layer),
                       static_cast<uint64_t>(kv_head), kVaseStreamTag}));
    for (float& s : out) s = static_cast<float>(std::log(1.0 - rng.uniform()) / static_cast<double>(s));
    // Sinks outrank everything (the schedule's own pins are +inf as well).
    const int64_t protected_below = std::max(kVaseSinks, in.n_pinned);
    std::vector<int32_t> open;  // candidates neither sink nor pinned: the range tier's pool
    for (int64_t i = 0; i < n; ++i) {
      if (pos[i] < kVaseSinks) out[static_cast<size_t>(i)] = std::numeric_limits<float>::infinity();
      if (pos[i] >= protected_below) open.push_back(static_cast<int32_t>(i));
    }
    const int64_t own_sinks = std::max<int64_t>(0, kVaseSinks - in.n_pinned);
    const int64_t n_large = n_large_ >= 0 ? n_large_ : in.budget / 4;
    const auto tier =
        static_cast<size_t>(std::clamp<int64_t>(n_large - own_sinks, 0, static_cast<int64_t>(open.size())));
    if (tier == 0) return;
    std::vector<float> range(static_cast<size_t>(n));
    for (int32_t i : open) {
      const float* v = values + int64_t{i} * hd;
      const auto [lo, hi] = std::minmax_element(v, v + hd);
      range[static_cast<size_t>(i)] = *hi - *lo;
    }
    // Widest range first; ties to the older slot, so the tier never depends on sort internals.
    std::partial_sort(open.begin(), open.begin() + static_cast<ptrdiff_t>(tier), open.end(), [&](int32_t a, int32_t b) {
      const float ra = range[static_cast<size_t>(a)], rb = range[static_cast<size_t>(b)];
      return ra > rb || (ra == rb && a < b);
    });
    // Above every sample key (<= 0), below +inf, in range order.
    for (size_t k = 0; k < tier; ++k) out[static_cast<size_t>(open[k])] = 1.0f + static_cast<float>(tier - k);
  }

 private:
  SnapKvParams p_;
  int64_t n_large_;  ///< -1: B / 4 of the round's budget
};

}  // namespace

const PolicyInfo& policy_vase() {
  static const PolicyInfo info{
      .name = "vase",
      .summary = "VaSE: 4 sinks + the n_large widest value ranges + a SnapKV-weighted sample for the rest (seeded).",
      .source = "VaSE (terarachang/VaSE) via arXiv 2609.03430's code; docs/eviction-spec.md §3",
      .evicts = true,
      .protect_prompt = false,
      .sinks = 0,
      .make =
          [](const SelectorParams& params) {
            const int64_t n_large = params.get_int("n_large", -1, 0, int64_t{1} << 30);
            return std::make_unique<VaseSelector>(SnapKvParams::read(params), n_large);
          },
      .min_k_sel = kVaseSinks,
      .min_k_sel_reason = "keeps 4 sinks"};
  return info;
}

}  // namespace kvevict
