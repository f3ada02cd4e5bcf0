#include "eval/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "engine/generation.h"
#include "eval/grader.h"
#include "util/error.h"
#include "util/rng.h"

namespace kvevict {
namespace {

RolloutRecord base_record(const EvalTask& task, const EvalCell& cell, int rollout, int64_t prompt_tokens) {
  RolloutRecord r;
  r.policy = cell.spec.policy;
  r.budget = cell.spec.budget;
  r.problem_id = task.id;
  r.problem_index = task.index;
  r.rollout = rollout;
  r.prompt_tokens = prompt_tokens;
  r.gold = task.answer;
  return r;
}

}  // namespace

uint64_t rollout_sequence_id(const std::string& problem_id, int rollout) {
  return stream_id({fnv1a64(problem_id), static_cast<uint64_t>(rollout)});
}

std::optional<int64_t> fact_token_position(const Tokenizer& tok, std::span<const int32_t> prompt,
                                           const std::string& problem) {
  if (!once_code_offset(problem)) return std::nullopt;
  // Decoded piece by piece, so any template or tokenizer that keeps the problem text works.
  std::string text;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const size_t before = text.size();
    text += tok.piece(prompt[i]);
    // The token that completes "#<digit>" (a template may hold other '#' characters).
    for (size_t j = std::max<size_t>(before, 1); j < text.size(); ++j)
      if (text[j - 1] == '#' && std::isdigit(static_cast<unsigned char>(text[j]))) return static_cast<int64_t>(i);
  }
  return std::nullopt;
}

int64_t generation_cap(const RolloutOptions& opts, int64_t prompt_tokens) {
  int64_t cap = opts.max_length - prompt_tokens;
  if (opts.max_new_tokens > 0) cap = std::min(cap, opts.max_new_tokens);
  return cap;
}

void run_rollouts(Engine& engine, const EvalTask& task, std::span<const int32_t> prompt, const EvalCell& cell,
                  std::span<const int> todo, const RolloutOptions& opts,
                  const std::function<void(RolloutRecord&&)>& on_finished) {
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  const int64_t cap = generation_cap(opts, prompt_len);
  if (cap <= 0) {
    for (const int r : todo) {
      RolloutRecord rec = base_record(task, cell, r, prompt_len);
      rec.finish = "prompt_too_long";
      rec.grade = grade_outcome_name(GradeOutcome::NoAnswer);
      on_finished(std::move(rec));
    }
    return;
  }
  const Tokenizer& tok = engine.model().tokenizer();
  const int64_t bytes_per_slot = engine.kv_shape().bytes_per_token();
  const std::optional<int64_t> fact_pos = fact_token_position(tok, prompt, task.problem);
  GenerationConfig gen;
  gen.sampler = opts.sampler;
  gen.max_new_tokens = cap;
  gen.keep_incomplete_tail = true;  // the record's text is the generated tokens' bytes
  std::vector<GenerationInput> inputs;
  inputs.reserve(todo.size());
  for (const int r : todo) inputs.push_back({rollout_sequence_id(task.id, r), prompt});
  GenerationCallbacks cb;
  cb.on_finished = [&](size_t i, std::unique_ptr<Sequence> seq, GenerationResult res) {
    RolloutRecord rec = base_record(task, cell, todo[i], prompt_len);
    rec.generated_tokens = static_cast<int64_t>(res.tokens.size());
    // Rollouts end at an end-of-generation token (EOS or any end-of-turn token of the family) or
    // at the cap.
    rec.finish = res.stop == StopCause::Eog ? "eos" : finish_reason(res.stop);
    rec.text = std::move(res.text);
    const Grade g = grade_response(rec.text, task.answer, task.grading);
    rec.extracted = g.extracted;
    rec.correct = g.correct;
    rec.grade = grade_outcome_name(g.outcome);
    if (g.outcome == GradeOutcome::GraderError)
      fmt::print(stderr, "warning: grading rollout {} of {} failed ({}); recorded as wrong\n", todo[i], task.id,
                 g.error);
    const SequenceStats& s = seq->stats;
    rec.rounds = s.rounds;
    rec.peak_slots = s.peak_slots;
    rec.peak_kv_bytes = s.peak_slots * bytes_per_slot;
    rec.kv_bytes = seq->kv.unshared_bytes();  // the same whether or not rollouts shared the prompt
    rec.prefill_ms = s.prefill_ms;
    rec.decode_ms = s.decode_ms;
    rec.score_ms = s.score_ms;
    rec.compact_ms = s.compact_ms;
    if (fact_pos) {
      const KvShape shape = seq->kv.shape();
      bool kept = false;
      for (int layer = 0; layer < shape.n_layers && !kept; ++layer) {
        const int64_t n = seq->kv.length(layer);
        for (int h = 0; h < shape.n_kv_heads && !kept; ++h) {
          const int32_t* pos = seq->kv.positions(layer, h);
          kept = std::find(pos, pos + n, *fact_pos) != pos + n;
        }
      }
      rec.fact_kept = kept;
    }
    seq.reset();  // free the cache before the callback does any I/O
    on_finished(std::move(rec));
  };
  // The rollouts decode as one batch (Engine::decode_batch, bit-identical to one at a time).
  generate_batch(engine, cell.kv, inputs, gen, cb);
}

void run_grid(Engine& engine, const std::vector<EvalTask>& tasks, const std::vector<std::vector<int32_t>>& prompts,
              const std::vector<EvalCell>& cells, const RolloutOptions& opts,
              const std::function<bool(const std::string& key)>& is_done,
              const std::function<void(RolloutRecord&&)>& on_finished) {
  if (prompts.size() != tasks.size())
    throw Error(fmt::format("run_grid: {} prompts for {} tasks", prompts.size(), tasks.size()));
  std::vector<int> todo;
  for (size_t t = 0; t < tasks.size(); ++t) {
    for (const EvalCell& cell : cells) {
      todo.clear();
      for (int r = 0; r < opts.rollouts; ++r)
        if (!is_done(rollout_key(cell.spec.policy, cell.spec.budget, tasks[t].id, r))) todo.push_back(r);
      if (!todo.empty()) run_rollouts(engine, tasks[t], prompts[t], cell, todo, opts, on_finished);
    }
  }
}

}  // namespace kvevict
