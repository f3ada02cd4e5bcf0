// Attention accumulated per slot since the slot entered the cache: what H2O ranks by, and what an
// out-of-tree selector (eviction/external.h) may ask for.
//
// Source: H2O (arXiv 2306.14048) §3 (accumulated attention); docs/eviction-spec.md §3 row `h2o`:
// every query of the sequence (prefill and decode) adds its probability over the live slots,
// summed over the query heads of the KV head's group; the sums move with the slots at each
// compaction and a slot appended later starts from zero.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "eviction/selector.h"

namespace kvevict {

/// Accumulated attention per slot of every (layer, KV head), slot-aligned with the cache.
/// Needs SelectorNeeds::attention (the forward pass must deliver probabilities).
class AttentionSumState : public SelectorState {
 public:
  explicit AttentionSumState(const KvShape& shape);

  /// Adds obs.probs [n_heads, n_slots] to the sums of each head's KV head. Throws kvevict::Error
  /// when the observation holds no probabilities.
  void observe(const AttentionObservation& obs) override;
  std::unique_ptr<SelectorState> clone() const override { return std::make_unique<AttentionSumState>(*this); }
  /// Keeps the sums of the slots `keep` (old slot indices, ascending), in that order.
  void on_compact(int layer, int kv_head, std::span<const int32_t> keep) override;

  /// Sums of (layer, KV head): [slots observed so far]; a slot past the end has received nothing.
  const std::vector<double>& slot_scores(int layer, int kv_head) const {
    return acc_[static_cast<size_t>(layer * n_kv_heads_ + kv_head)];
  }

 private:
  std::vector<double>& sums(int layer, int kv_head) { return acc_[static_cast<size_t>(layer * n_kv_heads_ + kv_head)]; }
  int n_kv_heads_;
  std::vector<std::vector<double>> acc_;
};

}  // namespace kvevict
