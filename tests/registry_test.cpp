// Invariants every registered policy must keep, iterated over the registry (so a new selector is
// covered by adding its file and registry line), and the parameter metadata behind
// `kvevict policies --json`. Expected values come from docs/eviction-spec.md: §2.3 (a round every
// r decode steps once the length exceeds B; peak B + r), §2.4 (B slots after a round, sorted, the
// newest r kept, pins kept, seeded draws independent of the thread count) and §3 (parameter
// defaults and ranges).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "eval/calibrate.h"
#include "eviction/query_stats.h"
#include "eviction/registry.h"
#include "model_fixture.h"
#include "test_tmp.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

/// Every registered policy, and each with +prompt.
std::vector<std::string> every_policy() {
  std::vector<std::string> out;
  for (const PolicyInfo* p : all_policies()) out.push_back(p->name);
  for (const PolicyInfo* p : all_policies())
    if (p->evicts) out.push_back(p->name + "+prompt");
  return out;
}

/// Values for parameters a policy requires (it throws without them): a calibrated statistics file
/// for every text parameter named `stats`.
std::vector<std::string> required_params(const Model& m, const std::string& policy) {
  std::vector<std::string> out;
  const std::string base = policy.substr(0, policy.find('+'));
  for (const PolicyInfo* p : all_policies()) {
    if (p->name != base) continue;
    for (const ParamSpec& s : policy_params(*p))
      if (s.name == "stats") {
        static const std::string path = [&] {
          ThreadPool pool(1);
          const auto tokens = test::greedy_story_tokens(m, 256);
          const std::string f = test::tmp_path("registry_test.stats.json");
          save_query_stats(calibrate_query_stats(m, tokens, 128, pool), f);
          return f;
        }();
        out.push_back("stats=" + path);
      }
  }
  return out;
}

/// Positions held by every (layer, KV head) after each round, for one run.
std::vector<std::vector<std::vector<int32_t>>> rounds_of(const Model& m, const Policy& p, int threads,
                                                         uint64_t seed, const std::vector<int32_t>& tokens,
                                                         int64_t prompt, int64_t B, int64_t r, SequenceStats* stats) {
  Engine engine(m, threads);
  EvictionConfig cfg;
  cfg.budget = B;
  cfg.recent = r;
  cfg.seed = seed;
  auto seq = engine.new_sequence(0, p, cfg, prompt, static_cast<int64_t>(tokens.size()));
  std::vector<float> logits;
  engine.prefill(*seq, std::span<const int32_t>(tokens).first(static_cast<size_t>(prompt)), logits);
  std::vector<std::vector<std::vector<int32_t>>> out;
  for (size_t t = static_cast<size_t>(prompt); t < tokens.size(); ++t) {
    const int64_t before = seq->stats.rounds;
    engine.decode(*seq, tokens[t], logits);
    if (seq->stats.rounds == before) continue;
    std::vector<std::vector<int32_t>> heads;
    for (int l = 0; l < m.config().n_layers; ++l)
      for (int h = 0; h < m.config().n_kv_heads; ++h)
        heads.emplace_back(seq->kv.positions(l, h), seq->kv.positions(l, h) + seq->kv.length(l));
    out.push_back(std::move(heads));
  }
  *stats = seq->stats;
  return out;
}

