// Registry-wide selector tests: every registered policy on stories260K through the Engine, with
// the spec's invariants (budget exactly B after each round, the newest r, pins), reproducibility
// across thread counts, attention probabilities computed only for the policy that asks for them
// (H2O), and bad parameter values. A new selector is covered by adding its file and registry line;
// its own keep-set test against a brute-force reference goes in tests/selector_NAME_test.cpp
// (helpers: tests/selector_fixture.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "eval/calibrate.h"
#include "eviction/query_stats.h"
#include "eviction/registry.h"
#include "model/forward.h"
#include "model_fixture.h"
#include "test_tmp.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

std::string temp_path(const std::string& name) { return test::tmp_path("sel_" + name); }

TEST(SelectorParams, BadValuesAreErrors) {
  const auto make = [](const std::string& policy, const std::string& kv) {
    return make_policy(policy, std::nullopt, std::nullopt, SelectorParams::parse({kv}));
  };
  EXPECT_THROW(make("snapkv", "kernel=4"), Error);  // even kernel: no "same" padding
  EXPECT_THROW(make("snapkv", "window=0"), Error);
  EXPECT_THROW(make("snapkv", "window=2.5"), Error);
  EXPECT_THROW(make("rkv", "lambda=1.5"), Error);
  EXPECT_THROW(make("tova", "tova_scope=head"), Error);
  EXPECT_THROW(make("h2o", "heavy_ratio=-0.1"), Error);
  EXPECT_THROW(make("vase", "n_large=-3"), Error);
  EXPECT_THROW(make("random-shared", "window=4"), Error);
  EXPECT_NO_THROW(make("tova", "tova_scope=layer"));
  EXPECT_NO_THROW(make("h2o", "heavy_ratio=0.25"));
}

// ---------------------------------------------------------------------------------------------
// End to end on stories260K: invariants for every selector, probabilities only for H2O

/// Statistics for `triattention` from the TinyStories sample (not an evaluation text here).
const std::string& stories_stats() {
  static const std::string path = [] {
    const Model* m = test::stories_model();
    std::ifstream f(test::shared_path("data/tinystories/tinystories_sample.txt"));
    const std::string text((std::istreambuf_iterator<char>(f)), {});
    ThreadPool pool(2);
    QueryStats st = calibrate_query_stats(*m, m->tokenizer().encode(text, true), 256, pool);
    const std::string p = temp_path("stories_stats.json");
    save_query_stats(st, p);
    return p;
  }();
  return path;
}

// Every registered evicting policy except the four schedule baselines that eviction_test.cpp
// covers: read from the registry, so a new selector is tested by adding its file and registry line.
std::vector<std::string> scored_policies() {
  const std::set<std::string> baselines = {"random", "random-unprotected", "recency", "streaming"};
  std::vector<std::string> out;
  for (const PolicyInfo* p : all_policies())
    if (p->evicts && !baselines.count(p->name)) out.push_back(p->name);
  return out;
}

Policy build(const std::string& spec, std::optional<int> sinks = std::nullopt) {
  std::vector<std::string> params;
  if (spec.rfind("triattention", 0) == 0) params.push_back("stats=" + stories_stats());
  return make_policy(spec, std::nullopt, sinks, SelectorParams::parse(params));
}

std::vector<int32_t> story(const Model& m, int n) {
  // The prompt plus a fixed pseudo-random continuation, so every policy sees the same tokens.
  auto ids = m.tokenizer().encode("Once upon a time, Lily and Ben found a small red box", true);
  std::mt19937 gen(5);
  while (static_cast<int>(ids.size()) < n) ids.push_back(static_cast<int32_t>(3 + gen() % (m.config().n_vocab - 3)));
  return ids;
}

