// Generation: everything between "the logits of a step" and "the next token, or finished", in
// one place for every front end. GenerationState makes the per-token decisions of one sequence
// (sampler with logit bias and penalties, end-of-generation tokens, stop tokens, stop strings held
// back from streamed text until they can no longer match, min_tokens, length caps, logprobs);
// generate_batch / generate run sequences to completion through Engine::decode_batch. A caller
// that schedules its own steps (the server's continuous batching with chunked prefill) drives
// GenerationState directly and makes exactly the same decisions.
//
// Determinism: the token of step t (0-based, counting every sampled token) of a sequence with id
// `id` is drawn from Rng(stream_id({sampler.seed, id, t, kSampleStreamTag})), so it depends only
// on (settings, prompt, id): not on the batch, the position in it, the thread count or the other
// sequences. Engine::decode_batch equals per-sequence decode bit for bit (engine.h).
//
// Sources: finish reasons, `stop`, `logprobs`: OpenAI API reference; `min_tokens`,
// `stop_token_ids`, `ignore_eos`: vLLM SamplingParams (min_tokens masks EOS and stop token ids
// and skips stop strings until reached, vllm/engine/output_processor/stop_checker.py); sampler
// fields: engine/sampler.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/reasoning.h"
#include "engine/sampler.h"
#include "engine/text_stream.h"
#include "eviction/schedule.h"
#include "model/tokenizer.h"

namespace kvevict {

/// Tag of every sampling stream (kept from the first `kvevict generate`, so outputs never change).
inline constexpr uint64_t kSampleStreamTag = 0x5A4D504CULL;

/// Why a sequence ended.
enum class StopCause {
  None,        ///< still running
  Eog,         ///< an end-of-generation token (EOS, <|im_end|>, <|eot_id|>, ...), ignore_eos off
  StopToken,   ///< one of stop_token_ids
  StopString,  ///< a stop string appeared in the output text
  Predicate,   ///< the caller's stop_when returned true
  Length,      ///< max_new_tokens, or max_total_tokens with the prompt, reached
};

/// OpenAI's finish_reason: "stop" (Eog, StopToken, StopString, Predicate), "length", "" (None).
const char* finish_reason(StopCause cause);

/// The thinking trace of a reasoning model's reply (engine/reasoning.h): its tokens counted, and
/// its length bounded. Source of the budget: llama-server's `--reasoning-budget` and vLLM's
/// `thinking_token_budget` (after N tokens inside the trace the model is made to close it, and the
/// answer follows).
struct ThinkingConfig {
  bool track = false;        ///< the reply may hold a trace (the chat template has one): count its tokens
  bool starts_open = false;  ///< the prompt opened the trace (ChatTemplate::opens_thinking, thinking on)
  /// Tokens allowed inside the trace (-1 = no limit; 0 closes it at once). Tokens inside the trace
  /// are those after its opening tag ("<think>", written by the model or by the prompt) and before
  /// the end-of-thinking text. Once `budget` of them were output, the next steps output
  /// close_tokens instead of sampling (their logits still give logprobs); then sampling resumes.
  int64_t budget = -1;
  /// The template's end-of-thinking text, tokenised (ChatTemplate::thinking_end_text); must hold
  /// "</think>" when budget >= 0.
  std::vector<int32_t> close_tokens;
};

/// Everything that decides, per step, the next token and whether the sequence ends. Every field
/// past max_new_tokens is off by default.
struct GenerationConfig {
  SamplerConfig sampler;        ///< sampler.seed is the base seed of the sampling streams
  int64_t max_new_tokens = 16;  ///< tokens to sample at most (>= 1), an ending EOG / stop token included
  /// Prompt + sampled tokens at most (>= 0; 0 = none), e.g. the model's context or eval's
  /// --max-length: the sequence ends with Length when it is reached.
  int64_t max_total_tokens = 0;
  /// Tokens to sample before the sequence may end by itself: until then EOG tokens and
  /// stop_token_ids get logit -inf and stop strings do not match (vLLM's min_tokens).
  int64_t min_tokens = 0;
  std::vector<std::string> stop;        ///< stop strings; the output text ends before the first match
  std::vector<int32_t> stop_token_ids;  ///< tokens that end the sequence (not part of the output)
  bool ignore_eos = false;              ///< EOG tokens do not end the sequence; they are output as any token
  /// -1: no logprobs; N >= 0: per step the chosen token's log-probability and the N most likely
  /// alternatives' (token_logprobs, from the raw logits), at most kMaxLogprobs.
  int logprobs = -1;
  /// At the end, an incomplete trailing UTF-8 character is handed out verbatim (a terminal, the
  /// eval's rollout text = the tokens' bytes) instead of dropped (JSON needs valid UTF-8).
  bool keep_incomplete_tail = false;
  /// Called after each output token with every output byte so far (held-back text included);
  /// true ends the sequence with Predicate, the text kept (e.g. "the answer's \boxed{} closed").
  std::function<bool(const std::string& text)> stop_when;
  ThinkingConfig thinking;  ///< off by default
};

/// Largest GenerationConfig::logprobs (OpenAI's top_logprobs limit).
inline constexpr int kMaxLogprobs = 20;

/// Checks a configuration for a vocabulary of n_vocab tokens: validate_sampler, max_new_tokens
/// in [1, limits::kTokens], max_total_tokens and min_tokens in [0, limits::kTokens], stop token
/// ids in [0, n_vocab), logprobs in [-1, kMaxLogprobs], thinking.budget in [-1, limits::kTokens]
/// with thinking.track on and close_tokens given (ids in [0, n_vocab)) when budget >= 0. Throws
/// FieldError naming the field.
void validate_generation(const GenerationConfig& cfg, int32_t n_vocab);

/// Tokens a sequence with a prompt of `prompt_len` may sample: max_new_tokens, capped by
/// max_total_tokens - prompt_len when max_total_tokens > 0. <= 0 means the prompt leaves no room.
int64_t generation_limit(const GenerationConfig& cfg, int64_t prompt_len);

/// What one step decided.
struct StepResult {
  int32_t token = -1;  ///< the sampled token
  std::string text;    ///< output text that became final with this token (may be empty)
  /// When the sequence ended at this step: the text held back until then (a possible stop
  /// string's start, an incomplete character), now final. Streamed after `text`.
  std::string tail;
  StopCause stop = StopCause::None;  ///< None: append `token` (Engine::decode) and step again
  /// The step's log-probabilities when GenerationConfig::logprobs >= 0 (else null); valid until
  /// the next step.
  const TokenLogprobs* logprobs = nullptr;
};

/// The per-token decisions of one sequence. Not thread-safe; one per sequence.
class GenerationState {
 public:
  /// `cfg` must be valid (validate_generation) and is copied. `sequence_id` selects the sampling
  /// streams (header). `prompt`: the sequence's prompt (repetition penalty; its length counts
  /// against max_total_tokens).
  GenerationState(const Tokenizer& tok, GenerationConfig cfg, uint64_t sequence_id, std::span<const int32_t> prompt);

