// The scored selectors (snapkv, rkv, vase, h2o, tova, random-shared, triattention).
//
// Unit tests build a SequenceKv by hand from seeded normal draws and compare each selector's
// keep-set with a brute-force reference written here from the formula in docs/eviction-spec.md §3:
// the reference scores are recomputed in double with plain loops (no code shared with the
// selectors), ranked pins first, then score descending, then slot ascending (spec §2.4), and the
// top K_sel plus the newest r taken. End-to-end tests run every selector on stories260K through
// the Engine and check the spec's invariants (budget exactly B after each round, the newest r,
// pins) and that attention probabilities are computed only for H2O.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numbers>
#include <numeric>
#include <random>
#include <set>

#include "engine/engine.h"
#include "eval/calibrate.h"
#include "eviction/query_stats.h"
#include "eviction/registry.h"
#include "eviction/schedule.h"
#include "kernels/rope.h"
#include "model/forward.h"
#include "model_fixture.h"
#include "test_tmp.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

// ---------------------------------------------------------------------------------------------
// Hand-built caches

constexpr int kLayers = 2, kKvHeads = 2, kGroup = 2, kHeads = kKvHeads * kGroup, kHd = 8;
constexpr int64_t kLen = 40, kRecent = 8, kBudget = 24, kPrompt = 5, kSeen = 200;
constexpr int64_t kCand = kLen - kRecent, kKsel = kBudget - kRecent;
constexpr float kTheta = 10000.0f;

