// Sampler and seeding. Expected frequencies come from the nucleus-sampling definition
// (Holtzman et al. §3.1) evaluated in the test; thread-pool determinism from its contract.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/sampler.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

TEST(Sampler, GreedyAndDegenerateSettingsPickArgmax) {
  const std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f, 2.0f};
  Rng rng(1);
  EXPECT_EQ(argmax(logits), 1);  // lowest id on ties
  EXPECT_EQ(sample_token(logits, {0.0f, 0.95f, 0, 0}, rng), 1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sample_token(logits, {1.0f, 1.0f, 1, 0}, rng), 1);   // top-k 1
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sample_token(logits, {1.0f, 1e-6f, 0, 0}, rng), 1);  // tiny top-p
}

TEST(Sampler, FrequenciesMatchTruncatedSoftmax) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -3.0f};
  const float temp = 0.7f, top_p = 0.9f;
  // Expected: softmax(logits / temp), sorted desc, cut at the smallest prefix reaching top_p,
  // renormalised.
  std::vector<double> p;
  double z = 0;
  for (float l : logits) z += std::exp(l / temp);
  for (float l : logits) p.push_back(std::exp(l / temp) / z);
  double cum = 0;
  size_t keep = 0;
  while (cum < top_p) cum += p[keep++];
  std::map<int, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    Rng rng(stream_id({42, static_cast<uint64_t>(i)}));
    counts[sample_token(logits, {temp, top_p, 0, 0}, rng)]++;
  }
  for (size_t k = 0; k < logits.size(); ++k) {
    const double expected = k < keep ? p[k] / cum : 0.0;
    EXPECT_NEAR(counts[static_cast<int>(k)] / double(n), expected, 0.01) << "token " << k;
  }
}

// The ordering sample_token draws in, written out with a comparison sort (the definition:
// probability desc, id asc), against order_by_probability's radix sort / partial sort.
std::vector<int32_t> reference_order(const std::vector<float>& l) {
  std::vector<int32_t> idx(l.size());
  for (size_t i = 0; i < l.size(); ++i) idx[i] = static_cast<int32_t>(i);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)] ||
        (l[static_cast<size_t>(a)] == l[static_cast<size_t>(b)] && a < b);
  });
  return idx;
}

// Logits with what a sort can get wrong: ties, -0.0 next to +0.0, -inf (masked tokens),
// negative and positive values of every magnitude, a vocabulary of SmolLM2's size.
std::vector<float> awkward_logits(uint64_t seed, size_t n) {
  Rng rng(seed);
  std::vector<float> l(n);
  for (float& v : l) {
    const double u = rng.uniform();
    if (u < 0.05) v = 0.0f;
    else if (u < 0.10) v = -0.0f;
    else if (u < 0.12) v = -std::numeric_limits<float>::infinity();
    else if (u < 0.30) v = static_cast<float>(static_cast<int>(rng.uniform() * 8) - 4);  // integer ties
    else v = static_cast<float>((rng.uniform() * 2 - 1) * std::pow(10.0, rng.uniform() * 6 - 3));
  }
  return l;
}

TEST(Sampler, OrderByProbabilityIsTheComparisonSortOrder) {
  for (uint64_t seed = 1; seed <= 6; ++seed)
    for (const size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{49152}}) {
      const std::vector<float> l = awkward_logits(seed, n);
      const std::vector<int32_t> ref = reference_order(l);
      EXPECT_EQ(order_by_probability(l), ref) << "seed " << seed << " n " << n;
      for (const int32_t k : {1, 40, 3000}) {
        const std::vector<int32_t> got = order_by_probability(l, k);
        const size_t m = std::min(ref.size(), static_cast<size_t>(k));
        ASSERT_GE(got.size(), m);
        EXPECT_TRUE(std::equal(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(m), got.begin()))
            << "top_k " << k << " seed " << seed << " n " << n;
      }
    }
}

