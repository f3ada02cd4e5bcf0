// Bad input to `kvevict eval`, `merge`, `probe` and `perplexity --budgets`: one line on stderr
// starting "kvevict: error: ", exit code 2, and nothing already on disk changed. Expected
// messages are the CLI's contract (file:line for malformed JSON, missing fields, B <= r,
// unknown policies, an output directory holding another configuration).
#include <gtest/gtest.h>

#include "eval/results.h"
#include "eval_cli_helpers.h"
#include "util/memory.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

void expect_one_line_error(const test::RunResult& r, const std::string& must_contain, const std::string& what) {
  EXPECT_EQ(r.code, 2) << what << "\n" << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << what << "\n" << r.err;
  EXPECT_EQ(r.err.rfind("kvevict: error: ", 0), 0u) << what << "\n" << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << what << "\n" << r.err;
}

class EvalCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(test::stories260k())) KVEVICT_SKIP_UNLESS_CI("stories260K not found under " << test::shared_dir());
    root_ = test::fresh_dir("eval_cli");
    tasks_ = root_ + "/tasks.jsonl";
    std::ofstream(tasks_) << "{\"id\": \"t1\", \"problem\": \"Once upon a time\", \"answer\": \"x\"}\n"
                             "{\"id\": \"t2\", \"problem\": \"The cat\", \"answer\": \"y\"}\n";
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }
  std::vector<std::string> args(const std::string& tasks, const std::string& out, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"eval",
                                  "-m",
                                  test::stories260k(),
                                  "--tasks",
                                  tasks,
                                  "--rollouts",
                                  "1",
                                  "--max-new-tokens",
                                  "8",
                                  "--no-plots",
                                  "-t",
                                  "1",
                                  "-o",
                                  out};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  test::RunResult run(const std::vector<std::string>& a) { return test::run_kvevict(a, root_, "run"); }
  std::string root_, tasks_;
};

TEST_F(EvalCli, MalformedLineStopsWithFileAndLineOrIsSkipped) {
  const std::string bad = root_ + "/bad.jsonl";
  std::ofstream(bad) << "{\"id\": \"t1\", \"problem\": \"Once\", \"answer\": \"x\"}\n{\"id\": \"t2\", \"problem\": \n";
  expect_one_line_error(run(args(bad, root_ + "/o1", {"--policies", "full"})), bad + ":2: not valid JSON", "stop");
  EXPECT_FALSE(fs::exists(root_ + "/o1")) << "a refused run must not create its output directory";
  const test::RunResult skip = run(args(bad, root_ + "/o2", {"--policies", "full", "--bad-lines", "skip"}));
  EXPECT_EQ(skip.code, 0) << skip.err;
  EXPECT_NE(skip.err.find(bad + ":2:"), std::string::npos) << skip.err;
  EXPECT_EQ(test::complete_lines(root_ + "/o2/rollouts.jsonl").size(), 1u);
}

