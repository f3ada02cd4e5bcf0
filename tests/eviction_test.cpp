// The shared eviction schedule (docs/eviction-spec.md §2) and the baseline policies (random,
// random-unprotected, recency, streaming), end to end on stories260K and on the keep-set chooser
// alone. Expected values come from the spec's rules, restated here as brute-force checks, and
// from the naive masked reference model.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "eviction/schedule.h"
#include "masked_eviction.h"
#include "model_fixture.h"
#include "reference_model.h"
#include "util/error.h"

namespace kvevict {
namespace {

// ---- keep-set chooser vs a brute-force statement of spec §2.4 ----

std::vector<int32_t> brute_keep(const std::vector<float>& s, const std::vector<int32_t>& pos, int64_t n_pinned,
                                int64_t k_sel, int64_t recent) {
  // Rank every candidate by (pinned first, score desc with NaN lowest, slot asc); keep the
  // first k_sel, ascending; then the recent buffer.
  std::vector<int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto key = [&](int32_t i) {
    const bool pin = pos[static_cast<size_t>(i)] < n_pinned;
    const float v = std::isnan(s[static_cast<size_t>(i)]) ? -INFINITY : s[static_cast<size_t>(i)];
    return std::make_tuple(!pin, -v, i);
  };
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return key(a) < key(b); });
  std::vector<int32_t> keep(idx.begin(), idx.begin() + std::min<int64_t>(k_sel, static_cast<int64_t>(s.size())));
  std::sort(keep.begin(), keep.end());
  for (int64_t i = 0; i < recent; ++i) keep.push_back(static_cast<int32_t>(s.size() + static_cast<size_t>(i)));
  return keep;
}

TEST(KeepSet, MatchesBruteForceOnRandomScores) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 5 + static_cast<int>(gen() % 60), k_sel = 1 + static_cast<int>(gen() % static_cast<unsigned>(n));
    const int recent = static_cast<int>(gen() % 5), n_pinned = static_cast<int>(gen() % static_cast<unsigned>(k_sel));
    std::vector<float> s(static_cast<size_t>(n));
    std::vector<int32_t> pos(static_cast<size_t>(n));
    int p = 0;
    for (int i = 0; i < n; ++i) {
      s[static_cast<size_t>(i)] = static_cast<float>(gen() % 7);  // many ties on purpose
      if (gen() % 13 == 0) s[static_cast<size_t>(i)] = NAN;
      p += 1 + static_cast<int>(gen() % 3);
      pos[static_cast<size_t>(i)] = p - 1;
    }
    EXPECT_EQ(choose_keep_set(s, pos.data(), n_pinned, k_sel, recent), brute_keep(s, pos, n_pinned, k_sel, recent))
        << "trial " << trial;
  }
}

TEST(Schedule, RoundTimingAndCapacity) {
  // Spec §2.3: rounds when length exceeds B and (length - B) is a multiple of r; peak B + r.
  EvictionConfig c;
  c.budget = 128;
  c.recent = 64;
  EXPECT_FALSE(round_due(128, c));
  EXPECT_FALSE(round_due(191, c));
  EXPECT_TRUE(round_due(192, c));
  EXPECT_TRUE(round_due(256, c));  // a long prompt: first round at the next multiple
  const Policy rnd = make_policy("random");
  EXPECT_EQ(required_capacity(c, rnd, 10, 1000), 192);
  EXPECT_EQ(required_capacity(c, rnd, 300, 1000), 364);
  EXPECT_EQ(required_capacity(c, make_policy("full"), 10, 1000), 1010);
  EXPECT_EQ(pinned_positions(c, rnd, 10), 10);
  EXPECT_EQ(pinned_positions(c, rnd, 100), 63);  // min(prompt, K_sel - 1)
  // A round interval s apart from r (R-KV's buffer_size): rounds at B + s, B + 2s, ...; peak B + s.
  EvictionConfig s = c;
  s.interval = 24;
  EXPECT_EQ(s.round_interval(), 24);
  EXPECT_EQ(c.round_interval(), 64);  // 0 = r
  EXPECT_FALSE(round_due(151, s));
  EXPECT_TRUE(round_due(152, s));
  EXPECT_FALSE(round_due(192, s));
  EXPECT_TRUE(round_due(200, s));
  EXPECT_EQ(required_capacity(s, rnd, 10, 1000), 152);
  EXPECT_EQ(required_capacity(s, rnd, 300, 1000), 324);
  s.interval = 100;  // longer than r: more candidates per round than the buffer alone would give
  EXPECT_FALSE(round_due(192, s));
  EXPECT_TRUE(round_due(228, s));
  EXPECT_EQ(required_capacity(s, rnd, 10, 1000), 228);
  EXPECT_EQ(pinned_positions(c, make_policy("streaming"), 100), 4);
  EXPECT_EQ(pinned_positions(c, make_policy("random-unprotected"), 100), 0);
  EXPECT_EQ(pinned_positions(c, make_policy("recency+prompt"), 20), 20);
}

