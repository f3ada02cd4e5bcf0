// The server's sampling fields (vLLM / llama-server names): each one reaches the generation
// settings, a bad value is a 400 naming the field, and through the scheduler logit_bias and
// stop_token_ids change the output as specified. The formulas themselves are tested against
// hand-computed values in generation_test.cpp; here the expected tokens come from the engine's
// own prefill logits, ranked in the test (argmax and runner-up), not from the generation code.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "eviction/registry.h"
#include "format/gguf.h"
#include "model/model.h"
#include "serve/request.h"
#include "serve/scheduler.h"
#include "test_paths.h"

namespace kvevict {
namespace {

// Parses completions bodies on the reasoner's vocabulary with --max-tokens 32.
struct Parser {
  std::unique_ptr<Model> model = Model::load(test::reasoner_model());
  serve::ApiOptions opt = [] {
    serve::ApiOptions o;
    o.max_tokens_limit = 32;
    return o;
  }();
  std::atomic<uint64_t> counter{0};
  serve::ParsedRequest operator()(const std::string& fields) {
    return serve::parse_generation_request(R"({"prompt": "AB\nBC\n?", )" + fields + "}",
                                           serve::Endpoint::Completions, model->tokenizer(),
                                           model->config().context_length, opt, counter);
  }
  // The 400's param and message for `fields`; {"accepted", ""} when parsing succeeds.
  std::pair<std::string, std::string> error(const std::string& fields) {
    try {
      (void)(*this)(fields);
    } catch (const serve::ApiError& e) {
      EXPECT_EQ(e.status, 400) << fields;
      return {e.param, e.message};
    }
    return {"accepted", ""};
  }
};

TEST(ServeSampling, EveryFieldReachesTheGenerationSettings) {
  Parser parse;
  const serve::ParsedRequest p = parse(
      R"("max_tokens": 8, "min_p": 0.1, "repetition_penalty": 1.3, "presence_penalty": 0.5,)"
      R"( "frequency_penalty": -0.25, "logit_bias": {"5": -100, "7": 2.5}, "min_tokens": 3,)"
      R"( "stop_token_ids": [4, 9])");
  const GenerationConfig& g = p.gen.generation;
  EXPECT_FLOAT_EQ(g.sampler.min_p, 0.1f);
  EXPECT_FLOAT_EQ(g.sampler.repetition_penalty, 1.3f);
  EXPECT_FLOAT_EQ(g.sampler.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(g.sampler.frequency_penalty, -0.25f);
  ASSERT_EQ(g.sampler.logit_bias.size(), 2u);
  EXPECT_FLOAT_EQ(g.sampler.logit_bias.at(5), -100.0f);
  EXPECT_FLOAT_EQ(g.sampler.logit_bias.at(7), 2.5f);
  EXPECT_EQ(g.min_tokens, 3);
  EXPECT_EQ(g.stop_token_ids, (std::vector<int32_t>{4, 9}));
  // Absent fields are off: the defaults of SamplerConfig / GenerationConfig.
  const serve::ParsedRequest q = parse(R"("max_tokens": 8)");
  EXPECT_FALSE(q.gen.generation.sampler.adjusts_logits());
  EXPECT_EQ(q.gen.generation.sampler.min_p, 0.0f);
  EXPECT_EQ(q.gen.generation.min_tokens, 0);
  EXPECT_TRUE(q.gen.generation.stop_token_ids.empty());
}

TEST(ServeSampling, BadValuesAreA400NamingTheField) {
  // Ranges: min_p [0, 1] (vLLM), repetition_penalty > 0 (vLLM), presence / frequency penalty
  // [-2, 2] and logit_bias [-100, 100] (OpenAI API reference), ids in [0, n_vocab).
  Parser parse;
  const int32_t V = parse.model->tokenizer().n_vocab();
  EXPECT_EQ(parse.error(R"("min_p": 1.5)").first, "min_p");
  EXPECT_EQ(parse.error(R"("min_p": "x")").first, "min_p");
  EXPECT_EQ(parse.error(R"("repetition_penalty": 0)").first, "repetition_penalty");
  EXPECT_EQ(parse.error(R"("presence_penalty": 2.5)").first, "presence_penalty");
  EXPECT_EQ(parse.error(R"("frequency_penalty": -3)").first, "frequency_penalty");
  EXPECT_EQ(parse.error(R"("logit_bias": [1])").first, "logit_bias");
  EXPECT_EQ(parse.error(R"("logit_bias": {"abc": 1})").first, "logit_bias");
  EXPECT_EQ(parse.error(R"("logit_bias": {"5x": 1})").first, "logit_bias");
  EXPECT_EQ(parse.error(R"("logit_bias": {"5": "big"})").first, "logit_bias");
  EXPECT_EQ(parse.error(R"("logit_bias": {"5": 101})").first, "logit_bias");
  EXPECT_EQ(parse.error(R"("logit_bias": {")" + std::to_string(V) + R"(": 1})"),
            std::make_pair(std::string("logit_bias"),
                           "logit_bias: key \"" + std::to_string(V) + "\": must be a token id in [0, " +
                               std::to_string(V) + ")"));
  EXPECT_EQ(parse.error(R"("max_tokens": 8, "min_tokens": 9)"),
            std::make_pair(std::string("min_tokens"), std::string("min_tokens 9: must be in [0, 8] (max_tokens is 8)")));
  EXPECT_EQ(parse.error(R"("min_tokens": -1)").first, "min_tokens");
  EXPECT_EQ(parse.error(R"("stop_token_ids": 4)").first, "stop_token_ids");
  EXPECT_EQ(parse.error(R"("stop_token_ids": [-1])").first, "stop_token_ids");
  EXPECT_EQ(parse.error(R"("stop_token_ids": [)" + std::to_string(V) + "]").first, "stop_token_ids");
  EXPECT_EQ(parse.error(R"("stop_token_ids": [1.5])").first, "stop_token_ids");
  // The edges of each range are accepted.
  EXPECT_EQ(parse.error(R"("min_p": 1, "presence_penalty": -2, "frequency_penalty": 2, "logit_bias": {"0": -100})")
                .first,
            "accepted");
}

// Runs one parsed request through a scheduler; its single outcome.
serve::ChoiceOutcome run(const Model& m, const serve::ParsedRequest& p) {
  serve::SchedulerOptions so;
  so.threads = 1;
  so.kv_memory_bytes = 64 << 20;
  serve::Scheduler s(m, so);
  auto r = std::make_shared<serve::Request>(p.gen);
  EXPECT_EQ(s.submit(r), serve::Admission::Queued);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool done = false;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    auto e = r->next_event(std::chrono::milliseconds(100));
    done = e && (e->kind == serve::RequestEvent::Kind::Done || e->kind == serve::RequestEvent::Kind::Failed);
  }
  s.shutdown(std::chrono::milliseconds(0));
  EXPECT_TRUE(done);
  return r->outcomes().at(0);
}

TEST(ServeSampling, LogitBiasAndStopTokenIdsChangeTheOutputThroughTheScheduler) {
  Parser parse;
  const Model& m = *parse.model;
  const Tokenizer& tok = m.tokenizer();
  // The first token's ranking from the engine's prefill logits: greedy t0, runner-up t1.
  const serve::ParsedRequest base = parse(R"("max_tokens": 4, "temperature": 0, "ignore_eos": true)");
  Engine engine(m, 1);
  auto seq = engine.new_sequence(0, make_policy("full"), {}, static_cast<int64_t>(base.gen.prompt.size()), 1);
  std::vector<float> logits;
  engine.prefill(*seq, base.gen.prompt, logits);
  std::vector<int32_t> rank(logits.size());
  std::iota(rank.begin(), rank.end(), 0);
  std::stable_sort(rank.begin(), rank.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  const int32_t t0 = rank[0], t1 = rank[1];
  ASSERT_LT(logits[static_cast<size_t>(t0)] - logits[static_cast<size_t>(t1)], 100.0f);  // -100 demotes t0
  const std::string p0 = tok.piece(t0), p1 = tok.piece(t1);
  ASSERT_NE(p0, p1);

  const serve::ChoiceOutcome plain = run(m, base);
  EXPECT_EQ(plain.text.substr(0, p0.size()), p0);
  EXPECT_EQ(plain.completion_tokens, 4);

  // stop_token_ids = [t0]: the greedy first token ends the sequence and is not output.
  const std::string t0s = std::to_string(t0);
  const serve::ChoiceOutcome stopped =
      run(m, parse(R"("max_tokens": 4, "temperature": 0, "ignore_eos": true, "stop_token_ids": [)" + t0s + "]"));
  EXPECT_EQ(stopped.text, "");
  EXPECT_EQ(stopped.completion_tokens, 1);
  EXPECT_EQ(stopped.finish, serve::FinishReason::Stop);

  // logit_bias -100 on t0: the runner-up comes first; with t0 also a stop token the sequence now
  // runs to its length.
  const serve::ChoiceOutcome biased = run(m, parse(R"("max_tokens": 4, "temperature": 0, "ignore_eos": true,)"
                                                   R"( "stop_token_ids": [)" + t0s + R"(], "logit_bias": {")" +
                                                   t0s + R"(": -100})"));
  EXPECT_EQ(biased.text.substr(0, p1.size()), p1);
  EXPECT_EQ(biased.completion_tokens, 4);
  EXPECT_EQ(biased.finish, serve::FinishReason::Length);

  // min_tokens 2 masks the stop token at the first step: again the runner-up first.
  const serve::ChoiceOutcome held = run(m, parse(R"("max_tokens": 4, "temperature": 0, "ignore_eos": true,)"
                                                 R"( "min_tokens": 2, "stop_token_ids": [)" + t0s + "]"));
  EXPECT_EQ(held.text.substr(0, p1.size()), p1);
  EXPECT_GE(held.completion_tokens, 2);
}

}  // namespace
}  // namespace kvevict
