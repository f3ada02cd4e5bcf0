// Task generator: see generator.h for the format.
#include "tasks/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/rng.h"

namespace kvevict {
namespace {

/// Uniform integer in [0, n) from one draw (n <= 2^32, so the bias is below 2^-31).
int64_t below(Rng& rng, int64_t n) { return static_cast<int64_t>(rng.uniform() * static_cast<double>(n)); }

int64_t draw(Rng& rng, IntRange r) { return r.lo + below(rng, r.hi - r.lo + 1); }

char family_marker(TaskFamily f) {
  switch (f) {
    case TaskFamily::Chain:
      return '?';
    case TaskFamily::Running:
      return '$';
    case TaskFamily::Once:
      return '@';
  }
  return '?';
}

}  // namespace

const std::vector<TaskFamily>& all_task_families() {
  static const std::vector<TaskFamily> all{TaskFamily::Chain, TaskFamily::Running, TaskFamily::Once};
  return all;
}

const char* task_family_name(TaskFamily f) {
  switch (f) {
    case TaskFamily::Chain:
      return "chain";
    case TaskFamily::Running:
      return "running";
    case TaskFamily::Once:
      return "once";
  }
  return "?";
}

TaskFamily parse_task_family(const std::string& name) {
  for (TaskFamily f : all_task_families())
    if (name == task_family_name(f)) return f;
  throw Error(fmt::format("unknown task family '{}' (valid: chain, running, once)", name));
}

IntRange parse_int_range(const std::string& text, const std::string& option) {
  auto parse_one = [&](std::string_view s) -> int64_t {
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < 0)
      throw Error(fmt::format("{} '{}': expected a non-negative integer N or a range LO-HI", option, text));
    return v;
  };
  const std::string_view t(text);
  const auto dash = t.find('-');
  if (dash == std::string_view::npos) {
    const int64_t v = parse_one(t);
    return {v, v};
  }
  IntRange r{parse_one(t.substr(0, dash)), parse_one(t.substr(dash + 1))};
  if (r.lo > r.hi) throw Error(fmt::format("{} '{}': LO must be <= HI", option, text));
  return r;
}

int64_t min_steps(TaskFamily) { return 1; }

void validate_task_size(TaskFamily f, const TaskSize& size) {
  if (size.steps < min_steps(f) || size.steps > kMaxSteps)
    throw Error(fmt::format("steps {} out of range for family {}: must be in [{}, {}]", size.steps, task_family_name(f),
                            min_steps(f), kMaxSteps));
  if (size.facts < kMinFacts || size.facts > kMaxFacts)
    throw Error(fmt::format("facts {} out of range: must be in [{}, {}] (one upper-case letter per fact)", size.facts,
                            kMinFacts, kMaxFacts));
}

int64_t trace_length(TaskFamily f, int64_t steps) {
  switch (f) {
    case TaskFamily::Chain:
      return 7 * steps + 9;
    case TaskFamily::Running:
      return 9 * steps + 10;
    case TaskFamily::Once:
      return 7 * steps + 10;
  }
  return 0;
}

int64_t problem_length(TaskFamily f, int64_t facts) { return 3 * facts + (f == TaskFamily::Once ? 9 : 6); }

int letter_value(char letter) { return (letter - 'A') % 10; }

std::optional<int64_t> question_steps(const std::string& problem) {
  // The last 6 characters: marker, three digits, start letter, newline (see generate_task).
  if (problem.size() < 6 || problem.back() != '\n') return std::nullopt;
  const std::string_view nnn = std::string_view(problem).substr(problem.size() - 5, 3);
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(nnn.data(), nnn.data() + nnn.size(), n);
  if (ec != std::errc() || end != nnn.data() + nnn.size() || n < 0) return std::nullopt;
  return n;
}

int64_t steps_for_trace_length(TaskFamily f, int64_t tokens) {
  if (tokens < 1) throw Error(fmt::format("--length {}: must be >= 1 (trace tokens)", tokens));
  int64_t best = min_steps(f);
  for (int64_t n = min_steps(f); n <= kMaxSteps; ++n)
    if (std::llabs(trace_length(f, n) - tokens) < std::llabs(trace_length(f, best) - tokens)) best = n;
  return best;
}

