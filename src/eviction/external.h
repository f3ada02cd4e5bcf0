// The selector interface for selectors written outside this library (the Python package's
// kvevict.Selector): the library gathers, per (layer, KV head) of a round, what such a selector
// may read — the candidates' keys, values and positions, the recent queries (post-RoPE, and
// un-rotated to pre-RoPE on request) and the attention each slot has accumulated — and the
// selector writes one score per candidate. Everything else is the shared schedule's
// (eviction/schedule.h): when a round runs, pins (prompt, sinks), the top K_sel with ties to the
// older slot, compaction, the recent buffer. The library holds no Python: a binding derives
// from ExternalSelector and implements score_round.
//
// Source: docs/eviction-spec.md §2 (schedule), §3 (what SnapKV / TOVA / H2O read: the query
// window of QueryWindowState, the accumulated attention of AttentionSumState); kvpress's
// ScorerPress (one `score()` per press) for the shape of the interface.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "eviction/selector.h"

namespace kvevict {

/// What an external selector asks the forward pass and the state to provide.
struct ExternalNeeds {
  bool queries = false;      ///< the last `window` post-RoPE queries of the layer
  bool queries_pre = false;  ///< the same queries un-rotated to their pre-RoPE form (needs the model's RoPE)
  bool attention = false;    ///< attention accumulated per slot since it entered the cache (H2O's)
  int window = 64;           ///< queries held per layer, in [1, kMaxQueryWindow]
};

/// The candidates of one (layer, KV head) in one round, as an external selector reads them.
/// Every pointer is valid only during ExternalSelector::score_round.
struct HeadCandidates {
  int layer = 0, kv_head = 0;
  int64_t n_candidates = 0;  ///< candidates are slots [0, n_candidates), oldest first
  int head_dim = 0;
  const float* keys = nullptr;       ///< [n_candidates, head_dim], post-RoPE, float32 (an f16 cache converted)
  const float* values = nullptr;     ///< [n_candidates, head_dim]
  const int32_t* positions = nullptr;  ///< [n_candidates], logical positions, strictly increasing
  int n_queries = 0;                 ///< queries held (<= window; 0 unless asked for)
  int group_size = 0;                ///< query heads of this KV head's GQA group
  const float* queries = nullptr;      ///< [n_queries, group_size, head_dim] post-RoPE, oldest first (if asked)
  const float* queries_pre = nullptr;  ///< the same un-rotated by each query's position (if asked)
  const int64_t* query_positions = nullptr;  ///< [n_queries] logical positions of the held queries
  const double* attention = nullptr;  ///< [n_candidates] accumulated attention (if asked)
  uint64_t stream = 0;  ///< stream_id({seed, sequence_id, round, layer, kv_head}): seed of a seeded choice
};

/// Base of an out-of-tree selector. score() gathers every (layer, KV head) of the round, layer-major,
/// and calls score_round once, on the thread that runs the round (a binding takes its lock once).
class ExternalSelector : public Selector {
 public:
  /// Throws kvevict::Error for a window outside [1, kMaxQueryWindow] (eviction/query_window.h).
  explicit ExternalSelector(ExternalNeeds needs);
  SelectorNeeds needs() const override;
  std::unique_ptr<SelectorState> make_state(const KvShape& shape) const override;
  void score(const RoundInput& in, SelectorState* state, std::span<float> scores) const final;

  /// Writes scores [heads.size()][n_candidates] (row-major, one row per element of `heads`, in
  /// its order); higher = kept. Pins are applied afterwards by the schedule. May throw: the round
  /// is abandoned and the exception reaches the caller of the engine.
  virtual void score_round(const RoundInput& in, std::span<const HeadCandidates> heads, std::span<float> scores) const = 0;

  const ExternalNeeds& external_needs() const { return needs_; }

 private:
  ExternalNeeds needs_;
};

}  // namespace kvevict
