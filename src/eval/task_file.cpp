#include "eval/task_file.h"

#include <fmt/format.h>

#include <cctype>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/error.h"
#include "util/file.h"

namespace kvevict {
namespace {

using json = nlohmann::json;

// A line that cannot become a task: the message names the reason (the caller adds FILE:LINE).
struct BadLine {
  std::string reason;
};

std::string field_string(const json& obj, const char* key, const char* format, bool allow_number) {
  const auto it = obj.find(key);
  if (it == obj.end()) throw BadLine{fmt::format("missing field '{}' ({} format)", key, format)};
  if (it->is_string()) return it->get<std::string>();
  if (allow_number && it->is_number()) return it->dump();
  throw BadLine{
      fmt::format("field '{}' must be a string{}, got {}", key, allow_number ? " or a number" : "", it->type_name())};
}

TaskFormat detect(const json& obj) {
  if (obj.contains("question")) return TaskFormat::Gsm8k;
  if (obj.contains("unique_id") || obj.contains("solution")) return TaskFormat::Math500;
  if (obj.contains("id")) return TaskFormat::Kvevict;
  return TaskFormat::Auto;
}

EvalTask make_task(const json& obj, TaskFormat f, int64_t line) {
  EvalTask t;
  t.line = line;
  switch (f) {
    case TaskFormat::Math500:
      t.problem = field_string(obj, "problem", "MATH-500", false);
      t.answer = field_string(obj, "answer", "MATH-500", true);
      t.id =
          obj.contains("unique_id") ? field_string(obj, "unique_id", "MATH-500", true) : fmt::format("line-{}", line);
      t.grading = Grading::Math;
      break;
    case TaskFormat::Gsm8k: {
      t.problem = field_string(obj, "question", "GSM8K", false);
      const std::string a = field_string(obj, "answer", "GSM8K", false);
      const auto gold = gsm8k_gold(a);
      if (!gold) throw BadLine{"field 'answer' has no '#### N' final answer (GSM8K format)"};
      t.answer = *gold;
      t.id = fmt::format("gsm8k-{}", line);
      t.grading = Grading::Gsm8k;
      break;
    }
    case TaskFormat::Kvevict:
      t.id = field_string(obj, "id", "kvevict", true);
      t.problem = field_string(obj, "problem", "kvevict", false);
      t.answer = field_string(obj, "answer", "kvevict", true);
      t.grading = Grading::Exact;
      break;
    case TaskFormat::Auto:
      break;
  }
  if (t.problem.empty()) throw BadLine{"empty problem text"};
  return t;
}

}  // namespace

TaskFormat parse_task_format(const std::string& name) {
  if (name == "auto") return TaskFormat::Auto;
  if (name == "math500") return TaskFormat::Math500;
  if (name == "gsm8k") return TaskFormat::Gsm8k;
  if (name == "kvevict") return TaskFormat::Kvevict;
  throw Error(fmt::format("--format '{}': expected auto, math500, gsm8k or kvevict", name));
}

const char* task_format_name(TaskFormat f) {
  switch (f) {
    case TaskFormat::Auto:
      return "auto";
    case TaskFormat::Math500:
      return "math500";
    case TaskFormat::Gsm8k:
      return "gsm8k";
    case TaskFormat::Kvevict:
      return "kvevict";
  }
  return "?";
}

EvalTaskFile read_tasks(const std::string& path, const TaskReadOptions& opts) {
  std::istringstream in(read_file_limited(
      path, opts.max_bytes > 0 ? opts.max_bytes : std::numeric_limits<int64_t>::max() - 1, opts.option));
  EvalTaskFile file;
  file.path = path;
  file.format = opts.format;
  std::map<std::string, int64_t> seen;  // id -> line
  std::string text;
  int64_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    try {
      json obj;
      try {
        obj = json::parse(text);
      } catch (const json::parse_error& e) {
        // nlohmann's message starts with "[json.exception.parse_error.101] parse error at line 1, ...".
        std::string what = e.what();
        if (const auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
        throw BadLine{"not valid JSON: " + what};
      }
      if (!obj.is_object()) throw BadLine{fmt::format("expected a JSON object, got {}", obj.type_name())};
      if (file.format == TaskFormat::Auto) {
        file.format = detect(obj);
        if (file.format == TaskFormat::Auto)
          throw Error(
              fmt::format("{}:{}: cannot tell the task format from this line's fields (expected "
                          "'question' for GSM8K, 'unique_id'/'solution' for MATH-500, 'id' for "
                          "kvevict tasks); pass --format",
                          path, line));
      }
      EvalTask t = make_task(obj, file.format, line);
      if (const auto it = seen.find(t.id); it != seen.end())
        throw BadLine{fmt::format("duplicate id '{}' (first on line {})", t.id, it->second)};
      seen.emplace(t.id, line);
      t.index = static_cast<int64_t>(file.tasks.size());
      file.tasks.push_back(std::move(t));
      if (opts.limit > 0 && static_cast<int64_t>(file.tasks.size()) >= opts.limit) break;
    } catch (const BadLine& bad) {
      const std::string msg = fmt::format("{}:{}: {}", path, line, bad.reason);
      if (opts.on_bad_line == BadLinePolicy::Stop) throw Error(msg + " (--bad-lines skip skips such lines)");
      ++file.skipped;
      if (opts.warn) opts.warn(msg + "; line skipped");
    }
  }
  if (in.bad()) throw Error(fmt::format("{}: read error", path));
  if (file.tasks.empty())
    throw Error(fmt::format("{}: no tasks ({} lines read, {} skipped)", path, line, file.skipped));
  return file;
}

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

std::optional<int64_t> once_code_offset(const std::string& problem) {
  // A once problem: question line "@NNNS\n" last, a code line "#P\n" on its own line.
  if (problem.size() < 9 || problem[problem.size() - 6] != '@') return std::nullopt;
  const size_t hash = problem.find('#');
  if (hash == std::string::npos || hash + 2 >= problem.size() || (hash > 0 && problem[hash - 1] != '\n') ||
      !std::isdigit(static_cast<unsigned char>(problem[hash + 1])) || problem[hash + 2] != '\n')
    return std::nullopt;
  return static_cast<int64_t>(hash + 1);
}

std::string tasks_digest(const std::vector<EvalTask>& tasks) {
  uint64_t h = fnv1a64("");
  for (const EvalTask& t : tasks) {
    // Length-prefixed fields, so ("ab","c") and ("a","bc") differ.
    for (const std::string* f : {&t.id, &t.problem, &t.answer}) {
      h = fnv1a64(fmt::format("{}:", f->size()), h);
      h = fnv1a64(*f, h);
    }
  }
  return fmt::format("{:016x}", h);
}

}  // namespace kvevict
