// Greedy full-cache decoding of one problem: see solve.h.
#include "eval/solve.h"

#include <fmt/format.h>

#include "engine/sampler.h"
#include "eval/grader.h"
#include "eviction/registry.h"
#include "util/error.h"

namespace kvevict {

std::string greedy_solve(Engine& engine, const Model& model, const std::string& problem, int64_t max_new,
                         uint64_t seq_id) {
  if (max_new < 1) throw Error(fmt::format("greedy_solve: max_new {} must be >= 1", max_new));
  const Tokenizer& tok = model.tokenizer();
  const std::vector<int32_t> prompt = tok.encode(problem, true);
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

}  // namespace kvevict
