// The kvevict binary as a user runs it: bad input gives one line on stderr and exit code 2;
// the main commands print their summaries. Expected values come from the CLI contract
// and from the spec's peak-cache rule (B + r).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <regex>
#include <string>

#include "cli_run.h"
#include "test_paths.h"

namespace kvevict {
namespace {

using test::CliResult;
CliResult run(const std::string& args) { return test::run_cli(args); }

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

std::string model() { return test::stories260k(); }

TEST(Cli, ErrorsAreOneLineWithExitCode2) {
  const struct {
    std::string args, must_contain;
  } cases[] = {
      {"generate -m " + model() + " -p hi --budget 64", "greater than the recent buffer"},
      {"generate -m " + model() + " -p hi --budget 100 --buffer 100", "greater than the recent buffer"},
      {"generate -m /nonexistent.gguf -p hi", "/nonexistent.gguf"},
      {"generate -m " + model() + " -p hi --policy nope --budget 128", "unknown policy 'nope'"},
      {"generate -m " + model() + " -p hi --bogus", "--bogus"},
      {"generate -m " + model() + " -p hi --policy random", "needs --budget"},
      {"generate -m " + model() + " -p hi --budget 128 --sinks 64", "--sinks 64"},
      {"generate -m " + model() + " -p hi --budget 128 --round-interval 0", "--round-interval 0"},
      {"generate -m " + model() + " -p hi --top-p 1.5", "--top-p"},
      // Was run from BOS alone while the server refuses an empty prompt.
      {"generate -m " + model() + " -p '' -n 1", "-p \"\": the prompt must not be empty"},
      {"generate -m " + model() + " -p hi --budget 128 --param window=3", "window"},
      {"perplexity -m " + model() + " -f /nonexistent.txt", "/nonexistent.txt"},
      {"perplexity -m " + model() + " -f " + test::shared_path("data/tinystories/tinystories_sample.txt") +
           " --policies random,,full --budget 128",
       "empty list entry"},
      {"perplexity -m " + test::shared_path("data/tinystories/tinystories_sample.txt") + " -f " +
           test::shared_path("data/tinystories/tinystories_sample.txt"),
       "GGUF"},
      {"frobnicate", "frobnicate"},
  };
  for (const auto& c : cases) {
    const CliResult r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_EQ(lines(r.out), 1) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.must_contain), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("kvevict: error: ", 0), 0u) << r.out;
  }
}

TEST(Cli, GenerateSummaryRespectsPeak) {
  // Spec §2.3: peak cache = B + r. 300 tokens at B = 128 and r = 64 force rounds.
  const CliResult r = run("generate -m " + model() +
                          " -p 'Once upon a time' -n 300 --ignore-eos --policy random --budget 128 --seed 3");
  ASSERT_EQ(r.code, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.out, m,
      std::regex(R"(generated (\d+) tok .* eviction rounds (\d+) \| peak slots/KV head (\d+) \(B\+r = 192\))")))
      << r.out;
  EXPECT_EQ(std::stoi(m[1]), 300);
  EXPECT_EQ(std::stoi(m[2]), (5 + 299 - 192) / 64 + 1);  // prompt 5 tokens + 299 decode steps
  EXPECT_EQ(std::stoi(m[3]), 192);
  // --round-interval 16 (spec §2.3): rounds every 16 decode steps, peak B + s = 144.
  const CliResult s = run("generate -m " + model() +
                          " -p 'Once upon a time' -n 300 --ignore-eos --policy random --budget 128 --seed 3 "
                          "--round-interval 16");
  ASSERT_EQ(s.code, 0) << s.out;
  ASSERT_TRUE(std::regex_search(
      s.out, m,
      std::regex(R"(generated (\d+) tok .* eviction rounds (\d+) \| peak slots/KV head (\d+) \(B\+s = 144\))")))
      << s.out;
  EXPECT_EQ(std::stoi(m[2]), (5 + 299 - 144) / 16 + 1);
  EXPECT_EQ(std::stoi(m[3]), 144);
}

TEST(Cli, ChunkedPerplexityPrintsLlamaCppFormat) {
  const CliResult r =
      run("perplexity -m " + model() + " -f " + test::shared_path("data/tinystories/tinystories_sample.txt") +
          " -c 64 --chunks 3 --policy full");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\[1\][0-9.]+,\[2\][0-9.]+,\[3\][0-9.]+,)"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(Final estimate: PPL = [0-9.]+ \+/- [0-9.]+)"))) << r.out;
}

}  // namespace
}  // namespace kvevict
