#include "engine/engine.h"

#include <fmt/format.h>

#include <chrono>

#include "util/error.h"

namespace kvevict {
namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
// The policy state observes the forward pass only when its selector asked for it.
SelectorState* observer(Sequence& seq) {
  return (seq.policy.selector && seq.policy.selector->needs().any()) ? seq.state.get() : nullptr;
}
bool wants_probs(const Sequence& seq) { return seq.policy.selector && seq.policy.selector->needs().attention; }

// Forwards observations to the sequence's state and adds the time spent to stats.observe_ms, so
// per-token selector work is counted next to the per-round score and compaction times.
class TimedObserver final : public SelectorState {
 public:
  explicit TimedObserver(Sequence& seq) : inner_(observer(seq)), ms_(seq.stats.observe_ms) {}
  SelectorState* get() { return inner_ ? this : nullptr; }
  void observe(const AttentionObservation& obs) override {
    const auto t0 = Clock::now();
    inner_->observe(obs);
    ms_ += ms_since(t0);
  }

 private:
  SelectorState* inner_;
  double& ms_;
};
}  // namespace

Engine::Engine(const LlamaModel& model, int n_threads)
    : model_(model), rope_(model.config().head_dim, model.config().rope_theta), pool_(n_threads) {}

KvShape Engine::kv_shape() const {
  const LlamaConfig& c = model_.config();
  return KvShape{c.n_layers, c.n_kv_heads, c.head_dim};
}

std::unique_ptr<Sequence> Engine::new_sequence(uint64_t id, const Policy& policy, const EvictionConfig& cfg,
                                               int64_t prompt_len, int64_t max_new_tokens) {
  validate_eviction(cfg, policy);
  if (prompt_len < 1) throw Error("a sequence needs a prompt of at least one token");
  if (max_new_tokens < 0) throw Error(fmt::format("max new tokens {} must be >= 0", max_new_tokens));
  const int64_t cap = required_capacity(cfg, policy, prompt_len, max_new_tokens);
  auto seq = std::make_unique<Sequence>(id, policy, cfg, SequenceKv(kv_shape(), cap));
  seq->prompt_len = prompt_len;
  if (policy.selector) seq->state = policy.selector->make_state(kv_shape());
  return seq;
}

void Engine::prefill(Sequence& seq, std::span<const int32_t> prompt, std::vector<float>& logits, bool all_logits) {
  if (prompt.empty()) throw Error("prefill: empty prompt");
  const auto t0 = Clock::now();
  TimedObserver timed(seq);
  llama_forward(model_, rope_, seq.kv, prompt, seq.n_seen, seq.eviction.positions,
                all_logits ? LogitsWanted::All : LogitsWanted::Last, logits, timed.get(),
                wants_probs(seq), /*is_prefill=*/true, pool_, buf_);
  seq.n_seen += static_cast<int64_t>(prompt.size());
  seq.prompt_len = seq.n_seen;
  seq.stats.peak_slots = std::max(seq.stats.peak_slots, seq.kv.length(0));
  seq.stats.prefill_ms += ms_since(t0);
}

void Engine::decode(Sequence& seq, int32_t token, std::vector<float>& logits) {
  const auto t0 = Clock::now();
  const int32_t tok[1] = {token};
  TimedObserver timed(seq);
  llama_forward(model_, rope_, seq.kv, tok, seq.n_seen, seq.eviction.positions, LogitsWanted::Last,
                logits, timed.get(), wants_probs(seq), /*is_prefill=*/false, pool_, buf_);
  seq.n_seen += 1;
  seq.stats.decode_steps += 1;
  seq.stats.decode_ms += ms_since(t0);
  seq.stats.peak_slots = std::max(seq.stats.peak_slots, seq.kv.length(0));
  after_step(seq);
}

void Engine::after_step(Sequence& seq) {
  if (seq.eviction_off() || !round_due(seq.kv.length(0), seq.eviction)) return;
  const RoundTiming t = run_round(seq.kv, seq.policy, seq.state.get(), seq.eviction, seq.prompt_len,
                                  seq.n_seen, seq.id, seq.stats.rounds, rope_, &pool_,
                                  seq.record_keep_sets ? &seq.last_keep_sets : nullptr);
  seq.stats.rounds += 1;
  seq.stats.score_ms += t.score_ms;
  seq.stats.compact_ms += t.compact_ms;
}

}  // namespace kvevict
