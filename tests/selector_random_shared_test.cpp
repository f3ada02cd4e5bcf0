// random-shared: one uniform draw per layer shared by its KV heads (random draws per head),
// seeded and independent of the thread count.
#include <gtest/gtest.h>

#include <vector>

#include "selector_fixture.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

using namespace selector_fixture;

TEST(RandomShared, OneDrawPerLayerSharedByKvHeads) {
  HandCache c(20, false);
  const Policy shared = make_policy("random-shared"), rnd = make_policy("random");
  EXPECT_TRUE(shared.protect_prompt);
  const auto s = all_scores(shared, c.kv, nullptr, kPrompt, 3);
  const auto r = all_scores(rnd, c.kv, nullptr, kPrompt, 3);
  const auto head = [](const std::vector<float>& v, int l, int h) {
    return std::vector<float>(v.begin() + (l * kKvHeads + h) * kCand, v.begin() + (l * kKvHeads + h + 1) * kCand);
  };
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(head(s, l, 0), head(s, l, 1));
    EXPECT_NE(head(r, l, 0), head(r, l, 1));
  }
  EXPECT_NE(head(s, 0, 0), head(s, 1, 0));  // fresh per layer
  // Deterministic by seed, independent of the thread count; another seed or round differs.
  ThreadPool pool(3);
  for (const Policy* p : {&shared, &rnd}) {
    EXPECT_EQ(all_scores(*p, c.kv, nullptr, kPrompt, 3, 0, &pool), all_scores(*p, c.kv, nullptr, kPrompt, 3));
    EXPECT_NE(all_scores(*p, c.kv, nullptr, kPrompt, 4), all_scores(*p, c.kv, nullptr, kPrompt, 3));
    EXPECT_NE(all_scores(*p, c.kv, nullptr, kPrompt, 3, 1), all_scores(*p, c.kv, nullptr, kPrompt, 3));
  }
}

}  // namespace
}  // namespace kvevict
