// Task generator: determinism, answers checked by an independent solver, length scaling, format,
// and the CLI's error handling.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "eval/grader.h"
#include "eval/task_file.h"
#include "tasks/generator.h"
#include "test_paths.h"
#include "util/error.h"

namespace kvevict {
namespace {

/// Independent re-solver: parses the problem text (not the generator's internals) and follows
/// the rules of tasks/generator.h. Returns the expected answer and the expected trace.
struct Solved {
  std::string answer, trace;
};

Solved resolve(const std::string& problem) {
  std::istringstream in(problem);
  std::string line;
  std::map<char, char> fact;  // key -> value
  char marker = 0, start = 0, code = 0;
  int steps = 0;
  while (std::getline(in, line)) {
    if (line.size() == 2 && line[0] == '#') {
      EXPECT_EQ(code, 0) << "second code line";
      code = line[1];  // once's code line "#P"
    } else if (line.size() == 2 && std::isupper(static_cast<unsigned char>(line[0]))) {
      EXPECT_EQ(fact.count(line[0]), 0u) << "duplicate key " << line[0];
      fact[line[0]] = line[1];
    } else {
      EXPECT_EQ(line.size(), 5u) << line;
      marker = line[0];
      steps = std::stoi(line.substr(1, 3));
      start = line[4];
    }
  }
  Solved s;
  char cur = start;
  int sum = 0;
  char buf[32];
  for (int i = 1; i <= steps; ++i) {
    const char next = fact.at(cur);
    const int d = (next - 'A') % 10;  // the letter's value, as generator.h defines it
    std::snprintf(buf, sizeof buf, "%03d%c=%c", steps - i, cur, next);
    s.trace += buf;
    if (marker == '$') {
      sum = (sum + d) % 10;
      s.trace += std::to_string(d) + std::to_string(sum);
    }
    s.trace += "\n";
    cur = next;
  }
  s.answer = std::string(1, cur);
  if (marker == '$') s.answer += std::to_string(sum);
  if (marker == '@') {
    EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(code))) << "once problem without a code line";
    s.answer += code;
  }
  s.trace += "\\boxed{" + s.answer + "}";
  return s;
}

TEST(Tasks, DeterministicBySeedAndIndependentOfBatch) {
  for (TaskFamily f : all_task_families()) {
    const auto a = generate_tasks(f, {3, 40}, {5, 26}, 7, 20);
    const auto b = generate_tasks(f, {3, 40}, {5, 26}, 7, 20);
    const auto c = generate_tasks(f, {3, 40}, {5, 26}, 7, 5, 15);  // tasks 15..19 alone
    const auto d = generate_tasks(f, {3, 40}, {5, 26}, 8, 20);
    ASSERT_EQ(a.size(), 20u);
    int differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(task_to_json(a[i]), task_to_json(b[i]));
      differ += a[i].problem != d[i].problem;
    }
    for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(task_to_json(c[i]), task_to_json(a[15 + i]));
    EXPECT_GE(differ, 18) << "another seed should give other tasks";
  }
}

TEST(Tasks, AnswersAndTracesMatchAnIndependentSolver) {
  for (TaskFamily f : all_task_families()) {
    for (const Task& t : generate_tasks(f, {min_steps(f), 300}, {2, 26}, 3, 200)) {
      const Solved s = resolve(t.problem);
      ASSERT_EQ(t.answer, s.answer) << t.id;
      ASSERT_EQ(t.trace, s.trace) << t.id;
      ASSERT_EQ(extract_last_boxed(t.trace), t.answer);
      EXPECT_EQ(static_cast<int64_t>(t.trace.size()), trace_length(f, t.size.steps));
      EXPECT_EQ(static_cast<int64_t>(t.problem.size()), problem_length(f, t.size.facts));
    }
  }
}

