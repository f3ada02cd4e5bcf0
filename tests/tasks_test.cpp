// Task generator: determinism, answers checked by an independent solver, length scaling, format,
// and the CLI's error handling.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cmath>
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

/// The letter value of generator.h: alphabet index mod 10.
int value_of(char letter) { return (letter - 'A') % 10; }

/// recall / revisit by the rules of generator.h, from the problem text: question line
/// "<marker><R>><e>+<b><NNN><a>".
Solved resolve_trace_family(const std::map<char, char>& fact, const std::string& question) {
  EXPECT_EQ(question.size(), 10u) << question;
  const char marker = question[0], end_a = question[3], start_b = question[5], start_a = question[9];
  const int restate = question[1] - '0', steps = std::stoi(question.substr(6, 3));
  EXPECT_EQ(question[2], '>');
  EXPECT_EQ(question[4], '+');
  Solved s;
  char buf[32];
  int c = steps, sum = 0, depth = 0;
  char cur = start_a;
  do {  // phase A: running lines from a until the walk reaches e
    const char next = fact.at(cur);
    sum = (sum + value_of(next)) % 10;
    ++depth;
    std::snprintf(buf, sizeof buf, "%03d%c=%c%d%s%d\n", --c, cur, next, value_of(next), next == end_a ? "&" : "", sum);
    s.trace += buf;
    cur = next;
  } while (cur != end_a && depth < 30);
  const int period = restate > 1 ? 160 / restate : 0;
  cur = start_b;
  while (c > 0) {  // phase B: chain lines from b, a restatement or checkpoint every `period` lines
    const char next = fact.at(cur);
    std::snprintf(buf, sizeof buf, "%03d%c=%c\n", --c, cur, next);
    s.trace += buf;
    cur = next;
    if (period > 0 && c > 0 && c % period == 0)
      s.trace += marker == '%' ? "&" + std::to_string(sum) + "\n" : "!" + std::to_string((sum + value_of(cur)) % 10) + "\n";
  }
  s.answer = std::string(1, cur) + (marker == '%' ? "&" + std::to_string(sum) : "!" + std::to_string((sum + value_of(cur)) % 10));
  s.trace += "\\boxed{" + s.answer + "}";
  return s;
}

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
    } else if (line.size() == 10) {
      return resolve_trace_family(fact, line);
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
    const int d = value_of(next);
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

/// Size ranges valid for every family (recall/revisit need N > depth and facts >= depth + 4).
IntRange any_steps(TaskFamily f, int64_t hi) { return {is_trace_family(f) ? kDefaultDepth + 1 : 1, hi}; }
IntRange any_facts(TaskFamily f) { return {is_trace_family(f) ? kDefaultDepth + 4 : 2, 26}; }

TEST(Tasks, DeterministicBySeedAndIndependentOfBatch) {
  for (TaskFamily f : all_task_families()) {
    const auto a = generate_tasks(f, {7, 40}, {10, 26}, 7, 20);
    const auto b = generate_tasks(f, {7, 40}, {10, 26}, 7, 20);
    const auto c = generate_tasks(f, {7, 40}, {10, 26}, 7, 5, 15);  // tasks 15..19 alone
    const auto d = generate_tasks(f, {7, 40}, {10, 26}, 8, 20);
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
    const bool deep = is_trace_family(f);
    for (const Task& t : generate_tasks(f, any_steps(f, 300), any_facts(f), 3, 200, 0, {3, deep ? 6 : 0},
                                        deep ? std::vector<int64_t>{1, 2, 4, 8} : std::vector<int64_t>{})) {
      const Solved s = resolve(t.problem);
      ASSERT_EQ(t.answer, s.answer) << t.id;
      ASSERT_EQ(t.trace, s.trace) << t.id;
      ASSERT_EQ(extract_last_boxed(t.trace), t.answer);
      EXPECT_EQ(static_cast<int64_t>(t.trace.size()), trace_length(f, t.size));
      EXPECT_EQ(static_cast<int64_t>(t.problem.size()), problem_length(f, t.size.facts));
      const auto read = size_from_problem(f, t.problem);
      ASSERT_TRUE(read.has_value()) << t.id;
      EXPECT_EQ(read->steps, t.size.steps);
      EXPECT_EQ(read->facts, t.size.facts);
      EXPECT_EQ(read->depth, t.size.depth);
      EXPECT_EQ(read->restate, t.size.restate);
    }
  }
}

/// Cycle lengths of the successor map `next` (each key on exactly one cycle), ascending.
std::vector<int> cycle_lengths(const std::map<char, char>& next) {
  std::vector<int> out;
  std::set<char> seen;
  for (const auto& [start, _] : next) {
    if (seen.count(start)) continue;
    int len = 0;
    char c = start;
    do {
      seen.insert(c);
      c = next.at(c);
      ++len;
    } while (c != start && len <= 26);
    EXPECT_EQ(c, start) << "not a cycle through " << start;
    out.push_back(len);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Tasks, FactsFormCyclesAndOnlyThePromptAnswersALookup) {
  for (TaskFamily f : all_task_families()) {
    const Task t = generate_task(f, {300, 26}, 11, 0);
    std::map<char, char> next;
    std::istringstream in(t.problem);
    std::string line;
    while (std::getline(in, line) && line.size() == 2 && line[0] != '#') next[line[0]] = line[1];
    ASSERT_EQ(next.size(), 26u);
    // One cycle over all 26 letters; recall/revisit: cycle A of depth + 2 letters and cycle B.
    const std::vector<int> expected = is_trace_family(f)
        ? std::vector<int>{static_cast<int>(kDefaultDepth) + 2, 26 - static_cast<int>(kDefaultDepth) - 2}
        : std::vector<int>{26};
    std::vector<int> want = expected;
    std::sort(want.begin(), want.end());
    EXPECT_EQ(cycle_lengths(next), want) << task_family_name(f);
    // A step's lookup, as generator.h states it: "the letter right after X". In the prompt +
    // trace text it has exactly one answer, and it lies in the prompt, even though a 300-step
    // trace goes round the cycle many times.
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
    // The trace restates the state: every step line is the countdown, then "X=Y" with
    // Y = next(X); recall/revisit's extra lines ("&V", "!W") carry no countdown.
    std::istringstream tr(t.trace);
    int lines = 0;
    while (std::getline(tr, line) && line[0] != '\\') {
      if (line[0] == '&' || line[0] == '!') {
        EXPECT_TRUE(is_trace_family(f)) << line;
        EXPECT_EQ(line.size(), 2u) << line;
        continue;
      }
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
    // recall/revisit write K = 6 running lines before the value (~55 tokens) at the least.
    const bool deep = is_trace_family(f);
    const int64_t shortest = trace_length(f, min_steps(f));
    EXPECT_LT(shortest, deep ? 128 : 64) << task_family_name(f);
    const int64_t n = steps_for_trace_length(f, 8 * 64);
    EXPECT_GE(trace_length(f, n) + 11, 8 * 64);
    EXPECT_GE(trace_length(f, kMaxSteps), 8 * 256);
    int64_t prev = 0;
    for (int64_t len : {50, 100, 200, 400, 800, 1600}) {
      if (len < shortest) continue;
      const int64_t steps = steps_for_trace_length(f, len);
      const Task t = generate_task(f, {steps, kDefaultFacts}, 1, 0);
      EXPECT_GT(static_cast<int64_t>(t.trace.size()), prev);
      EXPECT_LE(std::llabs(static_cast<int64_t>(t.trace.size()) - len), 11) << task_family_name(f) << " " << len;
      prev = static_cast<int64_t>(t.trace.size());
    }
    // With a restate count, --length accounts for the extra lines.
    if (deep) {
      for (int64_t r : {1, 2, 4, 8}) {
        const TaskSize shape{0, kDefaultFacts, kDefaultDepth, r};
        const int64_t steps = steps_for_trace_length(f, 1200, shape);
        const Task t = generate_task(f, {steps, kDefaultFacts, kDefaultDepth, r}, 1, 0);
        EXPECT_LE(std::llabs(static_cast<int64_t>(t.trace.size()) - 1200), 11) << task_family_name(f) << " R " << r;
      }
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

// recall/revisit with N - K = 160 phase-B lines (generator.h): recall writes V exactly R times
// (the phase-A line and R - 1 restatements "&V"), revisit once and re-reads it at R - 1
// checkpoints "!W" (W = V + the letter value of that line's Y); copies and reads are evenly
// spaced, 160 / R lines apart, and the last one is 160 / R lines before the answer.
TEST(Tasks, RecallAndRevisitWriteTheirValueRTimesEvenlySpaced) {
  for (TaskFamily f : {TaskFamily::Recall, TaskFamily::Revisit}) {
    for (const auto& [r, k0] : {std::pair<int64_t, int64_t>{1, 3}, {2, 6}, {4, 4}, {8, 10}}) {
      for (const Task& t : generate_tasks(f, {k0 + 160, k0 + 160}, {k0 + 4, 26}, 21, 20, 0, {k0, k0}, {r})) {
        const int64_t k = t.size.depth;
        ASSERT_EQ(t.size.steps - k, 160);
        const std::vector<int64_t> copies = value_copy_offsets(f, t.trace);
        const char v = t.trace[static_cast<size_t>(copies.at(0))];
        for (int64_t o : copies) EXPECT_EQ(t.trace[static_cast<size_t>(o)], v) << t.id;
        // The first copy ends phase A: the K-th line, "cccX=Yd&V".
        EXPECT_EQ(copies[0], 9 * k - 1) << t.id;
        std::vector<int64_t> reads = copies;  // where V is written or used, in trace offsets
        if (f == TaskFamily::Recall) {
          EXPECT_EQ(static_cast<int64_t>(copies.size()), r) << t.id;
          EXPECT_EQ(t.answer.substr(1), std::string("&") + v) << t.id;
        } else {
          EXPECT_EQ(copies.size(), 1u) << t.id;
          for (size_t i = t.trace.find('!'); i != std::string::npos; i = t.trace.find('!', i + 1)) {
            // "cccX=Y\n!W" or the answer "{Y!W": W = V + value(Y).
            const char y = std::isupper(static_cast<unsigned char>(t.trace[i - 1])) ? t.trace[i - 1] : t.trace[i - 2];
            const int w = ((v - '0') + value_of(y)) % 10;
            EXPECT_EQ(t.trace[i + 1], '0' + w) << t.id;
            reads.push_back(static_cast<int64_t>(i + 1));
          }
          EXPECT_EQ(static_cast<int64_t>(reads.size()), r + 1) << t.id;  // the answer's '!' too
          reads.pop_back();
        }
        // Evenly spaced: 160 / R lines of 7 tokens (+ the 3-token extra line) between reads,
        // and as far from the last one to the answer's value.
        reads.push_back(static_cast<int64_t>(t.trace.size()) - 2);
        for (size_t i = 1; i < reads.size(); ++i) {
          const int64_t gap = reads[i] - reads[i - 1];
          EXPECT_GE(gap, 7 * (160 / r)) << t.id << " read " << i;
          EXPECT_LE(gap, 7 * (160 / r) + 11) << t.id << " read " << i;
        }
      }
    }
  }
}

// recall's value V is computed in the trace and, outside its copies, carried only by its
// computation and its inputs (generator.h). Over 20,000 tasks with K = 3, 7 facts (cycle A of
// 5 letters, cycle B of 2), N = 5, R = 1: remove from each text V's copies (and the answer's V),
// phase A's lines (the computation) and cycle A's fact lines plus the question's a and e (the
// inputs), found from the text alone. Among tasks whose remaining text is identical (1,300
// distinct texts: 325 letter pairs for cycle B x 2 line orders x 2 start letters), V still takes
// several values: nothing else in the text determines it. Its frequencies match the exact
// distribution of the sum of the values of 3 distinct random letters (enumerated below).
TEST(Tasks, RecallValueIsCarriedOnlyByItsCopiesComputationAndInputs) {
  std::map<std::string, std::set<char>> values;  // text without V -> values seen
  std::map<int, int> count;
  for (const Task& t : generate_tasks(TaskFamily::Recall, {5, 5}, {7, 7}, 6, 20000, 0, {3, 3}, {1})) {
    std::map<char, char> next;
    std::istringstream in(t.problem);
    std::string line, question;
    while (std::getline(in, line)) {
      if (line.size() == 2)
        next[line[0]] = line[1];
      else
        question = line;
    }
    ASSERT_EQ(question.size(), 10u);
    std::set<char> cycle_a;
    for (char c = question[9]; !cycle_a.count(c); c = next.at(c)) cycle_a.insert(c);
    ASSERT_EQ(cycle_a.size(), 5u) << t.id;
    std::string rest;
    std::istringstream again(t.problem);
    while (std::getline(again, line))
      if (line.size() == 2 && !cycle_a.count(line[0])) rest += line + "\n";
    question[3] = question[9] = '_';
    rest += question + "\n";
    // Phase A = the trace up to the first '&' line; then no '&' but the answer's.
    const size_t memo = t.trace.find('&');
    ASSERT_NE(memo, std::string::npos);
    const char v = t.trace[memo + 1];
    const size_t phase_b = t.trace.find('\n', memo) + 1;
    std::string tail = t.trace.substr(phase_b);
    const size_t amp = tail.find('&');
    ASSERT_EQ(tail.find('&', amp + 1), std::string::npos) << t.id;
    ASSERT_EQ(tail[amp + 1], v) << t.id;
    tail[amp + 1] = '_';
    rest += tail;
    EXPECT_EQ(t.trace.substr(0, phase_b).find('&'), memo) << "one copy with R = 1";
    values[rest].insert(v);
    ++count[v - '0'];
  }
  EXPECT_EQ(values.size(), 1300u);
  int many = 0;
  for (const auto& [rest, seen] : values) {
    EXPECT_GE(seen.size(), 2u) << "one value for a whole text group: derivable? " << rest;
    many += seen.size() >= 5;
  }
  EXPECT_GT(many, 1000);
  // Exact distribution: V = value(x) + value(y) + value(z) mod 10 over ordered triples of
  // distinct letters (a's three successors on a random cycle of 5 random letters).
  std::vector<double> p(10, 0.0);
  int triples = 0;
  for (int x = 0; x < 26; ++x)
    for (int y = 0; y < 26; ++y)
      for (int z = 0; z < 26; ++z)
        if (x != y && y != z && x != z) p[static_cast<size_t>((x % 10 + y % 10 + z % 10) % 10)] += 1, ++triples;
  ASSERT_EQ(count.size(), 10u);
  for (int d = 0; d < 10; ++d) {
    const double mean = 20000 * p[static_cast<size_t>(d)] / triples;
    EXPECT_NEAR(count[d], mean, 5 * std::sqrt(mean)) << d;  // 5 binomial standard deviations
  }
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
  EXPECT_THROW(generate_task(TaskFamily::Recall, {20, 20, 2, 1}, 1, 0), Error);   // depth < 3
  EXPECT_THROW(generate_task(TaskFamily::Recall, {20, 20, 21, 1}, 1, 0), Error);  // depth > 20
  EXPECT_THROW(generate_task(TaskFamily::Recall, {20, 9, 6, 1}, 1, 0), Error);    // facts < depth + 4
  EXPECT_THROW(generate_task(TaskFamily::Recall, {6, 20, 6, 1}, 1, 0), Error);    // steps <= depth
  EXPECT_THROW(generate_task(TaskFamily::Revisit, {20, 20, 6, 3}, 1, 0), Error);  // restate not 1/2/4/8
  EXPECT_THROW(generate_tasks(TaskFamily::Recall, {5, 40}, {20, 20}, 1, 3, 0, {3, 6}), Error);  // N 5 <= K 6
  EXPECT_THROW(generate_tasks(TaskFamily::Recall, {10, 40}, {8, 20}, 1, 3, 0, {3, 6}), Error);  // 8 facts < 6 + 4
  EXPECT_THROW(parse_restate_list("1,3", "--restate"), Error);
  EXPECT_THROW(parse_restate_list("", "--restate"), Error);
  EXPECT_THROW(parse_restate_list("2,", "--restate"), Error);
  EXPECT_EQ(parse_restate_list("1,2,4,8", "--restate"), (std::vector<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(generate_task(TaskFamily::Recall, {20, 20}, 1, 0).size.depth, kDefaultDepth);  // default filled in
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
                          " tasks gen --family chain --n 1 --steps 3 --facts 40",
                          " tasks gen --family chain --n 1 --steps 3 --depth 4",
                          " tasks gen --family recall --n 1 --steps 30 --restate 3",
                          " tasks gen --family recall --n 1 --length 300 --restate 1,2",
                          " tasks gen --family recall --n 1 --steps 5 --depth 6"}) {
    const int rc = std::system((bin + bad + " >/dev/null 2>&1").c_str());
    EXPECT_EQ(WEXITSTATUS(rc), 2) << bad;
  }
}

}  // namespace
}  // namespace kvevict
