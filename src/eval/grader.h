// Answer extraction and grading for the accuracy harness (`kvevict eval`).
//
// Source: the paper's protocol (docs/eviction-spec.md §4): grade the content of the last `\boxed{}`
// of a response. Equivalence rules for MATH-style answers are kvevict's own and are listed on
// normalize_math_answer; GSM8K's gold answer is the text after "####" (openai/grade-school-math
// data format); the project's own tasks are graded by exact match.
#pragma once

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

/// Content of the last complete `\boxed{...}` (or `\fbox{...}`) in `text`, braces balanced
/// (escaped `\{` `\}` do not count), or of `\boxed X` (a brace-less argument up to the next
/// whitespace or '$'). An unterminated last box is skipped in favour of the previous complete one.
/// nullopt when there is none.
std::optional<std::string> extract_last_boxed(std::string_view text);

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

/// True when the two answers are equivalent: equal after normalize_math_answer, or both numbers
/// (numeric_value) within a relative tolerance of 1e-9.
bool math_answers_equal(std::string_view gold, std::string_view predicted);

/// GSM8K gold answer from its "answer" field: the text after the last "####", trimmed, with
/// thousands commas removed. nullopt when there is no "####".
std::optional<std::string> gsm8k_gold(std::string_view answer_field);

/// Outcome of grading one response.
struct Grade {
  std::optional<std::string> extracted;  ///< the answer taken from the response (none: no box)
  bool correct = false;
};

/// Extracts the answer of `response` as `grading` says and compares it with `gold`.
Grade grade_response(std::string_view response, std::string_view gold, Grading grading);

/// Stable lower-case name ("math", "gsm8k", "exact").
const char* grading_name(Grading g);

}  // namespace kvevict
