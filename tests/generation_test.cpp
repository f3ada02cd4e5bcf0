// The generation component (engine/generation.h, engine/sampler.h): every sampling field and
// stop rule against an independent computation in the test. Expected values come from the
// formulas the header cites, restated here: logit bias (OpenAI API), repetition penalty (CTRL
// arXiv 1909.05858 §4.1 as vLLM applies it), frequency / presence penalties (OpenAI API), min-p
// (vLLM `_apply_min_p`), min_tokens / stop_token_ids / ignore_eos (vLLM SamplingParams),
// log-softmax written out in double. Determinism: the old per-sequence decode loop (Engine::decode
// and one sample_token per step), written in the test, is the reference for generate_batch.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "engine/generation.h"
#include "engine/policy_settings.h"
#include "model_fixture.h"
#include "util/field_error.h"
#include "util/rng.h"

namespace kvevict {
namespace {

// 0 <unk>, 1 <s>, 2 </s> (EOS), 3..258 the byte pieces <0x00>..<0xFF>, then a b c d.
Tokenizer vocab() {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    pieces.emplace_back(buf);
  }
  for (const char* p : {"a", "b", "c", "d"}) pieces.emplace_back(p);
  std::vector<float> scores(pieces.size(), 0.0f);
  return Tokenizer(std::move(pieces), std::move(scores), {}, 1, 2, 0, false);
}
constexpr int32_t kEos = 2, kA = 259, kB = 260, kC = 261, kD = 262;
int32_t byte_token(int b) { return 3 + b; }

// Logits of the vocabulary: -5 everywhere but `top`.
std::vector<float> logits(const Tokenizer& tok, const std::map<int32_t, float>& top) {
  std::vector<float> l(static_cast<size_t>(tok.n_vocab()), -5.0f);
  for (const auto& [t, v] : top) l[static_cast<size_t>(t)] = v;
  return l;
}

GenerationConfig greedy(int64_t max_new) {
  GenerationConfig c;
  c.sampler.temperature = 0.0f;
  c.max_new_tokens = max_new;
  return c;
}

int32_t test_argmax(const std::vector<float>& l) {
  int32_t best = 0;
  for (size_t i = 1; i < l.size(); ++i)
    if (l[i] > l[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

const std::vector<int32_t> kPrompt = {1};

TEST(Generation, LogitBiasMovesTheGreedyToken) {
  const Tokenizer tok = vocab();
  ASSERT_TRUE(tok.is_eog(kEos));
  const std::vector<float> l = logits(tok, {{kA, 3.0f}, {kB, 2.5f}, {kC, 1.0f}});
  GenerationConfig c = greedy(1);
  EXPECT_EQ(GenerationState(tok, c, 0, kPrompt).step(l).token, test_argmax(l));  // a
  // -100 on the greedy token: the next one wins (computed here: logits + bias, argmax).
  c.sampler.logit_bias = {{kA, -100.0f}};
  std::vector<float> biased = l;
  biased[kA] -= 100.0f;
  EXPECT_EQ(test_argmax(biased), kB);
  EXPECT_EQ(GenerationState(tok, c, 0, kPrompt).step(l).token, kB);
  // +2.5 lifts c above a.
  c.sampler.logit_bias = {{kC, 2.5f}};
  EXPECT_EQ(GenerationState(tok, c, 0, kPrompt).step(l).token, kC);
}

TEST(Generation, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOfSeenTokens) {
  const Tokenizer tok = vocab();
  const std::vector<float> l = logits(tok, {{kA, 3.0f}, {kB, 2.5f}, {kC, 1.0f}, {kD, -1.0f}});
  const std::vector<int32_t> prompt = {1, kA, kD};
  SamplerConfig sc;
  sc.repetition_penalty = 2.0f;
  // The formula, here: tokens of the prompt (and output) l > 0 ? l / p : l * p.
  std::vector<float> expect = l;
  for (const int32_t t : {1, kA, kD}) {
    float& v = expect[static_cast<size_t>(t)];
    v = v > 0 ? v / 2.0f : v * 2.0f;
  }
  const TokenCounts counts(tok.n_vocab(), prompt);
  std::vector<float> got = l;
  adjust_logits(got, sc, &counts);
  for (size_t i = 0; i < l.size(); ++i) ASSERT_EQ(got[i], expect[i]) << i;
  GenerationConfig c = greedy(1);
  c.sampler.repetition_penalty = 2.0f;
  EXPECT_EQ(GenerationState(tok, c, 0, prompt).step(l).token, kB);  // a: 3 / 2 = 1.5 < 2.5
  c.sampler.repetition_penalty = 1.0f;
  EXPECT_EQ(GenerationState(tok, c, 0, prompt).step(l).token, kA);
}

TEST(Generation, FrequencyAndPresencePenaltiesCountTheOutput) {
  const Tokenizer tok = vocab();
  const std::vector<float> l = logits(tok, {{kA, 2.0f}, {kB, 1.5f}, {kC, 1.2f}});
  const float freq = 0.3f, pres = 0.1f;
  GenerationConfig c = greedy(8);
  c.sampler.frequency_penalty = freq;
  c.sampler.presence_penalty = pres;
  const std::vector<int32_t> prompt = {kA, kA};  // prompt tokens do not count for these two
  GenerationState s(tok, c, 0, prompt);
  // Reference: counts of the generated tokens, l - c * freq - (c > 0) * pres, argmax.
  std::map<int32_t, int> counts;
  for (int step = 0; step < 8; ++step) {
    std::vector<float> adj = l;
    for (const auto& [t, n] : counts) adj[static_cast<size_t>(t)] -= static_cast<float>(n) * freq + pres;
    const int32_t expect = test_argmax(adj);
    const StepResult r = s.step(l);
    ASSERT_EQ(r.token, expect) << "step " << step;
    counts[expect] += 1;
  }
  EXPECT_GE(counts.size(), 2u);  // the penalties did change the greedy choice
}

TEST(Generation, MinPDropsTokensBelowItsShareOfTheLargestProbability) {
  // T = 1: p_rel = exp(l - l_max): b 0.607 kept at min_p 0.3, c 0.135 and the rest dropped.
  const Tokenizer tok = vocab();
  const std::vector<float> l = logits(tok, {{kA, 2.0f}, {kB, 1.5f}, {kC, 0.0f}, {kD, -1.0f}});
  SamplerConfig sc;
  sc.temperature = 1.0f;
  sc.top_p = 1.0f;
  sc.min_p = 0.3f;
  std::map<int32_t, int> n;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) {
    Rng rng(stream_id({5, static_cast<uint64_t>(i)}));
    n[sample_token(l, sc, rng)]++;
  }
  const double pb = std::exp(-0.5);
  EXPECT_EQ(n.size(), 2u);
  EXPECT_NEAR(n[kA] / double(draws), 1.0 / (1.0 + pb), 0.01);
  EXPECT_NEAR(n[kB] / double(draws), pb / (1.0 + pb), 0.01);
  sc.min_p = 0.0f;  // off: c and d appear
  n.clear();
  for (int i = 0; i < draws; ++i) {
    Rng rng(stream_id({5, static_cast<uint64_t>(i)}));
    n[sample_token(l, sc, rng)]++;
  }
  EXPECT_GT(n[kC], 0);
}

TEST(Generation, MinTokensMasksEndOfGenerationAndStops) {
  const Tokenizer tok = vocab();
  const std::vector<float> l = logits(tok, {{kEos, 5.0f}, {kA, 3.0f}, {kC, 4.0f}});
  GenerationConfig c = greedy(10);
  {
    GenerationState s(tok, c, 0, kPrompt);
    EXPECT_EQ(s.step(l).stop, StopCause::Eog);
    EXPECT_TRUE(s.tokens().empty());
    EXPECT_EQ(s.sampled(), 1);
  }
  c.min_tokens = 3;
  c.stop_token_ids = {kC};
  GenerationState s(tok, c, 0, kPrompt);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.step(l).token, kA);  // EOS and c masked: a
  const StepResult last = s.step(l);
  EXPECT_EQ(last.token, kEos);
  EXPECT_EQ(last.stop, StopCause::Eog);
  EXPECT_EQ(s.tokens(), (std::vector<int32_t>{kA, kA, kA}));
  EXPECT_EQ(s.text(), "aaa");
  EXPECT_EQ(s.sampled(), 4);
  EXPECT_STREQ(finish_reason(last.stop), "stop");
  // A stop string before min_tokens does not match; from token min_tokens on it does.
  GenerationConfig d = greedy(10);
  d.stop = {"a"};
  d.min_tokens = 2;
  GenerationState t(tok, d, 0, kPrompt);
  const std::vector<float> la = logits(tok, {{kA, 3.0f}});
  EXPECT_EQ(t.step(la).stop, StopCause::None);
  EXPECT_EQ(t.step(la).stop, StopCause::StopString);
  EXPECT_EQ(t.text(), "a");
}

TEST(Generation, StopTokenIdsEndTheSequenceAndAreNotOutput) {
  const Tokenizer tok = vocab();
  GenerationConfig c = greedy(10);
  c.stop_token_ids = {kC};
  GenerationState s(tok, c, 0, kPrompt);
  EXPECT_EQ(s.step(logits(tok, {{kA, 3.0f}})).stop, StopCause::None);
  const StepResult r = s.step(logits(tok, {{kC, 3.0f}}));
  EXPECT_EQ(r.token, kC);
  EXPECT_EQ(r.stop, StopCause::StopToken);
  EXPECT_EQ(s.tokens(), (std::vector<int32_t>{kA}));
  EXPECT_EQ(s.text(), "a");
  EXPECT_EQ(s.sampled(), 2);
}

TEST(Generation, IgnoreEosKeepsGoingToTheLengthCap) {
  const Tokenizer tok = vocab();
  GenerationConfig c = greedy(3);
  c.ignore_eos = true;
  GenerationState s(tok, c, 0, kPrompt);
  const std::vector<float> l = logits(tok, {{kEos, 5.0f}});
  EXPECT_EQ(s.step(l).stop, StopCause::None);
  EXPECT_EQ(s.step(l).stop, StopCause::None);
  const StepResult r = s.step(l);
  EXPECT_EQ(r.stop, StopCause::Length);
  EXPECT_STREQ(finish_reason(r.stop), "length");
  EXPECT_EQ(s.tokens(), (std::vector<int32_t>{kEos, kEos, kEos}));
}

TEST(Generation, LengthCapsCountThePromptWhenAsked) {
  const Tokenizer tok = vocab();
  GenerationConfig c = greedy(10);
  c.max_total_tokens = 5;
  EXPECT_EQ(generation_limit(c, 3), 2);
  EXPECT_EQ(generation_limit(c, 5), 0);
  c.max_total_tokens = 0;
  EXPECT_EQ(generation_limit(c, 3), 10);
  c.max_total_tokens = 5;
  const std::vector<int32_t> prompt = {1, kA, kB};
  GenerationState s(tok, c, 0, prompt);
  const std::vector<float> l = logits(tok, {{kA, 3.0f}});
  EXPECT_EQ(s.step(l).stop, StopCause::None);
  EXPECT_EQ(s.step(l).stop, StopCause::Length);
  EXPECT_THROW(s.step(l), Error);  // after the end
}

TEST(Generation, StopStringsAreHeldBackUntilTheyCannotMatch) {
  const Tokenizer tok = vocab();
  GenerationConfig c = greedy(10);
  c.stop = {"bc"};
  {
    GenerationState s(tok, c, 0, kPrompt);
    EXPECT_EQ(s.step(logits(tok, {{kA, 1.0f}})).text, "a");
    EXPECT_EQ(s.step(logits(tok, {{kB, 1.0f}})).text, "");  // could start "bc"
    const StepResult r = s.step(logits(tok, {{kC, 1.0f}}));
    EXPECT_EQ(r.stop, StopCause::StopString);
    EXPECT_EQ(r.text + r.tail, "");
    EXPECT_EQ(s.text(), "a");
    EXPECT_EQ(s.tokens(), (std::vector<int32_t>{kA, kB, kC}));
  }
  GenerationState s(tok, c, 0, kPrompt);
  s.step(logits(tok, {{kA, 1.0f}}));
  s.step(logits(tok, {{kB, 1.0f}}));
  EXPECT_EQ(s.step(logits(tok, {{kD, 1.0f}})).text, "bd");  // "bd" cannot become "bc"
  // The custom predicate sees every byte and keeps the text.
  GenerationConfig p = greedy(10);
  p.stop_when = [](const std::string& text) { return text.size() >= 2; };
  GenerationState q(tok, p, 0, kPrompt);
  EXPECT_EQ(q.step(logits(tok, {{kA, 1.0f}})).stop, StopCause::None);
  EXPECT_EQ(q.step(logits(tok, {{kB, 1.0f}})).stop, StopCause::Predicate);
  EXPECT_EQ(q.text(), "ab");
}

TEST(Generation, SplitCharactersAreHeldBackAndTheTailFollowsTheSetting) {
  // "é" = C3 A9 arrives as two byte tokens (RFC 3629).
  const Tokenizer tok = vocab();
  GenerationConfig c = greedy(2);
  GenerationState s(tok, c, 0, kPrompt);
  EXPECT_EQ(s.step(logits(tok, {{byte_token(0xC3), 1.0f}})).text, "");
  const StepResult r = s.step(logits(tok, {{byte_token(0xA9), 1.0f}}));
  EXPECT_EQ(r.text, "\xC3\xA9");
  EXPECT_EQ(r.stop, StopCause::Length);
  // Cut after the first byte: dropped for JSON, kept for a terminal.
  c.max_new_tokens = 1;
  GenerationState drop(tok, c, 0, kPrompt);
  EXPECT_EQ(drop.step(logits(tok, {{byte_token(0xC3), 1.0f}})).tail, "");
  c.keep_incomplete_tail = true;
  GenerationState keep(tok, c, 0, kPrompt);
  EXPECT_EQ(keep.step(logits(tok, {{byte_token(0xC3), 1.0f}})).tail, "\xC3");
  EXPECT_EQ(keep.text(), "\xC3");
}

TEST(Generation, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  const Tokenizer tok = vocab();
  std::vector<float> l(static_cast<size_t>(tok.n_vocab()));
  Rng rng(stream_id({11}));
  for (float& v : l) v = static_cast<float>(rng.uniform() * 10.0 - 5.0);
  // Reference: log(exp(l_t) / sum exp(l)) in double, without the max shift.
  double z = 0;
  for (const float v : l) z += std::exp(static_cast<double>(v));
  const auto logp = [&](int32_t t) { return static_cast<double>(l[static_cast<size_t>(t)]) - std::log(z); };
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
  GenerationConfig c = greedy(1);
  c.logprobs = 3;
  c.sampler.logit_bias = {{order[5], 100.0f}};  // the choice moves; the logprobs stay raw
  GenerationState s(tok, c, 0, kPrompt);
  const StepResult r = s.step(l);
  EXPECT_EQ(r.token, order[5]);
  ASSERT_NE(r.logprobs, nullptr);
  EXPECT_EQ(r.logprobs->token, order[5]);
  EXPECT_NEAR(r.logprobs->logprob, logp(order[5]), 1e-5);
  ASSERT_EQ(r.logprobs->top.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.logprobs->top[i].first, order[i]);
    EXPECT_NEAR(r.logprobs->top[i].second, logp(order[i]), 1e-5);
  }
  EXPECT_EQ(s.logprobs().size(), 1u);
  GenerationConfig off = greedy(1);
  EXPECT_EQ(GenerationState(tok, off, 0, kPrompt).step(l).logprobs, nullptr);
}

TEST(Generation, InvalidSettingsNameTheirField) {
  const auto field = [](const GenerationConfig& c) -> std::optional<Field> {
    try {
      validate_generation(c, 300);
    } catch (const FieldError& e) {
      return e.field();
    }
    return std::nullopt;
  };
  GenerationConfig ok;
  EXPECT_EQ(field(ok), std::nullopt);
  const std::vector<std::pair<Field, std::function<void(GenerationConfig&)>>> bad = {
      {Field::Temperature, [](GenerationConfig& c) { c.sampler.temperature = -1; }},
      {Field::TopP, [](GenerationConfig& c) { c.sampler.top_p = 0; }},
      {Field::TopK, [](GenerationConfig& c) { c.sampler.top_k = -1; }},
      {Field::MinP, [](GenerationConfig& c) { c.sampler.min_p = 1.5f; }},
      {Field::RepetitionPenalty, [](GenerationConfig& c) { c.sampler.repetition_penalty = 0; }},
      {Field::PresencePenalty, [](GenerationConfig& c) { c.sampler.presence_penalty = 2.5f; }},
      {Field::FrequencyPenalty, [](GenerationConfig& c) { c.sampler.frequency_penalty = -3; }},
      {Field::LogitBias,
       [](GenerationConfig& c) {
         c.sampler.logit_bias = {{300, 1.0f}};
       }},
      {Field::LogitBias,
       [](GenerationConfig& c) {
         c.sampler.logit_bias = {{3, 101.0f}};
       }},
      {Field::MaxNewTokens, [](GenerationConfig& c) { c.max_new_tokens = 0; }},
      {Field::MaxTotalTokens, [](GenerationConfig& c) { c.max_total_tokens = -1; }},
      {Field::MinTokens, [](GenerationConfig& c) { c.min_tokens = -1; }},
      {Field::StopTokenIds, [](GenerationConfig& c) { c.stop_token_ids = {300}; }},
      {Field::Logprobs, [](GenerationConfig& c) { c.logprobs = kMaxLogprobs + 1; }},
  };
  for (const auto& [f, set] : bad) {
    GenerationConfig c;
    set(c);
    EXPECT_EQ(field(c), f) << field_name(f);
  }
}

// The old decode loop of `kvevict generate`, kept here as the reference: one sequence, one
// Engine::decode per token, one sample_token per step from Rng(stream_id({seed, id, step, tag})).
std::vector<int32_t> reference_tokens(const Model& m, const CheckedPolicy& kv, uint64_t id,
                                      const std::vector<int32_t>& prompt, const SamplerConfig& sc, int64_t n) {
  Engine e(m, 1);
  auto seq = e.new_sequence(id, kv, static_cast<int64_t>(prompt.size()), n);
  std::vector<float> l;
  e.prefill(*seq, prompt, l);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    Rng rng(stream_id({sc.seed, id, static_cast<uint64_t>(i), 0x5A4D504CULL}));
    const int32_t t = sample_token(l, sc, rng);
    out.push_back(t);
    if (i + 1 < n) e.decode(*seq, t, l);
  }
  return out;
}

