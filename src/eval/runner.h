// The rollouts of `kvevict eval`: for each problem and each (policy, budget) cell, the missing
// rollouts are decoded as one batch through the engine's generation component
// (engine/generation.h, Engine::decode_batch), graded, and handed to a callback as soon as each
// one finishes.
//
// Source: the paper's protocol (docs/eviction-spec.md §4): sampling with temperature / top-p (top-k
// off by default), a length cap that counts the prompt, grading of the last \boxed{}.
// Determinism: rollout r of problem p is sequence rollout_sequence_id(p, r) in every cell, and
// its token at step t is drawn from Rng(stream_id({seed, sequence id, t, tag})) (generation.h), so a rollout's
// text depends only on (settings, problem, cell, r): not on threads, shards, the order of work,
// or which other rollouts run beside it. Paired cells share sampling streams.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "eval/prompt.h"
#include "eval/results.h"
#include "eval/task_file.h"

namespace kvevict {

/// One grid cell ready to run.
struct EvalCell {
  CellSpec spec;
  CheckedPolicy kv;  ///< policy and schedule (engine/policy_settings.h)
};

/// Decoding settings shared by every rollout.
struct RolloutOptions {
  int rollouts = 1;            ///< per problem and cell
  SamplerConfig sampler;       ///< sampler.seed is the base seed of the sampling streams
  int64_t max_length = 32768;  ///< prompt + generated tokens
  int64_t max_new_tokens = 0;  ///< extra cap on generated tokens (0 = none)
};

/// Sequence id of rollout `rollout` of the problem `problem_id` (also the id the eviction
/// selectors see): stream_id({fnv1a64(problem_id), rollout}).
uint64_t rollout_sequence_id(const std::string& problem_id, int rollout);

/// Index in `prompt` [T] of the token that holds a once task's code digit (the fact stated once,
/// once_code_offset, eval/task_file.h): the first token at which the decoded prompt contains
/// "#<digit>". nullopt when `problem` is not a once problem or no token completes the code.
std::optional<int64_t> fact_token_position(const Tokenizer& tok, std::span<const int32_t> prompt,
                                           const std::string& problem);

/// Tokens a rollout may generate after a prompt of `prompt_tokens`: max_length - prompt_tokens,
/// capped by max_new_tokens when that is > 0; <= 0 means the prompt leaves no room.
int64_t generation_cap(const RolloutOptions& opts, int64_t prompt_tokens);

/// Decodes rollouts `todo` (indices in [0, opts.rollouts)) of `task` under `cell`, prompt
/// `prompt` [T] (token ids, BOS included), as one batch (generate_batch). Each finished rollout is graded
/// against task.answer and passed to `on_finished` at once (in completion order). A prompt that
/// leaves no room (generation_cap <= 0) yields records with finish "prompt_too_long", no text,
/// not correct. For a once task, RolloutRecord::fact_kept says whether any (layer, KV head) still
/// held the code's slot at the end. Throws kvevict::Error from the engine (e.g. an invalid policy for the budget).
void run_rollouts(Engine& engine, const EvalTask& task, std::span<const int32_t> prompt, const EvalCell& cell,
                  std::span<const int> todo, const RolloutOptions& opts,
                  const std::function<void(RolloutRecord&&)>& on_finished);

/// Runs the grid tasks x cells in that order (problem-major, so an interrupted run holds complete
/// comparisons for its first problems), skipping every rollout whose key `is_done` accepts.
/// prompts: [tasks.size()] token ids per task.
void run_grid(Engine& engine, const std::vector<EvalTask>& tasks, const std::vector<std::vector<int32_t>>& prompts,
              const std::vector<EvalCell>& cells, const RolloutOptions& opts,
              const std::function<bool(const std::string& key)>& is_done,
              const std::function<void(RolloutRecord&&)>& on_finished);

}  // namespace kvevict