TEST(SelectorsEndToEnd, BudgetRecentAndPinsAfterEveryRound) {
  KVEVICT_REQUIRE_MODEL(m);
  const auto tokens = story(*m, 260);
  const int64_t P = 13, B = 48, r = 16, k_sel = B - r;
  const KvShape shape{m->config().n_layers, m->config().n_kv_heads, m->config().head_dim};
  for (const std::string& name : scored_policies())
    for (const auto& [variant, sinks] : std::vector<std::pair<std::string, std::optional<int>>>{
             {"", std::nullopt}, {"+prompt", std::nullopt}, {"", 3}}) {
      const Policy p = build(name + variant, sinks);
      SCOPED_TRACE(p.name + (sinks ? " --sinks 3" : ""));
      Engine engine(*m, 2);
      EvictionConfig cfg;
      cfg.budget = B;
      cfg.recent = r;
      cfg.seed = 9;
      auto seq = engine.new_sequence(0, p, cfg, P, static_cast<int64_t>(tokens.size()) - P);
      std::vector<float> logits;
      engine.prefill(*seq, std::span<const int32_t>(tokens).first(P), logits);
      int64_t checked = 0;
      for (size_t t = P; t < tokens.size(); ++t) {
        const int64_t before = seq->stats.rounds;
        engine.decode(*seq, tokens[t], logits);
        ASSERT_LE(seq->kv.length(0), B + r);
        if (seq->stats.rounds == before) continue;
        ++checked;
        const int64_t seen = seq->n_seen;
        // Pinned: the prompt when protected (all 13 < K_sel - 1), the sinks, VaSE's own 4 sinks.
        int32_t must_keep = std::max(p.protect_prompt ? static_cast<int32_t>(P) : 0, sinks.value_or(0));
        if (name == "vase") must_keep = std::max(must_keep, 4);
        for (int l = 0; l < shape.n_layers; ++l)
          for (int h = 0; h < shape.n_kv_heads; ++h) {
            ASSERT_EQ(seq->kv.length(l), B);  // exactly B after the round
            const std::vector<int32_t> pos(seq->kv.positions(l, h), seq->kv.positions(l, h) + B);
            ASSERT_TRUE(std::adjacent_find(pos.begin(), pos.end(), std::greater_equal<>()) ==
                        pos.end());  // strictly increasing
            for (int64_t i = 0; i < r; ++i) ASSERT_EQ(pos[static_cast<size_t>(k_sel + i)], seen - r + i);  // newest r
            for (int32_t q = 0; q < must_keep; ++q)
              ASSERT_EQ(pos[static_cast<size_t>(q)], q) << "pinned position " << q;
            if (name == "triattention") {  // one keep-set per KV head shared by all layers
              ASSERT_TRUE(std::equal(pos.begin(), pos.end(), seq->kv.positions(0, h)));
            }
            if (name == "random-shared") {  // identical across the KV heads of a layer
              ASSERT_TRUE(std::equal(pos.begin(), pos.end(), seq->kv.positions(l, 0)));
            }
          }
      }
      EXPECT_EQ(checked, (static_cast<int64_t>(tokens.size()) - (B + r)) / r + 1);
      EXPECT_EQ(seq->stats.rounds, checked);
      EXPECT_GT(seq->stats.score_ms, 0.0);
      EXPECT_GT(seq->stats.compact_ms, 0.0);
    }
}

TEST(SelectorsEndToEnd, SeededSelectorsAreReproducibleAcrossThreadCounts) {
  KVEVICT_REQUIRE_MODEL(m);
  const auto tokens = story(*m, 200);
  const auto trace = [&](const std::string& pol, int threads, uint64_t seed) {
    Engine engine(*m, threads);
    EvictionConfig cfg;
    cfg.budget = 48;
    cfg.recent = 16;
    cfg.seed = seed;
    auto seq = engine.new_sequence(0, build(pol), cfg, 13, 200);
    std::vector<float> logits;
    engine.prefill(*seq, std::span<const int32_t>(tokens).first(13), logits);
    std::vector<int32_t> all;
    for (size_t t = 13; t < tokens.size(); ++t) engine.decode(*seq, tokens[t], logits);
    for (int l = 0; l < m->config().n_layers; ++l)
      for (int h = 0; h < m->config().n_kv_heads; ++h)
        all.insert(all.end(), seq->kv.positions(l, h), seq->kv.positions(l, h) + seq->kv.length(l));
    return all;
  };
  for (const std::string pol : {"random", "random-shared", "vase", "random-beacon"}) {
    SCOPED_TRACE(pol);
    EXPECT_EQ(trace(pol, 1, 5), trace(pol, 2, 5));
    EXPECT_NE(trace(pol, 1, 5), trace(pol, 1, 6));
  }
}

TEST(SelectorsEndToEnd, AttentionProbabilitiesOnlyWhenAsked) {
  // Only H2O declares needs().attention; for every other policy the two-pass
  // kernel never runs, so g_attention_probability_rows must not move over a generation. For H2O
  // it counts one row per (token, layer, query head): (prompt + decode steps) * layers * heads.
  KVEVICT_REQUIRE_MODEL(m);
  const auto tokens = story(*m, 150);
  std::vector<std::string> policies;
  for (const PolicyInfo* p : all_policies()) policies.push_back(p->name);  // the whole registry
  for (const std::string& name : policies) {
    SCOPED_TRACE(name);
    const Policy p = build(name);
    Engine engine(*m, 2);
    EvictionConfig cfg;
    cfg.budget = p.evicts ? 48 : 0;
    cfg.recent = 16;
    const int64_t before = g_attention_probability_rows.load();
    auto seq = engine.new_sequence(0, p, cfg, 13, 150);
    std::vector<float> logits;
    engine.prefill(*seq, std::span<const int32_t>(tokens).first(13), logits);
    for (size_t t = 13; t < tokens.size(); ++t) engine.decode(*seq, tokens[t], logits);
    const int64_t rows = g_attention_probability_rows.load() - before;
    if (name == "h2o") {
      EXPECT_EQ(rows, static_cast<int64_t>(tokens.size()) * m->config().n_layers * m->config().n_heads);
      EXPECT_GT(seq->stats.observe_ms, 0.0);
    } else {
      EXPECT_EQ(rows, 0);
    }
    if (!p.selector || !p.selector->needs().any()) {
      EXPECT_EQ(seq->stats.observe_ms, 0.0);
    }
  }
}

}  // namespace
}  // namespace kvevict
