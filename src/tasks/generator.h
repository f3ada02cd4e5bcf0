// Synthetic reasoning tasks for kvevict's own model: three families whose worked traces have the
// mechanisms the Random Attention paper studies (a prompt needed throughout, a trace that restates
// the state it carries, a value stated once early and needed only at the end).
//
// Source: issue 6 and shared/docs/reasoner-notes.md (layout lessons). The format is kvevict's own.
//
// Format, shared by every family (one character = one token of the model's vocabulary):
//   problem = M fact lines "XYd\n", shuffled, then one question line "<marker>S<NNN>\n".
//     X, Y are distinct upper-case letters; the facts form ONE random cycle over M letters
//     (X -> Y), d is a digit attached to the step X -> Y. S is the start letter, NNN the number
//     of steps N, zero-padded to three digits. The marker names the family: '?' chain,
//     '$' running, '@' once.
//   trace = one line per step i = 1..N with a zero-padded countdown c = N - i, then
//     "\boxed{answer}".
//     chain:   "<ccc>XY\n"                             answer: the letter after N steps
//     running: "<ccc>XYds\n"  d = the digit of fact X, s = running sum of d mod 10 (from 0)
//                                                      answer: final letter, then final s
//     once:    steps 1-2 as running lines, then "#P\n" (P = their sum mod 10, written only
//              there), steps 3..N as chain lines      answer: final letter, then P
//   Every earlier occurrence of a key, in the prompt or the trace, is immediately followed by its
//   value (and every value Y by the digit of the step into it), so a previous-token head plus an
//   induction head suffice for every lookup (shared/docs/reasoner-notes.md: a first layout that
//   wrote the trace pair as "X>Y" left the lookup at chance for 1.2M training tokens).
//   Redundancy, by design of each family: chain and running restate every fact they use in the
//   trace, so once the chain has gone around the cycle (M steps) the trace holds every fact;
//   before that, each step needs the prompt. once's passcode exists only in its "#P" line.
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

/// Size knobs of one task. steps: N, the number of trace lines (1..999; once: 3..999).
/// facts: M, the number of fact lines = cycle length (2..26).
struct TaskSize {
  int64_t steps = 0;
  int64_t facts = 0;
};

/// Default number of facts (M) when none is given: 20 facts = a prompt of 87 tokens with BOS.
inline constexpr int64_t kDefaultFacts = 20;
/// Largest / smallest allowed N and M.
inline constexpr int64_t kMaxSteps = 999, kMaxFacts = 26, kMinFacts = 2;

/// Smallest N a family accepts (once: 3, since its passcode takes two steps).
int64_t min_steps(TaskFamily f);

/// Throws kvevict::Error when `size` is out of range for `f` (see TaskSize).
void validate_task_size(TaskFamily f, const TaskSize& size);

/// Number of characters (= model tokens) of the trace of a task of family `f` with N = `steps`,
/// including "\boxed{...}" and excluding BOS/EOS. Exact: chain 6N+9, running 8N+10, once 6N+17.
int64_t trace_length(TaskFamily f, int64_t steps);

/// Number of characters of the problem: 4M + 6 (excluding BOS).
int64_t problem_length(int64_t facts);

/// The N whose trace length is closest to `tokens` (at least min_steps(f), at most kMaxSteps).
/// Throws kvevict::Error when `tokens` < 1.
int64_t steps_for_trace_length(TaskFamily f, int64_t tokens);

/// One generated task.
struct Task {
  std::string id;       ///< "<family>-<seed>-<index>"
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

}  // namespace kvevict
