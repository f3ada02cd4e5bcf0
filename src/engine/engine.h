// Sequence state and the engine that advances it: prefill, decode steps, and the eviction rounds
// the shared schedule calls for after each decode step.
//
// Source: docs/eviction-spec.md §2 (no eviction in prefill; a round after a decode step when due).
// The model is immutable, a Sequence owns its cache and policy state, and the Engine owns only
// threads and scratch, so many sequences share one model and engine (batched decode, the
// server's scheduler).
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <vector>

#include "eviction/registry.h"
#include "eviction/schedule.h"
#include "kvcache/kv_cache.h"
#include "model/forward.h"
#include "model/model.h"
#include "util/thread_pool.h"

namespace kvevict {

/// Counters of one sequence, for summaries and benchmarks.
struct SequenceStats {
  int64_t rounds = 0;      ///< eviction rounds run
  int64_t peak_slots = 0;  ///< max live slots per (layer, KV head) ever held
  double score_ms = 0;     ///< total time in selector scoring, ms
  double compact_ms = 0;   ///< total time in keep-set choice + compaction, ms
  double prefill_ms = 0;   ///< time in prefill forward passes, ms
  double decode_ms = 0;    ///< time in decode forward passes (rounds excluded), ms
  int64_t decode_steps = 0;
  /// Time in SelectorState::observe (per-token selector work such as H2O's accumulation or a
  /// query window), ms; part of prefill_ms and decode_ms. 0 for selectors that observe nothing.
  double observe_ms = 0;
};

/// One sequence: its tokens so far, KV cache, policy and policy state.
class Sequence {
 public:
  uint64_t id = 0;
  Policy policy;
  EvictionConfig eviction;
  int64_t prompt_len = 0;  ///< set by prefill
  int64_t n_seen = 0;      ///< tokens processed = logical position of the next token
  SequenceKv kv;
  std::unique_ptr<SelectorState> state;
  SequenceStats stats;
  /// Keep-sets of the last round (only when keep_keep_sets was set).
  bool record_keep_sets = false;
  KeepSets last_keep_sets;

  Sequence(uint64_t id_, Policy p, EvictionConfig e, SequenceKv kv_)
      : id(id_), policy(std::move(p)), eviction(e), kv(std::move(kv_)) {}
  /// True when this sequence never evicts (full, or a long prompt with LongPromptMode::Skip).
  bool eviction_off() const { return eviction_disabled(eviction, policy, prompt_len); }
};

/// Refuses a KV cache of `kv_type` that `kv` cannot run on: an f16 cache with
/// PositionMode::Cache for an evicting policy (keys are re-rotated in float32, eviction-spec.md
/// §5). Throws FieldError(Field::KvType). Engine::new_sequence calls it; a front end may call it
/// first to refuse a setting before any request runs.
void check_kv_type(KvType kv_type, const CheckedPolicy& kv);

/// A sequence's part of a batched step (Engine::decode_batch, decode_batch_with_chunk) that threw
/// after the forward pass had run: its eviction round, or its selector state's observation of the
/// pass (held until the pass ends; a selector's error, a refused allocation). Every sequence of
/// the batch appended its tokens and its logits row is written; the other sequences' rounds ran.
/// The failed sequence should be ended (its state or schedule is off: a failed round leaves it
/// holding more slots than its schedule allows); a caller that retried the batch one sequence at
/// a time would append every token twice.
struct StepFailure {
  size_t index = 0;          ///< position in `seqs`; seqs.size() for the prefill sequence
  std::exception_ptr error;  ///< what was thrown, unchanged
};

/// Runs sequences of one model. Not thread-safe: one caller drives it.
class Engine {
 public:
  /// n_threads: worker threads for matmuls, attention and rounds (0 = all cores).
  /// kv_type: element type of the caches new_sequence allocates (F32 default, F16 halves them).
  Engine(const Model& model, int n_threads, KvType kv_type = KvType::F32);

  const Model& model() const { return model_; }
  ThreadPool& pool() { return pool_; }
  /// Shape (and element type) of the caches this engine allocates.
  KvShape kv_shape() const;
  KvType kv_type() const { return kv_type_; }