const Rope& rope() {
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
std::vector<float> random_query(std::mt19937_64& gen) {
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> q(kHeads * kHd);
  for (float& x : q) x = normal(gen);
  return q;
}

void observe(SelectorState& st, int layer, const std::vector<float>& q, int64_t n_slots, const float* probs = nullptr) {
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

EvictionConfig config(uint64_t seed = 1) {
  EvictionConfig c;
  c.budget = kBudget;
  c.recent = kRecent;
  c.seed = seed;
  return c;
}

RoundInput round_input(const SequenceKv& kv, int64_t n_pinned, uint64_t seed = 1, int64_t round = 0,
                       ThreadPool* pool = nullptr) {
  return RoundInput{
      kv, kCand, kPrompt, kSeen, seed, 7, round, pool, kBudget, kRecent, n_pinned, &rope(), PositionMode::Logical};
}

/// Brute force of spec §2.4 for one (layer, KV head): positions < n_pinned first, then higher
/// reference score, then lower slot; keep K_sel of them, ascending, then the newest r. Returns the
/// kept positions.
std::vector<int32_t> brute_keep(const std::vector<double>& score, const std::vector<int32_t>& pos, int64_t n_pinned) {
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
std::vector<std::vector<int32_t>> run_one_round(HandCache& c, const Policy& p, SelectorState* st, uint64_t seed = 1,
                                                int64_t round = 0) {
  run_round(c.kv, p, st, config(seed), kPrompt, kSeen, 7, round, rope(), nullptr);
  std::vector<std::vector<int32_t>> out;
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kKvHeads; ++h) {
      EXPECT_EQ(c.kv.length(l), kBudget);
      out.push_back(c.positions(l, h));
    }
  return out;
}

std::vector<float> all_scores(const Policy& p, const SequenceKv& kv, SelectorState* st, int64_t n_pinned,
                              uint64_t seed = 1, int64_t round = 0, ThreadPool* pool = nullptr) {
  std::vector<float> s(static_cast<size_t>(kLayers * kKvHeads * kCand));
  p.selector->score(round_input(kv, n_pinned, seed, round, pool), st, s);
  return s;
}

// ---- reference formulas (spec §3), double precision ----

std::vector<double> ref_softmax(const float* q, const float* K, int64_t n) {
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
std::vector<double> ref_snapkv(const SequenceKv& kv, int l, int h, const std::vector<std::vector<float>>& window,
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

/// R-KV (spec §3): λ·snapkv − (1−λ)·softmax_i(mean_j cos(k_i, k_j)), diagonal zeroed, mean over n.
std::vector<double> ref_rkv(const SequenceKv& kv, int l, int h, const std::vector<std::vector<float>>& window,
                            double lambda) {
  const auto snap = ref_snapkv(kv, l, h, window, 5);
  const float* K = kv.keys(l, h);
  std::vector<double> red(static_cast<size_t>(kCand));
  for (int64_t i = 0; i < kCand; ++i) {
    double s = 0;
    for (int64_t j = 0; j < kCand; ++j) {
      if (i == j) continue;
      double dot = 0, ni = 0, nj = 0;
      for (int e = 0; e < kHd; ++e)
        dot += double(K[i * kHd + e]) * K[j * kHd + e], ni += double(K[i * kHd + e]) * K[i * kHd + e],
            nj += double(K[j * kHd + e]) * K[j * kHd + e];
      s += dot / (std::sqrt(ni) * std::sqrt(nj));
    }
    red[static_cast<size_t>(i)] = s / kCand;
  }
  double z = 0;
  for (double r : red) z += std::exp(r);
  std::vector<double> out(static_cast<size_t>(kCand));
  for (int64_t i = 0; i < kCand; ++i)
    out[static_cast<size_t>(i)] =
        lambda * snap[static_cast<size_t>(i)] - (1 - lambda) * std::exp(red[static_cast<size_t>(i)]) / z;
  return out;
}

void expect_scores_near(const std::vector<float>& got, const std::vector<double>& ref, int l, int h, double tol) {
  for (int64_t i = 0; i < kCand; ++i)
    ASSERT_NEAR(got[static_cast<size_t>((l * kKvHeads + h) * kCand + i)], ref[static_cast<size_t>(i)], tol)
        << "layer " << l << " head " << h << " candidate " << i;
}

// ---------------------------------------------------------------------------------------------
// Scored selectors vs brute force

TEST(SnapKv, KeepSetMatchesFormula) {
  // Window w = 4 fed 6 queries: only the last 4 may count (ring buffer). Pins: none (default),
  // the prompt (+prompt) and 3 sinks.
  for (const auto& [spec, sinks, n_pinned] : std::vector<std::tuple<std::string, int, int64_t>>{
           {"snapkv", 0, 0}, {"snapkv+prompt", 0, kPrompt}, {"snapkv", 3, 3}}) {
    SCOPED_TRACE(spec + " sinks " + std::to_string(sinks));
    const Policy p = make_policy(spec, std::nullopt, sinks, SelectorParams::parse({"window=4"}));
    HandCache c(11, false);
    auto st = p.selector->make_state(c.kv.shape());
    std::mt19937_64 gen(3);
    std::vector<std::vector<std::vector<float>>> fed(kLayers);
    for (int step = 0; step < 6; ++step)
      for (int l = 0; l < kLayers; ++l) {
        fed[static_cast<size_t>(l)].push_back(random_query(gen));
        observe(*st, l, fed[static_cast<size_t>(l)].back(), kLen);
      }
    const auto scores = all_scores(p, c.kv, st.get(), n_pinned);
    std::vector<std::vector<int32_t>> expect;
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        const std::vector<std::vector<float>> window(fed[static_cast<size_t>(l)].end() - 4,
                                                     fed[static_cast<size_t>(l)].end());
        const auto ref = ref_snapkv(c.kv, l, h, window, 5);
        expect_scores_near(scores, ref, l, h, 1e-6);
        expect.push_back(brute_keep(ref, c.positions(l, h), n_pinned));
      }
    EXPECT_EQ(run_one_round(c, p, st.get()), expect);
  }
}

TEST(SnapKv, FewerQueriesThanWindowAndKernelParameter) {
  // Default w = 64 with 3 queries seen: the mean runs over the 3. kernel=1 means no pooling.
  const Policy p = make_policy("snapkv", std::nullopt, std::nullopt, SelectorParams::parse({"kernel=1"}));
  HandCache c(12, false);
  auto st = p.selector->make_state(c.kv.shape());
  std::mt19937_64 gen(4);
  std::vector<std::vector<float>> fed;
  for (int step = 0; step < 3; ++step) {
    fed.push_back(random_query(gen));
    for (int l = 0; l < kLayers; ++l) observe(*st, l, fed.back(), kLen);
  }
  const auto scores = all_scores(p, c.kv, st.get(), 0);
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kKvHeads; ++h) expect_scores_near(scores, ref_snapkv(c.kv, l, h, fed, 1), l, h, 1e-6);
}

TEST(Rkv, KeepSetMatchesFormula) {
  for (const auto& [spec, lambda] : std::vector<std::pair<std::string, double>>{{"rkv", 0.5}, {"rkv+prompt", 0.1}}) {
    SCOPED_TRACE(spec);
    const Policy p = make_policy(spec, std::nullopt, std::nullopt,
                                 SelectorParams::parse({"lambda=" + std::to_string(lambda), "window=3"}));
    const int64_t n_pinned = p.protect_prompt ? kPrompt : 0;
    HandCache c(13, false);
    auto st = p.selector->make_state(c.kv.shape());
    std::mt19937_64 gen(5);
    std::vector<std::vector<float>> fed;
    for (int step = 0; step < 3; ++step) {
      fed.push_back(random_query(gen));
      for (int l = 0; l < kLayers; ++l) observe(*st, l, fed.back(), kLen);
    }
    const auto scores = all_scores(p, c.kv, st.get(), n_pinned);
    std::vector<std::vector<int32_t>> expect;
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        const auto ref = ref_rkv(c.kv, l, h, fed, lambda);
        expect_scores_near(scores, ref, l, h, 1e-6);
        expect.push_back(brute_keep(ref, c.positions(l, h), n_pinned));
      }
    EXPECT_EQ(run_one_round(c, p, st.get()), expect);
  }
}

TEST(Tova, KeepSetMatchesFormula) {
  // The newest query's softmax over every live slot (kLen of them), read at the candidates;
  // group mean, or mean over all query heads of the layer (tova_scope=layer, aligned cache).
  for (const std::string scope : {"group", "layer"}) {
    SCOPED_TRACE(scope);
    const Policy p = make_policy("tova", std::nullopt, std::nullopt, SelectorParams::parse({"tova_scope=" + scope}));
    HandCache c(14, scope == "layer");
    auto st = p.selector->make_state(c.kv.shape());
    std::mt19937_64 gen(6);
    std::vector<std::vector<float>> newest(kLayers);
    for (int step = 0; step < 3; ++step)
      for (int l = 0; l < kLayers; ++l) observe(*st, l, newest[static_cast<size_t>(l)] = random_query(gen), kLen);
    const auto scores = all_scores(p, c.kv, st.get(), 0);
    std::vector<std::vector<int32_t>> expect;
    for (int l = 0; l < kLayers; ++l) {
      std::vector<std::vector<double>> group_mean(kKvHeads, std::vector<double>(kCand, 0.0));
      for (int hq = 0; hq < kHeads; ++hq) {
        const auto pr = ref_softmax(newest[static_cast<size_t>(l)].data() + hq * kHd, c.kv.keys(l, hq / kGroup), kLen);
        for (int64_t i = 0; i < kCand; ++i)
          group_mean[static_cast<size_t>(hq / kGroup)][static_cast<size_t>(i)] += pr[static_cast<size_t>(i)] / kGroup;
      }
      for (int h = 0; h < kKvHeads; ++h) {
        std::vector<double> ref = group_mean[static_cast<size_t>(h)];
        if (scope == "layer")
          for (int64_t i = 0; i < kCand; ++i)
            ref[static_cast<size_t>(i)] =
                (group_mean[0][static_cast<size_t>(i)] + group_mean[1][static_cast<size_t>(i)]) / 2;
        expect_scores_near(scores, ref, l, h, 1e-6);
        expect.push_back(brute_keep(ref, c.positions(l, h), 0));
      }
    }
    const auto got = run_one_round(c, p, st.get());
    EXPECT_EQ(got, expect);
    if (scope == "layer") {
      for (int l = 0; l < kLayers; ++l)
        EXPECT_EQ(got[static_cast<size_t>(l * kKvHeads)], got[static_cast<size_t>(l * kKvHeads + 1)]);
    }
  }
}

TEST(H2o, KeepSetMatchesAccumulatedAttentionAcrossRounds) {
  // Reference: accumulators keyed by *position* (not slot): every observation adds each query
  // head's probability of each live slot to the position that slot holds, summed over the group.
  // Two rounds with new slots appended in between, so the slot-aligned state must follow the
  // compaction. Keep rule (spec §3): pins, then the newest (free - heavy) unpinned candidates,
  // then the heaviest, free = K_sel - pinned candidates, heavy = floor(free * 0.5).
  for (const std::string spec : {"h2o", "h2o+prompt"}) {
    SCOPED_TRACE(spec);
    const Policy p = make_policy(spec);
    const int64_t n_pinned = p.protect_prompt ? kPrompt : 0;
    HandCache c(15, false);
    auto st = p.selector->make_state(c.kv.shape());
    std::mt19937_64 gen(7);
    std::uniform_real_distribution<float> uni(0.0f, 1.0f);
    std::map<std::pair<int, int>, std::map<int32_t, double>> acc;
    const auto feed = [&](int64_t n_slots) {
      for (int l = 0; l < kLayers; ++l) {
        std::vector<float> probs(static_cast<size_t>(kHeads * n_slots));
        for (float& x : probs) x = uni(gen) * uni(gen);  // skewed, not normalised: only sums matter
        observe(*st, l, random_query(gen), n_slots, probs.data());
        for (int hq = 0; hq < kHeads; ++hq)
          for (int64_t s = 0; s < n_slots; ++s)
            acc[{l, hq / kGroup}][c.kv.positions(l, hq / kGroup)[s]] += probs[static_cast<size_t>(hq * n_slots + s)];
      }
    };
    const auto expected = [&] {
      std::vector<std::vector<int32_t>> out;
      for (int l = 0; l < kLayers; ++l)
        for (int h = 0; h < kKvHeads; ++h) {
          const auto pos = c.positions(l, h);
          int64_t pinned = 0;
          for (int64_t i = 0; i < kCand; ++i) pinned += pos[static_cast<size_t>(i)] < n_pinned;
          const int64_t free = kKsel - pinned, heavy = free / 2;
          std::vector<double> ref(static_cast<size_t>(kCand));
          int64_t recent_left = free - heavy;
          for (int64_t i = kCand - 1; i >= 0; --i) {
            ref[static_cast<size_t>(i)] = acc[{l, h}][pos[static_cast<size_t>(i)]];
            if (pos[static_cast<size_t>(i)] >= n_pinned && recent_left > 0)
              ref[static_cast<size_t>(i)] = 1e300, --recent_left;
          }
          out.push_back(brute_keep(ref, pos, n_pinned));
        }
      return out;
    };
    for (int64_t n = kLen - 3; n <= kLen; ++n) feed(n);  // slots entering over time
    auto expect = expected();
    EXPECT_EQ(run_one_round(c, p, st.get()), expect);
    // Append kLen - kBudget fresh slots at newer positions, observe, and run a second round.
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kKvHeads; ++h)
        for (int64_t s = kBudget; s < kLen; ++s) {
          c.kv.positions(l, h)[s] = static_cast<int32_t>(kSeen + s - kBudget);
          for (int d = 0; d < kHd; ++d)
            c.kv.keys(l, h)[s * kHd + d] = c.kv.values(l, h)[s * kHd + d] = 0.1f * static_cast<float>(d);
        }
      c.kv.set_length(l, kLen);
    }
    feed(kLen);
    feed(kLen);
    expect = expected();
    run_round(c.kv, p, st.get(), config(), kPrompt, kSeen + kLen - kBudget, 7, 1, rope(), nullptr);
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kKvHeads; ++h) EXPECT_EQ(c.positions(l, h), expect[static_cast<size_t>(l * kKvHeads + h)]);
  }
}

