// eval's summary counts: how rollouts without a comparable answer are split into columns.
// Expected values: the grades written by the test.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/summary.h"

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
  EXPECT_NE(csv.find(",fact_lost_correct,answer_too_long\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",no_answer,hit_cap,"), std::string::npos) << csv;
  EXPECT_TRUE(csv.ends_with(",2\n")) << csv;
}

}  // namespace
}  // namespace kvevict
