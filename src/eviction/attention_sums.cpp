#include "eviction/attention_sums.h"

#include "util/error.h"

namespace kvevict {

AttentionSumState::AttentionSumState(const KvShape& s)
    : n_kv_heads_(s.n_kv_heads), acc_(static_cast<size_t>(s.n_layers) * s.n_kv_heads) {}

void AttentionSumState::observe(const AttentionObservation& obs) {
  if (!obs.probs) throw Error("accumulated attention: the forward pass delivered no attention probabilities");
  for (int h = 0; h < obs.n_heads; ++h) {
    auto& acc = sums(obs.layer, h / obs.group_size);
    if (static_cast<int64_t>(acc.size()) < obs.n_slots) acc.resize(static_cast<size_t>(obs.n_slots), 0.0);
    const float* p = obs.probs + int64_t{h} * obs.n_slots;
    for (int64_t s = 0; s < obs.n_slots; ++s) acc[static_cast<size_t>(s)] += p[s];
  }
}

void AttentionSumState::on_compact(int layer, int kv_head, std::span<const int32_t> keep) {
  auto& acc = sums(layer, kv_head);
  std::vector<double> kept(keep.size(), 0.0);
  for (size_t j = 0; j < keep.size(); ++j)
    if (static_cast<size_t>(keep[j]) < acc.size()) kept[j] = acc[static_cast<size_t>(keep[j])];
  acc = std::move(kept);  // slots appended later start from zero
}

}  // namespace kvevict
