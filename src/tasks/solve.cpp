// Greedy full-cache decoding of one task: see solve.h.
#include "tasks/solve.h"
#include "eval/grader.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "engine/sampler.h"
#include "eviction/registry.h"
#include "util/error.h"

namespace kvevict {

std::string greedy_solve(Engine& engine, const Model& model, const Task& task, int64_t max_new, uint64_t seq_id) {
  if (max_new < 1) throw Error(fmt::format("greedy_solve: max_new {} must be >= 1", max_new));
  const Tokenizer& tok = model.tokenizer();
  const std::vector<int32_t> prompt = tok.encode(task.problem, true);
  const Policy policy = make_policy("full");
  const EvictionConfig cfg{};
  auto seq = engine.new_sequence(seq_id, policy, cfg, static_cast<int64_t>(prompt.size()), max_new);
  std::vector<float> logits;
  engine.prefill(*seq, prompt, logits);
  std::string out;
  for (int64_t i = 0; i < max_new; ++i) {
    const int32_t next = argmax(logits);
    if (tok.is_eog(next)) break;
    out += tok.piece(next);
    if (out.back() == '}' && extract_last_boxed(out)) break;
    if (i + 1 < max_new) engine.decode(*seq, next, logits);
  }
  return out;
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
