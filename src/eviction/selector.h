// The policy interface: a selector scores eviction candidates; the shared schedule
// (eviction/schedule.h) pins, takes the top K_sel, sorts and gathers.
//
// Source: docs/eviction-spec.md §2 (schedule) and §3 (policies); the split mirrors kvpress's
// ScorerPress (a policy writes only `score`, higher = kept).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvcache/kv_cache.h"
#include "model/observer.h"

namespace kvevict {

class ThreadPool;
class Rope;

/// What a selector needs the forward pass to produce besides the cache itself.
struct SelectorNeeds {
  /// Post-RoPE queries of every query token, per layer (SnapKV's window, TOVA, calibration).
  /// Delivered through SelectorState::observe with probs == nullptr unless `attention` is set.
  bool queries = false;
  /// Attention probabilities of every query token over the live slots, per layer (H2O).
  /// Only then does the attention kernel compute and store probabilities.
  bool attention = false;
  bool any() const { return queries || attention; }
};

/// Per-sequence state of a selector (observation windows, accumulators). Owned by the sequence,
/// never shared between sequences. It observes the forward pass (model/observer.h: queries, and
/// probabilities only if needs().attention).
class SelectorState : public AttentionObserver {
 public:
  /// Called after (layer, kv_head) kept exactly the slots `keep` (old slot indices, ascending),
  /// so slot-aligned state can be gathered the same way.
  virtual void on_compact(int /*layer*/, int /*kv_head*/, std::span<const int32_t> /*keep*/) {}
  /// A copy of this state (what a second sequence forked after the same prefill starts from,
  /// Engine::fork), or nullptr when the state cannot be copied; then sequences of this policy
  /// do not share their prompt's KV.
  virtual std::unique_ptr<SelectorState> clone() const { return nullptr; }
};

/// Everything a selector may read in one eviction round of one sequence.
struct RoundInput {
  const SequenceKv& kv;
  int64_t n_candidates = 0;    ///< candidates are slots [0, n_candidates) of every (layer, KV head)
  int64_t prompt_len = 0;      ///< tokens of the prompt (positions [0, prompt_len))
  int64_t n_seen = 0;          ///< tokens processed so far = logical position of the next token
  uint64_t seed = 0;           ///< base seed of the run
  uint64_t sequence_id = 0;    ///< sequence index, part of every random stream id
  int64_t round = 0;           ///< 0-based index of this round within the sequence
  ThreadPool* pool = nullptr;  ///< may be used to parallelise over (layer, KV head)
  // The schedule's numbers, for selectors whose rule splits K_sel (H2O, VaSE). Defaults keep
  // aggregate initialisers that stop at `pool` valid.
  int64_t budget = 0;    ///< B: slots per (layer, KV head) after the round
  int64_t recent = 0;    ///< r: newest slots, never candidates; K_sel = budget - recent
  int64_t n_pinned = 0;  ///< positions [0, n_pinned) are forced in by the schedule
  /// The model's RoPE (TriAttention's frequencies); null when the caller has no model.
  const Rope* rope = nullptr;
  /// How cached keys were rotated: by logical position, or by slot index (PositionMode::Cache).
  PositionMode positions = PositionMode::Logical;
  int64_t k_sel() const { return budget - recent; }
};

/// Scores eviction candidates. Stateless and const: per-sequence data lives in SelectorState.
class Selector {
 public:
  virtual ~Selector() = default;
  virtual SelectorNeeds needs() const { return {}; }
  /// Creates this selector's per-sequence state, or nullptr when it keeps none.
  virtual std::unique_ptr<SelectorState> make_state(const KvShape& /*shape*/) const { return nullptr; }
  /// Writes scores [n_layers][n_kv_heads][n_candidates] (row-major) for one round; higher = kept.
  /// Pins are applied afterwards by the schedule, so a selector never handles protection.
  virtual void score(const RoundInput& in, SelectorState* state, std::span<float> scores) const = 0;
};

/// Convenience base for selectors whose keep-set of each (layer, KV head) depends only on that
/// head: score_head is called for every (layer, KV head), in parallel on in.pool.
class PerHeadSelector : public Selector {
 public:
  void score(const RoundInput& in, SelectorState* state, std::span<float> scores) const final;
  /// Writes out[n_candidates] for one (layer, KV head). Must be thread-safe and must not modify
  /// `state`.
  virtual void score_head(const RoundInput& in, const SelectorState* state, int layer, int kv_head,
                          std::span<float> out) const = 0;
};

/// One parameter a selector reads, as seen by a recording SelectorParams (for `kvevict policies`).
struct ParamSpec {
  std::string name;
  std::string type;                  ///< "number", "integer" or "text"
  std::string fallback;              ///< the default as text ("" for a text parameter without one)
  double lo = 0, hi = 0;             ///< allowed range (numbers and integers)
  std::vector<std::string> allowed;  ///< allowed values of a text choice (empty: any text)
};

/// Named numeric parameters of a selector (`--param name=value`). Every given key must be read
/// by the selector; an unread key is an error (catches typos such as `windw=32`).
class SelectorParams {
 public:
  SelectorParams() = default;
  /// Parses "k=v" strings. Throws kvevict::Error on a missing '=' or a repeated key.
  static SelectorParams parse(const std::vector<std::string>& items);
  /// Value of `key` as a number, or `fallback`. Throws kvevict::Error if the value is not a number
  /// or lies outside [lo, hi].
  double get(const std::string& key, double fallback, double lo, double hi) const;
  /// Value of `key` as an integer, or `fallback`. Throws kvevict::Error if the value is not an
  /// integer or lies outside [lo, hi].
  int64_t get_int(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const;
  /// Value of `key` as text, or `fallback`. When `allowed` is non-empty the value must be one of
  /// them (kvevict::Error listing them otherwise). Used for choices and file paths.
  std::string get_string(const std::string& key, const std::string& fallback,
                         const std::vector<std::string>& allowed = {}) const;
  /// Throws kvevict::Error naming every key that no get() asked for.
  void check_all_used(const std::string& policy) const;
  /// Keys that no get() asked for (sorted).
  std::vector<std::string> unused() const;
  /// An empty parameter set that appends every parameter a get*() call asks for to `*out`
  /// (name, type, default, range): a selector's factory run on it describes its parameters.
  static SelectorParams recording(std::vector<ParamSpec>* out);

 private:
  void record(ParamSpec spec) const;
  std::vector<ParamSpec>* record_ = nullptr;
  std::map<std::string, std::string> values_;
  mutable std::map<std::string, bool> used_;
};

}  // namespace kvevict