TEST(Vase, TiersAndDeterminism) {
  // Spec §3: the first 4 positions kept; the n_large widest value ranges (sinks counted in) kept;
  // the rest sampled. n_large = 10 here: 4 sinks + the 6 widest unpinned ranges, 6 samples.
  const Policy p = make_policy("vase", std::nullopt, std::nullopt, SelectorParams::parse({"n_large=10", "window=2"}));
  HandCache c(16, false);
  auto st = p.selector->make_state(c.kv.shape());
  std::mt19937_64 gen(8);
  for (int step = 0; step < 2; ++step)
    for (int l = 0; l < kLayers; ++l) observe(*st, l, random_query(gen), kLen);
  const auto a = all_scores(p, c.kv, st.get(), 0, /*seed=*/5);
  ThreadPool pool(3);
  EXPECT_EQ(a, all_scores(p, c.kv, st.get(), 0, 5, 0, &pool));  // thread count does not matter
  EXPECT_NE(a, all_scores(p, c.kv, st.get(), 0, 6));            // the seed does
  EXPECT_NE(a, all_scores(p, c.kv, st.get(), 0, 5, 1));         // so does the round
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kKvHeads; ++h) {
      const auto pos = c.positions(l, h);
      std::vector<float> sc(a.begin() + (l * kKvHeads + h) * kCand, a.begin() + (l * kKvHeads + h + 1) * kCand);
      const auto keep = choose_keep_set(sc, pos.data(), 0, kKsel, kRecent);
      std::set<int32_t> kept(keep.begin(), keep.end());
      for (int32_t s = 0; s < 4; ++s) EXPECT_TRUE(kept.count(s)) << "sink " << s;
      std::vector<std::pair<float, int32_t>> ranges;  // (−range, slot) of non-sink candidates
      for (int32_t i = 4; i < kCand; ++i) {
        const float* v = c.kv.values(l, h) + int64_t{i} * kHd;
        ranges.emplace_back(-(*std::max_element(v, v + kHd) - *std::min_element(v, v + kHd)), i);
      }
      std::sort(ranges.begin(), ranges.end());
      for (int k = 0; k < 6; ++k) EXPECT_TRUE(kept.count(ranges[static_cast<size_t>(k)].second)) << "range rank " << k;
    }
}

