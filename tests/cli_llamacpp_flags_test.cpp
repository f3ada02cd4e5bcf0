// The flags a llama.cpp user types, where kvevict's meaning is the same (llama.cpp's
// common/arg.cpp and tools/llama-bench are the source of each meaning): `-s SEED`, `--seed -1`
// (a random seed, printed), `-f FILE` (prompt from a file, one trailing newline dropped), `-c N`
// (context size: prompt + generated tokens stop there), `-n -1` (until the end of generation or
// the context); what kvevict does not have (`-ngl 99`) is named, not read as `-n gl`; bench's
// `-r` (recent buffer here, repetitions in llama-bench) warns when it looks like a repetition
// count; errors name the subcommand typed; perplexity without -c on a text longer than the
// context stops and suggests -c. Expected values: the CLI contract above, and token counts read
// from the summary line of the same run.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include "cli_run.h"
#include "test_paths.h"
#include "test_tmp.h"

namespace kvevict {
namespace {

std::string model() { return test::stories260k(); }

// stdout alone, stderr alone, and both (exit code of the run in each).
test::CliResult stdout_of(const std::string& args) {
  return test::run_shell(test::kvevict_binary() + " " + args + " 2>/dev/null");
}
test::CliResult stderr_of(const std::string& args) {
  return test::run_shell(test::kvevict_binary() + " " + args + " 2>&1 >/dev/null");
}
test::CliResult both(const std::string& args) { return test::run_cli(args); }

int64_t summary_count(const std::string& err, const std::string& what) {
  std::smatch m;
  if (!std::regex_search(err, m, std::regex(what + " (\\d+) tok"))) return -1;
  return std::stoll(m[1]);
}

void expect_one_line_error(const test::CliResult& r, const std::string& must_contain) {
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_EQ(r.out.rfind("kvevict: error: ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(must_contain), std::string::npos) << r.out;
}

class CliLlamaCppFlags : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(model())) KVEVICT_SKIP_UNLESS_CI("stories260K not found under " << test::shared_dir());
  }
  const std::string gen = "generate -t 1 -m " + model() + " ";
};

TEST_F(CliLlamaCppFlags, SeedShortFlagAndRandomSeed) {
  const std::string args = gen + "-p 'Once upon a time' -n 24 --temp 1.0 ";
  const test::CliResult s7 = stdout_of(args + "-s 7"), seed7 = stdout_of(args + "--seed 7");
  ASSERT_EQ(s7.code, 0) << s7.out;
  EXPECT_EQ(s7.out, seed7.out);
  EXPECT_NE(s7.out, stdout_of(args + "-s 8").out);  // the flag does reach the sampler
  // --seed -1: a drawn seed, printed on stderr; the same seed given back repeats the text.
  const std::string err = test::tmp_path("seed.err");
  const test::CliResult drawn = test::run_shell(test::kvevict_binary() + " " + args + "--seed -1 2>" + err);
  ASSERT_EQ(drawn.code, 0) << drawn.out;
  std::ifstream in(err);
  const std::string err_text((std::istreambuf_iterator<char>(in)), {});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err_text, m, std::regex("kvevict: seed (\\d+) \\(drawn for --seed -1\\)"))) << err_text;
  EXPECT_EQ(stdout_of(args + "--seed " + std::string(m[1])).out, drawn.out);
  expect_one_line_error(both(args + "--seed -2"), "--seed -2");
}

// llama.cpp's --min-p: tokens below min_p x the top probability are dropped. At 1 only the most
// likely token remains, so sampling at temperature 1 must give the greedy text (the reference:
// the same run at --temp 0); at 0 the cut is off and the sampled text differs; out of [0, 1] is an
// error naming the flag.
TEST_F(CliLlamaCppFlags, MinP) {
  const std::string args = gen + "-p 'Once upon a time' -n 32 -s 3 ";
  const test::CliResult greedy = stdout_of(args + "--temp 0");
  ASSERT_EQ(greedy.code, 0) << greedy.out;
  EXPECT_EQ(stdout_of(args + "--temp 1 --min-p 1").out, greedy.out);
  EXPECT_NE(stdout_of(args + "--temp 1 --min-p 0").out, greedy.out);
  expect_one_line_error(both(args + "--temp 1 --min-p 1.5"), "min-p");
}

