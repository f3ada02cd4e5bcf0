// The CLI as one vocabulary: upper limits on count options, "did you mean" for mistyped options,
// policies and commands, old spellings kept as aliases, `--param [POLICY:]NAME=VALUE`, eval's
// defaults running and refusing another model's statistics before its output directory exists,
// generate's summary on stderr, progress lines in a batch log. Expected values are the CLI
// contract (one line "kvevict: error: ...", exit 2) and the limits documented in cli/common.h.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "eval_cli_helpers.h"
#include "test_paths.h"
#include "util/suggest.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

class CliVocab : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(test::stories260k())) KVEVICT_SKIP_UNLESS_CI("stories260K not found under " << test::shared_dir());
    root_ = test::fresh_dir("cli_vocab");
    tasks_ = root_ + "/tasks.jsonl";
    std::ofstream(tasks_) << "{\"id\": \"t1\", \"problem\": \"Once upon a time\", \"answer\": \"x\"}\n"
                             "{\"id\": \"t2\", \"problem\": \"The cat\", \"answer\": \"y\"}\n";
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }
  test::RunResult run(const std::vector<std::string>& a) { return test::run_kvevict(a, root_, "run"); }
  void expect_error(const std::vector<std::string>& a, const std::string& must_contain) {
    const test::RunResult r = run(a);
    std::string cmd;
    for (const auto& x : a) cmd += x + " ";
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << cmd << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("kvevict: error: ", 0), 0u) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find(must_contain), std::string::npos) << cmd << "\n" << r.err;
  }
  std::string root_, tasks_;
};

// Reproducer: `generate -t 100000` ran for a minute at 2 GB. Now refused before the model loads;
// `-n 1` keeps an unfixed binary from running long (it would exit 0 and fail the test).
TEST_F(CliVocab, ThreadsAboveFourPerCoreAreRefused) {
  const int cap = 4 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  expect_error({"generate", "-m", test::stories260k(), "-p", "hi", "-n", "1", "-t", "100000"}, "--force-threads");
  expect_error({"generate", "-m", test::stories260k(), "-p", "hi", "-n", "1", "-t", std::to_string(cap + 1)},
               "error: --threads " + std::to_string(cap + 1) + ": must be <= " + std::to_string(cap) + " = 4 x ");
  // At the cap it runs; above it with the override it runs too.
  EXPECT_EQ(run({"generate", "-m", test::stories260k(), "-p", "hi", "-n", "1", "-t", std::to_string(cap)}).code, 0);
  EXPECT_EQ(run({"generate", "-m", test::stories260k(), "-p", "hi", "-n", "1", "-t", std::to_string(cap + 1),
                 "--force-threads"})
                .code,
            0);
}

// Reproducer: `eval --rollouts 100000000` never finished a rollout. Refused while parsing, and no
// output directory is created.
TEST_F(CliVocab, CountOptionsHaveUpperLimits) {
  const std::string out = root_ + "/never";
  const std::vector<std::string> base = {"eval", "-m", test::stories260k(), "-f", tasks_, "--no-plots", "-o", out};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  // One wording for every range error, CLI11's checks and ours: "OPTION VALUE: must be ...".
  expect_error(with({"--rollouts", "100000000"}), "error: --rollouts 100000000: must be in [1, 1024]\n");
  expect_error(with({"--budgets", "128,2000000"}), "error: --budgets 128,2000000: 2000000 must be <= 1048576\n");
  expect_error(with({"--budget", "2000000"}), "error: --budget 2000000: must be in [1, 1048576]\n");
  expect_error(with({"--budget", "0"}), "error: --budget 0: must be in [1, 1048576]\n");
  expect_error(with({"--budget", "x"}), "error: --budget x: must be an integer in [1, 1048576]\n");
  expect_error(with({"--temp", "x"}), "error: --temp x: must be a number\n");
  expect_error(with({"-n", "2000000"}), "[0, 1048576]");
  expect_error(with({"--max-length", "2000000"}), "[2, 1048576]");
  expect_error(with({"--bootstrap", "2000000"}), "[100, 1000000]");
  expect_error(with({"--shard", "0/1000000"}), "N <= 100000");
  EXPECT_FALSE(fs::exists(out));
  expect_error({"generate", "-m", test::stories260k(), "-p", "hi", "-n", "2000000"}, "[1, 1048576]");
  expect_error({"perplexity", "-m", test::stories260k(), "-f", tasks_, "-c", "2000000"}, "[0, 1048576]");
  expect_error({"probe", "-m", test::stories260k(), "--trials", "1000000"}, "[1, 100000]");
  expect_error({"tasks", "gen", "--count", "100000000", "--length", "100"}, "[1, 10000000]");
}