  /// Picks the next token from this step's logits [n_vocab] (the model's raw output) and applies
  /// every stop rule. When the sequence ends, the text still held back is the result's `tail`.
  /// Throws kvevict::Error when called after the sequence ended or with logits of the wrong size.
  StepResult step(std::span<const float> logits);

  bool finished() const { return stop_ != StopCause::None; }
  StopCause stop_cause() const { return stop_; }
  /// Tokens sampled so far, an ending EOG / stop token included (OpenAI's completion_tokens).
  int64_t sampled() const { return sampled_; }
  /// Output token ids (an ending EOG / stop token not included).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  /// Output text handed out so far (complete once finished; a stop string and what follows cut).
  const std::string& text() const { return text_.text(); }
  /// Log-probabilities of every step so far (empty unless cfg.logprobs >= 0).
  const std::vector<TokenLogprobs>& logprobs() const { return logprobs_; }
  /// Tokens of the thinking trace so far (cfg.thinking.track): from the first output token up to
  /// and including the one that completed "</think>" (the opening tag and forced end-of-thinking
  /// tokens included), or every token while the trace is still open; 0 without a trace.
  /// OpenAI's usage.completion_tokens_details.reasoning_tokens.
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  /// Tokens output inside the trace, between its opening tag and its end (what the budget counts).
  int64_t trace_tokens() const { return trace_tokens_; }
  /// Tokens this sequence may sample (generation_limit).
  int64_t limit() const { return limit_; }
  const GenerationConfig& config() const { return cfg_; }

 private:
  /// Follows the trace through one output token's text (forced: a token of the budget's close).
  void count_trace(const std::string& piece, bool forced);

