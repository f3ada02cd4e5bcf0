// Greedy full-cache decoding of one generated task: the small accuracy check behind
// `kvevict tasks eval` and the shipped model's test (the evaluation harness is `kvevict eval`).
#pragma once

#include <cstdint>
#include <string>

#include "engine/engine.h"
#include "model/model.h"
#include "tasks/generator.h"

namespace kvevict {

/// Prefills BOS + `task.problem` (tokenized by the model's tokenizer) into a new sequence of
/// `engine` with the `full` policy (no eviction), then decodes greedily (argmax, lowest id on
/// ties). Stops at EOS, once the generated text closes a "\boxed{...}", or after `max_new`
/// tokens. Returns the generated text (EOS not included). `seq_id` only labels the sequence.
/// Throws kvevict::Error when max_new < 1 or the prompt exceeds the engine's limits.
std::string greedy_solve(Engine& engine, const Model& model, const Task& task, int64_t max_new,
                         uint64_t seq_id = 0);

/// Default decode limit for `task`: its trace length plus 16 tokens; without a trace, the
/// family's formula for N steps (N from the task's length.steps, else read from the question
/// line). Throws kvevict::Error when neither gives N.
int64_t default_max_new(const Task& task);

}  // namespace kvevict