TEST(Registry, EveryPolicyKeepsTheScheduleInvariants) {
  KVEVICT_REQUIRE_MODEL(m);
  const int64_t P = 13, B = 48, r = 16, n = 240;
  const auto tokens = test::greedy_story_tokens(*m, static_cast<int>(n));
  for (const std::string& name : every_policy()) {
    SCOPED_TRACE(name);
    const Policy p = make_policy(name, std::nullopt, std::nullopt, SelectorParams::parse(required_params(*m, name)));
    if (!p.evicts) continue;
    SequenceStats st;
    const auto rounds = rounds_of(*m, p, 1, 7, tokens, P, B, r, &st);
    // §2.3: first round at length B + r, then every r steps.
    EXPECT_EQ(st.rounds, (n - (B + r)) / r + 1);
    EXPECT_EQ(st.peak_slots, B + r);
    ASSERT_EQ(static_cast<int64_t>(rounds.size()), st.rounds);
    for (size_t k = 0; k < rounds.size(); ++k) {
      const int64_t seen = B + r + static_cast<int64_t>(k) * r;
      for (const auto& pos : rounds[k]) {
        ASSERT_EQ(static_cast<int64_t>(pos.size()), B);
        ASSERT_TRUE(std::is_sorted(pos.begin(), pos.end()));
        ASSERT_EQ(std::adjacent_find(pos.begin(), pos.end()), pos.end());
        for (int64_t i = 0; i < r; ++i) ASSERT_EQ(pos[static_cast<size_t>(B - r + i)], seen - r + i);
        const std::set<int32_t> kept(pos.begin(), pos.end());
        if (p.protect_prompt) {
          for (int32_t q = 0; q < P; ++q) ASSERT_TRUE(kept.count(q)) << "prompt position " << q;
        }
        for (int32_t q = 0; q < p.sinks; ++q) ASSERT_TRUE(kept.count(q)) << "sink " << q;
      }
    }
    // §2.4: the same seed gives the same keep-sets with 1 and 2 threads.
    SequenceStats st2;
    EXPECT_EQ(rounds, rounds_of(*m, p, 2, 7, tokens, P, B, r, &st2));
  }
}

TEST(Registry, ParameterMetadataMatchesTheSpec) {
  // docs/eviction-spec.md §3: snapkv window 64, kernel 5; rkv lambda 0.5; h2o heavy_ratio 0.5;
  // tova_scope group|layer; triattention stats (a file, no default); random takes none.
  const auto find = [](const std::string& policy, const std::string& param) -> ParamSpec {
    for (const PolicyInfo* p : all_policies())
      if (p->name == policy)
        for (const ParamSpec& s : policy_params(*p))
          if (s.name == param) return s;
    ADD_FAILURE() << policy << " has no parameter " << param;
    return {};
  };
  EXPECT_EQ(find("snapkv", "window").fallback, "64");
  EXPECT_EQ(find("snapkv", "kernel").fallback, "5");
  EXPECT_EQ(find("snapkv", "window").type, "integer");
  EXPECT_EQ(find("rkv", "lambda").fallback, "0.5");
  EXPECT_EQ(find("rkv", "lambda").hi, 1.0);
  EXPECT_EQ(find("h2o", "heavy_ratio").fallback, "0.5");
  EXPECT_EQ(find("tova", "tova_scope").allowed, (std::vector<std::string>{"group", "layer"}));
  EXPECT_EQ(find("triattention", "stats").type, "text");
  for (const PolicyInfo* p : all_policies())
    if (p->name == "random" || p->name == "full") {
      EXPECT_TRUE(policy_params(*p).empty()) << p->name;
    }
}

TEST(Registry, ParamItemsHaveOneSyntax) {
  // [POLICY:]NAME=VALUE: a prefix selects the policy; a ':' after '=' belongs to the value.
  EXPECT_EQ(params_for_policy({"window=8", "snapkv:kernel=3", "h2o:heavy_ratio=0.2"}, "snapkv+prompt"),
            (std::vector<std::string>{"window=8", "kernel=3"}));
  EXPECT_EQ(params_for_policy({"stats=C:/x.json"}, "triattention"), (std::vector<std::string>{"stats=C:/x.json"}));
  EXPECT_THROW(params_for_policy({"snapvk:window=8"}, "snapkv"), Error);
  EXPECT_NO_THROW(check_param_items({"window=8"}, {"random", "snapkv"}));
  EXPECT_THROW(check_param_items({"window=8"}, {"random", "recency"}), Error);
  EXPECT_THROW(check_param_items({"snapkv:window=8"}, {"random"}), Error);
}

}  // namespace
}  // namespace kvevict
