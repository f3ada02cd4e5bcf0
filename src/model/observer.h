// What the forward pass reports to an observer of attention: the post-RoPE queries of every
// query token per layer and, on request, its attention probabilities. Defined here, below the
// eviction layer, so the forward pass needs nothing from eviction/ (selectors' per-sequence
// state, eviction/selector.h, derives from AttentionObserver; so does calibration).
//
// Source: docs/eviction-spec.md §3 (what SnapKV, TOVA, H2O and TriAttention calibration read).
#pragma once

#include <cstdint>

namespace kvevict {

/// What the forward pass saw for one query token in one layer.
struct AttentionObservation {
  int layer = 0;
  int64_t position = 0;  ///< logical position of the query token
  bool prefill = false;  ///< true during prefill, false in a decode step
  int n_heads = 0;       ///< query heads
  int group_size = 0;    ///< query heads per KV head; head h reads KV head h / group_size
  int head_dim = 0;
  int64_t n_slots = 0;             ///< live slots attended (same for every KV head of the layer)
  const float* queries = nullptr;  ///< [n_heads, head_dim], post-RoPE
  const float* probs = nullptr;    ///< [n_heads, n_slots], softmax over the slots; null
                                   ///< unless the probabilities were requested
};

/// Receives observations from the forward pass (model/forward.h, ForwardSegment::observer).
class AttentionObserver {
 public:
  virtual ~AttentionObserver() = default;
  /// Receives the queries (and, if requested, the probabilities) of one query token in one
  /// layer. Called for prefill and decode tokens, in token order, layer by layer.
  virtual void observe(const AttentionObservation& /*obs*/) {}
};

}  // namespace kvevict
