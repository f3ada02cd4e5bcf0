// triattention: scores against the spec's formula computed literally from the pre-RoPE keys
// (ref_triattention below), also at positions near 10^6; the query statistics file format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "eviction/query_stats.h"
#include "selector_fixture.h"
#include "test_tmp.h"
#include "util/error.h"

namespace kvevict {
namespace {

using namespace selector_fixture;

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

}  // namespace
}  // namespace kvevict