// sample_token's draw written out over the comparison-sort order (the implementation before
// order_by_probability): the same tokens for the same streams, whatever the settings.
int32_t reference_sample(const std::vector<float>& l, const SamplerConfig& cfg, Rng& rng) {
  const std::vector<int32_t> idx = reference_order(l);
  auto keep = static_cast<int32_t>(l.size());
  if (cfg.top_k > 0) keep = std::min(keep, cfg.top_k);
  const double maxl = l[static_cast<size_t>(idx[0])];
  std::vector<double> p(static_cast<size_t>(keep));
  double sum = 0;
  for (int32_t i = 0; i < keep; ++i) {
    p[static_cast<size_t>(i)] = std::exp((l[static_cast<size_t>(idx[static_cast<size_t>(i)])] - maxl) / cfg.temperature);
    sum += p[static_cast<size_t>(i)];
  }
  if (cfg.top_p < 1.0f) {
    double cum = 0;
    int32_t cut = keep;
    for (int32_t i = 0; i < keep; ++i) {
      cum += p[static_cast<size_t>(i)] / sum;
      if (cum >= cfg.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = 0;
    for (int32_t i = 0; i < keep; ++i) sum += p[static_cast<size_t>(i)];
  }
  if (cfg.min_p > 0.0f) {
    int32_t cut = 1;
    while (cut < keep && p[static_cast<size_t>(cut)] >= static_cast<double>(cfg.min_p)) ++cut;
    keep = cut;
    sum = 0;
    for (int32_t i = 0; i < keep; ++i) sum += p[static_cast<size_t>(i)];
  }
  const double r = rng.uniform() * sum;
  double cum = 0;
  for (int32_t i = 0; i < keep; ++i) {
    cum += p[static_cast<size_t>(i)];
    if (r < cum) return idx[static_cast<size_t>(i)];
  }
  return idx[static_cast<size_t>(keep - 1)];
}

TEST(Sampler, DrawsTheTokensOfTheComparisonSortDefinition) {
  const std::vector<SamplerConfig> cfgs = {
      {.temperature = 1.0f, .top_p = 1.0f},  {.temperature = 0.6f, .top_p = 0.95f},
      {.temperature = 0.8f, .top_p = 0.9f, .top_k = 40}, {.temperature = 1.3f, .top_p = 1.0f, .top_k = 3000},
      {.temperature = 0.7f, .top_p = 1.0f, .min_p = 0.05f}, {.temperature = 2.0f, .top_p = 0.5f}};
  int compared = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    std::vector<float> l = awkward_logits(100 + seed, 49152);
    for (float& v : l)  // finite, peaked enough that top-p cuts inside the vocabulary
      if (std::isinf(v)) v = -30.0f;
    for (size_t c = 0; c < cfgs.size(); ++c)
      for (uint64_t draw = 0; draw < 25; ++draw) {
        Rng a(stream_id({seed, c, draw})), b(stream_id({seed, c, draw}));
        ASSERT_EQ(sample_token(l, cfgs[c], a), reference_sample(l, cfgs[c], b))
            << "seed " << seed << " config " << c << " draw " << draw;
        ++compared;
      }
  }
  EXPECT_EQ(compared, 4 * 6 * 25);
}

TEST(Sampler, RejectsBadSettings) {
  EXPECT_THROW(validate_sampler({-1.0f, 0.9f, 0, 0}), Error);
  EXPECT_THROW(validate_sampler({1.0f, 0.0f, 0, 0}), Error);
  EXPECT_THROW(validate_sampler({1.0f, 1.5f, 0, 0}), Error);
  EXPECT_THROW(validate_sampler({1.0f, 0.9f, -2, 0}), Error);
  EXPECT_NO_THROW(validate_sampler({0.0f, 1.0f, 0, 0}));
}

TEST(Rng, StreamsAreOrderIndependentAndUniform) {
  // The same tuple gives the same stream; neighbouring tuples differ; mean of U(0,1) is 1/2.
  Rng a(stream_id({1, 2, 3})), b(stream_id({1, 2, 3})), c(stream_id({1, 2, 4}));
  double sum = 0;
  bool differ = false;
  for (int i = 0; i < 100000; ++i) {
    const double x = a.uniform();
    EXPECT_EQ(x, b.uniform());
    differ |= x != c.uniform();
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
    sum += x;
  }
  EXPECT_TRUE(differ);
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
}

TEST(ThreadPool, CoversRangeOnceAndPropagatesErrors) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      });
      for (int h : hits) EXPECT_EQ(h, 1);
    }
    EXPECT_THROW(pool.parallel_for(10,
                                   [](int64_t b, int64_t) {
                                     if (b > 0) throw Error("boom");
                                     throw Error("boom0");
                                   }),
                 Error);
    // Still usable after an error.
    int total = 0;
    std::mutex mu;
    pool.parallel_for(5, [&](int64_t b, int64_t e) {
      std::lock_guard<std::mutex> l(mu);
      total += static_cast<int>(e - b);
    });
    EXPECT_EQ(total, 5);
  }
}

// Below kMinParallelWork the whole range runs as one call on the calling thread; at or above it
// (or with no estimate) it is split across the workers.
TEST(ThreadPool, SmallWorkRunsOnTheCallingThread) {
  ThreadPool pool(2);
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> calls;
  std::vector<std::thread::id> ids;
  const auto record = [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> l(mu);
    calls.emplace_back(b, e);
    ids.push_back(std::this_thread::get_id());
  };
  pool.parallel_for(8, record, ThreadPool::kMinParallelWork - 1);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], std::make_pair(int64_t{0}, int64_t{8}));
  EXPECT_EQ(ids[0], std::this_thread::get_id());
  for (int64_t work : {int64_t{-1}, ThreadPool::kMinParallelWork}) {
    calls.clear();
    ids.clear();
    pool.parallel_for(8, record, work);
    EXPECT_EQ(calls.size(), 2u) << "work " << work;
  }
}

}  // namespace
}  // namespace kvevict
