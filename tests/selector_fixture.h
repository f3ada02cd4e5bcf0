// Shared by the selector tests (tests/selector_*_test.cpp): a SequenceKv built by hand from
// seeded normal draws, observation and round helpers, and the brute-force references of
// docs/eviction-spec.md written here without code shared with the selectors: reference scores
// in double with plain loops, ranked pins first, then score descending, then slot ascending
// (spec §2.4), and the top K_sel plus the newest r taken.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "eviction/registry.h"
#include "eviction/schedule.h"
#include "kernels/rope.h"
#include "kvcache/kv_cache.h"
#include "model/observer.h"
#include "util/thread_pool.h"

namespace kvevict::selector_fixture {

inline constexpr int kLayers = 2, kKvHeads = 2, kGroup = 2, kHeads = kKvHeads * kGroup, kHd = 8;
inline constexpr int64_t kLen = 40, kRecent = 8, kBudget = 24, kPrompt = 5, kSeen = 200;
inline constexpr int64_t kCand = kLen - kRecent, kKsel = kBudget - kRecent;
inline constexpr float kTheta = 10000.0f;

inline const Rope& rope() {
  static const Rope r(kHd, kTheta);
  return r;
}

/// A cache of kLen slots per (layer, KV head): positions = the prompt [0, kPrompt), a sorted random
/// subset of [kPrompt, kSeen - kRecent), then the newest kRecent positions; pre-RoPE keys and values
/// are normal draws (values with a per-slot scale so value ranges differ), keys stored rotated by
/// their position as the forward pass stores them. `aligned`: every (layer, KV head) holds the same
/// positions. pre[l * kKvHeads + h] keeps the pre-RoPE keys [kLen * kHd].
struct HandCache {
  SequenceKv kv{KvShape{kLayers, kKvHeads, kHd}, kLen + 8};
  std::vector<std::vector<float>> pre;

  HandCache(uint64_t seed, bool aligned) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal;
    std::vector<int32_t> shared_pos;
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kKvHeads; ++h) {
        std::vector<int32_t> pos = (aligned && !shared_pos.empty()) ? shared_pos : draw_positions(gen);
        if (aligned) shared_pos = pos;
        std::vector<float> k(kLen * kHd);
        for (int64_t s = 0; s < kLen; ++s) {
          const float vscale = 0.2f + 2.0f * static_cast<float>(gen() % 1000) / 1000.0f;
          for (int d = 0; d < kHd; ++d) {
            k[static_cast<size_t>(s * kHd + d)] = normal(gen);
            kv.values(l, h)[s * kHd + d] = vscale * normal(gen);
          }
          kv.positions(l, h)[s] = pos[static_cast<size_t>(s)];
          std::copy(k.begin() + s * kHd, k.begin() + (s + 1) * kHd, kv.keys(l, h) + s * kHd);
          rope().rotate(kv.keys(l, h) + s * kHd, pos[static_cast<size_t>(s)]);
        }
        pre.push_back(std::move(k));
      }
      kv.set_length(l, kLen);
    }
  }

  static std::vector<int32_t> draw_positions(std::mt19937_64& gen) {
    std::vector<int32_t> middle(kSeen - kRecent - kPrompt);
    std::iota(middle.begin(), middle.end(), static_cast<int32_t>(kPrompt));
    std::shuffle(middle.begin(), middle.end(), gen);
    middle.resize(kCand - kPrompt);
    std::sort(middle.begin(), middle.end());
    std::vector<int32_t> pos(kPrompt);
    std::iota(pos.begin(), pos.end(), 0);
    pos.insert(pos.end(), middle.begin(), middle.end());
    for (int64_t i = 0; i < kRecent; ++i) pos.push_back(static_cast<int32_t>(kSeen - kRecent + i));
    return pos;
  }

  std::vector<int32_t> positions(int l, int h) const { return {kv.positions(l, h), kv.positions(l, h) + kv.length(l)}; }
};

/// Random queries [kHeads * kHd], scaled so that softmaxes are not flat.
inline std::vector<float> random_query(std::mt19937_64& gen) {
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> q(kHeads * kHd);
  for (float& x : q) x = normal(gen);
  return q;
}

inline void observe(SelectorState& st, int layer, const std::vector<float>& q, int64_t n_slots,
                    const float* probs = nullptr) {
  AttentionObservation o;
  o.layer = layer;
  o.position = kSeen - 1;
  o.n_heads = kHeads;
  o.group_size = kGroup;
  o.head_dim = kHd;
  o.n_slots = n_slots;
  o.queries = q.data();
  o.probs = probs;
  st.observe(o);
}

inline EvictionConfig config(uint64_t seed = 1) {
  EvictionConfig c;
  c.budget = kBudget;
  c.recent = kRecent;
  c.seed = seed;
  return c;
}