TEST_F(CliVocab, DidYouMean) {
  expect_error({"generate", "-m", test::stories260k(), "-p", "hi", "--bugdet", "128"}, "did you mean --budget?");
  expect_error({"generate", "-m", test::stories260k(), "-p", "hi", "--policy", "randon", "--budget", "128"},
               "did you mean 'random'?");
  expect_error({"eval", "-m", test::stories260k(), "-f", tasks_, "--policies", "full,snapkv+promt"},
               "did you mean 'snapkv+prompt'?");
  expect_error({"generat"}, "did you mean 'generate'?");
  expect_error({"generate", "-m", test::stories260k(), "-p", "hi", "--budget", "128", "--param", "triattenton:stats=x"},
               "did you mean 'triattention'?");
}

TEST_F(CliVocab, NoCommandPointsToHelp) {
  const test::RunResult r = run({});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("kvevict --help"), std::string::npos) << r.err;
}

// Old spellings stay as aliases of the llama.cpp-style names (`--tasks` = `-f`, `--out` = `-o`,
// `--max-new-tokens` = `-n`, `calibrate --ctx` = `-c`, `tasks --n` = `--count`, `-j` = `-t`).
TEST_F(CliVocab, OldSpellingsAreAliases) {
  const test::RunResult a =
      run({"eval", "-m", test::stories260k(), "--tasks", tasks_, "--policies", "full", "--max-new-tokens", "2",
           "--rollouts", "1", "--no-plots", "-t", "1", "--out", root_ + "/a"});
  EXPECT_EQ(a.code, 0) << a.err;
  const test::RunResult b = run({"eval", "-m", test::stories260k(), "-f", tasks_, "--policies", "full", "-n", "2",
                                 "--rollouts", "1", "--no-plots", "-t", "1", "-o", root_ + "/b"});
  EXPECT_EQ(b.code, 0) << b.err;
  // Same configuration: the config files are equal (the alias means the same option).
  EXPECT_EQ(test::slurp(root_ + "/a/config.json"), test::slurp(root_ + "/b/config.json"));
  const test::RunResult g1 = run({"tasks", "gen", "--family", "chain", "--n", "2", "--seed", "3", "--length", "60"});
  const test::RunResult g2 =
      run({"tasks", "gen", "--family", "chain", "--count", "2", "--seed", "3", "--length", "60"});
  EXPECT_EQ(g1.code, 0) << g1.err;
  EXPECT_EQ(count_lines(g1.out), 2);
  EXPECT_EQ(g1.out, g2.out);
}

// `--param` has one syntax everywhere: [POLICY:]NAME=VALUE.
TEST_F(CliVocab, ParamSyntax) {
  // A prefixed parameter for a policy that does not run is an error, not silently ignored.
  expect_error(
      {"generate", "-m", test::stories260k(), "-p", "hi", "--budget", "128", "--param", "triattention:stats=x"},
      "no policy of this run takes it");
  // Unprefixed, for a policy that takes no parameters.
  expect_error({"generate", "-m", test::stories260k(), "-p", "hi", "--budget", "128", "--param", "window=3"},
               "window=3");
  // Prefixed for the policy that runs: the value is used (its file is opened).
  expect_error({"generate", "-m", test::stories260k(), "-p", "hi", "--policy", "triattention", "--budget", "128",
                "--param", "triattention:stats=" + root_ + "/missing.json"},
               "missing.json");
}

