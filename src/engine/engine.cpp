#include "engine/engine.h"

#include <fmt/format.h>

#include <chrono>
#include <exception>

#include "kvcache/kv_pool.h"
#include "util/error.h"
#include "util/memory.h"

namespace kvevict {
namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
// The policy state observes the forward pass only when its selector asked for it.
SelectorState* observer(Sequence& seq) {
  return (seq.policy.selector && seq.policy.selector->needs().any()) ? seq.state.get() : nullptr;
}
bool wants_probs(const Sequence& seq) { return seq.policy.selector && seq.policy.selector->needs().attention; }

// Forwards observations to the sequence's state and adds the time spent to stats.observe_ms, so
// per-token selector work is counted next to the per-round score and compaction times. An
// exception from the state is held until the pass ends (error()): thrown inside the pass it would
// stop it half-way, with some caches of a batch written and others not.
class TimedObserver final : public SelectorState {
 public:
  explicit TimedObserver(Sequence& seq) : inner_(observer(seq)), ms_(seq.stats.observe_ms) {}
  SelectorState* get() { return inner_ ? this : nullptr; }
  void observe(const AttentionObservation& obs) override {
    if (error_) return;  // the state is no longer consistent; its sequence will be ended
    const auto t0 = Clock::now();
    try {
      inner_->observe(obs);
    } catch (...) {
      error_ = std::current_exception();
    }
    ms_ += ms_since(t0);
  }
  const std::exception_ptr& error() const { return error_; }
  void rethrow_if_failed() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  SelectorState* inner_;
  double& ms_;
  std::exception_ptr error_;
};
}  // namespace

Engine::Engine(const Model& model, int n_threads, KvType kv_type)
    : model_(model), rope_(model.config().rope), pool_(n_threads), kv_type_(kv_type) {}

KvShape Engine::kv_shape() const {
  const ModelConfig& c = model_.config();
  return KvShape{c.n_layers, c.n_kv_heads, c.head_dim, kv_type_};
}

void check_kv_type(KvType kv_type, const CheckedPolicy& kv) {
  if (kv_type == KvType::F16 && kv.eviction().positions == PositionMode::Cache && kv.policy().evicts)
    throw FieldError(Field::KvType, "",
                     " f16 cannot be combined with position mode cache (keys are re-rotated in float32)");
}

std::unique_ptr<Sequence> Engine::new_sequence(uint64_t id, const Policy& policy, const EvictionConfig& cfg,
                                               int64_t prompt_len, int64_t max_new_tokens) {
  return new_sequence(id, CheckedPolicy::check(policy, cfg), prompt_len, max_new_tokens);
}

std::unique_ptr<Sequence> Engine::new_sequence(uint64_t id, const CheckedPolicy& kv, int64_t prompt_len,
                                               int64_t max_new_tokens) {
  return make_sequence(id, kv, prompt_len, max_new_tokens, false);
}

std::unique_ptr<Sequence> Engine::make_sequence(uint64_t id, const CheckedPolicy& kv, int64_t prompt_len,
                                                int64_t max_new_tokens, bool share_prompt) {
  const Policy& policy = kv.policy();
  const EvictionConfig& cfg = kv.eviction();
  check_kv_type(kv_type_, kv);
  if (prompt_len < 1) throw Error("a sequence needs a prompt of at least one token");
  if (max_new_tokens < 0) throw Error(fmt::format("max new tokens {} must be >= 0", max_new_tokens));
  const KvBytes bytes = sequence_kv_bytes(kv, prompt_len, max_new_tokens, share_prompt);
  const int64_t cap = bytes.capacity, shared = bytes.shared_slots;
  // The cache is allocated whole and zero-filled (once: a shared prompt is made in place, not
  // swapped in afterwards): past the free memory that is the OOM killer, not an error.
  const std::string how = eviction_disabled(cfg, policy, prompt_len)
                              ? fmt::format("prompt {} + up to {} new tokens", prompt_len, max_new_tokens)
                              : fmt::format("max(budget {}, prompt {}) + round interval {}", cfg.budget, prompt_len,
                                            cfg.round_interval());
  check_available_memory(bytes.own + bytes.shared,
                         fmt::format("KV cache of {} slots per (layer, KV head) = {}", cap, how));
  auto seq = std::make_unique<Sequence>(
      id, policy, cfg,
      shared > 0 ? SequenceKv(kv_shape(), cap, std::make_shared<SharedPromptKv>(kv_shape(), shared))
                 : SequenceKv(kv_shape(), cap));
  seq->prompt_len = prompt_len;
  if (policy.selector) seq->state = policy.selector->make_state(kv_shape());
  return seq;
}

int64_t Engine::shared_prompt_slots(const CheckedPolicy& kv, int64_t prompt_len) const {
  const Policy& policy = kv.policy();
  const EvictionConfig& cfg = kv.eviction();
  const bool evicts = !eviction_disabled(cfg, policy, prompt_len);
  if (evicts && cfg.positions == PositionMode::Cache) return 0;
  if (policy.selector) {
    const auto state = policy.selector->make_state(kv_shape());
    if (state && !state->clone()) return 0;
  }
  return evicts ? std::min(prompt_len, pinned_positions(cfg, policy, prompt_len)) : prompt_len;
}