TEST(Schedule, RejectsBadConfigs) {
  EvictionConfig c;
  c.budget = 64;
  c.recent = 64;
  EXPECT_THROW(validate_eviction(c, make_policy("random")), Error);  // B <= r
  c.budget = 70;
  EXPECT_THROW(validate_eviction(c, make_policy("random", std::nullopt, 6)), Error);  // sinks >= K_sel
  EXPECT_NO_THROW(validate_eviction(c, make_policy("random", std::nullopt, 5)));
  c.interval = -1;
  try {
    validate_eviction(c, make_policy("random"));
    ADD_FAILURE() << "a negative round interval was accepted";
  } catch (const FieldError& e) {
    EXPECT_EQ(e.field(), Field::RoundInterval);
  }
  c.interval = 0;
  EXPECT_THROW(make_policy("nope"), Error);
  EXPECT_THROW(make_policy("random", std::nullopt, -1), Error);
  EXPECT_THROW(make_policy("random", std::nullopt, std::nullopt, SelectorParams::parse({"window=3"})), Error);
}

// ---- end to end on stories260K ----

struct Trace {
  std::vector<std::vector<float>> logits;                 // after each step
  std::vector<std::vector<std::vector<int32_t>>> rounds;  // positions per (layer*H + head) after each round
  SequenceStats stats;
};

// Runs prompt + n forced tokens (the greedy continuation under `full`, fixed in advance so that
// every policy sees the same tokens), recording logits and post-round positions.
Trace run(const Model& m, const std::string& policy, int64_t B, int64_t r, int threads, uint64_t seed,
          const std::vector<int32_t>& tokens, int64_t prompt_len, PositionMode mode = PositionMode::Logical,
          LongPromptMode lp = LongPromptMode::PinHead, int64_t interval = 0) {
  Engine engine(m, threads);
  EvictionConfig cfg;
  cfg.budget = B;
  cfg.recent = r;
  cfg.interval = interval;
  cfg.seed = seed;
  cfg.positions = mode;
  cfg.long_prompt = lp;
  const Policy p = make_policy(policy);
  auto seq = engine.new_sequence(3, p, cfg, prompt_len, static_cast<int64_t>(tokens.size()) - prompt_len);
  Trace tr;
  std::vector<float> logits;
  engine.prefill(*seq, std::span<const int32_t>(tokens).first(static_cast<size_t>(prompt_len)), logits);
  tr.logits.push_back(logits);
  const KvShape s = engine.kv_shape();
  for (size_t t = static_cast<size_t>(prompt_len); t < tokens.size(); ++t) {
    const int64_t before = seq->stats.rounds;
    engine.decode(*seq, tokens[t], logits);
    tr.logits.push_back(logits);
    if (!seq->eviction_off()) {
      EXPECT_LE(seq->kv.length(0), std::max(B, prompt_len) + cfg.round_interval());
    }
    if (seq->stats.rounds != before) {
      std::vector<std::vector<int32_t>> pos;
      for (int l = 0; l < s.n_layers; ++l)
        for (int h = 0; h < s.n_kv_heads; ++h)
          pos.emplace_back(seq->kv.positions(l, h), seq->kv.positions(l, h) + seq->kv.length(l));
      tr.rounds.push_back(pos);
    }
  }
  tr.stats = seq->stats;
  return tr;
}