TEST(Vase, SampleIsProportionalToSnapKv) {
  // One sampled slot per round (K_sel 16 = 4 sinks + 11 range tier + 1): over many rounds each
  // remaining candidate must be drawn with probability w_i / Σw, w = the SnapKV score (spec §3),
  // computed by ref_snapkv. Bound: 5 binomial standard deviations.
  const Policy p = make_policy("vase", std::nullopt, std::nullopt, SelectorParams::parse({"n_large=15", "window=2"}));
  HandCache c(17, false);
  auto st = p.selector->make_state(c.kv.shape());
  std::mt19937_64 gen(9);
  std::vector<std::vector<float>> fed;
  for (int step = 0; step < 2; ++step) {
    fed.push_back(random_query(gen));
    for (int l = 0; l < kLayers; ++l) observe(*st, l, fed.back(), kLen);
  }
  const int l = 1, h = 0, trials = 4000;
  const auto pos = c.positions(l, h);
  const auto w = ref_snapkv(c.kv, l, h, fed, 5);
  std::map<int32_t, int> drawn;
  std::set<int32_t> tier;
  for (int t = 0; t < trials; ++t) {
    const auto a = all_scores(p, c.kv, st.get(), 0, 1, t);
    std::vector<float> sc(a.begin() + (l * kKvHeads + h) * kCand, a.begin() + (l * kKvHeads + h + 1) * kCand);
    std::set<int32_t> ranked;  // sinks and range tier: scores > 0
    for (int32_t i = 0; i < kCand; ++i)
      if (sc[static_cast<size_t>(i)] > 0) ranked.insert(i);
    ASSERT_EQ(ranked.size(), 15u);
    if (t == 0) tier = ranked;
    ASSERT_EQ(ranked, tier);  // the deterministic tiers do not depend on the draw
    for (int32_t s : choose_keep_set(sc, pos.data(), 0, kKsel, kRecent))
      if (s < kCand && !tier.count(s)) drawn[s] += 1;
  }
  double total = 0;
  for (int32_t i = 0; i < kCand; ++i)
    if (!tier.count(i)) total += w[static_cast<size_t>(i)];
  for (int32_t i = 0; i < kCand; ++i) {
    if (tier.count(i)) continue;
    const double pi = w[static_cast<size_t>(i)] / total, f = drawn[i] / double(trials);
    EXPECT_NEAR(f, pi, 5 * std::sqrt(pi * (1 - pi) / trials) + 1e-3) << "candidate " << i;
  }
}

