// tova: the newest query's softmax over every live slot read at the candidates (group mean, or the
// mean over the layer's query heads), against a double-precision reference (spec §3).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "selector_fixture.h"

namespace kvevict {
namespace {

using namespace selector_fixture;

TEST(Tova, KeepSetMatchesFormula) {
  // The newest query's softmax over every live slot (kLen of them), read at the candidates;
  // group mean, or mean over all query heads of the layer (tova_scope=layer, aligned cache).
  for (const std::string scope : {"group", "layer"}) {
    SCOPED_TRACE(scope);
    const Policy p = make_policy("tova", std::nullopt, std::nullopt, SelectorParams::parse({"tova_scope=" + scope}));
    HandCache c(14, scope == "layer");
    auto st = p.selector->make_state(c.kv.shape());
    std::mt19937_64 gen(6);
    std::vector<std::vector<float>> newest(kLayers);
    for (int step = 0; step < 3; ++step)
      for (int l = 0; l < kLayers; ++l) observe(*st, l, newest[static_cast<size_t>(l)] = random_query(gen), kLen);
    const auto scores = all_scores(p, c.kv, st.get(), 0);
    std::vector<std::vector<int32_t>> expect;
    for (int l = 0; l < kLayers; ++l) {
      std::vector<std::vector<double>> group_mean(kKvHeads, std::vector<double>(kCand, 0.0));
      for (int hq = 0; hq < kHeads; ++hq) {
        const auto pr = ref_softmax(newest[static_cast<size_t>(l)].data() + hq * kHd, c.kv.keys(l, hq / kGroup), kLen);
        for (int64_t i = 0; i < kCand; ++i)
          group_mean[static_cast<size_t>(hq / kGroup)][static_cast<size_t>(i)] += pr[static_cast<size_t>(i)] / kGroup;
      }
      for (int h = 0; h < kKvHeads; ++h) {
        std::vector<double> ref = group_mean[static_cast<size_t>(h)];
        if (scope == "layer")
          for (int64_t i = 0; i < kCand; ++i)
            ref[static_cast<size_t>(i)] =
                (group_mean[0][static_cast<size_t>(i)] + group_mean[1][static_cast<size_t>(i)]) / 2;
        expect_scores_near(scores, ref, l, h, 1e-6);
        expect.push_back(brute_keep(ref, c.positions(l, h), 0));
      }
    }
    const auto got = run_one_round(c, p, st.get());
    EXPECT_EQ(got, expect);
    if (scope == "layer") {
      for (int l = 0; l < kLayers; ++l)
        EXPECT_EQ(got[static_cast<size_t>(l * kKvHeads)], got[static_cast<size_t>(l * kKvHeads + 1)]);
    }
  }
}

}  // namespace
}  // namespace kvevict