TEST_F(CliLlamaCppFlags, PromptFromFile) {
  const std::string file = test::tmp_path("prompt.txt"), empty = test::tmp_path("empty.txt");
  std::ofstream(file) << "Once upon a time\n";  // llama.cpp drops this one trailing newline
  std::ofstream(empty) << "";
  const test::CliResult from_file = stdout_of(gen + "-f " + file + " -n 16 --temp 0");
  ASSERT_EQ(from_file.code, 0) << from_file.out;
  EXPECT_EQ(from_file.out, stdout_of(gen + "-p 'Once upon a time' -n 16 --temp 0").out);
  expect_one_line_error(both(gen + "-n 4"), "give -p TEXT or -f FILE");
  expect_one_line_error(both(gen + "-p hi -f " + file), "excludes");
  expect_one_line_error(both(gen + "-f " + empty), "the prompt must not be empty");
  expect_one_line_error(both(gen + "-f /nonexistent.txt"), "/nonexistent.txt");
}

TEST_F(CliLlamaCppFlags, ContextSizeAndUnboundedNPredict) {
  const std::string p = "-p 'Once upon a time' --ignore-eos --temp 0 ";
  // -c 20: prompt + generated = 20 although -n asks for 100.
  test::CliResult r = stderr_of(gen + p + "-c 20 -n 100");
  ASSERT_EQ(r.code, 0) << r.out;
  const int64_t prompt = summary_count(r.out, "prompt");
  ASSERT_GT(prompt, 0) << r.out;
  EXPECT_EQ(summary_count(r.out, "generated"), 20 - prompt) << r.out;
  // -n -1 -c 24: until the context is full.
  r = stderr_of(gen + p + "-c 24 -n -1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(summary_count(r.out, "generated"), 24 - prompt) << r.out;
  // -n within the context is unchanged by -c.
  r = stderr_of(gen + p + "-c 24 -n 3");
  EXPECT_EQ(summary_count(r.out, "generated"), 3) << r.out;
  expect_one_line_error(both(gen + p + "-c 3"), "-c 3");  // the prompt alone fills it
  expect_one_line_error(both(gen + p + "-n 0"), "-n");
  expect_one_line_error(both(gen + p + "-n -2"), "must be -1");
}

TEST_F(CliLlamaCppFlags, OptionsKvevictDoesNotHaveAreNamed) {
  // llama.cpp's -ngl (GPU layers) used to be read as `-n gl`.
  expect_one_line_error(both(gen + "-p hi -ngl 99"), "unknown option '-ngl'");
  expect_one_line_error(both(gen + "-p hi -ngl 99"), "kvevict generate --help");
  expect_one_line_error(both("perplexity -m " + model() + " -f " + model() + " -ctk q8_0"), "unknown option '-ctk'");
  // An attached number is still a value: -n5 is -n 5.
  const test::CliResult r = stderr_of(gen + "-p hi -n5 --ignore-eos");
  EXPECT_EQ(summary_count(r.out, "generated"), 5) << r.out;
}

TEST_F(CliLlamaCppFlags, ErrorsNameTheSubcommandTyped) {
  expect_one_line_error(both("bench decode -m " + model() + " -p 64"), "see `kvevict bench decode --help`");
  expect_one_line_error(both("tasks gen --bogus"), "see `kvevict tasks gen --help`");
  expect_one_line_error(both("generate -p hi"), "see `kvevict generate --help`");  // -m missing
}

TEST_F(CliLlamaCppFlags, BenchRecentBufferThatLooksLikeRepetitions) {
  const std::string bench = "bench decode -t 1 -m " + model() + " --reps 1 --steps 1 --no-sweep --prefill none ";
  test::CliResult r = stderr_of(bench + "-r 5");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("-r 5 sets the recent buffer r"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--reps"), std::string::npos) << r.out;
  r = stderr_of(bench + "-r 64");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("sets the recent buffer"), std::string::npos) << r.out;
}

TEST_F(CliLlamaCppFlags, PerplexityPastTheContextNeedsC) {
  // stories260K states a context of 2048 tokens: 3000 words of text are well past it.
  const std::string file = test::tmp_path("long.txt");
  {
    std::ofstream out(file);
    for (int i = 0; i < 300; ++i) out << "The little dog ran to the park and played with a red ball. ";
  }
  expect_one_line_error(both("perplexity -t 1 -m " + model() + " -f " + file), "pass -c N");
  const test::CliResult r = both("perplexity -t 1 -m " + model() + " -f " + file + " --tokens 64");
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST_F(CliLlamaCppFlags, ModelHelpNamesTheFamilies) {
  const test::CliResult r = both("generate --help");
  EXPECT_EQ(r.out.find("llama architecture"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("llama, qwen2, qwen3, phi3"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kvevict
