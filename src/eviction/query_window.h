// What the attention-scored selectors share: a per-layer ring buffer of recent post-RoPE queries
// (the "observation window") and the SnapKV score computed from it.
//
// Source: SnapKV (arXiv 2404.14469) §4 (observation window, pooling, GQA group); docs/eviction-spec.md
// §3 row `snapkv`, which follows the Random Attention code (`kvcompress/engine/cache_utils.py`,
// `compute_attention_scores`): softmax over the candidates only, mean over the window, 1-D
// average pooling whose zero padding counts in the denominator (PyTorch `avg_pool1d` defaults),
// mean over the query heads of the group.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "eviction/selector.h"

namespace kvevict {

/// Largest query window a selector may hold (snapkv's `window` parameter, a Python selector's
/// `window`): the ring is allocated up front, n_layers * window * n_heads * head_dim floats.
inline constexpr int kMaxQueryWindow = 1 << 16;

/// Per-sequence ring buffer of the last `window` post-RoPE queries of every layer.
///
/// Every query token is recorded, prefill included: as in the released Random Attention code the
/// window starts with the prompt's last queries and decode queries overwrite them, so once `window`
/// decode steps have run it holds exactly the last `window` decode queries (spec §3 `snapkv`).
/// A round that comes fewer than `window` decode steps after prefill (a prompt near or above B,
/// or a small B + r) therefore scores with some prompt queries. Other released code differs
/// here: SnapKV's own code compresses only at prefill with the prompt's last queries, and
/// kvpress's DecodingPress scores with a buffer of decode-step states only (no prompt queries,
/// fewer than `window` right after prefill). kvevict keeps the Random Attention behaviour, which
/// the spec follows; with the main job's sizes (67-token prompt, B = 128, r = 32) the first
/// round runs 93 decode steps after prefill, so a 64-query window holds decode queries only.
/// In PositionMode::Cache the stored queries keep the rotation of the step that produced them
/// while keys are re-rotated at each compaction, so relative positions drift; the logical mode
/// (default) has no such drift.
class QueryWindowState : public SelectorState {
 public:
  /// n_layers >= 1, window >= 1 (queries per layer). The head count is learnt from the first
  /// observation.
  QueryWindowState(int n_layers, int window);

  /// Copies obs.queries [n_heads, head_dim] into the layer's ring. Throws kvevict::Error if the
  /// layer index or the head shape disagrees with earlier observations.
  void observe(const AttentionObservation& obs) override;
  std::unique_ptr<SelectorState> clone() const override { return std::make_unique<QueryWindowState>(*this); }

  int window() const { return window_; }
  /// Queries held for `layer`: min(window, queries observed in that layer).
  int count(int layer) const;
  /// Held query i of `layer`, 0 = oldest held ... count - 1 = newest: [n_heads, head_dim].
  const float* query(int layer, int i) const;
  int n_heads() const { return n_heads_; }  ///< 0 until the first observation
  int head_dim() const { return head_dim_; }
  int group_size() const { return group_size_; }  ///< query heads per KV head

 private:
  int window_;
  int n_heads_ = 0, head_dim_ = 0, group_size_ = 0;
  std::vector<std::vector<float>> ring_;  ///< per layer: [window, n_heads * head_dim]
  std::vector<int64_t> seen_;             ///< per layer: queries observed so far
};

/// `state` as a QueryWindowState. Throws kvevict::Error naming `policy` when it is null or of
/// another type (a selector run without the state its make_state created).
const QueryWindowState& as_query_window(const SelectorState* state, const char* policy);

/// probs[n] = softmax_s(q · K[s] / sqrt(head_dim)) for s < n. q: [head_dim]; K: [n, head_dim]
/// row-major; n >= 1. Max-subtracted, float arithmetic with the normaliser summed in double.
void softmax_scores(const float* q, const float* K, int64_t n, int head_dim, float* probs);

/// SnapKV scores of the candidates of one (layer, KV head): for each held query of the layer and
/// each query head of the KV head's group, softmax(q·k/√d) over the candidates only; mean over the
/// queries; average pooling with an odd `kernel` (same padding, zeros counted); mean over the
/// group. out: [in.n_candidates], each >= 0, summing to about 1 (pooling leaks a little mass at
/// the ends). Throws kvevict::Error if the layer has observed no query.
void snapkv_scores(const RoundInput& in, const QueryWindowState& window, int layer, int kv_head, int kernel,
                   std::span<float> out);

/// Reads the `window` (default 64) and `kernel` (default 5, odd) parameters shared by the
/// SnapKV-based selectors. Throws kvevict::Error on an even or out-of-range kernel.
struct SnapKvParams {
  int window = 64;  ///< queries in the observation window (spec: w = 64)
  int kernel = 5;   ///< average-pooling width (spec: 5)
  static SnapKvParams read(const SelectorParams& params);
};

}  // namespace kvevict
