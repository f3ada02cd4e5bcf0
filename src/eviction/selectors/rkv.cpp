// `rkv` (R-KV): SnapKV importance minus key redundancy.
// score = λ·snapkv − (1−λ)·redundancy, where redundancy = softmax over the candidates of each
// candidate key's mean cosine similarity to the candidate keys (self-similarity zeroed, the mean
// taken over all n candidates as the released code does). Keys are the cached post-RoPE keys.
// Parameters: lambda=λ in [0, 1] (default 0.5, the Random Attention paper's rows; R-KV itself
// recommends 0.1), window=w (64), kernel=k (5) as for `snapkv`.
// Source: R-KV (arXiv 2505.24133) §3.2-3.3; docs/eviction-spec.md §3 row `rkv`, following the Random
// Attention code (`cache_utils.py`, `cal_redundancy`). The official R-KV variant (last 8 queries,
// group max, max-pool 7, cosine threshold 0.5) is not this row.
#include <algorithm>
#include <cmath>
#include <vector>

#include "eviction/query_window.h"
#include "eviction/registry.h"

namespace kvevict {
namespace {

class RkvSelector final : public PerHeadSelector {
 public:
  RkvSelector(SnapKvParams p, double lambda) : p_(p), lambda_(lambda) {}
  SelectorNeeds needs() const override { return {.queries = true}; }
  std::unique_ptr<SelectorState> make_state(const KvShape& shape) const override {
    return std::make_unique<QueryWindowState>(shape.n_layers, p_.window);
  }
  void score_head(const RoundInput& in, const SelectorState* state, int layer, int kv_head,
                  std::span<float> out) const override {
    snapkv_scores(in, as_query_window(state, "rkv"), layer, kv_head, p_.kernel, out);
    const int hd = in.kv.shape().head_dim;
    const int64_t n = in.n_candidates;
    const float* keys = in.kv.keys(layer, kv_head);
    // Unit keys (the 1e-8 guards a zero key, as in the released code).
    std::vector<float> unit(static_cast<size_t>(n * hd));
    for (int64_t i = 0; i < n; ++i) {
      double ss = 0.0;
      for (int d = 0; d < hd; ++d) ss += double{keys[i * hd + d]} * keys[i * hd + d];
      const double inv = 1.0 / (std::sqrt(ss) + 1e-8);
      for (int d = 0; d < hd; ++d) unit[static_cast<size_t>(i * hd + d)] = static_cast<float>(keys[i * hd + d] * inv);
    }
    // mean_j cos(i, j) over all n candidates with cos(i, i) = 0, then softmax over i.
    std::vector<double> red(static_cast<size_t>(n));
    double mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        if (j == i) continue;
        float dot = 0.0f;
        for (int d = 0; d < hd; ++d)
          dot += unit[static_cast<size_t>(i * hd + d)] * unit[static_cast<size_t>(j * hd + d)];
        sum += dot;
      }
      red[static_cast<size_t>(i)] = sum / static_cast<double>(n);
      mx = std::max(mx, red[static_cast<size_t>(i)]);
    }
    double z = 0.0;
    for (double& r : red) z += (r = std::exp(r - mx));
    for (int64_t i = 0; i < n; ++i)
      out[static_cast<size_t>(i)] =
          static_cast<float>(lambda_ * out[static_cast<size_t>(i)] - (1.0 - lambda_) * red[static_cast<size_t>(i)] / z);
  }

 private:
  SnapKvParams p_;
  double lambda_;
};

}  // namespace

const PolicyInfo& policy_rkv() {
  static const PolicyInfo info{
      .name = "rkv",
      .summary = "R-KV: lambda * SnapKV importance - (1 - lambda) * softmaxed key redundancy (lambda 0.5).",
      .source = "arXiv 2505.24133 §3; docs/eviction-spec.md §3",
      .evicts = true,
      .protect_prompt = false,
      .sinks = 0,
      .make = [](const SelectorParams& params) {
        const double lambda = params.get("lambda", 0.5, 0.0, 1.0);
        return std::make_unique<RkvSelector>(SnapKvParams::read(params), lambda);
      }};
  return info;
}

}  // namespace kvevict
