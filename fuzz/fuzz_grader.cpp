// libFuzzer harness: the answer grader with responses up to 1 MB (run with -max_len=1048576).
// The input is a response; its first line (up to 200 bytes) also serves as a gold answer. Every
// call must return (grade_response is noexcept and linear time; -timeout catches a hang) and
// never report GradeOutcome::GraderError.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "eval/grader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string_view first = text.substr(0, std::min(text.find('\n'), size_t{200}));
  for (const auto grading : {kvevict::Grading::Math, kvevict::Grading::Gsm8k, kvevict::Grading::Exact}) {
    for (const std::string_view gold : {std::string_view("\\frac{1}{2}"), first}) {
      const kvevict::Grade g = kvevict::grade_response(text, gold, grading);
      if (g.outcome == kvevict::GradeOutcome::GraderError) __builtin_trap();
    }
  }
  (void)kvevict::math_answers_equal(first, text.substr(first.size()));
  (void)kvevict::numeric_value(kvevict::normalize_math_answer(first));
  return 0;
}
