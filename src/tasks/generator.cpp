// Task generator: see generator.h for the format.
#include "tasks/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
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
    case TaskFamily::Recall:
      return '%';
    case TaskFamily::Revisit:
      return '^';
  }
  return '?';
}

/// A random order of the 26 letters (a partial Fisher-Yates over the first `k`).
std::string shuffled_letters(Rng& rng, int64_t k) {
  std::string letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  for (int64_t i = 0; i < k; ++i)
    std::swap(letters[static_cast<size_t>(i)], letters[static_cast<size_t>(i + below(rng, 26 - i))]);
  return letters.substr(0, static_cast<size_t>(k));
}

/// recall / revisit (see generator.h): two cycles, phase A computes V, phase B carries it.
void generate_trace_family(Task& t, Rng& rng) {
  const TaskSize& size = t.size;
  const int64_t k = size.depth, n = size.steps, f = size.facts;
  const int64_t ca = k + 2, cb = f - ca;
  const std::string letters = shuffled_letters(rng, f);
  const std::string a = letters.substr(0, static_cast<size_t>(ca)), b = letters.substr(static_cast<size_t>(ca));
  const auto at = [](const std::string& cyc, int64_t i) { return cyc[static_cast<size_t>(i % static_cast<int64_t>(cyc.size()))]; };
  // Fact lines of both cycles, shuffled together: line j < ca is A's fact j, else B's fact j - ca.
  for (int64_t j : random_permutation(rng, f)) {
    const std::string& cyc = j < ca ? a : b;
    const int64_t i = j < ca ? j : j - ca;
    t.problem += at(cyc, i);
    t.problem += at(cyc, i + 1);
    t.problem += '\n';
  }
  const int64_t start_a = below(rng, ca), start_b = below(rng, cb);
  const char end_a = at(a, start_a + k);
  t.problem += fmt::format("{}{}>{}+{}{:03d}{}\n", family_marker(t.family), size.restate, end_a, at(b, start_b), n,
                           at(a, start_a));
  int64_t c = n;
  int sum = 0;
  for (int64_t i = 1; i <= k; ++i) {
    const char x = at(a, start_a + i - 1), y = at(a, start_a + i);
    sum = (sum + letter_value(y)) % 10;
    // The K-th line keys its sum with '&': the value V that is needed again.
    t.trace += fmt::format("{:03d}{}={}{}{}{}\n", --c, x, y, letter_value(y), i == k ? "&" : "", sum);
  }
  const int value = sum;
  const int64_t period = restate_period(size.restate);
  char y = 0;
  for (int64_t i = 0; i < n - k; ++i) {
    const char x = at(b, start_b + i);
    y = at(b, start_b + i + 1);
    t.trace += fmt::format("{:03d}{}={}\n", --c, x, y);
    if (period > 0 && c > 0 && c % period == 0) {
      if (t.family == TaskFamily::Recall)
        t.trace += fmt::format("&{}\n", value);
      else
        t.trace += fmt::format("!{}\n", (value + letter_value(y)) % 10);
    }
  }
  t.answer = t.family == TaskFamily::Recall ? fmt::format("{}&{}", y, value)
                                            : fmt::format("{}!{}", y, (value + letter_value(y)) % 10);
  t.trace += "\\boxed{" + t.answer + "}";
}

}  // namespace

const std::vector<TaskFamily>& all_task_families() {
  static const std::vector<TaskFamily> all{TaskFamily::Chain, TaskFamily::Running, TaskFamily::Once,
                                          TaskFamily::Recall, TaskFamily::Revisit};
  return all;
}

bool is_trace_family(TaskFamily f) { return f == TaskFamily::Recall || f == TaskFamily::Revisit; }

int64_t restate_period(int64_t restate) { return restate > 1 ? kTraceSpan / restate : 0; }

const char* task_family_name(TaskFamily f) {
  switch (f) {
    case TaskFamily::Chain:
      return "chain";
    case TaskFamily::Running:
      return "running";
    case TaskFamily::Once:
      return "once";
    case TaskFamily::Recall:
      return "recall";
    case TaskFamily::Revisit:
      return "revisit";
  }
  return "?";
}