inline RoundInput round_input(const SequenceKv& kv, int64_t n_pinned, uint64_t seed = 1, int64_t round = 0,
                              ThreadPool* pool = nullptr) {
  return RoundInput{
      kv, kCand, kPrompt, kSeen, seed, 7, round, pool, kBudget, kRecent, n_pinned, &rope(), PositionMode::Logical};
}

/// Brute force of spec §2.4 for one (layer, KV head): positions < n_pinned first, then higher
/// reference score, then lower slot; keep K_sel of them, ascending, then the newest r. Returns the
/// kept positions.
inline std::vector<int32_t> brute_keep(const std::vector<double>& score, const std::vector<int32_t>& pos,
                                       int64_t n_pinned) {
  std::vector<int32_t> idx(static_cast<size_t>(kCand));
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    const bool pa = pos[static_cast<size_t>(a)] < n_pinned, pb = pos[static_cast<size_t>(b)] < n_pinned;
    if (pa != pb) return pa;
    if (score[static_cast<size_t>(a)] != score[static_cast<size_t>(b)])
      return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)];
    return a < b;
  });
  idx.resize(static_cast<size_t>(kKsel));
  std::sort(idx.begin(), idx.end());
  std::vector<int32_t> kept;
  for (int32_t i : idx) kept.push_back(pos[static_cast<size_t>(i)]);
  for (int64_t i = kCand; i < kLen; ++i) kept.push_back(pos[static_cast<size_t>(i)]);
  return kept;
}

/// Runs one real round (selector + shared schedule + compaction) and returns the kept positions of
/// every (layer, KV head), after checking the length is exactly B.
inline std::vector<std::vector<int32_t>> run_one_round(HandCache& c, const Policy& p, SelectorState* st,
                                                       uint64_t seed = 1, int64_t round = 0) {
  run_round(c.kv, p, st, config(seed), kPrompt, kSeen, 7, round, rope(), nullptr);
  std::vector<std::vector<int32_t>> out;
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kKvHeads; ++h) {
      EXPECT_EQ(c.kv.length(l), kBudget);
      out.push_back(c.positions(l, h));
    }
  return out;
}

inline std::vector<float> all_scores(const Policy& p, const SequenceKv& kv, SelectorState* st, int64_t n_pinned,
                                     uint64_t seed = 1, int64_t round = 0, ThreadPool* pool = nullptr) {
  std::vector<float> s(static_cast<size_t>(kLayers * kKvHeads * kCand));
  p.selector->score(round_input(kv, n_pinned, seed, round, pool), st, s);
  return s;
}

// ---- reference formulas (spec §3), double precision ----

inline std::vector<double> ref_softmax(const float* q, const float* K, int64_t n) {
  std::vector<double> p(static_cast<size_t>(n));
  double mx = -1e300, sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    double d = 0;
    for (int e = 0; e < kHd; ++e) d += double(q[e]) * K[j * kHd + e];
    p[static_cast<size_t>(j)] = d / std::sqrt(double(kHd));
    mx = std::max(mx, p[static_cast<size_t>(j)]);
  }
  for (double& x : p) sum += (x = std::exp(x - mx));
  for (double& x : p) x /= sum;
  return p;
}

/// SnapKV (spec §3): softmax over the candidates for each window query and group head, mean,
/// average pooling (zeros outside, divided by the kernel), the group mean folded into the mean.
inline std::vector<double> ref_snapkv(const SequenceKv& kv, int l, int h, const std::vector<std::vector<float>>& window,
                                      int kernel) {
  std::vector<double> m(static_cast<size_t>(kCand), 0.0), out(static_cast<size_t>(kCand), 0.0);
  for (const auto& q : window)
    for (int hq = h * kGroup; hq < (h + 1) * kGroup; ++hq) {
      const auto p = ref_softmax(q.data() + hq * kHd, kv.keys(l, h), kCand);
      for (int64_t j = 0; j < kCand; ++j)
        m[static_cast<size_t>(j)] += p[static_cast<size_t>(j)] / double(window.size() * kGroup);
    }
  for (int64_t j = 0; j < kCand; ++j)
    for (int64_t o = -kernel / 2; o <= kernel / 2; ++o)
      if (j + o >= 0 && j + o < kCand) out[static_cast<size_t>(j)] += m[static_cast<size_t>(j + o)] / kernel;
  return out;
}

inline void expect_scores_near(const std::vector<float>& got, const std::vector<double>& ref, int l, int h,
                               double tol) {
  for (int64_t i = 0; i < kCand; ++i)
    ASSERT_NEAR(got[static_cast<size_t>((l * kKvHeads + h) * kCand + i)], ref[static_cast<size_t>(i)], tol)
        << "layer " << l << " head " << h << " candidate " << i;
}

}  // namespace kvevict::selector_fixture