// ---- TriAttention ----

QueryStats random_stats(uint64_t seed) {
  QueryStats s;
  s.n_layers = kLayers;
  s.n_heads = kHeads;
  s.n_kv_heads = kKvHeads;
  s.head_dim = kHd;
  s.rope_theta = kTheta;
  s.tokens = 1000;
  s.model = "hand-built";
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  for (int i = 0; i < kLayers * kHeads * kHd / 2; ++i) {
    s.mean_re.push_back(normal(gen));
    s.mean_im.push_back(normal(gen));
    s.mean_abs.push_back(std::hypot(s.mean_re.back(), s.mean_im.back()) + std::abs(normal(gen)));
  }
  return s;
}

std::string temp_path(const std::string& name) { return test::tmp_path("sel_" + name); }

/// The spec's formula, literally, from the *pre-RoPE* keys the cache was built from: per query
/// head and band, amp·cos((t − p + d)ω_f + φ) averaged over d ∈ {1, 2, …, 65536}, plus the extra
/// term; z-normalised over candidates at positions >= min(prompt, K_sel − 1); max over the group;
/// mean over layers. Returns [kKvHeads][kCand].
std::vector<std::vector<double>> ref_triattention(const HandCache& c, const QueryStats& st, int64_t t) {
  const int64_t pin_extent = std::min(kPrompt, kKsel - 1);
  std::vector<std::vector<double>> out(kKvHeads, std::vector<double>(kCand, 0.0));
  for (int h = 0; h < kKvHeads; ++h)
    for (int l = 0; l < kLayers; ++l) {
      std::vector<double> best(kCand, -1e300);
      for (int hq = h * kGroup; hq < (h + 1) * kGroup; ++hq) {
        std::vector<double> s(kCand, 0.0);
        for (int64_t i = 0; i < kCand; ++i) {
          const float* k = c.pre[static_cast<size_t>(l * kKvHeads + h)].data() + i * kHd;
          const double p = c.kv.positions(l, h)[i];
          for (int f = 0; f < kHd / 2; ++f) {
            const std::complex<double> q(st.mean_re[st.index(l, hq, f)], st.mean_im[st.index(l, hq, f)]);
            const std::complex<double> kf(k[2 * f], k[2 * f + 1]);
            const double amp = std::abs(q) * std::abs(kf), phi = std::arg(q * std::conj(kf));
            const double omega = std::pow(double(kTheta), -2.0 * f / kHd);
            double trig = 0;
            for (int64_t d = 1; d <= 65536; d *= 2) trig += amp * std::cos((double(t) - p + double(d)) * omega + phi);
            s[static_cast<size_t>(i)] += trig / 17 + (st.mean_abs[st.index(l, hq, f)] - std::abs(q)) * std::abs(kf);
          }
        }
        double mu = 0, var = 0, n = 0;
        for (int64_t i = 0; i < kCand; ++i)
          if (c.kv.positions(l, h)[i] >= pin_extent) mu += s[static_cast<size_t>(i)], n += 1;
        mu /= n;
        for (int64_t i = 0; i < kCand; ++i)
          if (c.kv.positions(l, h)[i] >= pin_extent)
            var += (s[static_cast<size_t>(i)] - mu) * (s[static_cast<size_t>(i)] - mu);
        const double sd = std::max(1e-6, std::sqrt(var / n));
        for (int64_t i = 0; i < kCand; ++i)
          best[static_cast<size_t>(i)] = std::max(best[static_cast<size_t>(i)], (s[static_cast<size_t>(i)] - mu) / sd);
      }
      for (int64_t i = 0; i < kCand; ++i)
        out[static_cast<size_t>(h)][static_cast<size_t>(i)] += best[static_cast<size_t>(i)] / kLayers;
    }
  return out;
}

