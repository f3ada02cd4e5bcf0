// random-beacon: beacons are the far, unpinned candidates with the most window attention mass,
// checked against a brute-force reference written here (double-precision softmax per held query
// and group head over the candidates, mean, top floor(share * K_sel) by mass then slot); the rest
// of K_sel is uniform random. The generic invariants (budget, newest r, pins, reproducibility) are
// in selectors_test.cpp's end-to-end tests, which include random-beacon.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "eviction/registry.h"
#include "eviction/schedule.h"
#include "eviction/selector.h"
#include "kernels/rope.h"
#include "util/error.h"

namespace kvevict {
namespace {

constexpr int kKvHeads = 2, kGroup = 2, kHeads = kKvHeads * kGroup, kHd = 8;
constexpr int64_t kLen = 60, kRecent = 8, kBudget = 40, kPrompt = 6, kSeen = 400;
constexpr int64_t kCand = kLen - kRecent, kKsel = kBudget - kRecent;

/// One layer, two KV heads: positions = prompt [0, kPrompt), a sorted random subset of the
/// middle, the newest kRecent; keys normal draws (stored as given: the selector reads them as
/// cached, rotation does not matter to the reference either).
struct Cache {
  SequenceKv kv{KvShape{1, kKvHeads, kHd}, kLen + 4};
  explicit Cache(uint64_t seed) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal;
    for (int h = 0; h < kKvHeads; ++h) {
      std::vector<int32_t> mid(static_cast<size_t>(kSeen - kRecent - kPrompt));
      std::iota(mid.begin(), mid.end(), static_cast<int32_t>(kPrompt));
      std::shuffle(mid.begin(), mid.end(), gen);
      mid.resize(static_cast<size_t>(kCand - kPrompt));
      std::sort(mid.begin(), mid.end());
      std::vector<int32_t> pos(kPrompt);
      std::iota(pos.begin(), pos.end(), 0);
      pos.insert(pos.end(), mid.begin(), mid.end());
      for (int64_t i = 0; i < kRecent; ++i) pos.push_back(static_cast<int32_t>(kSeen - kRecent + i));
      for (int64_t s = 0; s < kLen; ++s) {
        kv.positions(0, h)[s] = pos[static_cast<size_t>(s)];
        for (int d = 0; d < kHd; ++d) {
          kv.keys(0, h)[s * kHd + d] = normal(gen);
          kv.values(0, h)[s * kHd + d] = normal(gen);
        }
      }
    }
    kv.set_length(0, kLen);
  }
};

std::vector<std::vector<float>> feed(SelectorState& st, int n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<std::vector<float>> qs;
  for (int i = 0; i < n; ++i) {
    std::vector<float> q(kHeads * kHd);
    for (float& x : q) x = normal(gen);
    AttentionObservation o;
    o.layer = 0;
    o.position = kSeen - n + i;
    o.n_heads = kHeads;
    o.group_size = kGroup;
    o.head_dim = kHd;
    o.n_slots = kLen;
    o.queries = q.data();
    st.observe(o);
    qs.push_back(std::move(q));
  }
  return qs;
}

RoundInput input(const SequenceKv& kv, int64_t n_pinned, uint64_t seed, int64_t round) {
  return RoundInput{
      kv, kCand, kPrompt, kSeen, seed, 3, round, nullptr, kBudget, kRecent, n_pinned, nullptr, PositionMode::Logical};
}

/// Reference window mass of every candidate of KV head h (double precision, plain loops).
std::vector<double> ref_mass(const SequenceKv& kv, int h, const std::vector<std::vector<float>>& window) {
  std::vector<double> m(static_cast<size_t>(kCand), 0.0);
  const float* K = kv.keys(0, h);
  for (const auto& q : window)
    for (int hq = h * kGroup; hq < (h + 1) * kGroup; ++hq) {
      std::vector<double> p(static_cast<size_t>(kCand));
      double mx = -1e300, z = 0;
      for (int64_t j = 0; j < kCand; ++j) {
        double d = 0;
        for (int e = 0; e < kHd; ++e) d += double(q[static_cast<size_t>(hq * kHd + e)]) * K[j * kHd + e];
        p[static_cast<size_t>(j)] = d / std::sqrt(double(kHd));
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      for (double& x : p) z += (x = std::exp(x - mx));
      for (int64_t j = 0; j < kCand; ++j)
        m[static_cast<size_t>(j)] += p[static_cast<size_t>(j)] / z / double(window.size() * kGroup);
    }
  return m;
}

/// Reference beacon slots of KV head h: far (age >= distance) and unpinned, top n by mass then slot.
std::set<int64_t> ref_beacons(const SequenceKv& kv, int h, const std::vector<double>& mass, int64_t n_pinned,
                              int64_t distance, int64_t n) {
  std::vector<int64_t> far;
  for (int64_t j = 0; j < kCand; ++j) {
    const int32_t p = kv.positions(0, h)[j];
    if (p >= n_pinned && kSeen - 1 - p >= distance) far.push_back(j);
  }
  std::sort(far.begin(), far.end(), [&](int64_t a, int64_t b) {
    return mass[static_cast<size_t>(a)] != mass[static_cast<size_t>(b)]
        ? mass[static_cast<size_t>(a)] > mass[static_cast<size_t>(b)]
        : a < b;
  });
  far.resize(std::min<size_t>(far.size(), static_cast<size_t>(n)));
  return {far.begin(), far.end()};
}

TEST(RandomBeacon, BeaconsAreTheFarSlotsWithTheMostWindowMass) {
  // window 4 fed 6 queries: only the last 4 count. share 0.25 of K_sel = 32 -> 8 beacons.
  // distance 250: slots at positions <= 149 are far.
  for (const int64_t n_pinned : {int64_t{0}, kPrompt}) {
    SCOPED_TRACE(n_pinned);
    const Policy p = make_policy("random-beacon", n_pinned > 0, std::nullopt,
                                 SelectorParams::parse({"share=0.25", "window=4", "distance=250"}));
    Cache c(21);
    auto st = p.selector->make_state(c.kv.shape());
    const auto fed = feed(*st, 6, 5);
    const std::vector<std::vector<float>> window(fed.end() - 4, fed.end());
    std::vector<float> s(static_cast<size_t>(kKvHeads * kCand));
    p.selector->score(input(c.kv, n_pinned, 1, 0), st.get(), s);
    for (int h = 0; h < kKvHeads; ++h) {
      const auto mass = ref_mass(c.kv, h, window);
      const auto expect = ref_beacons(c.kv, h, mass, n_pinned, 250, kKsel / 4);
      ASSERT_EQ(expect.size(), 8u) << "the hand cache must hold enough far slots";
      std::set<int64_t> got;
      for (int64_t j = 0; j < kCand; ++j) {
        const float v = s[static_cast<size_t>(h * kCand + j)];
        if (v >= 1.0f) {
          got.insert(j);
          EXPECT_NEAR(v, 1.0 + mass[static_cast<size_t>(j)], 1e-5);
        } else {
          EXPECT_GE(v, 0.0f);
        }
      }
      EXPECT_EQ(got, expect) << "head " << h;
    }
    // Through the real schedule: every beacon is kept, plus the pins and the newest r.
    std::vector<std::set<int32_t>> beacon_pos(kKvHeads);
    for (int h = 0; h < kKvHeads; ++h)
      for (int64_t j : ref_beacons(c.kv, h, ref_mass(c.kv, h, window), n_pinned, 250, kKsel / 4))
        beacon_pos[static_cast<size_t>(h)].insert(c.kv.positions(0, h)[j]);
    EvictionConfig cfg;
    cfg.budget = kBudget;
    cfg.recent = kRecent;
    cfg.seed = 1;
    run_round(c.kv, p, st.get(), cfg, kPrompt, kSeen, 3, 0, Rope(kHd, 10000.0f), nullptr);
    for (int h = 0; h < kKvHeads; ++h) {
      ASSERT_EQ(c.kv.length(0), kBudget);
      const std::set<int32_t> kept(c.kv.positions(0, h), c.kv.positions(0, h) + kBudget);
      for (int32_t b : beacon_pos[static_cast<size_t>(h)]) EXPECT_TRUE(kept.count(b)) << "beacon " << b;
      for (int32_t q = 0; q < n_pinned; ++q) EXPECT_TRUE(kept.count(q));
    }
  }
}

TEST(RandomBeacon, RestIsUniformRandomAndSeeded) {
  // share 0: no beacon, every score a U(0,1) draw; the top-K_sel of 600 rounds keeps each
  // unpinned candidate with probability (K_sel - pins) / (candidates - pins) = 26/46.
  const Policy p = make_policy("random-beacon", true, std::nullopt, SelectorParams::parse({"share=0"}));
  Cache c(22);
  auto st = p.selector->make_state(c.kv.shape());
  feed(*st, 3, 6);
  std::vector<int> kept(static_cast<size_t>(kCand), 0);
  const int rounds = 600;
  for (int r = 0; r < rounds; ++r) {
    std::vector<float> s(static_cast<size_t>(kKvHeads * kCand));
    p.selector->score(input(c.kv, kPrompt, 9, r), st.get(), s);
    for (float v : s) ASSERT_LT(v, 1.0f);
    const auto keep =
        choose_keep_set(std::span<const float>(s).first(kCand), c.kv.positions(0, 0), kPrompt, kKsel, kRecent);
    for (int32_t j : keep)
      if (j < kCand) ++kept[static_cast<size_t>(j)];
  }
  const double prob = double(kKsel - kPrompt) / double(kCand - kPrompt);
  const double sd = std::sqrt(rounds * prob * (1 - prob));  // binomial standard deviation
  for (int64_t j = kPrompt; j < kCand; ++j) EXPECT_NEAR(kept[static_cast<size_t>(j)], rounds * prob, 5 * sd) << j;
  // Same seed, same scores; another seed or round, other scores.
  std::vector<float> a(static_cast<size_t>(kKvHeads * kCand)), b(a.size()), d(a.size());
  p.selector->score(input(c.kv, kPrompt, 9, 0), st.get(), a);
  p.selector->score(input(c.kv, kPrompt, 9, 0), st.get(), b);
  p.selector->score(input(c.kv, kPrompt, 10, 0), st.get(), d);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, d);
}

TEST(RandomBeacon, NoFarSlotMeansPlainRandomAndBadParamsAreErrors) {
  // distance beyond every candidate's age: no beacon at all.
  const Policy p = make_policy("random-beacon", std::nullopt, std::nullopt, SelectorParams::parse({"distance=100000"}));
  Cache c(23);
  auto st = p.selector->make_state(c.kv.shape());
  feed(*st, 2, 7);
  std::vector<float> s(static_cast<size_t>(kKvHeads * kCand));
  p.selector->score(input(c.kv, kPrompt, 1, 0), st.get(), s);
  for (float v : s) EXPECT_LT(v, 1.0f);
  EXPECT_TRUE(p.protect_prompt);  // as random
  EXPECT_TRUE(p.selector->needs().queries);
  EXPECT_FALSE(p.selector->needs().attention);
  EXPECT_THROW(make_policy("random-beacon", std::nullopt, std::nullopt, SelectorParams::parse({"share=1.5"})), Error);
  EXPECT_THROW(make_policy("random-beacon", std::nullopt, std::nullopt, SelectorParams::parse({"window=0"})), Error);
  EXPECT_THROW(make_policy("random-beacon", std::nullopt, std::nullopt, SelectorParams::parse({"distance=-1"})), Error);
  EXPECT_THROW(make_policy("random-beacon", std::nullopt, std::nullopt, SelectorParams::parse({"windw=4"})), Error);
}

}  // namespace
}  // namespace kvevict
