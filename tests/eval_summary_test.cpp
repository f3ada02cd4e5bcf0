// eval's summary counts: how rollouts without a comparable answer are split into columns.
// Expected values: the grades written by the test.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/summary.h"
#include "util/error.h"

namespace kvevict {
namespace {

// Reproducer: summary's no_answer also counted rollouts whose boxed answer was too long to
// compare (grade answer_too_long, extracted null). Expected counts: the grades written below.
TEST(EvalStats, NoAnswerAndAnswerTooLongAreCountedApart) {
  EvalSettings st;
  st.tasks_format = "kvevict";
  st.n_tasks = 4;
  st.cells = {CellSpec{"full", 0}};
  st.reference = "full";
  st.bootstrap_resamples = 100;
  std::vector<RolloutRecord> recs;
  const char* grades[] = {"graded", "no_answer", "answer_too_long", "answer_too_long"};
  const char* ids[] = {"p0", "p1", "p2", "p3"};
  for (int i = 0; i < 4; ++i) {
    RolloutRecord r;
    r.policy = "full";
    r.problem_id = ids[i];
    r.problem_index = i;
    r.finish = "eos";
    r.grade = grades[i];
    if (i == 0) r.extracted = "1";
    recs.push_back(r);
  }
  const EvalSummary s = summarize(st, recs);
  ASSERT_EQ(s.cells.size(), 1u);
  EXPECT_EQ(s.cells[0].no_answer, 1);
  EXPECT_EQ(s.cells[0].answer_too_long, 2);
  const nlohmann::json j = summary_json(s)["cells"][0];
  EXPECT_EQ(j["no_answer"], 1);
  EXPECT_EQ(j["answer_too_long"], 2);
  // CSV: the new column is the last one, after the columns old readers know.
  const std::string csv = summary_csv(s);
  EXPECT_NE(csv.find(",fact_lost_correct,answer_too_long,"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",no_answer,hit_cap,"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",0,0,0,0,2,"), std::string::npos) << csv;  // fact counts, then answer_too_long
}

// Equivalence, Holm, budget fractions and pooling over budgets. Expected values: written out from
// the records below (hand-made), with eval/stats.h's functions applied to the per-problem values
// the test itself lists.
TEST(EvalStats, SummaryAddsEquivalenceHolmFractionAndPooledClusters) {
  EvalSettings st;
  st.tasks_format = "kvevict";
  st.n_tasks = 4;
  st.cells = {CellSpec{"full", 0}, CellSpec{"random", 100}, CellSpec{"random", 200}};
  st.reference = "full";
  st.bootstrap_resamples = 200;
  std::vector<RolloutRecord> recs;
  // full right on all 4 problems; random@100 wrong on problems 0, 1; random@200 wrong on 0.
  const auto add = [&](const std::string& policy, int64_t budget, int problem, bool correct) {
    RolloutRecord r;
    r.policy = policy;
    r.budget = budget;
    r.problem_id = "p" + std::to_string(problem);
    r.problem_index = problem;
    r.finish = "eos";
    r.grade = "graded";
    r.correct = correct;
    r.prompt_tokens = 100;
    r.generated_tokens = 300;  // sequence length 400
    recs.push_back(r);
  };
  for (int i = 0; i < 4; ++i) {
    add("full", 0, i, true);
    add("random", 100, i, i >= 2);
    add("random", 200, i, i >= 1);
  }
  const EvalSummary s = summarize(st, recs, 0.1);
  ASSERT_EQ(s.cells.size(), 3u);
  EXPECT_EQ(s.cells[0].budget_fraction, 0.0);
  EXPECT_DOUBLE_EQ(s.cells[1].budget_fraction, 0.25);  // 100 / 400
  EXPECT_DOUBLE_EQ(s.cells[2].budget_fraction, 0.5);
  // Sign tests: 0 wins, 2 losses (p = 0.5) and 0 wins, 1 loss (p = 1); Holm: min(1, 2 * 0.5) = 1,
  // then max(1, 1 * 1) = 1.
  ASSERT_TRUE(s.cells[1].sign && s.cells[2].sign);
  EXPECT_DOUBLE_EQ(s.cells[1].sign->p, 0.5);
  EXPECT_DOUBLE_EQ(*s.cells[1].sign_p_holm, 1.0);
  EXPECT_DOUBLE_EQ(*s.cells[2].sign_p_holm, 1.0);
  EXPECT_FALSE(s.cells[0].sign_p_holm.has_value());
  // Binary outcomes: Tango's TOST with n10 = 0, n01 = 2 of 4.
  ASSERT_TRUE(s.cells[1].equiv.has_value());
  EXPECT_EQ(s.cells[1].equiv->method, "tango-score");
  EXPECT_EQ(s.cells[1].equiv->n01, 2);
  EXPECT_DOUBLE_EQ(s.cells[1].equiv->margin, 0.1);
  EXPECT_FALSE(s.cells[1].equiv->equivalent);
  // Pooled over the two budgets: 4 problems, not 8; per-problem random means 0, 0.5, 1, 1
  // against 1, 1, 1, 1, so 2 losses and 2 ties; means are not binary: the paired t TOST.
  ASSERT_EQ(s.pooled.size(), 1u);
  EXPECT_EQ(s.pooled[0].policy, "random");
  EXPECT_EQ(s.pooled[0].budgets, (std::vector<int64_t>{100, 200}));
  EXPECT_EQ(s.pooled[0].diff.n, 4);
  EXPECT_DOUBLE_EQ(s.pooled[0].diff.mean_diff, -0.375);
  EXPECT_EQ(s.pooled[0].sign.n_neg, 2);
  EXPECT_EQ(s.pooled[0].sign.n_ties, 2);
  ASSERT_TRUE(s.pooled[0].equiv.has_value());
  EXPECT_EQ(s.pooled[0].equiv->method, "paired-t");
  const std::vector<double> ra{0, 0.5, 1, 1}, fb{1, 1, 1, 1};
  EXPECT_DOUBLE_EQ(s.pooled[0].equiv->p, paired_t_tost(ra, fb, 0.1).p);
  // Rendered: the markdown names the margin and has the pooled table; JSON carries the fields.
  const std::string md = summary_markdown(s);
  EXPECT_NE(md.find("TOST ±10 p (power)"), std::string::npos) << md;
  EXPECT_NE(md.find("Pooled over budgets"), std::string::npos) << md;
  const nlohmann::json j = summary_json(s);
  EXPECT_EQ(j["margin"], 0.1);
  EXPECT_EQ(j["cells"][1]["equivalence"]["method"], "tango-score");
  EXPECT_EQ(j["pooled"][0]["diff"]["n"], 4);
  EXPECT_THROW(summarize(st, recs, 0.0), Error);
}

}  // namespace
}  // namespace kvevict