Engine::KvBytes Engine::sequence_kv_bytes(const CheckedPolicy& kv, int64_t prompt_len, int64_t max_new_tokens,
                                          bool share_prompt) const {
  KvBytes b;
  b.capacity = required_capacity(kv.eviction(), kv.policy(), prompt_len, max_new_tokens);
  // At most capacity - 1 shared slots: a sequence must own room for the token it appends.
  b.shared_slots = share_prompt ? std::min(shared_prompt_slots(kv, prompt_len), b.capacity - 1) : 0;
  b.own = kv_bytes_for_capacity(kv_shape(), b.capacity, b.shared_slots);
  b.shared = b.shared_slots > 0 ? shared_prompt_bytes(kv_shape(), b.shared_slots) : 0;
  return b;
}

std::unique_ptr<Sequence> Engine::new_shared_sequence(uint64_t id, const CheckedPolicy& kv, int64_t prompt_len,
                                                      int64_t max_new_tokens) {
  return make_sequence(id, kv, prompt_len, max_new_tokens, true);
}

std::unique_ptr<Sequence> Engine::fork(const Sequence& leader, uint64_t id) {
  if (leader.stats.decode_steps > 0)
    throw Error(fmt::format("fork: sequence {} has decoded already (only a prefilled sequence is forked)", leader.id));
  std::unique_ptr<SelectorState> state;
  if (leader.state) {
    state = leader.state->clone();
    if (!state) throw Error(fmt::format("fork: the selector state of policy {} cannot be copied", leader.policy.name));
  }
  check_available_memory(
      kv_bytes_for_capacity(kv_shape(), leader.kv.capacity(), leader.kv.shared_slots()),
      fmt::format("KV cache of a copy of a prefilled sequence (a rollout or choice: {} slots per (layer, KV head), {} "
                  "of them shared)",
                  leader.kv.capacity(), leader.kv.shared_slots()));
  auto seq = std::make_unique<Sequence>(id, leader.policy, leader.eviction, leader.kv.fork());
  seq->prompt_len = leader.prompt_len;
  seq->n_seen = leader.n_seen;
  seq->state = std::move(state);
  seq->record_keep_sets = leader.record_keep_sets;
  seq->stats.peak_slots = leader.stats.peak_slots;
  return seq;
}

void Engine::prefill(Sequence& seq, std::span<const int32_t> prompt, std::vector<float>& logits, bool all_logits) {
  if (prompt.empty()) throw Error("prefill: empty prompt");
  run_prefill(seq, prompt, logits, all_logits, /*allow_blas=*/true);
}

void Engine::prefill_chunk(Sequence& seq, std::span<const int32_t> tokens, std::vector<float>& logits) {
  if (tokens.empty()) throw Error("prefill_chunk: empty chunk");
  run_prefill(seq, tokens, logits, /*all_logits=*/false, /*allow_blas=*/false);
}

void Engine::run_prefill(Sequence& seq, std::span<const int32_t> tokens, std::vector<float>& logits, bool all_logits,
                         bool allow_blas) {
  const auto t0 = Clock::now();
  TimedObserver timed(seq);
  const ForwardSegment seg{&seq.kv,
                           tokens,
                           seq.n_seen,
                           seq.eviction.positions,
                           timed.get(),
                           wants_probs(seq),
                           /*is_prefill=*/true};
  model_forward({.model = model_,
                 .rope = rope_,
                 .pool = pool_,
                 .buf = buf_,
                 .wanted = all_logits ? LogitsWanted::All : LogitsWanted::Last,
                 .allow_blas = allow_blas},
                seg, logits);
  timed.rethrow_if_failed();
  seq.n_seen += static_cast<int64_t>(tokens.size());
  seq.prompt_len = seq.n_seen;
  seq.stats.peak_slots = std::max(seq.stats.peak_slots, seq.kv.length(0));
  seq.stats.prefill_ms += ms_since(t0);
}

void Engine::decode(Sequence& seq, int32_t token, std::vector<float>& logits) {
  const auto t0 = Clock::now();
  const int32_t tok[1] = {token};
  TimedObserver timed(seq);
  const ForwardSegment seg{
      &seq.kv, tok, seq.n_seen, seq.eviction.positions, timed.get(), wants_probs(seq), /*is_prefill=*/false};
  model_forward({.model = model_, .rope = rope_, .pool = pool_, .buf = buf_}, seg, logits);
  timed.rethrow_if_failed();
  seq.n_seen += 1;
  seq.stats.decode_steps += 1;
  seq.stats.decode_ms += ms_since(t0);
  seq.stats.peak_slots = std::max(seq.stats.peak_slots, seq.kv.length(0));
  after_step(seq);
}

