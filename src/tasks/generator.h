// Synthetic reasoning tasks for kvevict's own model: five families whose worked traces have the
// mechanisms the Random Attention paper studies. Three test whether the prompt survives (a prompt
// needed at every step; a trace that restates the state it carries; a fact stated once in the
// prompt and needed only at the end). Two test whether the trace survives: a value computed in
// the trace and needed again far later, written M times (`recall`), or written once and re-read
// at M far points (`revisit`).
//
// Source: shared/docs/reasoner-notes.md (layout lessons). The format is kvevict's own.
//
// Format, shared by every family (one character = one token of the model's vocabulary):
//   problem = fact lines "XY\n", shuffled, (once only: a code line "#P\n"), then one question
//     line. X, Y are distinct upper-case letters; X -> Y is a fact. No letter outside a fact line
//     is ever followed by a letter, so "the letter right after X" has exactly one answer in the
//     text: the fact line of X.
//   trace = worked lines, then "\boxed{answer}".
//
// Prompt-survival families (question "<marker><NNN>S\n": N = steps, zero-padded, S the start
// letter; the M facts form ONE random cycle over M letters). Trace: one line per step i = 1..N
// with a zero-padded countdown c = N - i; X is the current letter, Y = the next one (looked up in
// the prompt).
//     chain   ('?'):  "<ccc>X=Y\n"                             answer: the letter after N steps
//     running ('$'):  "<ccc>X=Yds\n"  d = letter_value(Y), s = running sum of the d's mod 10 (from 0)
//                                                              answer: final letter, then final s
//     once    ('@'):  "<ccc>X=Y\n" (chain lines)              answer: final letter, then P
//              P is the code of the prompt's "#P" line: a digit drawn from its own random stream,
//              so nothing else in the problem or trace depends on it; it is written exactly once
//              ('#' occurs nowhere else) and the trace never restates it. The only way to answer
//              is to read that one slot at the end.
//   What they test: a step's lookup is "the letter right after X". In the prompt every key is
//   immediately followed by its value ("XY"); in the trace never (an upper-case letter there is
//   preceded by a countdown digit, '=' or '{', and followed by '=', a digit, a newline or '}').
//   So a model that learned the key-then-value lookup (a previous-token head plus an induction
//   head) must read the prompt at every step, while the trace restates the state it carries. With
//   the prompt pinned, any policy that keeps the newest line succeeds: these families test
//   prompt protection, not the trace. (The trace does spell each fact out as "X=Y"; whether the
//   model reads it there is measured: tools/ablate_prompt.py, models/reasoner/MODEL_CARD.md.)
//
// Trace-survival families: recall ('%') and revisit ('^'). The facts form TWO disjoint random
// cycles: cycle A over K + 2 letters (K = the depth, >= 3) and cycle B over the other F - K - 2
// (F = facts). Question line "<marker><R>><e>+<b><NNN><a>\n": R = the restate count (1, 2, 4
// or 8), e = the letter where phase A ends, b = phase B's start letter, NNN = N, the number of
// step lines (zero-padded), a = phase A's start letter. Every value a later line needs from the
// question sits right after its own key character (R after the marker, e after '>', b after
// '+'), so it is found by content at any distance; N and a sit where the first trace line reads
// them, at a fixed offset. The countdown c = N - i runs over the whole trace.
//   phase A, K lines: the walk on cycle A from a to e, written as running lines "<ccc>X=Yds\n";
//     the K-th line (Y = e) writes "<ccc>X=Yd&V\n" instead: V = the running sum s after K steps
//     (a digit), the value the answer needs again. It is computed in the trace from cycle A's
//     facts: the sum of the values of the K letters after a (the last is e), so even with a and e
//     read from the question it takes K - 1 >= 2 chained lookups; '&' is its key.
//   phase B, N - K lines: the walk on cycle B from b, as chain lines "<ccc>X=Y\n". After a line
//     whose countdown c > 0 is a multiple of P = kTraceSpan / R (R > 1), one extra line:
//       recall:  "&V\n"   (a restatement: another copy of V)
//       revisit: "!W\n"   W = (V + letter_value(Y)) mod 10 with Y that line's letter: V is re-read
//                         and used, not restated
//   answer:  recall  "Y&V" (Y = the final letter: key '&' then V, so the recall is the lookup
//            "the digit right after '&'");  revisit "Y!W" (W as above, with the final letter).
//   With N - K = kTraceSpan the trace holds exactly R copies of V (recall: the phase-A line and
//   R - 1 restatements; revisit: the phase-A line only, read again at R - 1 checkpoints and the
//   answer), evenly spaced kTraceSpan / R lines apart, the last one kTraceSpan / R lines
//   (~7 tokens a line) before the answer. With R = 1 the value is written once, about
//   7 * (N - K) tokens before it is needed. Outside its copies V is carried only by its inputs
//   (cycle A's facts, a and e, in the prompt) and its computation (phase A's lines): the rest of
//   the text is independent of it (tests/tasks_test.cpp proves it over 20,000 tasks). With the
//   prompt pinned, losing every copy leaves only a K-step recomputation, which the format never
//   asks for: the model must read a copy.
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

