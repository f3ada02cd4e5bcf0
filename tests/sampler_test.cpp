// Sampler and seeding. Expected frequencies come from the nucleus-sampling definition
// (Holtzman et al. §3.1) evaluated in the test; thread-pool determinism from its contract.
#include <gtest/gtest.h>

#include <cmath>
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