TEST(TriAttention, ScoresEqualTheFormulaAtKnownPositions) {
  const QueryStats st = random_stats(21);
  const std::string path = temp_path("tri_stats.json");
  save_query_stats(st, path);
  const Policy p = make_policy("triattention", std::nullopt, std::nullopt, SelectorParams::parse({"stats=" + path}));
  EXPECT_TRUE(p.protect_prompt);  // spec: pins the prompt natively
  HandCache c(18, /*aligned=*/true);
  const auto scores = all_scores(p, c.kv, nullptr, kPrompt);
  const auto ref = ref_triattention(c, st, kSeen);
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kKvHeads; ++h) expect_scores_near(scores, ref[static_cast<size_t>(h)], l, h, 2e-4);
  // The keep-set: one per KV head, the same in every layer.
  std::vector<std::vector<int32_t>> expect;
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kKvHeads; ++h)
      expect.push_back(brute_keep(ref[static_cast<size_t>(h)], c.positions(l, h), kPrompt));
  const auto got = run_one_round(c, p, nullptr);
  EXPECT_EQ(got, expect);
  for (int h = 0; h < kKvHeads; ++h) EXPECT_EQ(got[static_cast<size_t>(h)], got[static_cast<size_t>(kKvHeads + h)]);
  std::filesystem::remove(path);
}

TEST(TriAttention, LargePositionsAndErrors) {
  // Positions near 10^6 (phases of 10^6 radians): the closed form must still match the formula.
  const QueryStats st = random_stats(22);
  const std::string path = temp_path("tri_stats2.json");
  save_query_stats(st, path);
  const Policy p = make_policy("triattention", std::nullopt, std::nullopt, SelectorParams::parse({"stats=" + path}));
  HandCache c(19, true);
  const int32_t shift = 1000000;
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kKvHeads; ++h)
      for (int64_t s = kPrompt; s < kLen; ++s) {
        c.kv.positions(l, h)[s] += shift;
        const float* pre = c.pre[static_cast<size_t>(l * kKvHeads + h)].data() + s * kHd;
        std::copy(pre, pre + kHd, c.kv.keys(l, h) + s * kHd);
        rope().rotate(c.kv.keys(l, h) + s * kHd, c.kv.positions(l, h)[s]);
      }
  RoundInput in = round_input(c.kv, kPrompt);
  in.n_seen = kSeen + shift;
  std::vector<float> scores(static_cast<size_t>(kLayers * kKvHeads * kCand));
  p.selector->score(in, nullptr, scores);
  const auto ref = ref_triattention(c, st, kSeen + shift);
  for (int h = 0; h < kKvHeads; ++h) expect_scores_near(scores, ref[static_cast<size_t>(h)], 0, h, 2e-3);
  // Layers holding different positions cannot share a keep-set.
  c.kv.positions(1, 0)[kPrompt] -= 1;
  EXPECT_THROW(p.selector->score(in, nullptr, scores), Error);
  // Statistics of another shape, a missing file, and no file at all are user errors.
  EXPECT_THROW(p.selector->make_state(KvShape{3, kKvHeads, kHd}), Error);
  EXPECT_THROW(
      make_policy("triattention", std::nullopt, std::nullopt, SelectorParams::parse({"stats=/nonexistent.json"})),
      Error);
  EXPECT_THROW(make_policy("triattention"), Error);
  std::filesystem::remove(path);
}

TEST(QueryStatsFile, RoundTripAndBadFiles) {
  const QueryStats st = random_stats(23);
  const std::string path = temp_path("stats_rt.json");
  save_query_stats(st, path);
  const QueryStats back = load_query_stats(path);
  EXPECT_EQ(back.n_layers, st.n_layers);
  EXPECT_EQ(back.n_heads, st.n_heads);
  EXPECT_EQ(back.mean_re, st.mean_re);  // JSON keeps doubles exactly (round-trip formatting)
  EXPECT_EQ(back.mean_im, st.mean_im);
  EXPECT_EQ(back.mean_abs, st.mean_abs);
  for (const std::string bad : {"{}", "not json", R"({"format":"kvevict-query-stats","version":1,"n_layers":2})"}) {
    { std::ofstream(path) << bad; }
    EXPECT_THROW(load_query_stats(path), Error) << bad;
  }
  std::filesystem::remove(path);
}

// ---- random-shared vs random ----

TEST(RandomShared, OneDrawPerLayerSharedByKvHeads) {
  HandCache c(20, false);
  const Policy shared = make_policy("random-shared"), rnd = make_policy("random");
  EXPECT_TRUE(shared.protect_prompt);
  const auto s = all_scores(shared, c.kv, nullptr, kPrompt, 3);
  const auto r = all_scores(rnd, c.kv, nullptr, kPrompt, 3);
  const auto head = [](const std::vector<float>& v, int l, int h) {
    return std::vector<float>(v.begin() + (l * kKvHeads + h) * kCand, v.begin() + (l * kKvHeads + h + 1) * kCand);
  };
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(head(s, l, 0), head(s, l, 1));
    EXPECT_NE(head(r, l, 0), head(r, l, 1));
  }
  EXPECT_NE(head(s, 0, 0), head(s, 1, 0));  // fresh per layer
  // Deterministic by seed, independent of the thread count; another seed or round differs.
  ThreadPool pool(3);
  for (const Policy* p : {&shared, &rnd}) {
    EXPECT_EQ(all_scores(*p, c.kv, nullptr, kPrompt, 3, 0, &pool), all_scores(*p, c.kv, nullptr, kPrompt, 3));
    EXPECT_NE(all_scores(*p, c.kv, nullptr, kPrompt, 4), all_scores(*p, c.kv, nullptr, kPrompt, 3));
    EXPECT_NE(all_scores(*p, c.kv, nullptr, kPrompt, 3, 1), all_scores(*p, c.kv, nullptr, kPrompt, 3));
  }
}