TEST_F(EvalCli, OptionErrors) {
  const std::string missing = root_ + "/missing.jsonl";
  std::ofstream(missing) << "{\"id\": \"t1\", \"problem\": \"Once\"}\n";
  const std::string out = root_ + "/never";
  const struct {
    std::vector<std::string> args;
    std::string must_contain;
  } cases[] = {
      {args(missing, out, {"--policies", "full"}), missing + ":1: missing field 'answer'"},
      {args(tasks_, out, {"--policies", "full,random", "--budgets", "64"}), "greater than the recent buffer"},
      {args(tasks_, out, {"--policies", "full,random", "--budgets", "32", "--buffer", "32"}),
       "greater than the recent buffer"},
      {args(tasks_, out, {"--policies", "full,nope", "--budgets", "128"}), "unknown policy 'nope'"},
      {args(tasks_, out, {"--policies", "full,random", "--budgets", "128,x"}), "--budgets 128,x: 'x' must be an integer >= 1"},
      {args(tasks_, out, {"--policies", "random", "--budgets", "128"}), "--reference 'full' is not among"},
      {args(tasks_, out, {"--policies", "full", "--shard", "2/2"}), "--shard 2/2: must be i/N"},
      {args(tasks_, out, {"--policies", "full", "--max-length", "1"}), "--max-length 1: must be in [2,"},
      {args(tasks_, out, {"--policies", "full", "--margin", "5"}), "--margin 5: must be an accuracy difference in (0, 1)"},
      {args(tasks_, out, {"--policies", "full", "--margin", "0"}), "--margin 0: must be"},
      {{"merge", root_ + "/nonexistent-dir", "-o", out, "--margin", "-0.1"}, "--margin -0.1: must be"},
      {args(root_ + "/nonexistent.jsonl", out, {"--policies", "full"}), "nonexistent.jsonl"},
      {{"merge", root_ + "/nonexistent-dir", "-o", out}, "nonexistent-dir"},
      {{"probe", "-m", test::stories260k(), "--kinds", "planted,nope", "--budgets", "128"}, "unknown probe 'nope'"},
      {{"probe", "-m", test::stories260k(), "--kinds", "planted", "--budgets", "64"}, "greater than the recent buffer"},
      {{"probe", "-m", test::stories260k(), "--kinds", "planted", "--budgets", "128", "--sites", "9:0"},
       "9:0 is outside"},
      {{"perplexity", "-m", test::stories260k(), "-f", tasks_, "--policies", "random", "--budgets", "64"},
       "greater than the recent buffer"},
      {{"perplexity", "-m", test::stories260k(), "-f", tasks_, "--budgets", "128", "--budget", "128"}, "not both"},
  };
  for (const auto& c : cases) expect_one_line_error(run(c.args), c.must_contain, c.args[0] + " ... " + c.must_contain);
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(EvalCli, OutputDirectoryOfAnotherConfigurationIsRefusedUntouched) {
  const std::string out = root_ + "/out";
  const test::RunResult first = run(args(tasks_, out, {"--policies", "full,random", "--budgets", "128"}));
  ASSERT_EQ(first.code, 0) << first.err;
  const std::string rollouts = test::slurp(out + "/rollouts.jsonl"), config = test::slurp(out + "/config.json");
  ASSERT_EQ(count_lines(rollouts), 4);
  const struct {
    std::vector<std::string> args;
    std::string must_contain;
  } cases[] = {
      {args(tasks_, out, {"--policies", "full,random", "--budgets", "160"}),
       "/cells/1/budget: 128 (there) vs 160 (here)"},
      {args(tasks_, out, {"--policies", "full,random", "--budgets", "128", "--seed", "5"}), "/seed"},
      {args(tasks_, out, {"--policies", "full,random", "--budgets", "128", "--temp", "0"}), "/sampler/temperature"},
      {args(tasks_, out, {"--policies", "full,random", "--budgets", "128", "--no-resume"}), "--no-resume"},
  };
  for (const auto& c : cases) {
    expect_one_line_error(run(c.args), c.must_contain, c.must_contain);
    EXPECT_EQ(test::slurp(out + "/rollouts.jsonl"), rollouts);
    EXPECT_EQ(test::slurp(out + "/config.json"), config);
  }
  // A changed task file is another configuration too.
  std::ofstream(tasks_, std::ios::app) << "{\"id\": \"t3\", \"problem\": \"A dog\", \"answer\": \"z\"}\n";
  expect_one_line_error(run(args(tasks_, out, {"--policies", "full,random", "--budgets", "128"})), "/tasks/", "tasks");
  EXPECT_EQ(test::slurp(out + "/rollouts.jsonl"), rollouts);
}

TEST_F(EvalCli, AFolderWithoutRolloutsIsTakenOverByAnotherConfiguration) {
  // A run refused before its first rollout leaves config.json and an empty rollouts.jsonl; a
  // retry with other settings must not be refused as "mixing runs". The refusal here is the
  // memory check of the whole batch of rollouts (generate_batch): an evicting sequence holds
  // max(B, prompt) + s slots (required_capacity), 1.36 GB at B = 10^6 for stories260K, times
  // 1,024 rollouts, checked before any cache is allocated.
  if (available_memory_bytes() == 0) GTEST_SKIP() << "no MemAvailable here: the memory check that refuses is off";
  const std::string out = root_ + "/out";
  // random's cell first: the grid runs cells in --policies order, and full's would fit.
  std::vector<std::string> big = args(tasks_, out, {"--policies", "random,full", "--budgets", "1000000"});
  *std::find(big.begin(), big.end(), "--rollouts").operator++() = "1024";
  const test::RunResult refused = run(big);
  ASSERT_EQ(refused.code, 2) << refused.err;
  EXPECT_NE(refused.err.find("KV caches of 1024 sequences decoded as one batch"), std::string::npos) << refused.err;
  ASSERT_TRUE(fs::exists(out + "/config.json"));
  ASSERT_TRUE(test::slurp(out + "/rollouts.jsonl").empty());
  const test::RunResult retry = run(args(tasks_, out, {"--policies", "full,random", "--budgets", "128"}));
  ASSERT_EQ(retry.code, 0) << retry.err;
  EXPECT_EQ(count_lines(test::slurp(out + "/rollouts.jsonl")), 4);
  EXPECT_NE(test::slurp(out + "/config.json").find("\"budget\": 128"), std::string::npos);

  // A torn first line (a run killed while writing its first rollout) is no rollout either.
  const std::string torn = root_ + "/torn";
  ASSERT_EQ(run(args(tasks_, torn, {"--policies", "full,random", "--budgets", "160"})).code, 0);
  std::ofstream(torn + "/rollouts.jsonl", std::ios::trunc) << "{\"budget\":16";
  const test::RunResult over = run(args(tasks_, torn, {"--policies", "full,random", "--budgets", "128"}));
  ASSERT_EQ(over.code, 0) << over.err;
  EXPECT_EQ(count_lines(test::slurp(torn + "/rollouts.jsonl")), 4);
}

TEST_F(EvalCli, AFolderLockedByAnotherRunIsRefusedUntouched) {
  // A run holds its folder's lock from before config.json is written to its end, so a second run
  // neither appends beside it nor takes over a folder whose first rollout is still running.
  const std::string out = root_ + "/out";
  const test::RunResult first = run(args(tasks_, out, {"--policies", "full,random", "--budgets", "128"}));
  ASSERT_EQ(first.code, 0) << first.err;
  const std::string rollouts = test::slurp(out + "/rollouts.jsonl"), config = test::slurp(out + "/config.json");
  ASSERT_EQ(run(args(tasks_, root_ + "/other", {"--policies", "full,random", "--budgets", "128"})).code, 0);
  {
    const DirLock held = DirLock::acquire(out);  // this process plays the running one
    for (const auto& budgets : {"128", "160"})
      expect_one_line_error(run(args(tasks_, out, {"--policies", "full,random", "--budgets", budgets})),
                            "is in use by another kvevict run", budgets);
    std::vector<std::string> merge = {"merge", root_ + "/other", "-o", out};
    expect_one_line_error(run(merge), "is in use by another kvevict run", "merge");
    EXPECT_EQ(test::slurp(out + "/rollouts.jsonl"), rollouts);
    EXPECT_EQ(test::slurp(out + "/config.json"), config);
  }
  const test::RunResult resumed = run(args(tasks_, out, {"--policies", "full,random", "--budgets", "128"}));
  EXPECT_EQ(resumed.code, 0) << "the lock is released with its holder: " << resumed.err;
}

TEST_F(EvalCli, MarginReachesTheSummaryAndOnlyTheSummary) {
  // --margin changes the TOST of summary.json, not the rollouts: the same folder resumes with
  // another margin and re-summarizes; kvevict merge takes it too.
  const std::string out = root_ + "/out";
  ASSERT_EQ(run(args(tasks_, out, {"--policies", "full,random", "--budgets", "128"})).code, 0);
  const std::string rollouts = test::slurp(out + "/rollouts.jsonl");
  EXPECT_EQ(nlohmann::json::parse(test::slurp(out + "/summary.json"))["margin"].get<double>(), 0.05);
  const test::RunResult again = run(args(tasks_, out, {"--policies", "full,random", "--budgets", "128", "--margin", "0.1"}));
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(test::slurp(out + "/rollouts.jsonl"), rollouts);
  EXPECT_EQ(nlohmann::json::parse(test::slurp(out + "/summary.json"))["margin"].get<double>(), 0.1);
  const std::string merged = root_ + "/merged";
  const test::RunResult m = run({"merge", out, "-o", merged, "--no-plots", "--margin", "0.2"});
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_EQ(nlohmann::json::parse(test::slurp(merged + "/summary.json"))["margin"].get<double>(), 0.2);
}

TEST_F(EvalCli, RetrainedModelOfTheSameNameAndSizeIsAnotherConfiguration) {
  // A retrained checkpoint keeps its file name and size; resuming would mix its rollouts with the
  // old model's. Changing one weight byte (the last byte of the file, inside the tensor data) must
  // be caught by the model digest, with nothing on disk changed.
  const std::string model = root_ + "/model.gguf", out = root_ + "/out";
  fs::copy_file(test::stories260k(), model);
  std::vector<std::string> a = args(tasks_, out, {"--policies", "full"});
  a[2] = model;
  const test::RunResult first = run(a);
  ASSERT_EQ(first.code, 0) << first.err;
  const std::string rollouts = test::slurp(out + "/rollouts.jsonl"), config = test::slurp(out + "/config.json");
  EXPECT_EQ(run(a).code, 0) << "the same file resumes";
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char c = static_cast<char>(f.get() ^ 0x01);
    f.seekp(-1, std::ios::end);
    f.put(c);
  }
  expect_one_line_error(run(a), "/model/digest", "changed weights");
  EXPECT_EQ(test::slurp(out + "/rollouts.jsonl"), rollouts);
  EXPECT_EQ(test::slurp(out + "/config.json"), config);
  // A folder written before the digest existed is not resumed, and the message says why.
  nlohmann::json old = nlohmann::json::parse(config);
  old["model"].erase("digest");
  std::ofstream(out + "/config.json") << old.dump(2) << "\n";
  const std::string old_config = test::slurp(out + "/config.json");
  expect_one_line_error(run(a), "did not record the model's digest", "folder of an older kvevict");
  EXPECT_EQ(test::slurp(out + "/config.json"), old_config);
  EXPECT_EQ(test::slurp(out + "/rollouts.jsonl"), rollouts);
}

}  // namespace
}  // namespace kvevict