TEST(Eviction, InvariantsAfterEveryRound) {
  KVEVICT_REQUIRE_MODEL(m);
  const auto tokens = test::greedy_story_tokens(*m, 300);
  // The first 13 tokens are the prompt (prefilled); K_sel = 32 > 13, so all of it is pinned.
  const int64_t P = 13, B = 48, r = 16;
  for (const char* pol : {"random", "random-unprotected", "recency", "streaming"}) {
    SCOPED_TRACE(pol);
    const auto tr = run(*m, pol, B, r, 2, 11, tokens, P);
    // Rounds at lengths 64, 80, ...: after 300 - 13 decode steps, (300 - 64) / 16 + 1 rounds.
    EXPECT_EQ(tr.stats.rounds, (300 - (B + r)) / r + 1);
    EXPECT_EQ(tr.stats.peak_slots, B + r);
    for (size_t k = 0; k < tr.rounds.size(); ++k) {
      const int64_t seen = B + r + static_cast<int64_t>(k) * r;  // tokens seen at round k
      for (const auto& pos : tr.rounds[k]) {
        ASSERT_EQ(static_cast<int64_t>(pos.size()), B);
        ASSERT_TRUE(std::is_sorted(pos.begin(), pos.end()));
        ASSERT_EQ(std::adjacent_find(pos.begin(), pos.end()), pos.end());
        for (int64_t i = 0; i < r; ++i) ASSERT_EQ(pos[static_cast<size_t>(B - r + i)], seen - r + i);  // newest r
        const std::set<int32_t> kept(pos.begin(), pos.end());
        if (std::string(pol) == "random") {
          for (int32_t p = 0; p < P; ++p) ASSERT_TRUE(kept.count(p)) << "prompt position " << p;
        }
        if (std::string(pol) == "streaming") {
          for (int32_t p = 0; p < 4; ++p) ASSERT_TRUE(kept.count(p)) << "sink " << p;
        }
        if (std::string(pol) == "recency") {  // the newest K_sel candidates: a contiguous window
          ASSERT_EQ(pos.front(), seen - B);
        }
      }
    }
  }
}

TEST(Eviction, RoundIntervalApartFromTheBuffer) {
  KVEVICT_REQUIRE_MODEL(m);
  // Spec §2.3 with s != r: rounds at lengths B + s, B + 2s, ... (every s decode steps), peak B + s,
  // length B after each round; the newest r slots are never candidates, the s - r before them are.
  const auto tokens = test::greedy_story_tokens(*m, 300);
  const int64_t P = 13, B = 48, r = 8;
  for (const int64_t s : {int64_t{4}, int64_t{24}}) {
    SCOPED_TRACE(s);
    const auto tr = run(*m, "random", B, r, 2, 11, tokens, P, PositionMode::Logical, LongPromptMode::PinHead, s);
    EXPECT_EQ(tr.stats.rounds, (300 - (B + s)) / s + 1);
    EXPECT_EQ(tr.stats.peak_slots, B + s);
    bool older_than_r_evicted = false;  // a slot of [seen - s, seen - r) dropped at its round
    for (size_t k = 0; k < tr.rounds.size(); ++k) {
      const int64_t seen = B + s + static_cast<int64_t>(k) * s;  // tokens seen at round k
      for (const auto& pos : tr.rounds[k]) {
        ASSERT_EQ(static_cast<int64_t>(pos.size()), B);
        ASSERT_TRUE(std::is_sorted(pos.begin(), pos.end()));
        for (int64_t i = 0; i < r; ++i) ASSERT_EQ(pos[static_cast<size_t>(B - r + i)], seen - r + i);  // newest r
        const std::set<int32_t> kept(pos.begin(), pos.end());
        for (int32_t p = 0; p < P; ++p) ASSERT_TRUE(kept.count(p)) << "prompt position " << p;
        for (int64_t p = seen - s; p < seen - r; ++p) older_than_r_evicted |= !kept.count(static_cast<int32_t>(p));
      }
    }
    // s = 24: 16 candidates per round newer than the last round, K_sel = 40 of 56: some go.
    if (s > r) {
      EXPECT_TRUE(older_than_r_evicted);
    }
  }
}

TEST(Eviction, RandomDiffersAcrossHeadsAndIsSeeded) {
  KVEVICT_REQUIRE_MODEL(m);
  const auto tokens = test::greedy_story_tokens(*m, 200);
  const auto a = run(*m, "random", 48, 16, 1, 5, tokens, 13);
  const auto b = run(*m, "random", 48, 16, 2, 5, tokens, 13);  // same seed, 2 threads
  const auto c = run(*m, "random", 48, 16, 1, 6, tokens, 13);  // another seed
  ASSERT_FALSE(a.rounds.empty());
  EXPECT_EQ(a.rounds, b.rounds);
  EXPECT_EQ(a.logits, b.logits);  // bit-identical, whatever the thread count
  EXPECT_NE(a.rounds, c.rounds);
  // Keep-sets differ across the KV heads of a layer (per-head draws).
  const auto& first = a.rounds.front();
  const int H = m->config().n_kv_heads;
  for (int l = 0; l < m->config().n_layers; ++l)
    for (int h = 1; h < H; ++h) EXPECT_NE(first[static_cast<size_t>(l * H)], first[static_cast<size_t>(l * H + h)]);
  // random-unprotected evicts prompt positions at some point; random never does.
  const auto u = run(*m, "random-unprotected", 48, 16, 1, 5, tokens, 13);
  bool lost = false;
  for (const auto& rd : u.rounds)
    for (const auto& pos : rd) lost |= !std::binary_search(pos.begin(), pos.end(), 5);
  EXPECT_TRUE(lost);
}