TEST(Tasks, FactsFormOneCycleAndOnlyThePromptAnswersALookup) {
  for (TaskFamily f : all_task_families()) {
    const Task t = generate_task(f, {300, 26}, 11, 0);
    std::map<char, char> next;
    std::istringstream in(t.problem);
    std::string line;
    while (std::getline(in, line) && line.size() == 2 && line[0] != '#') next[line[0]] = line[1];
    ASSERT_EQ(next.size(), 26u);
    std::set<char> seen;
    char c = 'A';
    for (int i = 0; i < 26; ++i) {
      seen.insert(c);
      c = next.at(c);
    }
    EXPECT_EQ(c, 'A');
    EXPECT_EQ(seen.size(), 26u);
    // A step's lookup, as generator.h states it: "the letter right after X". In the prompt +
    // trace text it has exactly one answer, and it lies in the prompt, even though a 300-step
    // trace goes round the 26-cycle 11 times.
    const std::string text = t.problem + t.trace;
    const auto p_len = t.problem.size();
    for (char key = 'A'; key <= 'Z'; ++key) {
      int letters = 0;
      for (size_t i = 1; i < text.size(); ++i) {
        if (text[i - 1] != key || !std::isupper(static_cast<unsigned char>(text[i]))) continue;
        EXPECT_LT(i, p_len) << task_family_name(f) << ": '" << key << text[i] << "' in the trace";
        ++letters;
      }
      EXPECT_EQ(letters, 1) << key;
    }
    // The trace restates the state: every line is the countdown, then "X=Y" with Y = next(X).
    std::istringstream tr(t.trace);
    int lines = 0;
    while (std::getline(tr, line) && line[0] != '\\') {
      if (line[0] == '#') continue;
      ASSERT_GE(line.size(), 6u) << line;
      EXPECT_EQ(line[4], '=') << line;
      EXPECT_EQ(next.at(line[3]), line[5]) << line;
      EXPECT_EQ(std::stoi(line.substr(0, 3)), 300 - 1 - lines) << line;
      ++lines;
    }
    EXPECT_EQ(lines, 300);
  }
}

TEST(Tasks, LengthKnobScalesFromBelowSmallBudgetToEightTimesIt) {
  for (TaskFamily f : all_task_families()) {
    const int64_t shortest = trace_length(f, min_steps(f));
    EXPECT_LT(shortest, 64) << task_family_name(f);
    const int64_t n = steps_for_trace_length(f, 8 * 64);
    EXPECT_GE(trace_length(f, n) + 11, 8 * 64);
    EXPECT_GE(trace_length(f, kMaxSteps), 8 * 256);
    int64_t prev = 0;
    for (int64_t len : {50, 100, 200, 400, 800, 1600}) {
      const int64_t steps = steps_for_trace_length(f, len);
      const Task t = generate_task(f, {steps, kDefaultFacts}, 1, 0);
      EXPECT_GT(static_cast<int64_t>(t.trace.size()), prev);
      EXPECT_LE(std::llabs(static_cast<int64_t>(t.trace.size()) - len), 11) << task_family_name(f) << " " << len;
      prev = static_cast<int64_t>(t.trace.size());
    }
  }
}

// once states its fact exactly once and nothing else determines it (generator.h):
// (1) in prompt + trace of every task, '#' occurs once, in the prompt, followed by the code that
//     the answer asks for, and the trace is chain lines only (no digit but the countdown's);
// (2) the code is not derivable: among tasks whose text without the code line is identical
//     (M = 2, N = 3 gives 1,300 distinct texts for 20,000 tasks), the codes differ, and each digit
//     is about equally frequent.
TEST(Tasks, OnceCodeIsStatedExactlyOnceAndNotDerivable) {
  for (const Task& t : generate_tasks(TaskFamily::Once, {1, 120}, {2, 26}, 4, 300)) {
    const std::string text = t.problem + t.trace;
    ASSERT_EQ(std::count(text.begin(), text.end(), '#'), 1) << t.id;
    const auto off = once_code_offset(t.problem);
    ASSERT_TRUE(off.has_value()) << t.id;
    ASSERT_EQ(t.answer.size(), 2u);
    EXPECT_EQ(t.problem[static_cast<size_t>(*off)], t.answer[1]) << t.id;
    EXPECT_EQ(t.problem.substr(static_cast<size_t>(*off) + 1, 2), "\n@") << "code line right before the question";
    std::istringstream tr(t.trace);
    std::string line;
    int lines = 0;
    while (std::getline(tr, line) && line[0] != '\\') {
      ASSERT_EQ(line.size(), 6u) << t.id << ": " << line;  // "cccX=Y"
      ++lines;
    }
    EXPECT_EQ(lines, t.size.steps);
  }
  std::map<std::string, std::set<char>> codes;  // text without its code -> codes seen
  std::map<char, int> count;
  for (const Task& t : generate_tasks(TaskFamily::Once, {3, 3}, {2, 2}, 6, 20000)) {
    const auto off = static_cast<size_t>(*once_code_offset(t.problem));
    const std::string rest = t.problem.substr(0, off - 1) + t.problem.substr(off + 2) +
        t.trace.substr(0, t.trace.size() - 3) + t.answer.substr(0, 1);
    codes[rest].insert(t.answer[1]);
    ++count[t.answer[1]];
  }
  EXPECT_EQ(codes.size(), 1300u);  // 325 letter pairs x 2 fact-line orders x 2 start letters
  int many = 0;
  for (const auto& [rest, seen] : codes) {
    EXPECT_GE(seen.size(), 2u) << "one code for a whole text group: derivable? " << rest;
    many += seen.size() >= 5;
  }
  EXPECT_GT(many, 1000);
  ASSERT_EQ(count.size(), 10u);
  // 2,000 expected per digit; 5 binomial standard deviations = 5 * sqrt(20000 * 0.1 * 0.9) = 212.
  for (const auto& [digit, n] : count) EXPECT_NEAR(n, 2000, 212) << digit;
}