TEST(SelectorParams, BadValuesAreErrors) {
  const auto make = [](const std::string& policy, const std::string& kv) {
    return make_policy(policy, std::nullopt, std::nullopt, SelectorParams::parse({kv}));
  };
  EXPECT_THROW(make("snapkv", "kernel=4"), Error);  // even kernel: no "same" padding
  EXPECT_THROW(make("snapkv", "window=0"), Error);
  EXPECT_THROW(make("snapkv", "window=2.5"), Error);
  EXPECT_THROW(make("rkv", "lambda=1.5"), Error);
  EXPECT_THROW(make("tova", "tova_scope=head"), Error);
  EXPECT_THROW(make("h2o", "heavy_ratio=-0.1"), Error);
  EXPECT_THROW(make("vase", "n_large=-3"), Error);
  EXPECT_THROW(make("random-shared", "window=4"), Error);
  EXPECT_NO_THROW(make("tova", "tova_scope=layer"));
  EXPECT_NO_THROW(make("h2o", "heavy_ratio=0.25"));
}

// ---------------------------------------------------------------------------------------------
// End to end on stories260K: invariants for every selector, probabilities only for H2O

/// Statistics for `triattention` from the TinyStories sample (not an evaluation text here).
const std::string& stories_stats() {
  static const std::string path = [] {
    const Model* m = test::stories_model();
    std::ifstream f(test::shared_path("data/tinystories/tinystories_sample.txt"));
    const std::string text((std::istreambuf_iterator<char>(f)), {});
    ThreadPool pool(2);
    QueryStats st = calibrate_query_stats(*m, m->tokenizer().encode(text, true), 256, pool);
    const std::string p = temp_path("stories_stats.json");
    save_query_stats(st, p);
    return p;
  }();
  return path;
}

// Every registered evicting policy except the four schedule baselines that eviction_test.cpp
// covers: read from the registry, so a new selector is tested by adding its file and registry line.
std::vector<std::string> scored_policies() {
  const std::set<std::string> baselines = {"random", "random-unprotected", "recency", "streaming"};
  std::vector<std::string> out;
  for (const PolicyInfo* p : all_policies())
    if (p->evicts && !baselines.count(p->name)) out.push_back(p->name);
  return out;
}

Policy build(const std::string& spec, std::optional<int> sinks = std::nullopt) {
  std::vector<std::string> params;
  if (spec.rfind("triattention", 0) == 0) params.push_back("stats=" + stories_stats());
  return make_policy(spec, std::nullopt, sinks, SelectorParams::parse(params));
}

std::vector<int32_t> story(const Model& m, int n) {
  // The prompt plus a fixed pseudo-random continuation, so every policy sees the same tokens.
  auto ids = m.tokenizer().encode("Once upon a time, Lily and Ben found a small red box", true);
  std::mt19937 gen(5);
  while (static_cast<int>(ids.size()) < n) ids.push_back(static_cast<int32_t>(3 + gen() % (m.config().n_vocab - 3)));
  return ids;
}