TaskFamily parse_task_family(const std::string& name) {
  for (TaskFamily f : all_task_families())
    if (name == task_family_name(f)) return f;
  throw Error(fmt::format("unknown task family '{}' (valid: chain, running, once, recall, revisit)", name));
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

int64_t min_steps(TaskFamily f) { return is_trace_family(f) ? kDefaultDepth + 1 : 1; }

int64_t min_steps(TaskFamily f, const TaskSize& size) {
  return is_trace_family(f) ? with_defaults(f, size).depth + 1 : 1;
}

TaskSize with_defaults(TaskFamily f, TaskSize size) {
  if (!is_trace_family(f)) {
    size.depth = 0;
    size.restate = 1;
  } else if (size.depth == 0) {
    size.depth = kDefaultDepth;
  }
  return size;
}

void validate_task_size(TaskFamily f, const TaskSize& size) {
  const int64_t lo = min_steps(f, size);
  if (size.steps < lo || size.steps > kMaxSteps)
    throw Error(fmt::format("steps {} out of range for family {}: must be in [{}, {}]{}", size.steps,
                            task_family_name(f), lo, kMaxSteps,
                            is_trace_family(f) ? " (more than the depth K)" : ""));
  if (size.facts < kMinFacts || size.facts > kMaxFacts)
    throw Error(fmt::format("facts {} out of range: must be in [{}, {}] (one upper-case letter per fact)", size.facts,
                            kMinFacts, kMaxFacts));
  if (!is_trace_family(f)) return;
  if (size.depth < kMinDepth || size.depth > kMaxDepth)
    throw Error(fmt::format("depth {} out of range for family {}: must be in [{}, {}]", size.depth,
                            task_family_name(f), kMinDepth, kMaxDepth));
  if (size.facts < size.depth + 4)
    throw Error(fmt::format("facts {} too few for depth {}: family {} needs facts >= depth + 4 (cycle A has "
                            "depth + 2 letters, cycle B at least 2)",
                            size.facts, size.depth, task_family_name(f)));
  if (size.restate != 1 && size.restate != 2 && size.restate != 4 && size.restate != 8)
    throw Error(fmt::format("restate {} invalid for family {}: must be 1, 2, 4 or 8", size.restate,
                            task_family_name(f)));
}

int64_t trace_length(TaskFamily f, const TaskSize& size) {
  const int64_t n = size.steps;
  switch (f) {
    case TaskFamily::Chain:
      return 7 * n + 9;
    case TaskFamily::Running:
      return 9 * n + 10;
    case TaskFamily::Once:
      return 7 * n + 10;
    case TaskFamily::Recall:
    case TaskFamily::Revisit: {
      const TaskSize s = with_defaults(f, size);
      const int64_t k = s.depth, period = restate_period(s.restate);
      const int64_t restatements = period > 0 && n - k >= 1 ? (n - k - 1) / period : 0;
      return 9 * k + 1 + 7 * (n - k) + 3 * restatements + 11;
    }
  }
  return 0;
}

int64_t trace_length(TaskFamily f, int64_t steps) { return trace_length(f, TaskSize{steps, kDefaultFacts, 0, 1}); }

int64_t problem_length(TaskFamily f, int64_t facts) {
  if (is_trace_family(f)) return 3 * facts + 11;
  return 3 * facts + (f == TaskFamily::Once ? 9 : 6);
}

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

int64_t steps_for_trace_length(TaskFamily f, int64_t tokens) { return steps_for_trace_length(f, tokens, {}); }

int64_t steps_for_trace_length(TaskFamily f, int64_t tokens, const TaskSize& size) {
  if (tokens < 1) throw Error(fmt::format("--length {}: must be >= 1 (trace tokens)", tokens));
  TaskSize s = with_defaults(f, size);
  const auto length = [&](int64_t n) {
    s.steps = n;
    return trace_length(f, s);
  };
  int64_t best = min_steps(f, s);
  for (int64_t n = best; n <= kMaxSteps; ++n)
    if (std::llabs(length(n) - tokens) < std::llabs(length(best) - tokens)) best = n;
  return best;
}

std::optional<TaskSize> size_from_problem(TaskFamily f, const std::string& problem) {
  const std::optional<int64_t> n = question_steps(problem);
  if (!n) return std::nullopt;
  TaskSize size;
  size.steps = *n;
  std::map<char, char> next;
  size_t pos = 0;
  while (pos < problem.size()) {
    const size_t end = problem.find('\n', pos);
    if (end == std::string::npos) break;
    const std::string_view line(problem.data() + pos, end - pos);
    if (line.size() == 2 && std::isupper(static_cast<unsigned char>(line[0])) &&
        std::isupper(static_cast<unsigned char>(line[1])))
      next[line[0]] = line[1];
    pos = end + 1;
  }
  size.facts = static_cast<int64_t>(next.size());
  if (!is_trace_family(f)) return with_defaults(f, size);
  // Question "<marker><R>><e>+<b><NNN><a>\n": 11 characters.
  if (problem.size() < 11) return std::nullopt;
  const std::string_view q(problem.data() + problem.size() - 11, 11);
  if (q[0] != family_marker(f) || q[2] != '>' || q[4] != '+') return std::nullopt;
  size.restate = q[1] - '0';
  const char end_a = q[3];
  char cur = q[9];
  for (size.depth = 0; size.depth <= kMaxFacts; ++size.depth) {
    if (size.depth > 0 && cur == end_a) return size;
    const auto it = next.find(cur);
    if (it == next.end()) return std::nullopt;
    cur = it->second;
  }
  return std::nullopt;
}

std::vector<int64_t> value_copy_offsets(TaskFamily f, const std::string& trace) {
  std::vector<int64_t> out;
  if (!is_trace_family(f)) return out;
  const size_t boxed = trace.rfind("\\boxed{");
  for (size_t i = trace.find('&'); i != std::string::npos && i < boxed; i = trace.find('&', i + 1))
    out.push_back(static_cast<int64_t>(i + 1));
  return out;
}

std::vector<int64_t> parse_restate_list(const std::string& text, const std::string& option) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item(text.data() + pos, comma - pos);
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || (v != 1 && v != 2 && v != 4 && v != 8))
      throw Error(fmt::format("{} '{}': expected a restate count 1, 2, 4 or 8, or a comma-separated list of them",
                              option, text));
    out.push_back(v);
    pos = comma + 1;
  }
  return out;
}