  /// Creates a sequence whose cache is allocated once for a prompt of `prompt_len` tokens and up
  /// to `max_new_tokens` decode steps (capacity from required_capacity), under a policy the
  /// settings builder (engine/policy_settings.h) or CheckedPolicy::check already validated.
  /// Throws kvevict::Error for prompt_len < 1 or max_new_tokens < 0, FieldError(KvType) from
  /// check_kv_type, MemoryError (util/memory.h) when the cache's bytes exceed the memory available
  /// now, its message giving the capacity's terms (max(B, prompt) + s, or prompt + max new tokens
  /// without eviction): the cache is allocated whole, and past that size it would be killed, not
  /// refused.
  std::unique_ptr<Sequence> new_sequence(uint64_t id, const CheckedPolicy& kv, int64_t prompt_len,
                                         int64_t max_new_tokens);
  /// The same for a policy and schedule built by hand: validates them first (validate_eviction).
  std::unique_ptr<Sequence> new_sequence(uint64_t id, const Policy& policy, const EvictionConfig& cfg,
                                         int64_t prompt_len, int64_t max_new_tokens);

  /// Slots of a `prompt_len`-token prompt that sequences of one prompt under `kv` can read from
  /// one shared, read-only copy (kvcache/kv_cache.h): slots that no round ever moves or drops.
  /// That is the whole prompt when the sequence never evicts (`full`, or LongPromptMode::Skip
  /// with a long prompt), else the pinned prefix min(prompt_len, pinned_positions) (the pinned
  /// slots are the oldest, so compaction keeps them in place; docs/eviction-spec.md §2.4). 0
  /// (nothing shared) under PositionMode::Cache with eviction (keys are re-rotated) and for a
  /// selector whose per-sequence state cannot be copied (SelectorState::clone).
  int64_t shared_prompt_slots(const CheckedPolicy& kv, int64_t prompt_len) const;

  /// The KV memory of a sequence of `kv` before it is made: what new_sequence (share_prompt
  /// false) or new_shared_sequence (true) allocates, and each fork() of the latter. One formula
  /// for the engine's own memory check, the server's pool reservations and a batch's check.
  struct KvBytes {
    int64_t capacity = 0;      ///< slots per (layer, KV head): required_capacity
    int64_t shared_slots = 0;  ///< prompt slots in the shared segment (0: none)
    int64_t own = 0;           ///< bytes of the sequence's own slots (each fork allocates this)
    int64_t shared = 0;        ///< bytes of the shared segment (once for all that read it)
  };
  KvBytes sequence_kv_bytes(const CheckedPolicy& kv, int64_t prompt_len, int64_t max_new_tokens,
                            bool share_prompt) const;

  /// new_sequence whose first shared_prompt_slots slots (at most capacity - 1) live in a new
  /// SharedPromptKv: its prefill writes them, fork() hands them on read-only. A plain sequence
  /// when nothing can be shared. Throws as new_sequence.
  std::unique_ptr<Sequence> new_shared_sequence(uint64_t id, const CheckedPolicy& kv, int64_t prompt_len,
                                                int64_t max_new_tokens);

  /// Sequence `id` starting where `leader` stands: same policy, schedule, prompt, cache
  /// (SequenceKv::fork: a shared prompt is referenced, the rest copied) and a copy of the
  /// selector state. For a leader right after its prefill, so its followers skip the prefill;
  /// their outputs equal those of sequences prefilled separately bit for bit (same cache, same
  /// state). Statistics start at zero but for peak_slots. Throws kvevict::Error when the
  /// leader's selector state cannot be copied or the leader has decoded (stats.decode_steps > 0),
  /// MemoryError when the copy's own slots exceed the memory available now (as new_sequence).
  std::unique_ptr<Sequence> fork(const Sequence& leader, uint64_t id);

  /// Runs the prompt in one pass (no eviction). logits: [n_vocab] of the last token, or
  /// [T, n_vocab] with all_logits. Throws kvevict::Error on an empty prompt or one longer than
  /// the capacity.
  void prefill(Sequence& seq, std::span<const int32_t> prompt, std::vector<float>& logits, bool all_logits = false);

