// Task files for `kvevict eval`: JSON lines, one problem per line, in one of three formats.
//
// Source: field names of the data files themselves (../shared/data/SOURCES.md):
//   - MATH-500 (openai/prm800k test split): {"problem", "solution", "answer", "subject", "level",
//     "unique_id"}; id = unique_id, gold = answer, graded as Grading::Math.
//   - GSM8K (openai/grade-school-math test.jsonl): {"question", "answer"} where answer ends with
//     "#### N"; id = "gsm8k-<line>", gold = N (gsm8k_gold), graded as Grading::Gsm8k.
//   - kvevict's own format (written by `kvevict tasks gen`): {"id", "problem", "answer", ...};
//     graded as Grading::Exact. Unknown fields of every format are ignored.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eval/grader.h"

namespace kvevict {

/// Format of a task file.
enum class TaskFormat { Auto, Math500, Gsm8k, Kvevict };

/// Parses "auto", "math500", "gsm8k" or "kvevict". Throws kvevict::Error listing the choices.
TaskFormat parse_task_format(const std::string& name);
/// Lower-case name as accepted by parse_task_format.
const char* task_format_name(TaskFormat f);

/// One problem.
struct EvalTask {
  std::string id;       ///< unique within the file (MATH-500 unique_id, GSM8K "gsm8k-<line>", "id")
  int64_t index = 0;    ///< 0-based position among the tasks read (after skipped lines)
  int64_t line = 0;     ///< 1-based line in the file
  std::string problem;  ///< problem text as given
  std::string answer;   ///< gold answer as graded (GSM8K: the text after "####")
  Grading grading = Grading::Exact;
};

/// What to do with a line that is not valid JSON or lacks a required field.
enum class BadLinePolicy { Stop, Skip };

/// Options of read_tasks.
struct TaskReadOptions {
  TaskFormat format = TaskFormat::Auto;
  BadLinePolicy on_bad_line = BadLinePolicy::Stop;
  int64_t limit = 0;  ///< keep only the first `limit` valid tasks (0 = all)
  /// Receives one "FILE:LINE: reason" message per skipped line (Skip only).
  std::function<void(const std::string&)> warn;
  /// Largest file read (bytes; 0 = no limit). The file is read whole first (read_file_limited),
  /// so /dev/zero or an endless pipe is refused instead of filling memory.
  int64_t max_bytes = 0;
  /// What the path is called in file-level errors (the CLI passes its option, "-f").
  std::string option = "task file";
};

/// The tasks of one file.
struct EvalTaskFile {
  std::string path;
  TaskFormat format = TaskFormat::Auto;  ///< the format actually used (never Auto)
  std::vector<EvalTask> tasks;
  int64_t skipped = 0;  ///< bad lines skipped
};

/// Reads `path`. Blank lines are ignored. With TaskFormat::Auto the format is taken from the
/// first valid JSON object: "question" -> GSM8K, "unique_id" or "solution" -> MATH-500, "id" ->
/// kvevict. Errors (kvevict::Error, message "FILE:LINE: ..."): unreadable file, a file over
/// opts.max_bytes (message "OPTION FILE: ... limit of N bytes ..."); with
/// BadLinePolicy::Stop, the first line that is not a JSON object, lacks a required field or has a
/// field of the wrong type, or repeats an id; a file with no task; a format that cannot be told.
EvalTaskFile read_tasks(const std::string& path, const TaskReadOptions& opts);

/// 64-bit FNV-1a digest of every task's (id, problem, answer), as 16 hex digits: identifies the
/// problem set of a run independently of the file's name or unknown fields.
std::string tasks_digest(const std::vector<EvalTask>& tasks);

/// FNV-1a 64-bit hash of a byte string (Fowler, Noll, Vo). Stable across platforms and runs.
uint64_t fnv1a64(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ull);

/// Character index, in a problem of kvevict's `once` family (tasks/generator.h, which writes the
/// format), of its code digit P: the fact stated once, which the rollout runner follows
/// (fact_token_position, eval/runner.h). nullopt unless the problem is a once problem (question
/// line "@NNNS" last, one "#<digit>" line). Its token position is this + 1 (BOS first).
std::optional<int64_t> once_code_offset(const std::string& problem);

}  // namespace kvevict