Task generate_task(TaskFamily family, const TaskSize& requested, uint64_t seed, uint64_t index) {
  const TaskSize size = with_defaults(family, requested);
  validate_task_size(family, size);
  Rng rng(stream_id({seed, static_cast<uint64_t>(family), index}));
  if (is_trace_family(family)) {
    Task t;
    t.family = family;
    t.size = size;
    t.id = fmt::format("{}-{}-{}", task_family_name(family), seed, index);
    generate_trace_family(t, rng);
    return t;
  }
  const int64_t m = size.facts, n = size.steps;

  // M distinct letters in a random order; the order is the cycle sym[i] -> sym[i+1].
  const std::string sym = shuffled_letters(rng, m);
  const std::vector<int64_t> order = random_permutation(rng, m);
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
                                 uint64_t first_index, IntRange depth, const std::vector<int64_t>& restate) {
  if (n < 0) throw Error(fmt::format("--n {}: must be >= 0", n));
  const bool trace_family = is_trace_family(family);
  if (!trace_family) {
    depth = {0, 0};
  } else if (depth.lo == 0 && depth.hi == 0) {
    depth = {kDefaultDepth, kDefaultDepth};
  }
  const std::vector<int64_t> restates = restate.empty() || !trace_family ? std::vector<int64_t>{1} : restate;
  // The extremes of every range must be valid together: the largest depth with the fewest steps
  // and facts, the smallest depth with the most.
  for (int64_t r : restates) {
    validate_task_size(family, {steps.lo, facts.lo, depth.hi, r});
    validate_task_size(family, {steps.hi, facts.hi, depth.lo, r});
  }
  std::vector<Task> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t index = first_index + static_cast<uint64_t>(k);
    Rng size_rng(stream_id({seed, static_cast<uint64_t>(family), index, 1}));
    TaskSize size;
    size.steps = draw(size_rng, steps);
    size.facts = draw(size_rng, facts);
    if (trace_family) {
      // Drawn after N and facts, so the three prompt families keep their tasks.
      size.depth = draw(size_rng, depth);
      size.restate = restates[static_cast<size_t>(below(size_rng, static_cast<int64_t>(restates.size())))];
    }
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
  if (is_trace_family(t.family)) {
    j["length"]["depth"] = t.size.depth;
    j["length"]["restate"] = t.size.restate;
  }
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
      t.size.depth = j["length"].value("depth", int64_t{0});
      t.size.restate = j["length"].value("restate", int64_t{1});
    }
    return t;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("task line: missing or mistyped field: {}", e.what()));
  }
}

int64_t default_max_new(const Task& task) {
  if (!task.trace.empty()) return static_cast<int64_t>(task.trace.size()) + 16;
  TaskSize size = task.size;
  if (size.steps < 1) {
    // No trace and no "length": read the size from the problem text.
    const std::optional<TaskSize> read = size_from_problem(task.family, task.problem);
    if (!read)
      throw Error(
          fmt::format("task {}: no trace, no length.steps and no question line \"<marker><NNN>S\" to read "
                      "the number of steps from",
                      task.id));
    size = *read;
  }
  size = with_defaults(task.family, size);
  size.steps = std::max(size.steps, min_steps(task.family, size));
  return trace_length(task.family, size) + 16;
}

}  // namespace kvevict
