// The eval report's keep-log check for the `once` family: the token position of the code (the
// fact stated once), whether a rollout still held it at the end, and the summary's split of
// accuracy by it. Expected positions come from the task text (BOS + the code's character
// offset, the reasoner maps one character to one token); kept / lost from what each policy must
// do by its definition (full keeps everything; recency without pins keeps only the newest B).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "engine/engine.h"
#include "eval/prompt.h"
#include "eval/runner.h"
#include "eval/summary.h"
#include "eval/task_file.h"
#include "eviction/registry.h"
#include "model/model.h"
#include "tasks/generator.h"
#include "test_paths.h"

namespace kvevict {
namespace {

EvalCell cell(const std::string& name, int64_t budget) {
  EvalCell c;
  c.spec = {name, budget};
  EvictionConfig e;
  e.budget = budget;
  e.recent = 16;
  e.seed = 3;
  c.kv = CheckedPolicy::check(make_policy(name), e);
  return c;
}

TEST(FactKept, PositionOfTheOnceCodeAndKeptOrLostAtTheEnd) {
  ASSERT_TRUE(std::filesystem::exists(test::reasoner_model())) << test::reasoner_model();
  const auto model = Model::load(test::reasoner_model());
  const Task once = generate_task(TaskFamily::Once, {12, 20}, 5000, 3);
  const PromptBuilder prompts(*model, {TemplateChoice::Plain, false});
  const std::vector<int32_t> prompt = prompts.tokens(once.problem);
  const auto pos = fact_token_position(model->tokenizer(), prompt, once.problem);
  ASSERT_TRUE(pos.has_value());
  EXPECT_EQ(*pos, *once_code_offset(once.problem) + 1);  // BOS, then one token per character
  EXPECT_EQ(*pos, 3 * 20 + 2);                           // after the 20 fact lines and '#'
  const Task chain = generate_task(TaskFamily::Chain, {12, 20}, 5000, 3);
  EXPECT_FALSE(fact_token_position(model->tokenizer(), prompts.tokens(chain.problem), chain.problem));
  EXPECT_FALSE(once_code_offset("AB\nBA\n#3\n?002A\n"));  // a '#' line outside a once problem

  Engine engine(*model, 1);
  EvalTask t;
  t.id = once.id;
  t.problem = once.problem;
  t.answer = once.answer;
  RolloutOptions o;
  o.sampler.temperature = 0;
  o.sampler.seed = 1;
  o.max_length = static_cast<int64_t>(prompt.size()) + 120;
  const int todo[] = {0};
  std::vector<RolloutRecord> recs;
  const auto collect = [&](RolloutRecord&& r) { recs.push_back(std::move(r)); };
  run_rollouts(engine, t, prompt, cell("full", 0), todo, o, collect);
  // recency at B = 48, r = 16 keeps the newest 48 positions only; the prompt is 70 tokens and
  // the 12-step trace ~94, so by the end (rounds every 16 steps) the code slot (62) is gone.
  run_rollouts(engine, t, prompt, cell("recency", 48), todo, o, collect);
  ASSERT_EQ(recs.size(), 2u);
  ASSERT_TRUE(recs[0].fact_kept.has_value());
  EXPECT_TRUE(*recs[0].fact_kept);
  ASSERT_TRUE(recs[1].fact_kept.has_value());
  EXPECT_GT(recs[1].rounds, 0);
  EXPECT_FALSE(*recs[1].fact_kept);
  // JSON: the key is written only when the check applies, and read back.
  EXPECT_EQ(RolloutRecord::from_json(recs[1].to_json(), "t").fact_kept, std::optional<bool>(false));
  RolloutRecord plain = recs[0];
  plain.fact_kept.reset();
  EXPECT_FALSE(plain.to_json().contains("fact_kept"));
  EXPECT_FALSE(RolloutRecord::from_json(plain.to_json(), "t").fact_kept.has_value());
}

TEST(FactKept, SummarySplitsAccuracyByWhetherTheFactWasKept) {
  EvalSettings st;
  st.n_tasks = 4;
  st.cells = {{"random", 128}};
  st.reference = "full";
  st.bootstrap_resamples = 100;
  std::vector<RolloutRecord> recs;
  // kept & right, kept & wrong, lost & wrong, lost & right -> kept 1/2, lost 1/2; then a second
  // lost & wrong -> lost 1/3.
  const bool kept[] = {true, true, false, false, false};
  const bool right[] = {true, false, false, true, false};
  for (int i = 0; i < 5; ++i) {
    RolloutRecord r;
    r.policy = "random";
    r.budget = 128;
    r.problem_id = std::to_string(i);
    r.problem_index = i;
    r.finish = "eos";
    r.correct = right[i];
    r.fact_kept = kept[i];
    recs.push_back(r);
  }
  const EvalSummary s = summarize(st, recs);
  ASSERT_EQ(s.cells.size(), 1u);
  EXPECT_EQ(s.cells[0].fact_kept_rollouts, 2);
  EXPECT_EQ(s.cells[0].fact_kept_correct, 1);
  EXPECT_EQ(s.cells[0].fact_lost_rollouts, 3);
  EXPECT_EQ(s.cells[0].fact_lost_correct, 1);
  const std::string md = summary_markdown(s);
  EXPECT_NE(md.find("| random | 128 | 2 | 0.500 (1/2) | 3 | 0.333 (1/3) |"), std::string::npos) << md;
  // fact_kept/lost columns, then answer_too_long (0: every record is graded).
  EXPECT_NE(summary_csv(s).find(",2,1,3,1,0,"), std::string::npos);  // then budget_fraction, ...
  // Without the check (other families) the second table is absent.
  for (auto& r : recs) r.fact_kept.reset();
  EXPECT_EQ(summary_markdown(summarize(st, recs)).find("Fact stated once"), std::string::npos);
}

}  // namespace
}  // namespace kvevict