TEST(SelectorsEndToEnd, BudgetRecentAndPinsAfterEveryRound) {
  KVEVICT_REQUIRE_MODEL(m);
  const auto tokens = story(*m, 260);
  const int64_t P = 13, B = 48, r = 16, k_sel = B - r;
  const KvShape shape{m->config().n_layers, m->config().n_kv_heads, m->config().head_dim};
  for (const std::string& name : scored_policies())
    for (const auto& [variant, sinks] : std::vector<std::pair<std::string, std::optional<int>>>{
             {"", std::nullopt}, {"+prompt", std::nullopt}, {"", 3}}) {
      const Policy p = build(name + variant, sinks);
      SCOPED_TRACE(p.name + (sinks ? " --sinks 3" : ""));
      Engine engine(*m, 2);
      EvictionConfig cfg;
      cfg.budget = B;
      cfg.recent = r;
      cfg.seed = 9;
      auto seq = engine.new_sequence(0, p, cfg, P, static_cast<int64_t>(tokens.size()) - P);
      std::vector<float> logits;
      engine.prefill(*seq, std::span<const int32_t>(tokens).first(P), logits);
      int64_t checked = 0;
      for (size_t t = P; t < tokens.size(); ++t) {
        const int64_t before = seq->stats.rounds;
        engine.decode(*seq, tokens[t], logits);
        ASSERT_LE(seq->kv.length(0), B + r);
        if (seq->stats.rounds == before) continue;
        ++checked;
        const int64_t seen = seq->n_seen;
        // Pinned: the prompt when protected (all 13 < K_sel - 1), the sinks, VaSE's own 4 sinks.
        int32_t must_keep = std::max(p.protect_prompt ? static_cast<int32_t>(P) : 0, sinks.value_or(0));
        if (name == "vase") must_keep = std::max(must_keep, 4);
        for (int l = 0; l < shape.n_layers; ++l)
          for (int h = 0; h < shape.n_kv_heads; ++h) {
            ASSERT_EQ(seq->kv.length(l), B);  // exactly B after the round
            const std::vector<int32_t> pos(seq->kv.positions(l, h), seq->kv.positions(l, h) + B);
            ASSERT_TRUE(std::adjacent_find(pos.begin(), pos.end(), std::greater_equal<>()) ==
                        pos.end());  // strictly increasing
            for (int64_t i = 0; i < r; ++i) ASSERT_EQ(pos[static_cast<size_t>(k_sel + i)], seen - r + i);  // newest r
            for (int32_t q = 0; q < must_keep; ++q)
              ASSERT_EQ(pos[static_cast<size_t>(q)], q) << "pinned position " << q;
            if (name == "triattention") {  // one keep-set per KV head shared by all layers
              ASSERT_TRUE(std::equal(pos.begin(), pos.end(), seq->kv.positions(0, h)));
            }
            if (name == "random-shared") {  // identical across the KV heads of a layer
              ASSERT_TRUE(std::equal(pos.begin(), pos.end(), seq->kv.positions(l, 0)));
            }
          }
      }
      EXPECT_EQ(checked, (static_cast<int64_t>(tokens.size()) - (B + r)) / r + 1);
      EXPECT_EQ(seq->stats.rounds, checked);
      EXPECT_GT(seq->stats.score_ms, 0.0);
      EXPECT_GT(seq->stats.compact_ms, 0.0);
    }
}

TEST(SelectorsEndToEnd, SeededSelectorsAreReproducibleAcrossThreadCounts) {
  KVEVICT_REQUIRE_MODEL(m);
  const auto tokens = story(*m, 200);
  const auto trace = [&](const std::string& pol, int threads, uint64_t seed) {
    Engine engine(*m, threads);
    EvictionConfig cfg;
    cfg.budget = 48;
    cfg.recent = 16;
    cfg.seed = seed;
    auto seq = engine.new_sequence(0, build(pol), cfg, 13, 200);
    std::vector<float> logits;
    engine.prefill(*seq, std::span<const int32_t>(tokens).first(13), logits);
    std::vector<int32_t> all;
    for (size_t t = 13; t < tokens.size(); ++t) engine.decode(*seq, tokens[t], logits);
    for (int l = 0; l < m->config().n_layers; ++l)
      for (int h = 0; h < m->config().n_kv_heads; ++h)
        all.insert(all.end(), seq->kv.positions(l, h), seq->kv.positions(l, h) + seq->kv.length(l));
    return all;
  };
  for (const std::string pol : {"random", "random-shared", "vase", "random-beacon"}) {
    SCOPED_TRACE(pol);
    EXPECT_EQ(trace(pol, 1, 5), trace(pol, 2, 5));
    EXPECT_NE(trace(pol, 1, 5), trace(pol, 1, 6));
  }
}

TEST(SelectorsEndToEnd, AttentionProbabilitiesOnlyWhenAsked) {
  // Only H2O declares needs().attention; for every other policy the two-pass
  // kernel never runs, so g_attention_probability_rows must not move over a generation. For H2O
  // it counts one row per (token, layer, query head): (prompt + decode steps) * layers * heads.
  KVEVICT_REQUIRE_MODEL(m);
  const auto tokens = story(*m, 150);
  std::vector<std::string> policies;
  for (const PolicyInfo* p : all_policies()) policies.push_back(p->name);  // the whole registry
  for (const std::string& name : policies) {
    SCOPED_TRACE(name);
    const Policy p = build(name);
    Engine engine(*m, 2);
    EvictionConfig cfg;
    cfg.budget = p.evicts ? 48 : 0;
    cfg.recent = 16;
    const int64_t before = g_attention_probability_rows.load();
    auto seq = engine.new_sequence(0, p, cfg, 13, 150);
    std::vector<float> logits;
    engine.prefill(*seq, std::span<const int32_t>(tokens).first(13), logits);
    for (size_t t = 13; t < tokens.size(); ++t) engine.decode(*seq, tokens[t], logits);
    const int64_t rows = g_attention_probability_rows.load() - before;
    if (name == "h2o") {
      EXPECT_EQ(rows, static_cast<int64_t>(tokens.size()) * m->config().n_layers * m->config().n_heads);
      EXPECT_GT(seq->stats.observe_ms, 0.0);
    } else {
      EXPECT_EQ(rows, 0);
    }
    if (!p.selector || !p.selector->needs().any()) {
      EXPECT_EQ(seq->stats.observe_ms, 0.0);
    }
  }
}

}  // namespace
}  // namespace kvevict
