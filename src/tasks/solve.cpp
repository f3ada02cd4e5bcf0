// Greedy full-cache decoding of one task: see solve.h.
#include "tasks/solve.h"
#include "eval/grader.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "engine/generation.h"
#include "util/error.h"

namespace kvevict {

std::string greedy_solve(Engine& engine, const Model& model, const Task& task, int64_t max_new, uint64_t seq_id) {
  if (max_new < 1) throw Error(fmt::format("greedy_solve: max_new {} must be >= 1", max_new));
  const std::vector<int32_t> prompt = model.tokenizer().encode(task.problem, true);
  GenerationConfig gen;
  gen.sampler.temperature = 0.0f;  // greedy: argmax, lowest id on ties
  gen.max_new_tokens = max_new;
  gen.keep_incomplete_tail = true;
  gen.stop_when = [](const std::string& text) { return text.back() == '}' && extract_last_boxed(text).has_value(); };
  return generate(engine, CheckedPolicy(), {seq_id, prompt}, gen).result.text;
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
