// Greedy full-cache decoding of one problem: see solve.h.
#include "eval/solve.h"

#include <fmt/format.h>

#include "engine/generation.h"
#include "eval/grader.h"
#include "util/error.h"

namespace kvevict {

std::string greedy_solve(Engine& engine, const Model& model, const std::string& problem, int64_t max_new,
                         uint64_t seq_id) {
  if (max_new < 1) throw Error(fmt::format("greedy_solve: max_new {} must be >= 1", max_new));
  const std::vector<int32_t> prompt = model.tokenizer().encode(problem, true);
  GenerationConfig gen;
  gen.sampler.temperature = 0.0f;  // greedy: argmax, lowest id on ties
  gen.max_new_tokens = max_new;
  gen.keep_incomplete_tail = true;
  gen.stop_when = [](const std::string& text) { return text.back() == '}' && extract_last_boxed(text).has_value(); };
  return generate(engine, CheckedPolicy(), {seq_id, prompt}, gen).result.text;
}

}  // namespace kvevict