/// The task families (ids are part of every task's random stream: never renumber).
enum class TaskFamily : uint64_t { Chain = 1, Running = 2, Once = 3, Recall = 4, Revisit = 5 };

/// All families, in id order.
const std::vector<TaskFamily>& all_task_families();

/// Family name as used on the command line and in task files: "chain", "running", "once",
/// "recall", "revisit".
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

/// Whether `f` is a trace-survival family (recall, revisit): two cycles, a depth and a restate
/// count (see the format above).
bool is_trace_family(TaskFamily f);

/// Size knobs of one task. steps: N, the number of trace step lines (1..999). facts: the number
/// of fact lines (2..26; for one cycle it is the cycle length). depth: K, recall/revisit only
/// (kMinDepth..kMaxDepth, facts >= K + 4); 0 for the other families. restate: R, recall/revisit only
/// (1, 2, 4 or 8); 1 for the other families.
struct TaskSize {
  int64_t steps = 0;
  int64_t facts = 0;
  int64_t depth = 0;
  int64_t restate = 1;
};

/// recall/revisit: with N - K = kTraceSpan step lines after phase A, the value has exactly R
/// copies (recall) or reads (revisit), kTraceSpan / R lines apart.
inline constexpr int64_t kTraceSpan = 160;
/// recall/revisit: smallest, default and largest depth K (phase-A lines).
inline constexpr int64_t kMinDepth = 3, kDefaultDepth = 6, kMaxDepth = 20;

/// recall/revisit: lines between restatements (or checkpoints), kTraceSpan / R; 0 for R = 1.
int64_t restate_period(int64_t restate);

/// Default number of facts (M) when none is given: 20 facts = a prompt of 67 tokens with BOS.
inline constexpr int64_t kDefaultFacts = 20;
/// Largest / smallest allowed N and M.
inline constexpr int64_t kMaxSteps = 999, kMaxFacts = 26, kMinFacts = 2;

/// Smallest N a family accepts: 1, recall/revisit kDefaultDepth + 1.
int64_t min_steps(TaskFamily f);
/// Smallest N for `size` (recall/revisit: size.depth + 1; else min_steps(f)).
int64_t min_steps(TaskFamily f, const TaskSize& size);

/// `size` with the family's defaults filled in where they are unset (recall/revisit: depth 0 ->
/// kDefaultDepth; other families: depth 0, restate 1).
TaskSize with_defaults(TaskFamily f, TaskSize size);

/// Throws kvevict::Error when `size` is out of range for `f` (see TaskSize).
void validate_task_size(TaskFamily f, const TaskSize& size);

/// Number of characters (= model tokens) of the trace of a task of family `f` and size `size`,
/// including "\boxed{...}" and excluding BOS/EOS. Exact: chain 7N+9, running 9N+10, once 7N+10;
/// recall/revisit 9K + 1 + 7(N - K) + 3 * #restatements + 11, with #restatements =
/// floor((N - K - 1) / P) for P = restate_period(R) > 0, else 0.
int64_t trace_length(TaskFamily f, const TaskSize& size);
/// trace_length with N = `steps` and the family's default depth and restate count.
int64_t trace_length(TaskFamily f, int64_t steps);

/// Number of characters of the problem of family `f` with `facts` fact lines (excluding BOS):
/// 3 * facts + 6; once + 3 (its code line "#P\n"); recall/revisit 3 * facts + 11.
int64_t problem_length(TaskFamily f, int64_t facts);

