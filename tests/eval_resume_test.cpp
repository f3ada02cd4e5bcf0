// Kill-and-resume and shard+merge of `kvevict eval`, run as a child process on stories260K and
// the first MATH-500 problems. Expected values come from a second, uninterrupted run of the same
// command: rollouts are seeded per (problem, cell, rollout), so every field but wall-clock
// timings must match exactly, and so must the summary (bootstrap streams are seeded too).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "eval_cli_helpers.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;

bool have_inputs() {
  return fs::exists(test::stories260k()) && fs::exists(test::shared_path("data/math500/test.jsonl"));
}

// 4 problems x (full + random@96) x 2 rollouts = 16 rollouts of <= 40 tokens: ~1 s on 2 cores.
std::vector<std::string> eval_args(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"eval",
                                "-m",
                                test::stories260k(),
                                "--tasks",
                                test::shared_path("data/math500/test.jsonl"),
                                "--limit",
                                "4",
                                "--policies",
                                "full,random",
                                "--budgets",
                                "96",
                                "--buffer",
                                "32",
                                "--rollouts",
                                "2",
                                "--max-new-tokens",
                                "40",
                                "--seed",
                                "11",
                                "--bootstrap",
                                "500",
                                "--no-plots",
                                "-t",
                                "2",
                                "-o",
                                out};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}
constexpr size_t kTotal = 16;

TEST(EvalResume, KillMidwayThenResumeRecomputesNothing) {
  if (!have_inputs()) KVEVICT_SKIP_UNLESS_CI("stories260K or MATH-500 not found under " << test::shared_dir());
  const std::string root = test::fresh_dir("eval_resume");
  const std::string killed = root + "/killed", clean = root + "/clean";
  const std::string rollouts = killed + "/rollouts.jsonl";

  // 1. Start a slowed-down run and kill it (SIGKILL: no chance to clean up) after 5 rollouts.
  const test::Child child = test::spawn_kvevict(eval_args(killed, {"--debug-delay-ms", "150"}), root, "killed");
  ASSERT_GT(child.pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (test::complete_lines(rollouts).size() < 5 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(child.pid, SIGKILL);
  EXPECT_EQ(test::wait_child(child), -1) << "the run finished before it could be killed";
  const std::vector<std::string> before = test::complete_lines(rollouts);
  ASSERT_GE(before.size(), 5u);
  ASSERT_LT(before.size(), kTotal);
  // Simulate a write cut short by the kill: a partial record without its newline.
  { std::ofstream(rollouts, std::ios::app | std::ios::binary) << "{\"policy\":\"full\",\"bud"; }

  // 2. Resume: the torn line is dropped, finished rollouts are kept byte for byte, the rest run.
  const test::RunResult resumed = test::run_kvevict(eval_args(killed), root, "resumed");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("incomplete last line"), std::string::npos) << resumed.err;
  EXPECT_NE(resumed.err.find("; " + std::to_string(before.size()) + " already in"), std::string::npos) << resumed.err;
  const std::vector<std::string> after = test::complete_lines(rollouts);
  ASSERT_EQ(after.size(), kTotal);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], before[i]) << "line " << i + 1 << " was rewritten";
  std::set<std::string> keys;
  for (const auto& [k, v] : test::rollouts_without_timing(killed)) keys.insert(k);
  EXPECT_EQ(keys.size(), kTotal) << "a rollout was computed twice";

  // 3. A third invocation has nothing left to do and leaves the file alone.
  const test::RunResult again = test::run_kvevict(eval_args(killed), root, "again");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find(", 0 to run"), std::string::npos) << again.err;
  EXPECT_EQ(test::complete_lines(rollouts), after);

  // 4. Same results as an uninterrupted run.
  const test::RunResult ref = test::run_kvevict(eval_args(clean), root, "clean");
  ASSERT_EQ(ref.code, 0) << ref.err;
  EXPECT_EQ(test::rollouts_without_timing(killed), test::rollouts_without_timing(clean));
  EXPECT_EQ(test::summary_cells_without_timing(killed), test::summary_cells_without_timing(clean));
  fs::remove_all(root);
}

