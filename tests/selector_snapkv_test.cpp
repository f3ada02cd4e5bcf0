// snapkv: scores and keep-set against the spec §3 formula (selector_fixture.h: ref_snapkv and the
// brute-force keep rule), with pins none / the prompt / sinks, a window shorter than the queries
// seen and the kernel parameter.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "selector_fixture.h"

namespace kvevict {
namespace {

using namespace selector_fixture;

TEST(SnapKv, KeepSetMatchesFormula) {
  // Window w = 4 fed 6 queries: only the last 4 may count (ring buffer). Pins: none (default),
  // the prompt (+prompt) and 3 sinks.
  for (const auto& [spec, sinks, n_pinned] : std::vector<std::tuple<std::string, int, int64_t>>{
           {"snapkv", 0, 0}, {"snapkv+prompt", 0, kPrompt}, {"snapkv", 3, 3}}) {
    SCOPED_TRACE(spec + " sinks " + std::to_string(sinks));
    const Policy p = make_policy(spec, std::nullopt, sinks, SelectorParams::parse({"window=4"}));
    HandCache c(11, false);
    auto st = p.selector->make_state(c.kv.shape());
    std::mt19937_64 gen(3);
    std::vector<std::vector<std::vector<float>>> fed(kLayers);
    for (int step = 0; step < 6; ++step)
      for (int l = 0; l < kLayers; ++l) {
        fed[static_cast<size_t>(l)].push_back(random_query(gen));
        observe(*st, l, fed[static_cast<size_t>(l)].back(), kLen);
      }
    const auto scores = all_scores(p, c.kv, st.get(), n_pinned);
    std::vector<std::vector<int32_t>> expect;
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        const std::vector<std::vector<float>> window(fed[static_cast<size_t>(l)].end() - 4,
                                                     fed[static_cast<size_t>(l)].end());
        const auto ref = ref_snapkv(c.kv, l, h, window, 5);
        expect_scores_near(scores, ref, l, h, 1e-6);
        expect.push_back(brute_keep(ref, c.positions(l, h), n_pinned));
      }
    EXPECT_EQ(run_one_round(c, p, st.get()), expect);
  }
}

TEST(SnapKv, FewerQueriesThanWindowAndKernelParameter) {
  // Default w = 64 with 3 queries seen: the mean runs over the 3. kernel=1 means no pooling.
  const Policy p = make_policy("snapkv", std::nullopt, std::nullopt, SelectorParams::parse({"kernel=1"}));
  HandCache c(12, false);
  auto st = p.selector->make_state(c.kv.shape());
  std::mt19937_64 gen(4);
  std::vector<std::vector<float>> fed;
  for (int step = 0; step < 3; ++step) {
    fed.push_back(random_query(gen));
    for (int l = 0; l < kLayers; ++l) observe(*st, l, fed.back(), kLen);
  }
  const auto scores = all_scores(p, c.kv, st.get(), 0);
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kKvHeads; ++h) expect_scores_near(scores, ref_snapkv(c.kv, l, h, fed, 1), l, h, 1e-6);
}

}  // namespace
}  // namespace kvevict
