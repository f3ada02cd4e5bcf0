// Greedy full-cache decoding of one problem, stopping at its answer: the small accuracy check
// behind `kvevict tasks eval` and the shipped model's test (the evaluation harness with policies,
// sampling and statistics is the rollout runner, eval/runner.h).
#pragma once

#include <cstdint>
#include <string>

#include "engine/engine.h"
#include "model/model.h"

namespace kvevict {

/// Prefills BOS + `problem` (tokenized by the model's tokenizer) into a new sequence of `engine`
/// with the `full` policy (no eviction), then decodes greedily (argmax, lowest id on ties). Stops
/// at an end-of-generation token, once the generated text closes a "\boxed{...}"
/// (extract_last_boxed, eval/grader.h), or after `max_new` tokens. Returns the generated text
/// (the end-of-generation token not included). `seq_id` only labels the sequence. Throws
/// kvevict::Error when max_new < 1 or the prompt exceeds the engine's limits.
std::string greedy_solve(Engine& engine, const Model& model, const std::string& problem, int64_t max_new,
                         uint64_t seq_id = 0);

}  // namespace kvevict
