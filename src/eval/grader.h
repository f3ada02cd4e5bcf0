// Answer extraction and grading for the accuracy harness (`kvevict eval`).
//
// Source: the paper's protocol (docs/eviction-spec.md §4): grade the content of the last `\boxed{}`
// of a response. Equivalence rules for MATH-style answers are kvevict's own and are listed on
// normalize_math_answer and math_answers_equal; they are checked against the PyPI package
// math-verify over the MATH-500 and GSM8K golds (tests/eval_grader_reference_test.cpp; the
// disagreements are listed in docs/cli.md "Grading"). GSM8K's gold answer is the text after "####"
// (openai/grade-school-math data format); the project's own tasks are graded by exact match.
//
// Every function here runs in time linear in its input (no std::regex, no recursion on the
// input's nesting), so a model that loops inside a box cannot stall or crash a run.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kvevict {

/// How a task's answer is compared with the gold answer.
enum class Grading {
  Math,   ///< MATH-500: last \boxed{} content, compared with math_answers_equal
  Gsm8k,  ///< GSM8K: last \boxed{} (else a "#### N" line) compared with math_answers_equal
  Exact,  ///< project tasks: last \boxed{} content, surrounding whitespace trimmed, byte-equal
};

/// Longest answer (bytes) that is compared: an extracted answer or a gold above it is graded
/// wrong with outcome GradeOutcome::AnswerTooLong / GoldTooLong. The longest MATH-500 gold is 53
/// bytes, so this leaves ~20x headroom.
inline constexpr size_t kMaxAnswerBytes = 1000;

/// Relative tolerance used only when one side is written as a decimal and the other side's exact
/// value has no finite decimal expansion (e.g. `4.6666666666667` against `\frac{14}{3}`):
/// |a - b| <= kDecimalRelTol * max(|a|, |b|), with no absolute floor.
inline constexpr double kDecimalRelTol = 1e-9;

/// Content of the last complete `\boxed{...}` (or `\fbox{...}`) in `text`, braces balanced
/// (escaped `\{` `\}` do not count), or of `\boxed X` (a brace-less argument up to the next
/// whitespace or '$'). An unterminated last box is skipped in favour of the previous complete one.
/// nullopt when there is none.
std::optional<std::string> extract_last_boxed(std::string_view text);

/// Byte range [begin, end) of what extract_last_boxed returns, within `text`.
struct BoxedRange {
  size_t begin = 0, end = 0;
};
/// Where extract_last_boxed's content lies in `text` (the same rules); nullopt when it has none.
std::optional<BoxedRange> last_boxed_range(std::string_view text);

/// Canonical form of a MATH-style answer, so that reformatted variants compare equal as strings:
/// strips `$`, `\left`/`\right`, spacing commands (`\!`, `\,`, `\;`, `\:`, `\ `, `~`), `\displaystyle`,
/// degrees (`^\circ`, `^{\circ}`, `°`), `\%`/`%`, dollar signs, trailing units written as
/// `\text{..}`/`\mbox{..}` (optionally `^2`/`^3`) or as a plain word after a number, a leading
/// `x =` / `x \in` (a one- or two-letter name); unwraps `\text{}`, `\textbf{}`, `\mathrm{}`,
/// `\mbox{}`; maps `\dfrac`/`\tfrac` to `\frac`; adds the braces of `\frac43`, `\frac 59`,
/// `\frac9{19}`, `\sqrt2`; removes all whitespace; removes thousands separators from a single
/// number (`10,\!080` -> `10080`); writes `.5` as `0.5`; reduces a lone choice `(C)` to `C`.
std::string normalize_math_answer(std::string_view answer);

/// Value of a normalized answer that is one real number: an integer or decimal (optionally
/// signed), `\frac{a}{b}`, `a/b`, `-\frac{a}{b}`, or a mixed number `1\frac{4}{5}` (= 9/5) whose
/// parts are plain numbers. nullopt for anything else (expressions, tuples, text, b = 0).
std::optional<double> numeric_value(std::string_view normalized);

/// True when the two answers are equivalent. In order: false when either is empty after
/// normalize_math_answer or longer than kMaxAnswerBytes; true when the normalized strings are
/// equal; when both are numbers (the forms of numeric_value), they are compared as exact
/// rationals (128-bit numerator and denominator; `\frac{2}{4}` equals `0.5` and `\frac12`,
/// `1000000001` differs from `1000000000`), except that a decimal matches a value with no finite
/// decimal expansion within kDecimalRelTol; anything else is false.
bool math_answers_equal(std::string_view gold, std::string_view predicted);

/// GSM8K gold answer from its "answer" field: the text after the last "####", trimmed, with
/// thousands commas removed. nullopt when there is no "####".
std::optional<std::string> gsm8k_gold(std::string_view answer_field);

/// How the grader reached its verdict; recorded with every rollout ("grade" in rollouts.jsonl).
enum class GradeOutcome {
  Graded,         ///< an answer was extracted and compared with the gold
  NoAnswer,       ///< no answer in the response (wrong)
  AnswerTooLong,  ///< the extracted answer exceeds kMaxAnswerBytes (wrong, not compared)
  GoldTooLong,    ///< the gold answer exceeds kMaxAnswerBytes (wrong, not compared)
  GraderError,    ///< the grader threw (e.g. out of memory); Grade::error says what (wrong)
};

/// Stable snake-case name ("graded", "no_answer", "answer_too_long", "gold_too_long",
/// "grader_error").
const char* grade_outcome_name(GradeOutcome o);

/// Outcome of grading one response.
struct Grade {
  std::optional<std::string> extracted;  ///< the answer taken from the response (none: no box, or too long)
  bool correct = false;
  GradeOutcome outcome = GradeOutcome::Graded;
  std::string error;  ///< what failed, for GradeOutcome::GraderError
};

/// Extracts the answer of `response` as `grading` says and compares it with `gold`. Never
/// throws: any failure is returned as GradeOutcome::GraderError (graded wrong), so one rollout's
/// text cannot end a run. Linear time in response.size() + gold.size().
Grade grade_response(std::string_view response, std::string_view gold, Grading grading) noexcept;

}  // namespace kvevict
