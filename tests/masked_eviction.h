// Eviction against the masked full-cache reference: runs a sequence token by token recording
// which positions each (layer, KV head) still holds before every decode step, so that the naive
// reference (reference_model.h) can be run over the whole sequence with exactly the evicted
// positions masked out, and compares the two (eviction, families and LongRoPE tests share it).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "eviction/registry.h"

namespace kvevict::test {

/// What one evicting run computed and what it could see.
struct EvictionTrace {
  int64_t prompt = 0;  ///< P: tokens prefilled at once
  int n_kv_heads = 0;
  /// logits[k]: logits (n_vocab) after token P - 1 + k (k = 0: the prefill).
  std::vector<std::vector<float>> logits;
  /// visible[t][layer * n_kv_heads + head]: positions live in the cache when token t is decoded.
  std::map<int, std::vector<std::set<int>>> visible;
  int64_t rounds = 0;  ///< eviction rounds run by the end

  /// Mask for ReferenceLlama::run: every token sees itself, the prompt sees everything (it is
  /// prefilled whole), each later token t only the positions that were in its cache.
  bool sees(int t, int l, int h, int p) const {
    if (p == t || t < prompt) return true;
    return visible.at(t)[static_cast<size_t>(l * n_kv_heads + h)].count(p) > 0;
  }
};

/// Prefills tokens[0, P) into `seq`, then decodes tokens[P, n) one at a time, recording the
/// logits and, before each decode, the positions of every (layer, KV head) cache.
inline EvictionTrace trace_eviction(Engine& engine, Sequence& seq, const std::vector<int32_t>& tokens, int64_t P,
                                    int n) {
  const KvShape s = engine.kv_shape();
  EvictionTrace tr;
  tr.prompt = P;
  tr.n_kv_heads = s.n_kv_heads;
  std::vector<float> logits;
  engine.prefill(seq, std::span<const int32_t>(tokens).first(static_cast<size_t>(P)), logits);
  tr.logits.push_back(logits);
  for (int t = static_cast<int>(P); t < n; ++t) {
    auto& vis = tr.visible[t];
    for (int l = 0; l < s.n_layers; ++l)
      for (int h = 0; h < s.n_kv_heads; ++h)
        vis.emplace_back(seq.kv.positions(l, h), seq.kv.positions(l, h) + seq.kv.length(l));
    engine.decode(seq, tokens[static_cast<size_t>(t)], logits);
    tr.logits.push_back(logits);
  }
  tr.rounds = seq.stats.rounds;
  return tr;
}

/// trace_eviction of policy `random` (budget B, recent buffer r and round interval s in tokens,
/// s = 0 meaning r; `seed`, 2 threads, room for `max_new` decoded tokens) on `m` over tokens[0, n).
inline EvictionTrace trace_random_eviction(const Model& m, const std::vector<int32_t>& tokens, int64_t P, int n,
                                           int64_t B, int64_t r, uint64_t seed, int64_t max_new, int64_t s = 0) {
  Engine engine(m, 2);
  EvictionConfig cfg;
  cfg.budget = B;
  cfg.recent = r;
  cfg.interval = s;
  cfg.seed = seed;
  auto seq = engine.new_sequence(0, make_policy("random"), cfg, P, max_new);
  return trace_eviction(engine, *seq, tokens, P, n);
}

/// Every logit of the run within `tol` of the reference's ref[t] (ref: one row per token of the
/// whole sequence); stops at the first difference (wrap in ASSERT_NO_FATAL_FAILURE).
inline void expect_logits_near(const EvictionTrace& tr, const std::vector<std::vector<float>>& ref, double tol) {
  for (size_t k = 0; k < tr.logits.size(); ++k) {
    const size_t t = static_cast<size_t>(tr.prompt) - 1 + k;
    for (size_t i = 0; i < tr.logits[k].size(); ++i)
      ASSERT_NEAR(tr.logits[k][i], ref[t][i], tol) << "token " << t << " logit " << i;
  }
}

/// Whether the mask of the last token (n - 1) hid interior positions: some decoded position
/// evicted while a later one, still outside the recent buffer of `recent` tokens, was kept (so
/// not only a sliding window).
inline bool evicted_interior(const EvictionTrace& tr, int n, int64_t recent) {
  const int P = static_cast<int>(tr.prompt), end = static_cast<int>(n - 1 - recent);
  bool interior = false;
  for (const auto& set : tr.visible.at(n - 1))
    for (int p = P; p < end; ++p)
      for (int q = p + 1; q < end; ++q) interior |= !set.count(p) && set.count(q);
  return interior;
}

}  // namespace kvevict::test
