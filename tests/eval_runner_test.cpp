// The rollout runner and prompt builder on stories260K. Expected values follow from the
// runner's contract (eval/runner.h): a rollout depends only on (settings, problem, cell, index),
// so running it alone, beside others, or with another thread count gives the same record; the
// length cap counts the prompt. The plain prompt is the problem plus the paper's suffix
// (docs/eviction-spec.md §4).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "eval/prompt.h"
#include "eval/runner.h"
#include "model_fixture.h"
#include "util/error.h"

namespace kvevict {
namespace {

EvalCell cell(const std::string& name, int64_t budget) {
  EvalCell c;
  c.spec = {name, budget};
  EvictionConfig e;
  e.budget = budget;
  e.recent = 32;
  e.seed = 9;
  c.kv = CheckedPolicy::check(make_policy(name), e);
  return c;
}

EvalTask task() {
  EvalTask t;
  t.id = "story-1";
  t.problem = "Once upon a time, there was a little dog.";
  t.answer = "dog";
  t.grading = Grading::Exact;
  return t;
}

TEST(EvalRunner, PlainPromptAndTemplateChoice) {
  KVEVICT_REQUIRE_MODEL(model);
  const PromptBuilder plain(*model, {TemplateChoice::Auto, true});
  EXPECT_EQ(plain.template_name(), "plain");  // stories260K carries no chat template
  EXPECT_EQ(plain.text("What is 2+2?"),
            "What is 2+2?\nPlease reason step by step, and put your final answer within \\boxed{}.");
  const std::vector<int32_t> ids = plain.tokens("What is 2+2?");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], model->tokenizer().bos_id());
  const PromptBuilder bare(*model, {TemplateChoice::Plain, false});
  EXPECT_EQ(bare.text("AB\nBC"), "AB\nBC");
  EXPECT_THROW(PromptBuilder(*model, {TemplateChoice::Chat, true}), Error);
  EXPECT_THROW(parse_template_choice("chatml"), Error);
}

TEST(EvalRunner, LengthCapCountsThePrompt) {
  RolloutOptions o;
  o.max_length = 50;
  EXPECT_EQ(generation_cap(o, 10), 40);
  o.max_new_tokens = 30;
  EXPECT_EQ(generation_cap(o, 10), 30);
  EXPECT_EQ(generation_cap(o, 45), 5);
  EXPECT_LE(generation_cap(o, 60), 0);

  KVEVICT_REQUIRE_MODEL(model);
  Engine engine(*model, 1);
  const PromptBuilder prompts(*model, {TemplateChoice::Plain, false});
  const EvalTask t = task();
  const std::vector<int32_t> prompt = prompts.tokens(t.problem);
  o.max_length = static_cast<int64_t>(prompt.size()) + 7;
  o.max_new_tokens = 0;
  o.sampler.seed = 1;
  std::vector<RolloutRecord> recs;
  const int todo[] = {0};
  run_rollouts(engine, t, prompt, cell("full", 0), todo, o, [&](RolloutRecord&& r) { recs.push_back(std::move(r)); });
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_LE(recs[0].prompt_tokens + recs[0].generated_tokens, o.max_length);
  if (recs[0].finish == "length") {
    EXPECT_EQ(recs[0].generated_tokens, 7);
  }
  // A prompt with no room: recorded, not run.
  o.max_length = static_cast<int64_t>(prompt.size());
  recs.clear();
  run_rollouts(engine, t, prompt, cell("full", 0), todo, o, [&](RolloutRecord&& r) { recs.push_back(std::move(r)); });
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].finish, "prompt_too_long");
  EXPECT_EQ(recs[0].generated_tokens, 0);
  EXPECT_FALSE(recs[0].correct);
}

TEST(EvalRunner, RolloutDependsOnlyOnItsKey) {
  KVEVICT_REQUIRE_MODEL(model);
  const PromptBuilder prompts(*model, {TemplateChoice::Plain, false});
  const EvalTask t = task();
  const std::vector<int32_t> prompt = prompts.tokens(t.problem);
  RolloutOptions o;
  o.rollouts = 3;
  o.max_new_tokens = 150;  // > B + r = 96: several eviction rounds
  o.sampler.seed = 4;
  o.sampler.temperature = 1.0f;
  const EvalCell random = cell("random", 64);
  const auto run = [&](int threads, std::vector<int> todo) {
    Engine engine(*model, threads);
    std::map<int, RolloutRecord> out;
    run_rollouts(engine, t, prompt, random, todo, o, [&](RolloutRecord&& r) { out[r.rollout] = std::move(r); });
    return out;
  };
  auto together = run(1, {0, 1, 2});
  ASSERT_EQ(together.size(), 3u);
  int64_t max_rounds = 0;
  for (int r = 0; r < 3; ++r) {
    auto alone = run(2, {r});
    ASSERT_EQ(alone.size(), 1u);
    const RolloutRecord &a = together[r], &b = alone[r];
    EXPECT_EQ(a.text, b.text) << "rollout " << r;
    EXPECT_EQ(a.generated_tokens, b.generated_tokens);
    EXPECT_EQ(a.rounds, b.rounds);
    EXPECT_EQ(a.peak_slots, b.peak_slots);
    EXPECT_LE(a.peak_slots, 96);  // B + r
    max_rounds = std::max(max_rounds, a.rounds);
  }
  EXPECT_GT(max_rounds, 0) << "no rollout ran long enough to evict";
  // Different rollouts of the same problem draw different tokens.
  EXPECT_NE(together[0].text, together[1].text);

  // run_grid skips what is done.
  Engine engine(*model, 1);
  int calls = 0;
  run_grid(
      engine, {t}, {prompt}, {random, cell("full", 0)}, o,
      [&](const std::string& key) { return key != rollout_key("full", 0, t.id, 1); },
      [&](RolloutRecord&& r) {
        ++calls;
        EXPECT_EQ(r.policy, "full");
        EXPECT_EQ(r.rollout, 1);
      });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace kvevict