// Eval with no --policies/--budgets runs (full + random at the default budget 256).
TEST_F(CliVocab, EvalDefaultsRun) {
  const std::string out = root_ + "/defaults";
  const test::RunResult r = run({"eval", "-m", test::stories260k(), "-f", tasks_, "--rollouts", "1", "-n", "2",
                                 "--no-plots", "-t", "1", "-o", out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| random | 256 |"), std::string::npos) << r.out;
  EXPECT_EQ(test::complete_lines(out + "/rollouts.jsonl").size(), 4u);  // 2 problems x (full, random@256)
}

// TriAttention statistics of another model (the shipped reasoner: 2 layers) are refused before
// the first rollout, and the output directory is never created.
TEST_F(CliVocab, EvalRefusesAnotherModelsStatisticsBeforeWriting) {
  const std::string reasoner = kvevict::test::reasoner_model();
  const std::string stats = root_ + "/reasoner.stats.json";
  const test::RunResult c =
      run({"calibrate", "-m", reasoner, "-f", test::shared_path("data/tinystories/tinystories_sample.txt"), "-o", stats,
           "--tokens", "256", "-c", "128", "-t", "1"});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string out = root_ + "/o";
  expect_error({"eval", "-m", test::stories260k(), "-f", tasks_, "--policies", "full,triattention", "--param",
                "stats=" + stats, "--rollouts", "1", "-n", "2", "--no-plots", "-o", out},
               "do not fit this model");
  EXPECT_FALSE(fs::exists(out)) << "a refused run must not create its output directory";
}

TEST_F(CliVocab, GenerateSummaryGoesToStderr) {
  const test::RunResult r =
      run({"generate", "-m", test::stories260k(), "-p", "Once upon a time", "-n", "8", "--temp", "0"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("[kvevict]"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("[kvevict] policy full | prompt"), std::string::npos) << r.err;
}

// Reproducer: `--policy full --budget 128` ran silently as if the budget applied. Now one warning
// line names what is unused; none when nothing is, or when another policy of the run evicts.
TEST_F(CliVocab, FullWarnsThatScheduleOptionsAreUnused) {
  const std::vector<std::string> gen = {"generate", "-m", test::stories260k(), "-p", "hi", "-n", "1", "--policy", "full"};
  auto with = [&](std::vector<std::string> base, std::vector<std::string> extra) {
    base.insert(base.end(), extra.begin(), extra.end());
    return run(base);
  };
  auto warnings = [](const std::string& err) {
    std::vector<std::string> w;
    for (size_t at = 0; (at = err.find("kvevict: warning: ", at)) != std::string::npos; ++at)
      w.push_back(err.substr(at, err.find('\n', at) - at));
    return w;
  };
  test::RunResult r = with(gen, {"--budget", "128"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(warnings(r.err),
            std::vector<std::string>{"kvevict: warning: policy 'full' keeps every token: --budget 128 is unused"})
      << r.err;
  r = with(gen, {"--budget", "128", "--buffer", "16", "--round-interval", "32", "--sinks", "4"});
  EXPECT_EQ(warnings(r.err), std::vector<std::string>{"kvevict: warning: policy 'full' keeps every token: --budget "
                                                      "128, --buffer 16, --round-interval 32, --sinks 4 are unused"})
      << r.err;
  // Given explicitly, even at its default value.
  r = with(gen, {"--buffer", "64"});
  EXPECT_EQ(warnings(r.err).size(), 1u) << r.err;
  r = with(gen, {});
  EXPECT_TRUE(warnings(r.err).empty()) << r.err;
  // A grid: warned only when no policy of it evicts.
  const std::vector<std::string> ppl = {"perplexity", "-m", test::stories260k(), "-f", tasks_, "--tokens", "8"};
  r = with(ppl, {"--policies", "full", "--budget", "64"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(warnings(r.err),
            std::vector<std::string>{"kvevict: warning: policy 'full' keeps every token: --budget 64 is unused"})
      << r.err;
  // A prompt pin on a policy that keeps every token would change nothing: refused (the builder).
  r = with(ppl, {"--policies", "full,full+prompt", "--budget", "64"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("policy 'full+prompt': +prompt pins the prompt against eviction, but 'full' keeps every token"),
            std::string::npos)
      << r.err;
  r = with(ppl, {"--policies", "full,random", "--budget", "64", "--buffer", "16"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(warnings(r.err).empty()) << r.err;
}

// Not a terminal: plain progress lines (KVEVICT_PROGRESS_SECONDS=0 prints one per rollout).
TEST_F(CliVocab, ProgressLinesWithoutTerminal) {
  setenv("KVEVICT_PROGRESS_SECONDS", "0", 1);
  const test::RunResult r = run({"eval", "-m", test::stories260k(), "-f", tasks_, "--policies", "full", "--rollouts",
                                 "1", "-n", "2", "--no-plots", "-t", "1", "-o", root_ + "/p"});
  unsetenv("KVEVICT_PROGRESS_SECONDS");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("eval: 1/2 rollouts (50.0%)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("eval: 2/2 rollouts (100.0%)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "no bar redraws in a log";
}

// Reference values: the textbook Levenshtein examples (kitten/sitting = 3, flaw/lawn = 2).
TEST(Suggest, EditDistanceAndClosest) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("flaw", "lawn"), 2u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(closest_match("randon", {"full", "random", "recency"}), "random");
  EXPECT_EQ(closest_match("xyz", {"full", "random"}), "");
}

}  // namespace
}  // namespace kvevict