  const Tokenizer* tok_;
  GenerationConfig cfg_;
  uint64_t sequence_id_;
  int64_t limit_;
  int64_t sampled_ = 0;
  StopCause stop_ = StopCause::None;
  std::vector<int32_t> tokens_;
  std::string raw_;  ///< every output byte (stop_when sees it)
  TextStream text_;
  TokenCounts counts_;           ///< only when the penalties need them
  std::vector<int32_t> ending_;  ///< tokens that would end the sequence (masked before min_tokens)
  std::vector<float> work_;      ///< adjusted logits
  std::vector<TokenLogprobs> logprobs_;
  ReasoningSplitter trace_;            ///< where the output is (start, trace, answer)
  int64_t trace_tokens_ = 0;           ///< see trace_tokens()
  int64_t reasoning_tokens_ = 0;       ///< see reasoning_tokens()
  std::vector<int32_t> forced_;        ///< tokens to output instead of sampling (the budget's close)
  size_t forced_next_ = 0;             ///< next of forced_ to output
};

/// One sequence for generate_batch: the id of its sampling and eviction streams, and its prompt
/// (token ids, BOS included when the model adds one).
struct GenerationInput {
  uint64_t id = 0;
  std::span<const int32_t> prompt;
};

/// What one sequence produced.
struct GenerationResult {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  ///< output tokens (an ending EOG / stop token not included)
  std::string text;             ///< output text
  StopCause stop = StopCause::None;
  int64_t sampled = 0;  ///< tokens sampled, an ending EOG / stop token included
  std::vector<TokenLogprobs> logprobs;
  int64_t reasoning_tokens = 0;  ///< GenerationState::reasoning_tokens
};

/// Hooks of generate_batch; `index` is the sequence's position in the inputs. All optional.
struct GenerationCallbacks {
  /// After every step of sequence `index`: the token and the text that became final (streaming).
  std::function<void(size_t index, const StepResult& step)> on_token;
  /// After every decode step of sequence `index` (its cache, statistics and last round are
  /// current; e.g. a keep log).
  std::function<void(size_t index, const Sequence& seq)> on_decode;
  /// When sequence `index` ended: its sequence (cache and statistics) and result, both handed
  /// over (the cache is freed when the callee drops the sequence).
  std::function<void(size_t index, std::unique_ptr<Sequence> seq, GenerationResult result)> on_finished;
};

/// Whether inputs with the same prompt share its KV (Engine::shared_prompt_slots).
enum class PromptSharing {
  On,   ///< the first input of each prompt is prefilled; the others fork from it and read the
        ///< prompt's shared slots (bit-identical outputs, less memory, one prefill)
  Off,  ///< every input prefills and stores its own prompt (the reference for the above)
};

/// Runs every input to its stop conditions under `kv`: creates each sequence with capacity for
/// generation_limit tokens, prefills it (Engine::prefill), then advances every unfinished one
/// together, one Engine::decode_batch per step. With PromptSharing::On, an input whose prompt
/// equals an earlier input's (same token ids) is forked from that one right after its prefill
/// (Engine::fork) when the policy lets sequences share the prompt (Engine::shared_prompt_slots
/// > 0); the outputs do not change. Sequences end in step order, within a step in input order
/// (on_finished is called in that order). Throws FieldError from validate_generation,
/// kvevict::Error when a prompt is empty or leaves no room (generation_limit <= 0), MemoryError
/// (util/memory.h) before any allocation when the batch's caches together exceed the memory
/// available, or from the engine.
void generate_batch(Engine& engine, const CheckedPolicy& kv, std::span<const GenerationInput> inputs,
                    const GenerationConfig& cfg, const GenerationCallbacks& callbacks = {},
                    PromptSharing sharing = PromptSharing::On);

/// One sequence's result and the sequence itself (its cache and statistics).
struct GenerationOutput {
  GenerationResult result;
  std::unique_ptr<Sequence> seq;
};

/// generate_batch for one sequence, returning what on_finished would receive (callbacks.on_finished
/// must be empty). Throws as generate_batch, and kvevict::Error when on_finished is set.
GenerationOutput generate(Engine& engine, const CheckedPolicy& kv, const GenerationInput& input,
                          const GenerationConfig& cfg, const GenerationCallbacks& callbacks = {});

}  // namespace kvevict