Task generate_task(TaskFamily family, const TaskSize& size, uint64_t seed, uint64_t index) {
  validate_task_size(family, size);
  Rng rng(stream_id({seed, static_cast<uint64_t>(family), index}));
  const int64_t m = size.facts, n = size.steps;

  // M distinct letters in a random order; the order is the cycle sym[i] -> sym[i+1].
  std::string letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  for (int64_t i = 0; i < m; ++i)
    std::swap(letters[static_cast<size_t>(i)], letters[static_cast<size_t>(i + below(rng, 26 - i))]);
  const std::string sym = letters.substr(0, static_cast<size_t>(m));
  std::vector<int64_t> order(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) order[static_cast<size_t>(i)] = i;
  for (int64_t i = m - 1; i > 0; --i)
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(below(rng, i + 1))]);
  const int64_t start = below(rng, m);

  Task t;
  t.family = family;
  t.size = size;
  t.id = fmt::format("{}-{}-{}", task_family_name(family), seed, index);
  for (int64_t i : order) {
    const auto u = static_cast<size_t>(i);
    t.problem += sym[u];
    t.problem += sym[static_cast<size_t>((i + 1) % m)];
    t.problem += '\n';
  }
  int passcode = 0;
  if (family == TaskFamily::Once) {
    // Its own stream: the rest of the task is the same whatever the code, so nothing else in the
    // text can reveal it.
    Rng code_rng(stream_id({seed, static_cast<uint64_t>(family), index, 2}));
    passcode = static_cast<int>(below(code_rng, 10));
    t.problem += fmt::format("#{}\n", passcode);
  }
  t.problem += fmt::format("{}{:03d}{}\n", family_marker(family), n, sym[static_cast<size_t>(start)]);

  int64_t cur = start;
  int sum = 0;
  for (int64_t i = 1; i <= n; ++i) {
    const int64_t next = (cur + 1) % m;
    // "X=Y", never "XY": the trace must not answer the prompt's lookups (see generator.h).
    const char y = sym[static_cast<size_t>(next)];
    t.trace += fmt::format("{:03d}{}={}", n - i, sym[static_cast<size_t>(cur)], y);
    if (family == TaskFamily::Running) {
      sum = (sum + letter_value(y)) % 10;
      t.trace += fmt::format("{}{}", letter_value(y), sum);
    }
    t.trace += '\n';
    cur = next;
  }
  t.answer = std::string(1, sym[static_cast<size_t>(cur)]);
  if (family == TaskFamily::Running) t.answer += static_cast<char>('0' + sum);
  if (family == TaskFamily::Once) t.answer += static_cast<char>('0' + passcode);
  t.trace += "\\boxed{" + t.answer + "}";
  return t;
}

std::vector<Task> generate_tasks(TaskFamily family, IntRange steps, IntRange facts, uint64_t seed, int64_t n,
                                 uint64_t first_index) {
  if (n < 0) throw Error(fmt::format("--n {}: must be >= 0", n));
  validate_task_size(family, {steps.lo, facts.lo});
  validate_task_size(family, {steps.hi, facts.hi});
  std::vector<Task> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t index = first_index + static_cast<uint64_t>(k);
    Rng size_rng(stream_id({seed, static_cast<uint64_t>(family), index, 1}));
    TaskSize size;
    size.steps = draw(size_rng, steps);
    size.facts = draw(size_rng, facts);
    out.push_back(generate_task(family, size, seed, index));
  }
  return out;
}

std::string task_to_json(const Task& t) {
  nlohmann::ordered_json j;
  j["id"] = t.id;
  j["family"] = task_family_name(t.family);
  j["problem"] = t.problem;
  j["answer"] = t.answer;
  j["trace"] = t.trace;
  j["length"] = {{"steps", t.size.steps},
                 {"facts", t.size.facts},
                 {"problem_tokens", static_cast<int64_t>(t.problem.size())},
                 {"trace_tokens", static_cast<int64_t>(t.trace.size())}};
  return j.dump();
}

Task task_from_json(const std::string& line) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("task line is not valid JSON: {}", e.what()));
  }
  try {
    Task t;
    t.id = j.at("id").get<std::string>();
    t.family = parse_task_family(j.at("family").get<std::string>());
    t.problem = j.at("problem").get<std::string>();
    t.answer = j.at("answer").get<std::string>();
    t.trace = j.value("trace", std::string());
    if (j.contains("length")) {
      t.size.steps = j["length"].value("steps", int64_t{0});
      t.size.facts = j["length"].value("facts", int64_t{0});
    }
    return t;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("task line: missing or mistyped field: {}", e.what()));
  }
}

int64_t default_max_new(const Task& task) {
  if (!task.trace.empty()) return static_cast<int64_t>(task.trace.size()) + 16;
  int64_t steps = task.size.steps;
  if (steps < 1) {
    // No trace and no "length": read N from the question line.
    const std::optional<int64_t> n = question_steps(task.problem);
    if (!n)
      throw Error(
          fmt::format("task {}: no trace, no length.steps and no question line \"<marker><NNN>S\" to read "
                      "the number of steps from",
                      task.id));
    steps = *n;
  }
  return trace_length(task.family, std::max<int64_t>(steps, min_steps(task.family))) + 16;
}

}  // namespace kvevict