TEST(EvalResume, ShardsMergeToTheUnshardedRun) {
  if (!have_inputs()) KVEVICT_SKIP_UNLESS_CI("stories260K or MATH-500 not found under " << test::shared_dir());
  const std::string root = test::fresh_dir("eval_shards");
  const std::string whole = root + "/whole", s0 = root + "/s0", s1 = root + "/s1", merged = root + "/merged";
  ASSERT_EQ(test::run_kvevict(eval_args(whole), root, "whole").code, 0);
  const test::RunResult r0 = test::run_kvevict(eval_args(s0, {"--shard", "0/2"}), root, "s0");
  const test::RunResult r1 = test::run_kvevict(eval_args(s1, {"--shard", "1/2"}), root, "s1");
  ASSERT_EQ(r0.code, 0) << r0.err;
  ASSERT_EQ(r1.code, 0) << r1.err;
  // Problems 0 and 2 in shard 0, 1 and 3 in shard 1: 8 rollouts each.
  EXPECT_EQ(test::complete_lines(s0 + "/rollouts.jsonl").size(), kTotal / 2);
  EXPECT_EQ(test::complete_lines(s1 + "/rollouts.jsonl").size(), kTotal / 2);
  const test::RunResult m = test::run_kvevict({"merge", s1, s0, "-o", merged, "--no-plots"}, root, "merge");
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_EQ(test::rollouts_without_timing(merged), test::rollouts_without_timing(whole));
  EXPECT_EQ(test::summary_cells_without_timing(merged), test::summary_cells_without_timing(whole));
  // The merged directory is a complete run of the unsharded configuration: resuming it runs nothing.
  const test::RunResult resumed = test::run_kvevict(eval_args(merged), root, "resume-merged");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find(", 0 to run"), std::string::npos) << resumed.err;
  // Merging a shard twice, or shards of different runs, is refused.
  const test::RunResult twice = test::run_kvevict({"merge", s0, s0, "-o", root + "/m2", "--no-plots"}, root, "twice");
  EXPECT_EQ(twice.code, 2);
  EXPECT_NE(twice.err.find("given twice"), std::string::npos) << twice.err;
  fs::remove_all(root);
}

// The math suffix defaults to on for MATH-500 (the paper's prompt) unless --no-math-suffix.
// Expected: config.json's math_suffix, and the same prompt length as with --math-suffix, longer
// than with --no-math-suffix (a regression: the default once came out off).
TEST(EvalPrompt, MathSuffixDefaultsOnForMath500) {
  if (!have_inputs()) KVEVICT_SKIP_UNLESS_CI("stories260K or MATH-500 missing under " << test::shared_dir());
  const auto run = [](const std::string& tag, std::vector<std::string> extra) {
    const std::string out = test::fresh_dir("suffix_" + tag);
    std::vector<std::string> a = {"eval",
                                  "-m",
                                  test::stories260k(),
                                  "--tasks",
                                  test::shared_path("data/math500/test.jsonl"),
                                  "--limit",
                                  "1",
                                  "--policies",
                                  "full",
                                  "--rollouts",
                                  "1",
                                  "--max-new-tokens",
                                  "2",
                                  "--no-plots",
                                  "-t",
                                  "1",
                                  "-o",
                                  out};
    a.insert(a.end(), extra.begin(), extra.end());
    EXPECT_EQ(test::run_kvevict(a, out, tag).code, 0);
    const auto cfg = nlohmann::json::parse(test::slurp(out + "/config.json"));
    const auto roll = nlohmann::json::parse(test::complete_lines(out + "/rollouts.jsonl").at(0));
    return std::make_pair(cfg.at("prompt").at("math_suffix").get<bool>(), roll.at("prompt_tokens").get<int64_t>());
  };
  const auto def = run("default", {}), on = run("on", {"--math-suffix"}), off = run("off", {"--no-math-suffix"});
  EXPECT_TRUE(def.first);
  EXPECT_TRUE(on.first);
  EXPECT_FALSE(off.first);
  EXPECT_EQ(def.second, on.second);
  EXPECT_GT(def.second, off.second);
}

}  // namespace
}  // namespace kvevict
