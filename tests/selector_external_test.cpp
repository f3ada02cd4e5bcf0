// The interface for selectors written outside the library (eviction/external.h, what the Python
// package's selectors implement): what it hands a selector for each (layer, KV head) against
// references written here (the observed queries regrouped by hand, pre-RoPE by the RoPE formula
// in double, attention sums by plain loops), and that its scores run under the shared schedule
// (pins, top K_sel with ties to the older slot) exactly as the built-ins' do.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "eviction/external.h"
#include "eviction/query_window.h"
#include "selector_fixture.h"
#include "util/rng.h"

namespace kvevict {
namespace {

using namespace selector_fixture;

/// Copies what it is given; scores each candidate by its slot index (the sliding window).
class Recording final : public ExternalSelector {
 public:
  explicit Recording(ExternalNeeds n) : ExternalSelector(n) {}
  struct Seen {
    int layer, kv_head;
    int64_t n;
    const float* keys;
    std::vector<float> q, qpre;
    std::vector<int64_t> qpos;
    std::vector<double> att;
    uint64_t stream;
  };
  mutable std::vector<Seen> seen;
  void score_round(const RoundInput& in, std::span<const HeadCandidates> heads, std::span<float> scores) const override {
    seen.clear();
    for (size_t i = 0; i < heads.size(); ++i) {
      const HeadCandidates& c = heads[i];
      const size_t nq = static_cast<size_t>(c.n_queries) * c.group_size * c.head_dim;
      Seen s{c.layer, c.kv_head, c.n_candidates, c.keys, {}, {}, {}, {}, c.stream};
      if (c.queries) s.q.assign(c.queries, c.queries + nq);
      if (c.queries_pre) s.qpre.assign(c.queries_pre, c.queries_pre + nq);
      if (c.query_positions) s.qpos.assign(c.query_positions, c.query_positions + c.n_queries);
      if (c.attention) s.att.assign(c.attention, c.attention + c.n_candidates);
      seen.push_back(std::move(s));
      for (int64_t j = 0; j < in.n_candidates; ++j) scores[i * static_cast<size_t>(in.n_candidates) + j] = static_cast<float>(j);
    }
  }
};

TEST(ExternalSelector, ReceivesCandidatesQueriesAndAttentionSums) {
  HandCache c(21, false);
  const Recording sel(ExternalNeeds{.queries = true, .queries_pre = true, .attention = true, .window = 3});
  auto st = sel.make_state(c.kv.shape());
  ASSERT_TRUE(st);
  std::mt19937_64 gen(3);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<std::vector<std::vector<float>>> q(kLayers);  // [layer][query] -> [kHeads * kHd]
  std::vector<std::vector<double>> att(kLayers * kKvHeads, std::vector<double>(kLen, 0.0));
  for (int t = 0; t < 4; ++t)
    for (int l = 0; l < kLayers; ++l) {
      q[l].push_back(random_query(gen));
      std::vector<float> probs(kHeads * kLen);
      for (float& x : probs) x = uni(gen);
      AttentionObservation o;
      o.layer = l;
      o.position = kSeen - 4 + t;
      o.n_heads = kHeads;
      o.group_size = kGroup;
      o.head_dim = kHd;
      o.n_slots = kLen;
      o.queries = q[l].back().data();
      o.probs = probs.data();
      st->observe(o);
      for (int hq = 0; hq < kHeads; ++hq)
        for (int64_t s = 0; s < kLen; ++s) att[l * kKvHeads + hq / kGroup][s] += probs[hq * kLen + s];
    }
  std::vector<float> scores(kLayers * kKvHeads * kCand);
  sel.score(round_input(c.kv, 0), st.get(), scores);
  ASSERT_EQ(sel.seen.size(), static_cast<size_t>(kLayers * kKvHeads));
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kKvHeads; ++h) {
      const auto& s = sel.seen[l * kKvHeads + h];
      SCOPED_TRACE(testing::Message() << "layer " << l << " KV head " << h);
      EXPECT_EQ(s.layer, l);  // layer-major order
      EXPECT_EQ(s.kv_head, h);
      EXPECT_EQ(s.n, kCand);
      EXPECT_EQ(s.keys, c.kv.keys(l, h));
      EXPECT_EQ(s.stream, stream_id({1, 7, 0, static_cast<uint64_t>(l), static_cast<uint64_t>(h)}));
      // The newest 3 queries (window 3) of this KV head's group: query heads h*G .. h*G + G - 1.
      ASSERT_EQ(s.qpos, (std::vector<int64_t>{kSeen - 3, kSeen - 2, kSeen - 1}));
      ASSERT_EQ(s.q.size(), static_cast<size_t>(3 * kGroup * kHd));
      for (int i = 0; i < 3; ++i)
        for (int g = 0; g < kGroup; ++g)
          for (int d = 0; d < kHd; ++d) {
            const float post = q[l][1 + i][(h * kGroup + g) * kHd + d];
            EXPECT_EQ(s.q[(i * kGroup + g) * kHd + d], post);
          }
      // Pre-RoPE: the adjacent-pair rotation by -position, angle p * theta^(-2f/d) (RoFormer §3.4).
      for (int i = 0; i < 3; ++i)
        for (int g = 0; g < kGroup; ++g)
          for (int f = 0; f < kHd / 2; ++f) {
            const float* x = &q[l][1 + i][(h * kGroup + g) * kHd + 2 * f];
            const double a = -static_cast<double>(s.qpos[i]) * std::pow(double{kTheta}, -2.0 * f / kHd);
            const double re = x[0] * std::cos(a) - x[1] * std::sin(a), im = x[0] * std::sin(a) + x[1] * std::cos(a);
            EXPECT_NEAR(s.qpre[(i * kGroup + g) * kHd + 2 * f], re, 1e-4);
            EXPECT_NEAR(s.qpre[(i * kGroup + g) * kHd + 2 * f + 1], im, 1e-4);
          }
      ASSERT_EQ(s.att.size(), static_cast<size_t>(kCand));
      for (int64_t j = 0; j < kCand; ++j) EXPECT_NEAR(s.att[j], att[l * kKvHeads + h][j], 1e-9);
    }
}

TEST(ExternalSelector, ScoresRunUnderTheSharedSchedule) {
  // A policy made from a PolicyInfo outside the registry, with 3 sinks: the schedule pins them and
  // keeps the K_sel - 3 newest others (scores = slot index), as brute_keep ranks them.
  static const PolicyInfo info{.name = "external-window",
                               .make = [](const SelectorParams&) -> std::unique_ptr<Selector> {
                                 return std::make_unique<Recording>(ExternalNeeds{});
                               }};
  const Policy p = make_policy(info, info.name, false, std::nullopt, 3, {}, true);
  EXPECT_EQ(p.info, &info);
  EXPECT_EQ(p.sinks, 3);
  HandCache c(22, false);
  EXPECT_EQ(p.selector->make_state(c.kv.shape()), nullptr);  // nothing asked for: no state
  std::vector<std::vector<int32_t>> expect;
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kKvHeads; ++h) {
      std::vector<double> ref(kCand);
      for (int64_t j = 0; j < kCand; ++j) ref[j] = static_cast<double>(j);
      expect.push_back(brute_keep(ref, c.positions(l, h), 3));
    }
  EXPECT_EQ(run_one_round(c, p, nullptr), expect);
}

TEST(ExternalSelector, RefusesAWindowOutsideItsBounds) {
  EXPECT_THROW(Recording(ExternalNeeds{.queries = true, .window = 0}), Error);
  // Above snapkv's bound (kMaxQueryWindow): refused before make_state would allocate the ring.
  EXPECT_THROW(Recording(ExternalNeeds{.queries = true, .window = kMaxQueryWindow + 1}), Error);
  EXPECT_THROW(Recording(ExternalNeeds{.queries = true, .window = 1000000000}), Error);
  EXPECT_NO_THROW(Recording(ExternalNeeds{.queries = true, .window = kMaxQueryWindow}));
}

}  // namespace
}  // namespace kvevict
