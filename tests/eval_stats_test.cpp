// Statistics tests. Expected values are computed independently of eval/stats.cpp: exact binomial
// sums written out here (sign test), a log-space recurrence for large n, the exact
// distribution of a tiny bootstrap (resampled mean of {0, 0, 1} = K/3 with K ~ Binomial(3, 1/3)),
// and quantiles worked out by hand from the type-7 definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "eval/stats.h"
#include "util/error.h"

namespace kvevict {
namespace {

TEST(EvalStats, SignTestExactSmallCases) {
  // 2 * sum_{i<=k} C(n, i) / 2^n, sums written out.
  EXPECT_DOUBLE_EQ(sign_test_p(1, 9), 2.0 * (1 + 10) / 1024);                                      // n = 10, k = 1
  EXPECT_DOUBLE_EQ(sign_test_p(9, 1), 2.0 * (1 + 10) / 1024);                                      // symmetric
  EXPECT_DOUBLE_EQ(sign_test_p(0, 5), 2.0 / 32);                                                   // n = 5, k = 0
  EXPECT_NEAR(sign_test_p(5, 15), 2.0 * (1 + 20 + 190 + 1140 + 4845 + 15504) / 1048576.0, 1e-15);  // n = 20, k = 5
  EXPECT_DOUBLE_EQ(sign_test_p(2, 2), 1.0);  // 2 * 11/16 capped at 1
  EXPECT_DOUBLE_EQ(sign_test_p(0, 0), 1.0);  // no untied pairs
  EXPECT_DOUBLE_EQ(sign_test_p(3, 4), 1.0);  // 2 * 64/128 = 1
  EXPECT_NEAR(sign_test_p(0, 1), 1.0, 1e-15);
}

TEST(EvalStats, SignTestLargeNAgainstLogSpaceRecurrence) {
  // 2 P(X <= k), X ~ Bin(n, 1/2), from log C(n, i+1) = log C(n, i) + log(n - i) - log(i + 1)
  // and a log-sum-exp, for one n of each of the implementation's two branches (<= 16000, above).
  for (const auto& [n, k] : {std::pair<int, int>{1000, 450}, std::pair<int, int>{20000, 9800}}) {
    std::vector<double> logs;
    double lc = 0;  // log C(n, 0)
    for (int i = 0; i <= k; ++i) {
      logs.push_back(lc - n * std::log(2.0));
      lc += std::log(static_cast<double>(n - i)) - std::log(static_cast<double>(i + 1));
    }
    const double top = *std::max_element(logs.begin(), logs.end());
    double sum = 0;
    for (double l : logs) sum += std::exp(l - top);
    const double expected = 2 * std::exp(top) * sum;
    EXPECT_NEAR(sign_test_p(k, n - k) / expected, 1.0, 1e-8) << "n = " << n << ", expected " << expected;
  }
}

TEST(EvalStats, PairedSignTestCounts) {
  const std::vector<double> a = {1, 0.5, 0, 1, 1}, b = {0, 0.5, 1, 1, 0.5};
  const SignTest t = paired_sign_test(a, b);
  EXPECT_EQ(t.n_pos, 2);
  EXPECT_EQ(t.n_neg, 1);
  EXPECT_EQ(t.n_ties, 2);
  EXPECT_DOUBLE_EQ(t.p, 1.0);  // 2 * (1 + 3) / 8 capped
  EXPECT_THROW(paired_sign_test(a, std::vector<double>{1}), Error);
}

TEST(EvalStats, QuantileType7ByHand) {
  const std::vector<double> s = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(quantile_sorted(s, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(quantile_sorted(s, 1.0), 4.0);
  EXPECT_DOUBLE_EQ(quantile_sorted(s, 0.5), 2.5);    // h = 1.5
  EXPECT_DOUBLE_EQ(quantile_sorted(s, 0.25), 1.75);  // h = 0.75
  EXPECT_DOUBLE_EQ(quantile_sorted(std::vector<double>{7}, 0.3), 7.0);
}

TEST(EvalStats, BootstrapMatchesExactDistributionOfTinyCase) {
  // Differences {0, 0, 1}: a resample's mean is K/3, K ~ Binomial(3, 1/3):
  // P(K=0) = 8/27, P(1) = 12/27, P(2) = 6/27, P(3) = 1/27.
  const std::vector<double> a = {0, 0, 1}, b = {0, 0, 0};
  const int m = 10000;
  const std::vector<double> d = bootstrap_mean_diffs(a, b, m, 42);
  ASSERT_EQ(d.size(), static_cast<size_t>(m));
  const double p[4] = {8.0 / 27, 12.0 / 27, 6.0 / 27, 1.0 / 27};
  int count[4] = {0, 0, 0, 0};
  for (double v : d) {
    const int k = static_cast<int>(std::lround(v * 3));
    ASSERT_TRUE(k >= 0 && k <= 3) << v;
    ASSERT_NEAR(v, k / 3.0, 1e-12);
    ++count[k];
  }
  for (int k = 0; k < 4; ++k) {
    const double sd = std::sqrt(p[k] * (1 - p[k]) / m);
    EXPECT_NEAR(count[k] / static_cast<double>(m), p[k], 5 * sd) << "K = " << k;
  }
  // 95% percentile interval: P(K = 0) = 0.296 > 0.025, so lo = 0; P(K <= 2) = 26/27 = 0.963 < 0.975,
  // so hi = 1.
  const BootstrapCi ci = paired_bootstrap_ci(a, b, m, 42);
  EXPECT_DOUBLE_EQ(ci.mean_diff, 1.0 / 3);
  EXPECT_DOUBLE_EQ(ci.lo, 0.0);
  EXPECT_DOUBLE_EQ(ci.hi, 1.0);
  EXPECT_EQ(ci.n, 3);
}

TEST(EvalStats, BootstrapIsPairedAndSeeded) {
  // a = b + 0.1 on every problem while problems differ a lot: pairing removes the between-problem
  // spread, so every resample's mean difference is 0.1 and the interval is [0.1, 0.1].
  std::vector<double> a, b;
  for (int i = 0; i < 20; ++i) b.push_back(i % 2 ? 0.9 : 0.0), a.push_back(b.back() + 0.1);
  const BootstrapCi ci = paired_bootstrap_ci(a, b, 2000, 7);
  EXPECT_NEAR(ci.lo, 0.1, 1e-12);
  EXPECT_NEAR(ci.hi, 0.1, 1e-12);
  // Same seed, same draws; another seed, other draws.
  const std::vector<double> x = {1, 0, 1, 1, 0, 0, 1}, zero(7, 0.0);
  EXPECT_EQ(bootstrap_mean_diffs(x, zero, 500, 3), bootstrap_mean_diffs(x, zero, 500, 3));
  EXPECT_NE(bootstrap_mean_diffs(x, zero, 500, 3), bootstrap_mean_diffs(x, zero, 500, 4));
  EXPECT_THROW(bootstrap_mean_diffs(x, std::vector<double>{0}, 10, 0), Error);
  EXPECT_THROW(bootstrap_mean_diffs({}, {}, 10, 0), Error);
  EXPECT_THROW(paired_bootstrap_ci(x, zero, 10, 0, 1.5), Error);
}

}  // namespace
}  // namespace kvevict

#include "eval/summary.h"

namespace kvevict {
namespace {

TEST(EvalStats, WilsonIntervalMatchesIndependentValues) {
  // Reference values: Wilson's formula evaluated in sympy at 17 digits with
  // z = sqrt(2) erfinv(0.95) = 1.9599639845400542 (independent of stats.cpp's bisection).
  EXPECT_NEAR(normal_two_sided_z(0.95), 1.9599639845400542, 1e-11);
  struct Case {
    double p;
    int64_t n;
    double lo, hi;
  };
  for (const Case& c : {Case{0.0, 1, 0.0, 0.79345068562276261}, Case{1.0, 1, 0.20654931437723739, 1.0},
                        Case{0.0, 30, 0.0, 0.11351339317396877}, Case{1.0, 30, 0.88648660682603123, 1.0},
                        Case{0.5, 30, 0.33154125640533765, 0.66845874359466235},
                        Case{0.7, 10, 0.39677814746114532, 0.89220873259369898}}) {
    const ProportionCi ci = wilson_interval(c.p, c.n);
    EXPECT_NEAR(ci.lo, c.lo, 1e-9) << c.p << " of " << c.n;
    EXPECT_NEAR(ci.hi, c.hi, 1e-9) << c.p << " of " << c.n;
  }
  const ProportionCi none = wilson_interval(0.5, 0);
  EXPECT_EQ(none.lo, 0.0);
  EXPECT_EQ(none.hi, 1.0);
  EXPECT_THROW(wilson_interval(1.5, 3), Error);
  EXPECT_THROW(wilson_interval(0.5, 3, 1.0), Error);
}

// Reproducer: an accuracy of exactly 1 (one problem, or 30) was reported as
// "1.000 [1.000, 1.000]" (a zero-width percentile bootstrap interval).
TEST(EvalStats, AccuracyIntervalDoesNotCollapseAtOne) {
  for (const int problems : {1, 30}) {
    EvalSettings st;
    st.tasks_format = "kvevict";
    st.n_tasks = problems;
    st.cells = {CellSpec{"full", 0}};
    st.reference = "full";
    st.bootstrap_resamples = 200;
    std::vector<RolloutRecord> recs;
    for (int i = 0; i < problems; ++i) {
      RolloutRecord r;
      r.policy = "full";
      r.problem_id = "p" + std::to_string(i);
      r.problem_index = i;
      r.finish = "eos";
      r.extracted = "1";
      r.correct = true;
      recs.push_back(r);
    }
    const EvalSummary s = summarize(st, recs);
    ASSERT_EQ(s.cells.size(), 1u);
    const CellSummary& c = s.cells[0];
    EXPECT_EQ(c.accuracy, 1.0);
    // Lower bounds from the sympy values above (1 of 1, 30 of 30).
    EXPECT_NEAR(c.accuracy_wilson.lo, problems == 1 ? 0.20654931437723739 : 0.88648660682603123, 1e-9);
    EXPECT_EQ(c.accuracy_wilson.hi, 1.0);
    const std::string md = summary_markdown(s);
    EXPECT_EQ(md.find("1.000 [1.000, 1.000]"), std::string::npos) << md;
    EXPECT_NE(md.find("Wilson"), std::string::npos) << md;
    EXPECT_NE(md.find("bootstrap"), std::string::npos) << md;
    EXPECT_EQ(md.find("warning: only") != std::string::npos, problems < 30) << md;
    EXPECT_NE(summary_csv(s).find("wilson"), std::string::npos);
    EXPECT_EQ(summary_json(s)["cells"][0]["accuracy_ci"]["method"], "wilson");
  }
}

}  // namespace
}  // namespace kvevict
