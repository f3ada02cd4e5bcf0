// Probes: the planted fact really stays only in the chosen (layer, KV head) sites, the layout
// puts the fact where it says, and head masks are what they claim. Expected values follow from
// the definitions: a site mask of s sites out of n_layers x n_kv_heads keeps a fraction s / total
// of the fact; k heads per layer means exactly k set entries per layer.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "engine/engine.h"
#include "eval/probe.h"
#include "model_fixture.h"
#include "util/error.h"

namespace kvevict {
namespace {

EvictionConfig schedule(int64_t budget, int64_t recent) {
  EvictionConfig c;
  c.budget = budget;
  c.recent = recent;
  c.seed = 5;
  return c;
}

TEST(EvalProbe, LayoutPlacesFactAndQuestion) {
  KVEVICT_REQUIRE_MODEL(model);
  const Tokenizer& tok = model->tokenizer();
  ProbeTextOptions o;
  o.lead = 10;
  const ProbeLayout once = build_probe_layout(tok, ProbeKind::Passcode, 120, o, 3, 0);
  const auto P = static_cast<int32_t>(once.prompt.size());
  const std::vector<int32_t> fact = tok.encode("The secret number is " + once.code + ".", false);
  ASSERT_EQ(once.fact_positions.size(), fact.size());
  for (size_t i = 0; i < fact.size(); ++i)
    EXPECT_EQ(once.trace[static_cast<size_t>(once.fact_positions[i] - P)], fact[i]);
  EXPECT_EQ(once.fact_positions.front(), P + 10);  // after the lead filler
  const std::vector<int32_t> question = tok.encode("What is the secret number? The secret number is", false);
  // distance = tokens between the end of the fact and the question.
  EXPECT_EQ(once.trace.size(), 10 + fact.size() + 120 + question.size());
  EXPECT_TRUE(
      std::equal(question.begin(), question.end(), once.trace.end() - static_cast<std::ptrdiff_t>(question.size())));
  EXPECT_EQ(once.answer, tok.encode(once.code, false));
  EXPECT_EQ(once.code.size(), 4u);
  // Same seed and trial, same layout; another trial, another code (with overwhelming odds).
  EXPECT_EQ(build_probe_layout(tok, ProbeKind::Passcode, 120, o, 3, 0).trace, once.trace);
  EXPECT_NE(build_probe_layout(tok, ProbeKind::Passcode, 120, o, 3, 1).code, once.code);

  o.restatements = 3;
  const ProbeLayout three = build_probe_layout(tok, ProbeKind::Restated, 120, o, 3, 0);
  EXPECT_EQ(three.fact_positions.size(), 3 * fact.size());
  // The last statement ends 120/3 = 40 tokens before the question.
  const auto last_end = static_cast<size_t>(three.fact_positions.back() - P) + 1;
  EXPECT_EQ(three.trace.size() - question.size() - last_end, 40u);
  EXPECT_THROW(build_probe_layout(tok, ProbeKind::Restated, 6, o, 3, 0), Error);  // too short for 3 statements
}

TEST(EvalProbe, HeadMasks) {
  const KvShape shape{5, 4, 8};
  for (int k = 0; k <= 4; ++k) {
    const std::vector<uint8_t> m = random_head_mask(shape, k, 99);
    ASSERT_EQ(m.size(), 20u);
    for (int l = 0; l < 5; ++l) EXPECT_EQ(std::count(m.begin() + l * 4, m.begin() + l * 4 + 4, 1), k) << "layer " << l;
    EXPECT_EQ(random_head_mask(shape, k, 99), m);
  }
  EXPECT_THROW(random_head_mask(shape, 5, 0), Error);
  const auto sites = parse_sites("0:1,4:3");
  ASSERT_EQ(sites.size(), 2u);
  const std::vector<uint8_t> m = site_mask(shape, sites);
  EXPECT_EQ(std::count(m.begin(), m.end(), 1), 2);
  EXPECT_EQ(m[1], 1);
  EXPECT_EQ(m[19], 1);
  EXPECT_THROW(site_mask(shape, {{5, 0}}), Error);
  EXPECT_THROW(parse_sites("1-2"), Error);
}

TEST(EvalProbe, PlantedFactStaysOnlyInChosenSites) {
  KVEVICT_REQUIRE_MODEL(model);
  Engine engine(*model, 2);
  const KvShape shape = engine.kv_shape();
  ProbeTextOptions o;
  const ProbeLayout layout = build_probe_layout(model->tokenizer(), ProbeKind::Planted, 300, o, 1, 0);
  const std::vector<std::pair<int, int>> sites = {{0, 1}, {shape.n_layers - 1, shape.n_kv_heads - 1}};
  const Policy policy = force_sites(make_policy("random-unprotected"), layout.fact_positions, site_mask(shape, sites));
  const EvictionConfig cfg = schedule(96, 32);

  // Drive the engine directly and look into the cache after the question.
  auto seq = engine.new_sequence(7, policy, cfg, static_cast<int64_t>(layout.prompt.size()),
                                 static_cast<int64_t>(layout.trace.size()));
  std::vector<float> logits;
  engine.prefill(*seq, layout.prompt, logits);
  for (const int32_t t : layout.trace) engine.decode(*seq, t, logits);
  ASSERT_GT(seq->stats.rounds, 5);
  const std::set<int32_t> fact(layout.fact_positions.begin(), layout.fact_positions.end());
  for (int l = 0; l < shape.n_layers; ++l)
    for (int h = 0; h < shape.n_kv_heads; ++h) {
      const int32_t* pos = seq->kv.positions(l, h);
      const auto n = static_cast<size_t>(
          std::count_if(pos, pos + seq->kv.length(l), [&](int32_t p) { return fact.count(p) != 0; }));
      const bool chosen = std::find(sites.begin(), sites.end(), std::make_pair(l, h)) != sites.end();
      EXPECT_EQ(n, chosen ? fact.size() : 0u) << "layer " << l << " KV head " << h;
    }

  // run_probe_trial measures the same thing: 2 of n_layers x n_kv_heads sites keep the fact.
  const ProbeTrial r = run_probe_trial(engine, policy, cfg, layout, 7);
  EXPECT_DOUBLE_EQ(r.fact_kept, 2.0 / (shape.n_layers * shape.n_kv_heads));
  EXPECT_EQ(r.answer_tokens, static_cast<int>(layout.answer.size()));
  EXPECT_LT(r.answer_logprob, 0.0);
  // With no eviction the fact is everywhere.
  const ProbeTrial full = run_probe_trial(engine, make_policy("full"), {}, layout, 7);
  EXPECT_DOUBLE_EQ(full.fact_kept, 1.0);
  EXPECT_EQ(full.rounds, 0);
}

TEST(EvalProbe, ForcedSitesLeaveOtherSlotsToTheInnerSelector) {
  KVEVICT_REQUIRE_MODEL(model);
  Engine engine(*model, 1);
  // Forcing positions that never occur changes nothing: same keep-sets as plain random.
  const ProbeLayout layout = build_probe_layout(model->tokenizer(), ProbeKind::Passcode, 200, {}, 2, 0);
  const Policy plain = make_policy("random");
  const Policy wrapped = force_sites(
      plain, {1 << 30},
      std::vector<uint8_t>(static_cast<size_t>(engine.kv_shape().n_layers * engine.kv_shape().n_kv_heads), 1));
  const EvictionConfig cfg = schedule(96, 32);
  const auto run = [&](const Policy& p) {
    auto seq = engine.new_sequence(3, p, cfg, static_cast<int64_t>(layout.prompt.size()),
                                   static_cast<int64_t>(layout.trace.size()));
    std::vector<float> logits;
    engine.prefill(*seq, layout.prompt, logits);
    for (const int32_t t : layout.trace) engine.decode(*seq, t, logits);
    const int32_t* pos = seq->kv.positions(2, 1);
    return std::vector<int32_t>(pos, pos + seq->kv.length(2));
  };
  EXPECT_EQ(run(wrapped), run(plain));
  EXPECT_THROW(force_sites(make_policy("full"), {}, {}), Error);
}

}  // namespace
}  // namespace kvevict
