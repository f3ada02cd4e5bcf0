// Engine::prefill_chunk: a prompt prefilled in chunks of any size continues the sequence from its
// cache and gives bit-identical first-token logits, cache, selector state and generated tokens
// to the same prompt prefilled in one call (the property chunked prefill in the server relies on).
// The reference is the one-call run of the same engine; the comparison is bitwise, so any
// dependence of a token's result on its chunk (rounding, positions, observations, slots) fails it.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "eviction/registry.h"
#include "model/model.h"
#include "model_fixture.h"
#include "util/error.h"
#include "util/rng.h"
#include "test_paths.h"

namespace kvevict {
namespace {

struct Run {
  std::vector<float> first_logits;  // after the whole prompt
  std::vector<int32_t> tokens;      // sampled afterwards
  int64_t rounds = 0;
  std::unique_ptr<Sequence> seq;
};

// Prefills `prompt` in chunks of `chunk` tokens (chunk >= prompt size: one call), then samples
// `n_new` tokens at temperature 1 with a seeded stream per step, decoding each.
Run run(Engine& e, const std::vector<int32_t>& prompt, int64_t chunk, const std::string& policy, int64_t n_new) {
  EvictionConfig cfg;
  cfg.budget = 64;
  cfg.recent = 16;
  cfg.seed = 1234;
  Run r;
  const auto P = static_cast<int64_t>(prompt.size());
  r.seq = e.new_sequence(7, make_policy(policy), cfg, P, n_new);
  std::vector<float> logits;
  for (int64_t i = 0; i < P; i += chunk) {
    const int64_t n = std::min(chunk, P - i);
    e.prefill_chunk(*r.seq, std::span<const int32_t>(prompt).subspan(static_cast<size_t>(i), static_cast<size_t>(n)),
                    logits);
  }
  r.first_logits = logits;
  SamplerConfig sc;
  sc.temperature = 1.0f;
  sc.top_p = 1.0f;
  sc.seed = 99;
  for (int64_t i = 0; i < n_new; ++i) {
    Rng rng(stream_id({sc.seed, 7, static_cast<uint64_t>(i)}));
    const int32_t t = sample_token(logits, sc, rng);
    r.tokens.push_back(t);
    e.decode(*r.seq, t, logits);
  }
  r.rounds = r.seq->stats.rounds;
  return r;
}

std::vector<int32_t> random_prompt(const Model& m, int64_t n, uint64_t seed) {
  Rng rng(stream_id({seed, 0x50524F4DULL}));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(1 + rng() % static_cast<uint64_t>(m.config().n_vocab - 1));
  return ids;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Keys, values and positions of every (layer, KV head), bitwise.
void expect_same_cache(const Sequence& a, const Sequence& b) {
  const KvShape s = a.kv.shape();
  for (int l = 0; l < s.n_layers; ++l)
    for (int h = 0; h < s.n_kv_heads; ++h) {
      ASSERT_EQ(a.kv.length(l), b.kv.length(l));
      const auto n = static_cast<size_t>(a.kv.length(l));
      EXPECT_EQ(0, std::memcmp(a.kv.keys(l, h), b.kv.keys(l, h), n * static_cast<size_t>(s.head_dim) * sizeof(float)));
      EXPECT_EQ(0,
                std::memcmp(a.kv.values(l, h), b.kv.values(l, h), n * static_cast<size_t>(s.head_dim) * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(a.kv.positions(l, h), b.kv.positions(l, h), n * sizeof(int32_t)));
    }
}

void check_model(const Model& m) {
  // 400 prompt tokens > B = 64: the prompt stays whole through prefill (no eviction there) and
  // the first round comes 16 decode steps later ((416 - 64) % 16 == 0), so 48 steps run 3 rounds.
  const auto prompt = random_prompt(m, 400, 5);
  Engine e(m, 2);
  // random: seeded per-head keep-sets; h2o: attention probabilities observed during prefill and
  // accumulated per slot; snapkv: the last prompt queries fill the observation window.
  for (const std::string policy : {"random", "h2o", "snapkv"}) {
    SCOPED_TRACE(policy);
    const Run one = run(e, prompt, 400, policy, 48);
    ASSERT_GE(one.rounds, 3);
    ASSERT_EQ(one.first_logits.size(), static_cast<size_t>(m.config().n_vocab));
    for (const int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{512}}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      const Run c = run(e, prompt, chunk, policy, 48);
      EXPECT_TRUE(same_bits(c.first_logits, one.first_logits));
      EXPECT_EQ(c.tokens, one.tokens);
      EXPECT_EQ(c.rounds, one.rounds);
      EXPECT_EQ(c.seq->n_seen, one.seq->n_seen);
      EXPECT_EQ(c.seq->prompt_len, 400);
      expect_same_cache(*c.seq, *one.seq);
    }
  }
}

TEST(EnginePrefillChunk, AnyChunkingIsBitIdenticalToOneCallOnStories260K) {
  KVEVICT_REQUIRE_MODEL(m);
  check_model(*m);
}

TEST(EnginePrefillChunk, AnyChunkingIsBitIdenticalToOneCallOnReasoner) {
  const auto m = Model::load(kvevict::test::reasoner_model());
  check_model(*m);
}

TEST(EnginePrefillChunk, FusedWithADecodeStepEqualsSeparateCallsBitForBit) {
  // Two sequences decode while a third's 100-token prompt is prefilled in chunks of 30 inside
  // the same forward passes; the reference runs the same work as separate decode_batch and
  // prefill_chunk calls on a second set of sequences.
  KVEVICT_REQUIRE_MODEL(m);
  Engine e(*m, 2);
  EvictionConfig cfg;
  cfg.budget = 8;  // the decoding sequences (6-token prompts) run a round every 2 steps from step 4
  cfg.recent = 2;
  cfg.seed = 3;
  const auto prompt = random_prompt(*m, 100, 8);
  const std::vector<int32_t> head = {1, 2, 3, 4, 5, 6};
  std::vector<std::unique_ptr<Sequence>> fused, sep;
  std::vector<float> lf, ls, tmp;
  for (auto* set : {&fused, &sep}) {
    for (int i = 0; i < 2; ++i) {
      set->push_back(e.new_sequence(static_cast<uint64_t>(i), make_policy(i == 0 ? "random" : "h2o"), cfg, 6, 40));
      e.prefill_chunk(*set->back(), head, tmp);
    }
    set->push_back(e.new_sequence(2, make_policy("h2o"), cfg, 100, 4));
  }
  std::vector<Sequence*> df = {fused[0].get(), fused[1].get()}, ds = {sep[0].get(), sep[1].get()};
  std::vector<int32_t> toks = {7, 9};
  std::vector<float> pre_s;
  for (int64_t i = 0; i < 100; i += 30) {
    const auto chunk = std::span<const int32_t>(prompt).subspan(static_cast<size_t>(i),
                                                                static_cast<size_t>(std::min<int64_t>(30, 100 - i)));
    e.decode_batch_with_chunk(df, toks, *fused[2], chunk, lf);
    e.decode_batch(ds, toks, ls);
    e.prefill_chunk(*sep[2], chunk, pre_s);
    const auto V = static_cast<size_t>(m->config().n_vocab);
    ASSERT_EQ(lf.size(), 3 * V);
    ls.insert(ls.end(), pre_s.begin(), pre_s.end());
    EXPECT_TRUE(same_bits(lf, ls)) << "chunk at " << i;
    for (size_t k = 0; k < 2; ++k)  // next tokens: argmax of each decode row
      toks[k] = static_cast<int32_t>(std::max_element(lf.begin() + static_cast<std::ptrdiff_t>(k * V),
                                                      lf.begin() + static_cast<std::ptrdiff_t>((k + 1) * V)) -
                                     (lf.begin() + static_cast<std::ptrdiff_t>(k * V)));
  }
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(fused[k]->n_seen, sep[k]->n_seen);
    EXPECT_EQ(fused[k]->stats.rounds, sep[k]->stats.rounds);
    expect_same_cache(*fused[k], *sep[k]);
  }
  EXPECT_GE(fused[0]->stats.rounds, 1);
  EXPECT_GE(fused[1]->stats.rounds, 1);
  EXPECT_EQ(fused[2]->prompt_len, 100);
  EXPECT_THROW(e.decode_batch_with_chunk(df, toks, *fused[0], std::span<const int32_t>(prompt).subspan(0, 1), lf),
               Error);
  EXPECT_THROW(e.decode_batch_with_chunk(df, toks, *fused[2], {}, lf), Error);
}

TEST(EnginePrefillChunk, OneCallAgreesWithBlasPrefillWithinRounding) {
  // prefill (BLAS for >= 16 rows) and prefill_chunk (row-exact kernels) compute the same
  // function; only the summation order differs, so logits agree to float rounding.
  KVEVICT_REQUIRE_MODEL(m);
  Engine e(*m, 2);
  const auto prompt = random_prompt(*m, 200, 6);
  EvictionConfig cfg;
  auto a = e.new_sequence(0, make_policy("full"), cfg, 200, 0);
  auto b = e.new_sequence(0, make_policy("full"), cfg, 200, 0);
  std::vector<float> la, lb;
  e.prefill(*a, prompt, la);
  e.prefill_chunk(*b, prompt, lb);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-3f) << i;
}

TEST(EnginePrefillChunk, RejectsEmptyAndOverCapacityChunksWithoutChangingTheSequence) {
  KVEVICT_REQUIRE_MODEL(m);
  Engine e(*m, 1);
  EvictionConfig cfg;
  auto s = e.new_sequence(0, make_policy("full"), cfg, 8, 0);  // capacity 8 slots
  std::vector<float> logits;
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  EXPECT_THROW(e.prefill_chunk(*s, {}, logits), Error);
  e.prefill_chunk(*s, five, logits);
  EXPECT_THROW(e.prefill_chunk(*s, five, logits), Error);  // 10 > 8 slots
  EXPECT_EQ(s->n_seen, 5);
  EXPECT_EQ(s->kv.length(0), 5);
  const std::vector<int32_t> three = {6, 7, 8};
  e.prefill_chunk(*s, three, logits);  // still fits exactly
  EXPECT_EQ(s->n_seen, 8);
}

}  // namespace
}  // namespace kvevict