TEST(Generation, SameSeedSameTokensWhateverTheBatchPositionOrThreads) {
  KVEVICT_REQUIRE_MODEL(model);
  PolicySettings ps;
  ps.budget = 32;
  ps.recent = 8;
  ps.seed = 3;
  const CheckedPolicy kv = build_policy_config(ps);  // random: eviction rounds draw too
  GenerationConfig c;
  c.sampler.temperature = 0.8f;
  c.sampler.top_k = 40;
  c.sampler.seed = 3;
  c.max_new_tokens = 70;  // > B + r: several rounds
  c.ignore_eos = true;
  const std::vector<int32_t> p1 = model->tokenizer().encode("Once upon a time", true);
  const std::vector<int32_t> p2 = model->tokenizer().encode("The dog", true);
  const std::vector<GenerationInput> in = {{7, p1}, {8, p2}, {9, p1}};
  const auto run = [&](const std::vector<GenerationInput>& inputs, int threads) {
    Engine engine(*model, threads);
    std::map<uint64_t, std::vector<int32_t>> out;
    GenerationCallbacks cb;
    cb.on_finished = [&](size_t, std::unique_ptr<Sequence> seq, GenerationResult r) {
      EXPECT_GT(seq->stats.rounds, 0);
      EXPECT_EQ(r.stop, StopCause::Length);
      out[r.id] = r.tokens;
    };
    generate_batch(engine, kv, inputs, c, cb);
    return out;
  };
  const auto batch = run(in, 1);
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_EQ(run({in[2], in[1], in[0]}, 2), batch);  // other positions, other thread count
  for (const GenerationInput& i : in) {
    EXPECT_EQ(run({i}, 1).at(i.id), batch.at(i.id)) << "alone: " << i.id;
    const std::vector<int32_t> prompt(i.prompt.begin(), i.prompt.end());
    EXPECT_EQ(reference_tokens(*model, kv, i.id, prompt, c.sampler, c.max_new_tokens), batch.at(i.id)) << i.id;
  }
  EXPECT_NE(batch.at(7), batch.at(9));  // same prompt, another sequence id: other draws
  // generate() of one sequence: the same tokens, the sequence handed back.
  Engine engine(*model, 1);
  const GenerationOutput one = generate(engine, kv, in[1], c);
  EXPECT_EQ(one.result.tokens, batch.at(8));
  ASSERT_NE(one.seq, nullptr);
  EXPECT_EQ(one.seq->id, 8u);
}

}  // namespace
}  // namespace kvevict
