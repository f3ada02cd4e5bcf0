#include "engine/generation.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "util/error.h"
#include "util/field_error.h"
#include "util/limits.h"
#include "util/memory.h"
#include "util/rng.h"

namespace kvevict {

const char* finish_reason(StopCause cause) {
  switch (cause) {
    case StopCause::None:
      return "";
    case StopCause::Length:
      return "length";
    case StopCause::Eog:
    case StopCause::StopToken:
    case StopCause::StopString:
    case StopCause::Predicate:
      return "stop";
  }
  return "";
}

void validate_generation(const GenerationConfig& cfg, int32_t n_vocab) {
  validate_sampler(cfg.sampler, n_vocab);
  if (cfg.max_new_tokens < 1 || cfg.max_new_tokens > limits::kTokens)
    throw FieldError(Field::MaxNewTokens, "",
                     fmt::format(" {}: must be in [1, {}]", cfg.max_new_tokens, limits::kTokens));
  if (cfg.max_total_tokens < 0 || cfg.max_total_tokens > limits::kTokens)
    throw FieldError(Field::MaxTotalTokens, "",
                     fmt::format(" {}: must be in [0, {}]", cfg.max_total_tokens, limits::kTokens));
  if (cfg.min_tokens < 0 || cfg.min_tokens > limits::kTokens)
    throw FieldError(Field::MinTokens, "", fmt::format(" {}: must be in [0, {}]", cfg.min_tokens, limits::kTokens));
  for (const int32_t t : cfg.stop_token_ids)
    if (t < 0 || t >= n_vocab)
      throw FieldError(Field::StopTokenIds, "", fmt::format(" {}: must be a token id in [0, {})", t, n_vocab));
  if (cfg.logprobs < -1 || cfg.logprobs > kMaxLogprobs)
    throw FieldError(Field::Logprobs, "", fmt::format(" {}: must be in [-1, {}]", cfg.logprobs, kMaxLogprobs));
  const ThinkingConfig& th = cfg.thinking;
  if (th.budget < -1 || th.budget > limits::kTokens)
    throw FieldError(Field::ReasoningBudget, "", fmt::format(" {}: must be in [-1, {}]", th.budget, limits::kTokens));
  if (th.budget >= 0 && (!th.track || th.close_tokens.empty()))
    throw FieldError(Field::ReasoningBudget, "",
                     fmt::format(" {}: needs a chat template whose replies hold a thinking trace", th.budget));
  for (const int32_t t : th.close_tokens)
    if (t < 0 || t >= n_vocab)
      throw FieldError(Field::ReasoningBudget, "",
                       fmt::format(": end-of-thinking token {} must be a token id in [0, {})", t, n_vocab));
}

int64_t generation_limit(const GenerationConfig& cfg, int64_t prompt_len) {
  int64_t limit = cfg.max_new_tokens;
  if (cfg.max_total_tokens > 0) limit = std::min(limit, cfg.max_total_tokens - prompt_len);
  return limit;
}

GenerationState::GenerationState(const Tokenizer& tok, GenerationConfig cfg, uint64_t sequence_id,
                                 std::span<const int32_t> prompt)
    : tok_(&tok),
      cfg_(std::move(cfg)),
      sequence_id_(sequence_id),
      limit_(generation_limit(cfg_, static_cast<int64_t>(prompt.size()))),
      text_(cfg_.stop),
      trace_(cfg_.thinking.starts_open) {
  if (cfg_.sampler.needs_counts()) counts_ = TokenCounts(tok.n_vocab(), prompt);
  if (cfg_.min_tokens > 0) {
    // What would end the sequence before min_tokens is masked (vLLM's MinTokensLogitsProcessor).
    if (!cfg_.ignore_eos) ending_ = tok.eog_ids();
    ending_.insert(ending_.end(), cfg_.stop_token_ids.begin(), cfg_.stop_token_ids.end());
  }
}

StepResult GenerationState::step(std::span<const float> logits) {
  if (finished()) throw Error("GenerationState::step: the sequence already ended");
  if (static_cast<int64_t>(logits.size()) != tok_->n_vocab())
    throw Error(fmt::format("GenerationState::step: {} logits for a vocabulary of {}", logits.size(), tok_->n_vocab()));
  // Raw logits unless something adjusts them (then a copy), so the default path samples from
  // exactly what the model produced.
  std::span<const float> use = logits;
  const bool mask = sampled_ < cfg_.min_tokens && !ending_.empty();
  if (cfg_.sampler.adjusts_logits() || mask) {
    work_.assign(logits.begin(), logits.end());
    adjust_logits(work_, cfg_.sampler, cfg_.sampler.needs_counts() ? &counts_ : nullptr);
    if (mask)
      for (const int32_t t : ending_) work_[static_cast<size_t>(t)] = -std::numeric_limits<float>::infinity();
    use = work_;
  }
  const ThinkingConfig& th = cfg_.thinking;
  // The budget: once `budget` tokens were output inside the trace, the end-of-thinking tokens
  // are output, one a step, instead of sampled ones.
  if (th.budget >= 0 && forced_.empty() && trace_.phase() == ReasoningSplitter::Phase::Trace &&
      trace_tokens_ >= th.budget)
    forced_ = th.close_tokens;
  const bool forced = forced_next_ < forced_.size();
  StepResult r;
  if (forced) {
    r.token = forced_[forced_next_++];
  } else {
    Rng rng(stream_id({cfg_.sampler.seed, sequence_id_, static_cast<uint64_t>(sampled_), kSampleStreamTag}));
    r.token = sample_token(use, cfg_.sampler, rng);
  }
  sampled_ += 1;
  if (cfg_.logprobs >= 0) {
    logprobs_.push_back(token_logprobs(logits, r.token, cfg_.logprobs));
    r.logprobs = &logprobs_.back();
  }
  const bool may_end = sampled_ > cfg_.min_tokens;  // this token is past the first min_tokens
  // A forced token is no end: the model did not choose it.
  if (!forced && !cfg_.ignore_eos && tok_->is_eog(r.token) && may_end) {
    stop_ = StopCause::Eog;
  } else if (!forced && may_end &&
             std::find(cfg_.stop_token_ids.begin(), cfg_.stop_token_ids.end(), r.token) != cfg_.stop_token_ids.end()) {
    stop_ = StopCause::StopToken;
  } else {
    tokens_.push_back(r.token);
    if (cfg_.sampler.needs_counts()) counts_.add_output(r.token);
    const std::string piece = tok_->piece(r.token);
    raw_ += piece;
    if (th.track) count_trace(piece, forced);
    r.text = text_.push(piece, /*match_stops=*/sampled_ >= cfg_.min_tokens);
    if (text_.stopped())
      stop_ = StopCause::StopString;
    else if (cfg_.stop_when && cfg_.stop_when(raw_))
      stop_ = StopCause::Predicate;
  }
  if (stop_ == StopCause::None && sampled_ >= limit_) stop_ = StopCause::Length;
  if (stop_ != StopCause::None) r.tail = text_.flush(cfg_.keep_incomplete_tail);
  r.stop = stop_;
  return r;
}

void GenerationState::count_trace(const std::string& piece, bool forced) {
  using Phase = ReasoningSplitter::Phase;
  const Phase before = trace_.phase();
  if (before == Phase::Answer) return;
  trace_.push(piece);
  const Phase after = trace_.phase();
  if (after == Phase::Start) return;  // undecided: counted once the trace opens
  if (after == Phase::Answer && !trace_.had_trace()) return;  // no trace: nothing counts
  // Every token from the first one to the one that closes the trace is a reasoning token.
  reasoning_tokens_ = static_cast<int64_t>(tokens_.size());
  // Trace tokens: inside the trace, not the opening tag's token, not the forced close.
  if (before == Phase::Trace && after == Phase::Trace && !forced) trace_tokens_ += 1;
}

void generate_batch(Engine& engine, const CheckedPolicy& kv, std::span<const GenerationInput> inputs,
                    const GenerationConfig& cfg, const GenerationCallbacks& callbacks, PromptSharing sharing) {
  const Tokenizer& tok = engine.model().tokenizer();
  validate_generation(cfg, tok.n_vocab());
  struct Live {
    std::unique_ptr<Sequence> seq;
    GenerationState state;
  };
  std::vector<Live> live;
  live.reserve(inputs.size());
  std::vector<float> logits;
  // leader[i]: the earlier input whose prompt input i shares (i itself when none); followers'
  // sequences are forked from their leader right after its prefill.
  std::vector<size_t> leader(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const GenerationInput& in = inputs[i];
    const auto prompt_len = static_cast<int64_t>(in.prompt.size());
    if (prompt_len < 1) throw Error(fmt::format("sequence {}: empty prompt", in.id));
    GenerationState state(tok, cfg, in.id, in.prompt);
    if (state.limit() < 1)
      throw FieldError(Field::MaxTotalTokens, fmt::format("a prompt of {} tokens leaves no room under ", prompt_len),
                       fmt::format(" {}", cfg.max_total_tokens));
    leader[i] = i;
    if (sharing == PromptSharing::On && engine.shared_prompt_slots(kv, prompt_len) > 0)
      for (size_t j = 0; j < i; ++j)
        if (leader[j] == j && std::equal(in.prompt.begin(), in.prompt.end(), inputs[j].prompt.begin(),
                                         inputs[j].prompt.end())) {
          leader[i] = j;
          break;
        }
    live.push_back(Live{nullptr, std::move(state)});  // sequences are made below
  }
  // has_followers[i]: input i leads others, so its prompt goes into a shared segment.
  std::vector<bool> has_followers(inputs.size(), false);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (leader[i] != i) has_followers[leader[i]] = true;
  // The batch's caches are checked against the free memory together first: allocated one by one
  // (each checked alone), 1,024 rollouts would fill the machine before the last was refused.
  if (inputs.size() > 1) {
    int64_t total = 0, largest = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      // A follower allocates what its leader's fork() does: the leader's own slots.
      const size_t l = leader[i];
      const Engine::KvBytes b = engine.sequence_kv_bytes(kv, static_cast<int64_t>(inputs[l].prompt.size()),
                                                         live[l].state.limit(), has_followers[l]);
      total += b.own + (l == i ? b.shared : 0);
      largest = std::max(largest, b.capacity);
    }
    check_available_memory(total, fmt::format("KV caches of {} sequences decoded as one batch (up to {} slots per "
                                              "(layer, KV head) each)",
                                              inputs.size(), largest));
  }
  // Leaders with followers write their prompt into a shared segment; every other input gets a
  // sequence of its own. All are created before any prefill, so a refusal starts nothing.
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (leader[i] != i) continue;
    const auto prompt_len = static_cast<int64_t>(inputs[i].prompt.size());
    live[i].seq = has_followers[i] ? engine.new_shared_sequence(inputs[i].id, kv, prompt_len, live[i].state.limit())
                                   : engine.new_sequence(inputs[i].id, kv, prompt_len, live[i].state.limit());
  }
  // Ends sequence i: hands its sequence and result to the caller (or drops them).
  const auto finish = [&](size_t i) {
    Live& l = live[i];
    GenerationResult res;
    res.id = l.seq->id;
    res.tokens = l.state.tokens();
    res.text = l.state.text();
    res.stop = l.state.stop_cause();
    res.sampled = l.state.sampled();
    res.logprobs = l.state.logprobs();
    res.reasoning_tokens = l.state.reasoning_tokens();
    if (callbacks.on_finished)
      callbacks.on_finished(i, std::move(l.seq), std::move(res));
    else
      l.seq.reset();
  };
  const auto step = [&](size_t i, std::span<const float> row) {
    const StepResult r = live[i].state.step(row);
    if (callbacks.on_token) callbacks.on_token(i, r);
    if (r.stop != StopCause::None) finish(i);
  };
  // Prefill every leader (one pass each, BLAS allowed) and fork its followers, then sample
  // each input's first token in input order (a follower from its leader's prefill logits).
  std::vector<std::vector<float>> first_logits(live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    if (leader[i] == i) {
      engine.prefill(*live[i].seq, inputs[i].prompt, logits);
      for (size_t j = i + 1; j < live.size(); ++j)
        if (leader[j] == i) {
          live[j].seq = engine.fork(*live[i].seq, inputs[j].id);
          first_logits[j] = logits;
        }
      step(i, logits);
    } else {
      step(i, first_logits[i]);
      std::vector<float>().swap(first_logits[i]);
    }
  }
  const auto V = static_cast<size_t>(tok.n_vocab());
  std::vector<Sequence*> seqs;
  std::vector<int32_t> tokens;
  std::vector<size_t> index;
  while (true) {
    seqs.clear(), tokens.clear(), index.clear();
    for (size_t i = 0; i < live.size(); ++i)
      if (live[i].seq) {
        seqs.push_back(live[i].seq.get());
        tokens.push_back(live[i].state.tokens().back());
        index.push_back(i);
      }
    if (seqs.empty()) break;
    engine.decode_batch(seqs, tokens, logits);
    if (callbacks.on_decode)
      for (size_t b = 0; b < index.size(); ++b) callbacks.on_decode(index[b], *seqs[b]);
    for (size_t b = 0; b < index.size(); ++b) step(index[b], std::span<const float>(logits).subspan(b * V, V));
  }
}

GenerationOutput generate(Engine& engine, const CheckedPolicy& kv, const GenerationInput& input,
                          const GenerationConfig& cfg, const GenerationCallbacks& callbacks) {
  if (callbacks.on_finished) throw Error("generate: on_finished is not used (the result is returned)");
  GenerationOutput out;
  GenerationCallbacks cb = callbacks;
  cb.on_finished = [&out](size_t, std::unique_ptr<Sequence> seq, GenerationResult result) {
    out.seq = std::move(seq);
    out.result = std::move(result);
  };
  generate_batch(engine, kv, std::span<const GenerationInput>(&input, 1), cfg, cb);
  return out;
}

}  // namespace kvevict