void Engine::decode_batch(std::span<Sequence* const> seqs, std::span<const int32_t> tokens,
                          std::vector<float>& logits, std::vector<StepFailure>* step_failures) {
  if (seqs.empty()) throw Error("decode_batch: empty batch");
  forward_step(seqs, tokens, nullptr, {}, logits, step_failures);
}

void Engine::decode_batch_with_chunk(std::span<Sequence* const> seqs, std::span<const int32_t> tokens,
                                     Sequence& prefill_seq, std::span<const int32_t> chunk,
                                     std::vector<float>& logits, std::vector<StepFailure>* step_failures) {
  if (chunk.empty()) throw Error("decode_batch_with_chunk: empty prompt chunk");
  for (const Sequence* s : seqs)
    if (s == &prefill_seq)
      throw Error(fmt::format("decode_batch_with_chunk: sequence {} is both decoded and prefilled", s->id));
  forward_step(seqs, tokens, &prefill_seq, chunk, logits, step_failures);
}

// Decode segments (one token each) and optionally one prompt chunk, through one forward pass on
// the row-exact kernels.
void Engine::forward_step(std::span<Sequence* const> seqs, std::span<const int32_t> tokens, Sequence* prefill_seq,
                          std::span<const int32_t> chunk, std::vector<float>& logits,
                          std::vector<StepFailure>* step_failures) {
  if (step_failures) step_failures->clear();
  if (seqs.size() != tokens.size())
    throw Error(fmt::format("decode_batch: {} sequences but {} tokens", seqs.size(), tokens.size()));
  const auto t0 = Clock::now();
  std::vector<ForwardSegment> segs(seqs.size());
  std::vector<std::unique_ptr<TimedObserver>> timed;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& s = *seqs[i];
    for (size_t j = 0; j < i; ++j)
      if (seqs[j] == seqs[i]) throw Error(fmt::format("decode_batch: sequence {} appears twice in the batch", s.id));
    timed.push_back(std::make_unique<TimedObserver>(s));
    segs[i] = ForwardSegment{&s.kv,          tokens.subspan(i, 1), s.n_seen, s.eviction.positions, timed.back()->get(),
                             wants_probs(s), /*is_prefill=*/false};
  }
  if (prefill_seq) {
    Sequence& p = *prefill_seq;
    timed.push_back(std::make_unique<TimedObserver>(p));
    segs.push_back(ForwardSegment{&p.kv, chunk, p.n_seen, p.eviction.positions, timed.back()->get(), wants_probs(p),
                                  /*is_prefill=*/true});
  }
  model_forward_segments({.model = model_, .rope = rope_, .pool = pool_, .buf = buf_}, segs, logits);
  // Time shared out per row: one per decoding sequence, |chunk| for the prefill.
  const double per_row = ms_since(t0) / static_cast<double>(seqs.size() + chunk.size());
  for (Sequence* s : seqs) {
    s->n_seen += 1;
    s->stats.decode_steps += 1;
    s->stats.decode_ms += per_row;
    s->stats.peak_slots = std::max(s->stats.peak_slots, s->kv.length(0));
  }
  if (prefill_seq) {
    Sequence& p = *prefill_seq;
    p.n_seen += static_cast<int64_t>(chunk.size());
    p.prompt_len = p.n_seen;
    p.stats.peak_slots = std::max(p.stats.peak_slots, p.kv.length(0));
    p.stats.prefill_ms += per_row * static_cast<double>(chunk.size());
  }
  // A sequence's failure (its selector state's observation, its round) ends only that sequence:
  // the pass has appended every token, so the caller must learn which sequences are intact
  // rather than retry the batch.
  std::vector<StepFailure> local;
  std::vector<StepFailure>& failed = step_failures ? *step_failures : local;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (timed[i]->error()) {
      failed.push_back({i, timed[i]->error()});
      continue;
    }
    try {
      after_step(*seqs[i]);
    } catch (...) {
      failed.push_back({i, std::current_exception()});
    }
  }
  if (prefill_seq && timed.back()->error()) failed.push_back({seqs.size(), timed.back()->error()});
  if (!step_failures && !failed.empty()) std::rethrow_exception(failed.front().error);
}

void Engine::after_step(Sequence& seq) {
  if (seq.eviction_off() || !round_due(seq.kv.length(0), seq.eviction)) return;
  const RoundTiming t =
      run_round(seq.kv, seq.policy, seq.state.get(), seq.eviction, seq.prompt_len, seq.n_seen, seq.id, seq.stats.rounds,
                rope_, &pool_, seq.record_keep_sets ? &seq.last_keep_sets : nullptr);
  // A gathered float32 copy (selectors that read whole key blocks) lives only for the round.
  if (seq.kv.shared_slots() > 0) seq.kv.release_mirrors();
  seq.stats.rounds += 1;
  seq.stats.score_ms += t.score_ms;
  seq.stats.compact_ms += t.compact_ms;
}

}  // namespace kvevict