TEST(Tasks, JsonRoundTripAndBoxedParsing) {
  const Task t = generate_task(TaskFamily::Running, {7, 9}, 2, 3);
  const Task u = task_from_json(task_to_json(t));
  EXPECT_EQ(u.id, t.id);
  EXPECT_EQ(u.family, t.family);
  EXPECT_EQ(u.problem, t.problem);
  EXPECT_EQ(u.trace, t.trace);
  EXPECT_EQ(u.answer, t.answer);
  EXPECT_EQ(u.size.steps, 7);
  EXPECT_EQ(u.size.facts, 9);
  EXPECT_EQ(extract_last_boxed("a \\boxed{1} b \\boxed{XY} c"), "XY");
  EXPECT_EQ(extract_last_boxed("\\boxed{X"), std::nullopt);
  EXPECT_EQ(extract_last_boxed("none"), std::nullopt);
  EXPECT_THROW(task_from_json("{"), Error);
  EXPECT_THROW(task_from_json(R"({"id":"x","family":"nope","problem":"","answer":""})"), Error);
}

// Expected: without a trace or length.steps (a task file with only id/problem/answer), the decode
// limit still covers the whole trace: N is read from the question line.
TEST(Tasks, DecodeLimitWithoutTraceReadsStepsFromTheQuestion) {
  for (TaskFamily f : all_task_families()) {
    Task t = generate_task(f, {42, 20}, 7, 0);
    const int64_t with_trace = default_max_new(t);
    EXPECT_EQ(with_trace, static_cast<int64_t>(t.trace.size()) + 16);
    t.trace.clear();
    t.size = {};
    EXPECT_EQ(default_max_new(t), with_trace) << task_family_name(f);
    t.problem = "AB\nBA\n";
    EXPECT_THROW(default_max_new(t), Error);
  }
}

TEST(Tasks, BadInputIsAnError) {
  EXPECT_THROW(parse_task_family("lookup"), Error);
  EXPECT_THROW(generate_task(TaskFamily::Chain, {0, 10}, 1, 0), Error);
  EXPECT_THROW(generate_task(TaskFamily::Once, {0, 10}, 1, 0), Error);
  EXPECT_THROW(generate_task(TaskFamily::Chain, {5, 27}, 1, 0), Error);
  EXPECT_THROW(generate_task(TaskFamily::Chain, {1000, 10}, 1, 0), Error);
  EXPECT_THROW(parse_int_range("5-3", "--steps"), Error);
  EXPECT_THROW(parse_int_range("x", "--steps"), Error);
  EXPECT_THROW(parse_int_range("-3", "--steps"), Error);
  EXPECT_EQ(parse_int_range("4-9", "--steps").hi, 9);
  EXPECT_THROW(steps_for_trace_length(TaskFamily::Chain, 0), Error);
  EXPECT_THROW(generate_tasks(TaskFamily::Chain, {1, 2}, {5, 5}, 1, -1), Error);
}

TEST(Tasks, CliWritesJsonLinesAndRejectsBadOptions) {
  const std::string bin = test::kvevict_binary();
  const std::string cmd = bin + " tasks gen --family once --n 3 --seed 9 --length 200";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0);
  std::istringstream in(out);
  std::string line;
  int count = 0;
  while (std::getline(in, line)) {
    const Task t = task_from_json(line);
    const Task g = generate_task(TaskFamily::Once, t.size, 9, static_cast<uint64_t>(count));
    EXPECT_EQ(task_to_json(t), task_to_json(g));
    ++count;
  }
  EXPECT_EQ(count, 3);
  for (const char* bad : {" tasks gen --family nope --n 1 --steps 3", " tasks gen --family chain --n 1",
                          " tasks gen --family chain --n 1 --steps 5 --length 50",
                          " tasks gen --family chain --n 1 --steps 3 --facts 40"}) {
    const int rc = std::system((bin + bad + " >/dev/null 2>&1").c_str());
    EXPECT_EQ(WEXITSTATUS(rc), 2) << bad;
  }
}

}  // namespace
}  // namespace kvevict
