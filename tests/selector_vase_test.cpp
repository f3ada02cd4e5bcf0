// vase: sinks and the widest value ranges kept, the rest sampled in proportion to the SnapKV score
// (spec §3); determinism by seed and round, not by thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "selector_fixture.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

using namespace selector_fixture;

TEST(Vase, TiersAndDeterminism) {
  // Spec §3: the first 4 positions kept; the n_large widest value ranges (sinks counted in) kept;
  // the rest sampled. n_large = 10 here: 4 sinks + the 6 widest unpinned ranges, 6 samples.
  const Policy p = make_policy("vase", std::nullopt, std::nullopt, SelectorParams::parse({"n_large=10", "window=2"}));
  HandCache c(16, false);
  auto st = p.selector->make_state(c.kv.shape());
  std::mt19937_64 gen(8);
  for (int step = 0; step < 2; ++step)
    for (int l = 0; l < kLayers; ++l) observe(*st, l, random_query(gen), kLen);
  const auto a = all_scores(p, c.kv, st.get(), 0, /*seed=*/5);
  ThreadPool pool(3);
  EXPECT_EQ(a, all_scores(p, c.kv, st.get(), 0, 5, 0, &pool));  // thread count does not matter
  EXPECT_NE(a, all_scores(p, c.kv, st.get(), 0, 6));            // the seed does
  EXPECT_NE(a, all_scores(p, c.kv, st.get(), 0, 5, 1));         // so does the round
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kKvHeads; ++h) {
      const auto pos = c.positions(l, h);
      std::vector<float> sc(a.begin() + (l * kKvHeads + h) * kCand, a.begin() + (l * kKvHeads + h + 1) * kCand);
      const auto keep = choose_keep_set(sc, pos.data(), 0, kKsel, kRecent);
      std::set<int32_t> kept(keep.begin(), keep.end());
      for (int32_t s = 0; s < 4; ++s) EXPECT_TRUE(kept.count(s)) << "sink " << s;
      std::vector<std::pair<float, int32_t>> ranges;  // (−range, slot) of non-sink candidates
      for (int32_t i = 4; i < kCand; ++i) {
        const float* v = c.kv.values(l, h) + int64_t{i} * kHd;
        ranges.emplace_back(-(*std::max_element(v, v + kHd) - *std::min_element(v, v + kHd)), i);
      }
      std::sort(ranges.begin(), ranges.end());
      for (int k = 0; k < 6; ++k) EXPECT_TRUE(kept.count(ranges[static_cast<size_t>(k)].second)) << "range rank " << k;
    }
}

TEST(Vase, SampleIsProportionalToSnapKv) {
  // One sampled slot per round (K_sel 16 = 4 sinks + 11 range tier + 1): over many rounds each
  // remaining candidate must be drawn with probability w_i / Σw, w = the SnapKV score (spec §3),
  // computed by ref_snapkv. Bound: 5 binomial standard deviations.
  const Policy p = make_policy("vase", std::nullopt, std::nullopt, SelectorParams::parse({"n_large=15", "window=2"}));
  HandCache c(17, false);
  auto st = p.selector->make_state(c.kv.shape());
  std::mt19937_64 gen(9);
  std::vector<std::vector<float>> fed;
  for (int step = 0; step < 2; ++step) {
    fed.push_back(random_query(gen));
    for (int l = 0; l < kLayers; ++l) observe(*st, l, fed.back(), kLen);
  }
  const int l = 1, h = 0, trials = 4000;
  const auto pos = c.positions(l, h);
  const auto w = ref_snapkv(c.kv, l, h, fed, 5);
  std::map<int32_t, int> drawn;
  std::set<int32_t> tier;
  for (int t = 0; t < trials; ++t) {
    const auto a = all_scores(p, c.kv, st.get(), 0, 1, t);
    std::vector<float> sc(a.begin() + (l * kKvHeads + h) * kCand, a.begin() + (l * kKvHeads + h + 1) * kCand);
    std::set<int32_t> ranked;  // sinks and range tier: scores > 0
    for (int32_t i = 0; i < kCand; ++i)
      if (sc[static_cast<size_t>(i)] > 0) ranked.insert(i);
    ASSERT_EQ(ranked.size(), 15u);
    if (t == 0) tier = ranked;
    ASSERT_EQ(ranked, tier);  // the deterministic tiers do not depend on the draw
    for (int32_t s : choose_keep_set(sc, pos.data(), 0, kKsel, kRecent))
      if (s < kCand && !tier.count(s)) drawn[s] += 1;
  }
  double total = 0;
  for (int32_t i = 0; i < kCand; ++i)
    if (!tier.count(i)) total += w[static_cast<size_t>(i)];
  for (int32_t i = 0; i < kCand; ++i) {
    if (tier.count(i)) continue;
    const double pi = w[static_cast<size_t>(i)] / total, f = drawn[i] / double(trials);
    EXPECT_NEAR(f, pi, 5 * std::sqrt(pi * (1 - pi) / trials) + 1e-3) << "candidate " << i;
  }
}

}  // namespace
}  // namespace kvevict