  /// Runs the next `tokens` of the prompt, continuing the sequence from its current cache
  /// (positions seq.n_seen ...; no eviction, eviction-spec.md §2.2, so a prompt longer than the
  /// budget stays whole until its first round). logits: [n_vocab] of the chunk's last token.
  /// Unlike prefill, every matmul runs on the row-exact kernels (no BLAS, whose rounding depends
  /// on how many tokens share a call), and attention, RoPE and observations are per token, so
  /// splitting a prompt into chunks of any sizes gives bit-identical logits, cache and selector
  /// state to one prefill_chunk call with the whole prompt. This is what a server needs to
  /// prefill a long prompt piecewise between decode steps (chunked prefill, Sarathi, arXiv
  /// 2308.16369 §4) without changing the request's output. Cost: no BLAS speed-up for long
  /// float32 prompts. Throws kvevict::Error on an empty chunk, a token id out of range, or a
  /// chunk that does not fit the remaining capacity (then nothing was modified).
  void prefill_chunk(Sequence& seq, std::span<const int32_t> tokens, std::vector<float>& logits);

  /// Appends one token, returns next-token logits [n_vocab], then runs an eviction round if the
  /// schedule says one is due. An exception from the round (a selector's error, a refused
  /// allocation) leaves the token appended, logits written and the round not run: the sequence
  /// then holds more slots than its schedule allows and should be ended.
  void decode(Sequence& seq, int32_t token, std::vector<float>& logits);

  /// One decode step for N sequences at once: sequence i appends tokens[i]; the weights are
  /// streamed once for the whole batch (matmuls with N rows), attention runs per sequence over
  /// its own cache, then each sequence runs its own eviction round when due. logits:
  /// [N, n_vocab], row i for sequence i. Results equal N calls of decode() bit for bit (every
  /// kernel computes each row independently). The batch may differ from step to step
  /// (sequences join after their prefill and leave whenever the caller stops passing them).
  /// Each sequence's decode_ms grows by the step time / N. Throws kvevict::Error when the sizes
  /// differ, a sequence appears twice, or any sequence's token/cache is invalid (then no cache
  /// was modified). A sequence whose round or observation throws does not stop the others
  /// (StepFailure): with `step_failures`, each is recorded there (cleared first) and the call
  /// returns; without, the first is rethrown unchanged once every round ran (a Python selector's
  /// exception reaches Python as raised).
  void decode_batch(std::span<Sequence* const> seqs, std::span<const int32_t> tokens, std::vector<float>& logits,
                    std::vector<StepFailure>* step_failures = nullptr);

  /// decode_batch and prefill_chunk in one forward pass (weights streamed once): sequence i
  /// appends tokens[i] as in decode_batch, and `prefill_seq` appends the prompt chunk `chunk` as in
  /// prefill_chunk. logits: [N + 1, n_vocab]; row i for sequence i, row N for the chunk's last
  /// token. Results equal decode_batch(seqs, tokens) followed by prefill_chunk(prefill_seq,
  /// chunk) bit for bit (row-exact kernels; each segment attends only to its own cache), so a
  /// scheduler can interleave a long prompt with running sequences at the granularity of one
  /// step (Sarathi's decode-maximal batching, arXiv 2308.16369 §4). seqs may be empty. Eviction
  /// rounds run for the decoding sequences only (none in prefill, eviction-spec.md §2.2). Time is
  /// shared out per row: prefill_ms of prefill_seq grows by |chunk| rows' share. Throws
  /// kvevict::Error as decode_batch and prefill_chunk, or when prefill_seq is also in seqs (then
  /// no cache was modified); step failures as decode_batch (the prefill sequence's observation
  /// too, at index seqs.size()).
  void decode_batch_with_chunk(std::span<Sequence* const> seqs, std::span<const int32_t> tokens, Sequence& prefill_seq,
                               std::span<const int32_t> chunk, std::vector<float>& logits,
                               std::vector<StepFailure>* step_failures = nullptr);

 private:
  // new_sequence (share_prompt false) and new_shared_sequence (true): one allocation either way.
  std::unique_ptr<Sequence> make_sequence(uint64_t id, const CheckedPolicy& kv, int64_t prompt_len,
                                          int64_t max_new_tokens, bool share_prompt);
  void after_step(Sequence& seq);
  void forward_step(std::span<Sequence* const> seqs, std::span<const int32_t> tokens, Sequence* prefill_seq,
                    std::span<const int32_t> chunk, std::vector<float>& logits,
                    std::vector<StepFailure>* step_failures);
  void run_prefill(Sequence& seq, std::span<const int32_t> tokens, std::vector<float>& logits, bool all_logits,
                   bool allow_blas);
  const Model& model_;
  Rope rope_;
  ThreadPool pool_;
  KvType kv_type_ = KvType::F32;
  ForwardBuffers buf_;
};

}  // namespace kvevict
