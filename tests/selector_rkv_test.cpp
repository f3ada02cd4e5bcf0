// rkv: scores and keep-set against the spec §3 formula, written here in double precision
// (ref_rkv: λ·SnapKV − (1−λ)·softmax of the mean key cosine redundancy).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "selector_fixture.h"

namespace kvevict {
namespace {

using namespace selector_fixture;

/// R-KV (spec §3): λ·snapkv − (1−λ)·softmax_i(mean_j cos(k_i, k_j)), diagonal zeroed, mean over n.
std::vector<double> ref_rkv(const SequenceKv& kv, int l, int h, const std::vector<std::vector<float>>& window,
                            double lambda) {
  const auto snap = ref_snapkv(kv, l, h, window, 5);
  const float* K = kv.keys(l, h);
  std::vector<double> red(static_cast<size_t>(kCand));
  for (int64_t i = 0; i < kCand; ++i) {
    double s = 0;
    for (int64_t j = 0; j < kCand; ++j) {
      if (i == j) continue;
      double dot = 0, ni = 0, nj = 0;
      for (int e = 0; e < kHd; ++e)
        dot += double(K[i * kHd + e]) * K[j * kHd + e], ni += double(K[i * kHd + e]) * K[i * kHd + e],
            nj += double(K[j * kHd + e]) * K[j * kHd + e];
      s += dot / (std::sqrt(ni) * std::sqrt(nj));
    }
    red[static_cast<size_t>(i)] = s / kCand;
  }
  double z = 0;
  for (double r : red) z += std::exp(r);
  std::vector<double> out(static_cast<size_t>(kCand));
  for (int64_t i = 0; i < kCand; ++i)
    out[static_cast<size_t>(i)] =
        lambda * snap[static_cast<size_t>(i)] - (1 - lambda) * std::exp(red[static_cast<size_t>(i)]) / z;
  return out;
}

TEST(Rkv, KeepSetMatchesFormula) {
  for (const auto& [spec, lambda] : std::vector<std::pair<std::string, double>>{{"rkv", 0.5}, {"rkv+prompt", 0.1}}) {
    SCOPED_TRACE(spec);
    const Policy p = make_policy(spec, std::nullopt, std::nullopt,
                                 SelectorParams::parse({"lambda=" + std::to_string(lambda), "window=3"}));
    const int64_t n_pinned = p.protect_prompt ? kPrompt : 0;
    HandCache c(13, false);
    auto st = p.selector->make_state(c.kv.shape());
    std::mt19937_64 gen(5);
    std::vector<std::vector<float>> fed;
    for (int step = 0; step < 3; ++step) {
      fed.push_back(random_query(gen));
      for (int l = 0; l < kLayers; ++l) observe(*st, l, fed.back(), kLen);
    }
    const auto scores = all_scores(p, c.kv, st.get(), n_pinned);
    std::vector<std::vector<int32_t>> expect;
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        const auto ref = ref_rkv(c.kv, l, h, fed, lambda);
        expect_scores_near(scores, ref, l, h, 1e-6);
        expect.push_back(brute_keep(ref, c.positions(l, h), n_pinned));
      }
    EXPECT_EQ(run_one_round(c, p, st.get()), expect);
  }
}

}  // namespace
}  // namespace kvevict