TEST(Eviction, BudgetAboveLengthEqualsFull) {
  KVEVICT_REQUIRE_MODEL(m);
  // Expected: `full` on the same tokens. With B >= length no round fires, so every logit must
  // agree within 1e-5 relative.
  const auto tokens = test::greedy_story_tokens(*m, 120);
  const auto full = run(*m, "full", 0, 64, 2, 1, tokens, 13);
  for (const char* pol : {"random", "recency", "streaming", "random-unprotected"}) {
    const auto t = run(*m, pol, 128, 64, 2, 1, tokens, 13);
    EXPECT_EQ(t.stats.rounds, 0);
    for (size_t s = 0; s < full.logits.size(); ++s)
      for (size_t i = 0; i < full.logits[s].size(); ++i)
        ASSERT_NEAR(t.logits[s][i], full.logits[s][i], 1e-5 * std::max(1.0f, std::abs(full.logits[s][i])));
  }
}

TEST(Eviction, CompactedCacheEqualsMaskedFullCache) {
  KVEVICT_REQUIRE_MODEL(m);
  // Expected: the naive reference (reference_model.h) over the whole sequence with an attention
  // mask that hides, for every later token, exactly the positions evicted from each
  // (layer, KV head) by then. Interior slots are evicted (random), so this checks compaction,
  // GQA sharing and logical RoPE positions together.
  const auto tokens = test::greedy_story_tokens(*m, 110);
  const int64_t P = 13, B = 40, r = 8;
  // tr.visible[t][layer*H + head] = positions live in the cache when token t is processed.
  const auto tr = test::trace_random_eviction(*m, tokens, P, 110, B, r, 99, 110);
  ASSERT_GE(tr.rounds, 5);
  const auto ref = test::ReferenceLlama(*m).run(std::vector<int32_t>(tokens.begin(), tokens.begin() + 110),
                                                [&](int t, int l, int h, int p) { return tr.sees(t, l, h, p); });
  ASSERT_NO_FATAL_FAILURE(test::expect_logits_near(tr, ref, 5e-5));
  // And the mask must have hidden something in the interior (not only a sliding window).
  bool interior = false;
  for (const auto& set : tr.visible.at(109))
    interior |= !set.count(static_cast<int>(P) + 2) && set.count(static_cast<int>(P) + 20);
  EXPECT_TRUE(interior);
  // A round interval apart from r (s = 13: rounds at 53, 66, ...; 45 candidates per round):
  // compaction from B + s slots, checked against the same masked reference.
  const auto ts = test::trace_random_eviction(*m, tokens, P, 110, B, r, 99, 110, 13);
  ASSERT_GE(ts.rounds, 4);
  const auto ref_s = test::ReferenceLlama(*m).run(std::vector<int32_t>(tokens.begin(), tokens.begin() + 110),
                                                  [&](int t, int l, int h, int p) { return ts.sees(t, l, h, p); });
  ASSERT_NO_FATAL_FAILURE(test::expect_logits_near(ts, ref_s, 5e-5));
}