/// N read back from a problem's question line "<marker><NNN>S\n" (its last line); nullopt when
/// the problem does not end with one.
std::optional<int64_t> question_steps(const std::string& problem);

/// The size of a problem read back from its text alone (N from the question line; facts = the
/// number of fact lines; recall/revisit: R from the question and K = the steps from a to e on
/// their cycle). nullopt when the text is not a problem of family `f`.
std::optional<TaskSize> size_from_problem(TaskFamily f, const std::string& problem);

/// Where the value V of a recall/revisit task is written: character offsets into `trace` of each
/// copy's digit V (recall: the phase-A line and every "&V" restatement; revisit: the phase-A
/// line only), in order. Read from the trace text: every '&' before the final "\boxed{" is
/// followed by V. Empty for the other families.
std::vector<int64_t> value_copy_offsets(TaskFamily f, const std::string& trace);

/// The value a running line adds for letter `letter` ('A'..'Z'): its alphabet index mod 10
/// (A = 0, ..., J = 9, K = 0, ...). Fixed, so the model learns it (not a lookup).
int letter_value(char letter);

/// The N whose trace length is closest to `tokens` (at least min_steps(f), at most kMaxSteps),
/// for the family's default depth and restate count. Throws kvevict::Error when `tokens` < 1.
int64_t steps_for_trace_length(TaskFamily f, int64_t tokens);
/// The same for a given depth and restate count (`size.steps` is ignored).
int64_t steps_for_trace_length(TaskFamily f, int64_t tokens, const TaskSize& size);

/// One generated task.
struct Task {
  std::string id;  ///< "<family>-<seed>-<index>"
  TaskFamily family = TaskFamily::Chain;
  std::string problem;  ///< the prompt (fact lines + question line), ends with '\n'
  std::string trace;    ///< the full worked trace, ends with "\boxed{answer}"
  std::string answer;   ///< the gold answer (the text inside the final \boxed{})
  TaskSize size;        ///< N, facts, depth and restate count actually used
};

/// Generates task number `index` of `family` for `seed`. All randomness comes from
/// Rng(stream_id({seed, family id, index})), so a task depends only on (seed, family, index,
/// size) — never on how many tasks are generated or in which order. Throws kvevict::Error when
/// `size` is invalid.
Task generate_task(TaskFamily family, const TaskSize& size, uint64_t seed, uint64_t index);

/// Generates tasks first_index .. first_index+n-1. When a range is not fixed, each task draws its
/// N and facts uniformly from the ranges with its own stream (stream_id({seed, family, index,
/// 1})); recall/revisit then draw the depth K from `depth` and R uniformly from `restate` with
/// the same stream. depth {0, 0} = kDefaultDepth; empty `restate` = {1}. Throws kvevict::Error
/// when n < 0 or a range is invalid for the family (recall/revisit: every N in `steps` must
/// exceed every K in `depth`, every facts value be >= K + 4).
std::vector<Task> generate_tasks(TaskFamily family, IntRange steps, IntRange facts, uint64_t seed, int64_t n,
                                 uint64_t first_index = 0, IntRange depth = {0, 0},
                                 const std::vector<int64_t>& restate = {});

/// Parses a restate list "R" or "R1,R2,..." (each 1, 2, 4 or 8). Throws kvevict::Error naming
/// `option` and the value otherwise.
std::vector<int64_t> parse_restate_list(const std::string& text, const std::string& option);

/// One JSON object (single line, no trailing newline) in kvevict's task format:
/// {"id", "family", "problem", "answer", "trace", "length": {"steps", "facts", "problem_tokens",
/// "trace_tokens"}}; recall/revisit add "depth" and "restate" to "length".
std::string task_to_json(const Task& t);

/// Parses one line written by task_to_json back into a Task. Throws kvevict::Error on malformed
/// JSON, a missing field or an unknown family.
Task task_from_json(const std::string& line);

/// Default decode limit for `task` (greedy_solve, eval/solve.h): its trace length plus 16
/// tokens; without a trace, the family's formula for N steps (N from the task's length.steps,
/// else read from the question line). Throws kvevict::Error when neither gives N.
int64_t default_max_new(const Task& task);

}  // namespace kvevict
