// Synthetic reasoning tasks for kvevict's own model: three families whose worked traces have the
// mechanisms the Random Attention paper studies (a prompt needed throughout, a trace that restates
// the state it carries, a fact stated exactly once early and needed only at the end).
//
// Source: shared/docs/reasoner-notes.md (layout lessons). The format is kvevict's own.
//
// Format, shared by every family (one character = one token of the model's vocabulary):
//   problem = M fact lines "XY\n", shuffled, (once only: a code line "#P\n"), then one question
//     line "<marker><NNN>S\n".
//     X, Y are distinct upper-case letters; the facts form ONE random cycle over M letters
//     (X -> Y). NNN is the number of steps N, zero-padded to three digits, S the start letter
//     (last, so that no letter outside a fact line is followed by a letter). The marker names
//     the family: '?' chain, '$' running, '@' once.
//   trace = one line per step i = 1..N with a zero-padded countdown c = N - i, then
//     "\boxed{answer}". X is the current letter, Y = the next one (looked up in the prompt).
//     chain:   "<ccc>X=Y\n"                                      answer: the letter after N steps
//     running: "<ccc>X=Yds\n"  d = letter_value(Y), s = running sum of the d's mod 10 (from 0)
//                                                               answer: final letter, then final s
//     once:    "<ccc>X=Y\n" (chain lines)                       answer: final letter, then P
//              P is the code of the prompt's "#P" line: a digit drawn from its own random stream,
//              so nothing else in the problem or trace depends on it; it is written exactly once
//              ('#' occurs nowhere else) and the trace never restates it. The only way to answer
//              is to read that one slot at the end.
//   What makes the prompt needed throughout: a step's lookup is "the letter right after X". In
//   the prompt every key is immediately followed by its value ("XY"); in the trace never — an
//   upper-case letter there is preceded by a countdown digit, '=' or (the final answer) '{', and
//   followed by '=', a digit, a newline or '}'. However long the trace, the lookup has exactly one answer in the text,
//   in the prompt's fact lines, so a model that learned the key-then-value lookup (a previous-token head plus an
//   induction head) must read the prompt at every step, while the trace restates the state it carries (X, Y and, in
//   running, the sum). The trace does still spell each fact out as "X=Y": with a cycle of M facts and N > M steps no
//   format can keep a step's fact out of the trace's history; whether the model reads it there
//   is measured, not assumed (tools/ablate_prompt.py, models/reasoner/MODEL_CARD.md).
//   History (shared/docs/reasoner-notes.md for the first layouts, models/reasoner/MODEL_CARD.md
//   for the rest): an earlier format wrote "cccXY", so after one cycle of M steps the trace
//   answered the lookups itself; a variant with a digit per fact in the prompt ("XYd", the digit
//   to add looked up too) never learned the digit lookup, so a letter's value is a fixed function
//   the model learns instead. An earlier once wrote "#P" in the trace with P = the running sum of
//   two running lines, so P was derivable from (and written next to) those lines' sum digit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvevict {

/// The three task families.
enum class TaskFamily : uint64_t { Chain = 1, Running = 2, Once = 3 };

/// All families, in id order.
const std::vector<TaskFamily>& all_task_families();

/// Family name as used on the command line and in task files: "chain", "running", "once".
const char* task_family_name(TaskFamily f);

/// Parses a family name (see task_family_name). Throws kvevict::Error listing the valid names.
TaskFamily parse_task_family(const std::string& name);

/// An inclusive integer range [lo, hi]; a fixed value has lo == hi.
struct IntRange {
  int64_t lo = 0, hi = 0;
};

/// Parses "N" or "LO-HI" (both >= 0, LO <= HI). `option` names the option in the error.
/// Throws kvevict::Error on anything else.
IntRange parse_int_range(const std::string& text, const std::string& option);

/// Size knobs of one task. steps: N, the number of trace lines (1..999).
/// facts: M, the number of fact lines = cycle length (2..26).
struct TaskSize {
  int64_t steps = 0;
  int64_t facts = 0;
};

/// Default number of facts (M) when none is given: 20 facts = a prompt of 67 tokens with BOS.
inline constexpr int64_t kDefaultFacts = 20;
/// Largest / smallest allowed N and M.
inline constexpr int64_t kMaxSteps = 999, kMaxFacts = 26, kMinFacts = 2;

/// Smallest N a family accepts (1 for every family).
int64_t min_steps(TaskFamily f);

/// Throws kvevict::Error when `size` is out of range for `f` (see TaskSize).
void validate_task_size(TaskFamily f, const TaskSize& size);

/// Number of characters (= model tokens) of the trace of a task of family `f` with N = `steps`,
/// including "\boxed{...}" and excluding BOS/EOS. Exact: chain 7N+9, running 9N+10, once 7N+10.
int64_t trace_length(TaskFamily f, int64_t steps);

/// Number of characters of the problem of family `f` with M = `facts` (excluding BOS): 3M + 6,
/// once 3M + 9 (its code line "#P\n").
int64_t problem_length(TaskFamily f, int64_t facts);

/// N read back from a problem's question line "<marker><NNN>S\n" (its last line); nullopt when
/// the problem does not end with one.
std::optional<int64_t> question_steps(const std::string& problem);

/// The value a running line adds for letter `letter` ('A'..'Z'): its alphabet index mod 10
/// (A = 0, ..., J = 9, K = 0, ...). Fixed, so the model learns it (not a lookup).
int letter_value(char letter);

/// The N whose trace length is closest to `tokens` (at least min_steps(f), at most kMaxSteps).
/// Throws kvevict::Error when `tokens` < 1.
int64_t steps_for_trace_length(TaskFamily f, int64_t tokens);

/// One generated task.
struct Task {
  std::string id;  ///< "<family>-<seed>-<index>"
  TaskFamily family = TaskFamily::Chain;
  std::string problem;  ///< the prompt (fact lines + question line), ends with '\n'
  std::string trace;    ///< the full worked trace, ends with "\boxed{answer}"
  std::string answer;   ///< the gold answer (the text inside the final \boxed{})
  TaskSize size;        ///< N and M actually used
};

/// Generates task number `index` of `family` for `seed`. All randomness comes from
/// Rng(stream_id({seed, family id, index})), so a task depends only on (seed, family, index,
/// size) — never on how many tasks are generated or in which order. Throws kvevict::Error when
/// `size` is invalid.
Task generate_task(TaskFamily family, const TaskSize& size, uint64_t seed, uint64_t index);

/// Generates tasks first_index .. first_index+n-1. When a range is not fixed, each task draws its
/// N and M uniformly from the ranges with its own stream (stream_id({seed, family, index, 1})).
/// Throws kvevict::Error when n < 0 or a range is invalid for the family.
std::vector<Task> generate_tasks(TaskFamily family, IntRange steps, IntRange facts, uint64_t seed, int64_t n,
                                 uint64_t first_index = 0);

/// One JSON object (single line, no trailing newline) in kvevict's task format:
/// {"id", "family", "problem", "answer", "trace", "length": {"steps", "facts", "problem_tokens",
/// "trace_tokens"}}.
std::string task_to_json(const Task& t);

/// Parses one line written by task_to_json back into a Task. Throws kvevict::Error on malformed
/// JSON, a missing field or an unknown family.
Task task_from_json(const std::string& line);

/// Default decode limit for `task` (greedy_solve, eval/solve.h): its trace length plus 16
/// tokens; without a trace, the family's formula for N steps (N from the task's length.steps,
/// else read from the question line). Throws kvevict::Error when neither gives N.
int64_t default_max_new(const Task& task);

}  // namespace kvevict