TEST(Eviction, CachePositionModeRerotatesKeys) {
  KVEVICT_REQUIRE_MODEL(m);
  // Expected: right after the first round both modes hold the same slots (random keep-sets do
  // not depend on contents, and before it both modes rotate by the same positions); in cache
  // mode each kept key must equal the logical-mode key rotated by (new slot - position).
  const auto tokens = test::greedy_story_tokens(*m, 64 + 13);
  const int64_t P = 13, B = 48, r = 16;
  Engine engine(*m, 1);
  EvictionConfig cfg;
  cfg.budget = B;
  cfg.recent = r;
  auto a = engine.new_sequence(0, make_policy("random"), cfg, P, 64);
  cfg.positions = PositionMode::Cache;
  auto b = engine.new_sequence(0, make_policy("random"), cfg, P, 64);
  std::vector<float> la, lb;
  engine.prefill(*a, std::span<const int32_t>(tokens).first(P), la);
  engine.prefill(*b, std::span<const int32_t>(tokens).first(P), lb);
  for (int t = static_cast<int>(P); a->stats.rounds == 0; ++t) {
    engine.decode(*a, tokens[static_cast<size_t>(t)], la);
    engine.decode(*b, tokens[static_cast<size_t>(t)], lb);
  }
  const Rope rope(m->config().head_dim, m->config().rope_theta);
  const int hd = m->config().head_dim;
  for (int l = 0; l < m->config().n_layers; ++l)
    for (int h = 0; h < m->config().n_kv_heads; ++h) {
      ASSERT_EQ(std::vector<int32_t>(a->kv.positions(l, h), a->kv.positions(l, h) + B),
                std::vector<int32_t>(b->kv.positions(l, h), b->kv.positions(l, h) + B));
      for (int64_t j = 0; j < B; ++j) {
        std::vector<float> k(a->kv.keys(l, h) + j * hd, a->kv.keys(l, h) + (j + 1) * hd);
        rope.rotate(k.data(), j - a->kv.positions(l, h)[j]);
        for (int d = 0; d < hd; ++d) ASSERT_NEAR(b->kv.keys(l, h)[j * hd + d], k[static_cast<size_t>(d)], 1e-4);
      }
    }
}

TEST(Eviction, LongPromptModes) {
  KVEVICT_REQUIRE_MODEL(m);
  // Spec §2.5: prompt (40 tokens) longer than K_sel - 1 (= 15 at B = 24, r = 8).
  const auto tokens = test::greedy_story_tokens(*m, 140);
  const auto pin = run(*m, "random", 24, 8, 1, 3, tokens, 40);
  EXPECT_GT(pin.stats.rounds, 0);
  EXPECT_EQ(pin.stats.peak_slots, 40 + 8);  // max(B, P) + r before the first round
  for (const auto& rd : pin.rounds)
    for (const auto& pos : rd) {
      ASSERT_EQ(pos.size(), 24u);
      for (int32_t p = 0; p < 15; ++p) ASSERT_EQ(pos[static_cast<size_t>(p)], p);  // first K_sel - 1 pinned
    }
  const auto skip = run(*m, "random", 24, 8, 1, 3, tokens, 40, PositionMode::Logical, LongPromptMode::Skip);
  EXPECT_EQ(skip.stats.rounds, 0);
  EXPECT_EQ(skip.stats.peak_slots, 140);
  // Spec §2.5: the vLLM port skips only while the prompt exceeds B. A 20-token prompt is longer
  // than K_sel - 1 = 15 but fits B = 24, so skip evicts like pin-head: same keep-sets.
  const auto fits = run(*m, "random", 24, 8, 1, 3, tokens, 20, PositionMode::Logical, LongPromptMode::Skip);
  const auto fits_pin = run(*m, "random", 24, 8, 1, 3, tokens, 20);
  EXPECT_GT(fits.stats.rounds, 0);
  EXPECT_EQ(fits.rounds, fits_pin.rounds);
  for (const auto& rd : fits.rounds)
    for (const auto& pos : rd) {
      ASSERT_EQ(pos.size(), 24u);
      for (int32_t p = 0; p < 15; ++p) ASSERT_EQ(pos[static_cast<size_t>(p)], p);
    }
}

TEST(Eviction, LongPromptSkipThresholdIsTheBudget) {
  // Spec §2.5: skip only while prompt_len > B (here B = 24, r = 8, K_sel - 1 = 15).
  EvictionConfig cfg;
  cfg.budget = 24;
  cfg.recent = 8;
  cfg.long_prompt = LongPromptMode::Skip;
  const Policy p = make_policy("random");
  EXPECT_FALSE(eviction_disabled(cfg, p, 15));
  EXPECT_FALSE(eviction_disabled(cfg, p, 16));
  EXPECT_FALSE(eviction_disabled(cfg, p, 24));
  EXPECT_TRUE(eviction_disabled(cfg, p, 25));
  EXPECT_NE(long_prompt_warning(cfg, p, 20).find("first 15 tokens are pinned"), std::string::npos);
  EXPECT_NE(long_prompt_warning(cfg, p, 25).find("skipped"), std::string::npos);
  cfg.long_prompt = LongPromptMode::PinHead;
  EXPECT_FALSE(eviction_disabled(cfg, p, 25));
  EXPECT_TRUE(eviction_disabled(cfg, make_policy("full"), 5));
}

}  // namespace
}  // namespace kvevict
