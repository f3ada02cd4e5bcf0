// Statistics tests. Expected values are computed independently of eval/stats.cpp: exact binomial
// sums written out here (sign test), a log-space recurrence for large n, the exact
// distribution of a tiny bootstrap (resampled mean of {0, 0, 1} = K/3 with K ~ Binomial(3, 1/3)),
// and quantiles worked out by hand from the type-7 definition. The t distribution, the TOSTs,
// their power and Holm's adjustment are checked against SciPy 1.10.1 and statsmodels 0.15.0
// values computed offline (the calls are quoted next to each value), an independent
// implementation of Tango's statistic (restricted MLE by numerical maximisation with
// scipy.optimize.minimize_scalar instead of the closed-form root), exact enumeration and a
// Monte Carlo simulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "eval/stats.h"
#include "util/error.h"
#include "util/rng.h"

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

TEST(EvalStats, IncompleteBetaAndStudentTMatchScipy) {
  // scipy.special.betainc(a, b, x)
  EXPECT_NEAR(incomplete_beta(2.5, 0.5, 0.3), 0.01892712407194565, 1e-13);
  EXPECT_NEAR(incomplete_beta(10, 0.5, 0.9), 0.15164090963470997, 1e-13);
  EXPECT_NEAR(incomplete_beta(0.5, 0.5, 0.01), 0.06376856085851987, 1e-13);
  EXPECT_NEAR(incomplete_beta(50, 3, 0.97), 0.7953934565796688, 1e-12);
  EXPECT_NEAR(incomplete_beta(1, 1, 0.42), 0.42, 1e-14);
  // scipy.stats.t.cdf(t, df)
  EXPECT_NEAR(student_t_cdf(0.0, 5), 0.5, 1e-15);
  EXPECT_NEAR(student_t_cdf(1.5, 3), 0.8847080673775886, 1e-13);
  EXPECT_NEAR(student_t_cdf(-2.2, 10), 0.02622053422467655, 1e-13);
  EXPECT_NEAR(student_t_cdf(2.0, 1), 0.8524163823495667, 1e-13);
  EXPECT_NEAR(student_t_cdf(3.1, 299), 0.9989402370682323, 1e-13);
  EXPECT_NEAR(student_t_cdf(-0.7, 29), 0.24475257430724184, 1e-13);
  // At a million degrees of freedom lgamma(a + b) - lgamma(a) cancels ~10 digits: 1e-9 there.
  EXPECT_NEAR(student_t_cdf(1.64, 1e6), 0.9494972592602203, 1e-9);
  // scipy.stats.t.ppf(p, df)
  EXPECT_NEAR(student_t_quantile(0.95, 29), 1.6991270265334972, 1e-9);
  EXPECT_NEAR(student_t_quantile(0.95, 299), 1.6499657674263084, 1e-9);
  EXPECT_NEAR(student_t_quantile(0.975, 5), 2.5705818366147395, 1e-9);
  EXPECT_THROW(incomplete_beta(0, 1, 0.5), Error);
  EXPECT_THROW(incomplete_beta(1, 1, 1.5), Error);
  EXPECT_THROW(student_t_cdf(1, 0), Error);
  EXPECT_THROW(student_t_quantile(1, 5), Error);
}

TEST(EvalStats, PairedTTostMatchesStatsmodels) {
  // statsmodels.stats.weightstats.ttost_paired(x1, x2, -0.1, 0.1) = (1.5274989962481754e-05,
  // (8.006462906668716, 3.2411238373751345e-06, 11.0), (-6.774699382565836, 1.5274989962481754e-05, 11.0))
  const std::vector<double> x1{0.9, 0.8, 1.0, 0.7, 0.85, 0.95, 0.6, 0.75, 0.9, 1.0, 0.8, 0.65};
  const std::vector<double> x2{0.85, 0.8, 0.95, 0.75, 0.8, 0.9, 0.65, 0.7, 0.95, 1.0, 0.75, 0.7};
  const Equivalence e = paired_t_tost(x1, x2, 0.1);
  EXPECT_EQ(e.method, "paired-t");
  EXPECT_EQ(e.n, 12);
  EXPECT_NEAR(e.p_lower, 3.2411238373751345e-06, 1e-12);
  EXPECT_NEAR(e.p_upper, 1.5274989962481754e-05, 1e-12);
  EXPECT_NEAR(e.p, 1.5274989962481754e-05, 1e-12);
  EXPECT_TRUE(e.equivalent);
  EXPECT_NEAR(e.mean_diff, 0.00833333333333334, 1e-15);
  // 90% t interval: mean -+ t_{0.95, 11} sd / sqrt(12), sd = 0.0468718433280546 (numpy std
  // ddof=1), t_{0.95, 11} = 1.7958848187040433 (scipy.stats.t.ppf).
  EXPECT_NEAR(e.ci_lo, 0.00833333333333334 - 1.7958848187040433 * 0.0468718433280546 / std::sqrt(12.0), 1e-9);
  EXPECT_NEAR(e.ci_hi, 0.00833333333333334 + 1.7958848187040433 * 0.0468718433280546 / std::sqrt(12.0), 1e-9);
  // No spread: nothing can be concluded, however many problems (a ceiling is not equivalence).
  const std::vector<double> ones(300, 1.0);
  const Equivalence c = paired_t_tost(ones, ones, 0.05);
  EXPECT_FALSE(c.equivalent);
  EXPECT_EQ(c.p, 1.0);
  EXPECT_THROW(paired_t_tost(x1, std::vector<double>(11, 0.0), 0.1), Error);
  EXPECT_THROW(paired_t_tost(x1, x2, 0), Error);
  EXPECT_THROW(paired_t_tost(x1, x2, 0.1, 0.6), Error);
}

TEST(EvalStats, TangoScoreMatchesNumericalRestrictedMle) {
  // (n10, n01, n, delta0) -> Z from an independent implementation: the profile likelihood
  // (q + d)^n10 q^n01 (1 - 2q - d)^(n - n10 - n01) maximised numerically over q (SciPy
  // minimize_scalar, bounded, xatol 1e-13), then (n10 - n01 - n d) / sqrt(n (2q + d (1 - d))).
  EXPECT_NEAR(tango_score_z(5, 2, 40, 0.05), 0.38778336289127663, 1e-7);
  EXPECT_NEAR(tango_score_z(5, 2, 40, -0.05), 1.777692428587747, 1e-7);
  EXPECT_NEAR(tango_score_z(0, 0, 300, 0.05), -3.9735970711114765, 1e-7);
  EXPECT_NEAR(tango_score_z(0, 0, 20, -0.05), 1.0259783520635546, 1e-7);
  EXPECT_NEAR(tango_score_z(12, 20, 150, 0.1), -3.763638121095022, 1e-7);
  EXPECT_NEAR(tango_score_z(30, 3, 60, -0.2), 6.54862160296282, 1e-7);
  EXPECT_EQ(tango_score_z(0, 0, 10, 0.0), 0.0);
  EXPECT_THROW(tango_score_z(6, 5, 10, 0.1), Error);
  EXPECT_THROW(tango_score_z(1, 1, 10, 1.0), Error);
}

TEST(EvalStats, TangoTostCeilingNeedsEnoughProblems) {
  // Both policies right on every problem: no discordant pair. Z(+-0.05) = -+sqrt(n 0.05 / 0.95)
  // (the formula with q = 0), so n = 20 cannot show equivalence within 5 points (p = 0.152) and
  // n = 300 can (p = 3.5e-5): equivalence comes from n, never from the ceiling alone.
  const std::vector<double> one20(20, 1.0), one300(300, 1.0);
  const Equivalence small = tango_tost(one20, one20, 0.05);
  EXPECT_EQ(small.method, "tango-score");
  EXPECT_NEAR(small.p, 1 - normal_cdf(std::sqrt(20 * 0.05 / 0.95)), 1e-12);
  EXPECT_FALSE(small.equivalent);
  EXPECT_EQ(small.power, 0.0);  // with no discordance the outcome is fixed: never equivalent at n = 20
  const Equivalence large = tango_tost(one300, one300, 0.05);
  EXPECT_NEAR(large.p, 1 - normal_cdf(std::sqrt(300 * 0.05 / 0.95)), 1e-12);
  EXPECT_TRUE(large.equivalent);
  EXPECT_NEAR(large.power, 1.0, 1e-12);
  EXPECT_LT(large.ci_lo, 0);
  EXPECT_GT(large.ci_hi, 0);
  // The interval's ends are where the one-sided statistics cross +-z.
  const double z = normal_two_sided_z(0.90);
  EXPECT_NEAR(tango_score_z(0, 0, 300, large.ci_hi), -z, 1e-6);
  // Counts and the test choice: binary values go to Tango, means to the paired t test.
  const std::vector<double> a{1, 1, 0, 1, 0, 1}, b{1, 0, 0, 0, 1, 1};
  const Equivalence e = equivalence_test(a, b, 0.2);
  EXPECT_EQ(e.method, "tango-score");
  EXPECT_EQ(e.n10, 2);
  EXPECT_EQ(e.n01, 1);
  EXPECT_EQ(equivalence_test(std::vector<double>{0.5, 1, 0}, std::vector<double>{1, 1, 0.5}, 0.2).method,
            "paired-t");
  EXPECT_THROW(tango_tost(std::vector<double>{0.5}, std::vector<double>{1}, 0.05), Error);
}

TEST(EvalStats, TangoTostPowerMatchesEnumerationWithIndependentStatistic) {
  // Exact power, enumerated in Python over every (n10, n01) with the numerically maximised
  // statistic of TangoScoreMatchesNumericalRestrictedMle and the multinomial pmf (math.lgamma).
  EXPECT_NEAR(tango_tost_power(60, 0.02, 0.02, 0.1), 0.8241364235414733, 1e-9);
  EXPECT_NEAR(tango_tost_power(40, 0.05, 0.01, 0.15), 0.6845507190004727, 1e-9);
  // Monte Carlo, seeded: 20,000 draws of (n10, n01) ~ Multinomial(60; 0.02, 0.02, 0.96) by inverse
  // transform per pair; standard error of the estimate <= 0.0036.
  Rng rng(stream_id({77}));
  int hits = 0;
  const double z = normal_two_sided_z(0.90);
  for (int s = 0; s < 20000; ++s) {
    int n10 = 0, n01 = 0;
    for (int i = 0; i < 60; ++i) {
      const double u = rng.uniform();
      n10 += u < 0.02;
      n01 += u >= 0.02 && u < 0.04;
    }
    hits += tango_score_z(n10, n01, 60, -0.1) > z && tango_score_z(n10, n01, 60, 0.1) < -z;
  }
  EXPECT_NEAR(hits / 20000.0, tango_tost_power(60, 0.02, 0.02, 0.1), 4 * 0.0036);
  EXPECT_THROW(tango_tost_power(0, 0.1, 0.1, 0.05), Error);
  EXPECT_THROW(tango_tost_power(10, 0.7, 0.5, 0.05), Error);
}

TEST(EvalStats, NormalTostPowerMatchesSimulation) {
  // numpy Monte Carlo (default_rng(7), 200,000 samples of n = 200 normal differences with SD 0.3)
  // of the paired t TOST at margin 0.06: power 0.761475 (standard error 0.001). The normal
  // approximation differs from the t test's exact power by O(1/n).
  EXPECT_NEAR(tost_power_normal(200, 0.3, 0.06), 0.761475, 0.004);
  // Closed form at true difference 0: 2 Phi(margin sqrt(n) / sd - z) - 1.
  EXPECT_NEAR(tost_power_normal(50, 0.2, 0.05), 2 * normal_cdf(0.05 * std::sqrt(50.0) / 0.2 - 1.6448536269514722) - 1,
              1e-9);
  EXPECT_EQ(tost_power_normal(5, 1.0, 0.01), 0.0);  // hopeless: clipped at 0
  EXPECT_LT(tost_power_normal(200, 0.3, 0.06, 0.05, 0.03), tost_power_normal(200, 0.3, 0.06));
  EXPECT_THROW(tost_power_normal(10, 0, 0.05), Error);
}

TEST(EvalStats, HolmMatchesStatsmodels) {
  // statsmodels.stats.multitest.multipletests([0.01, 0.04, 0.03, 0.005, 0.2, 0.04], method="holm")[1]
  const std::vector<double> p{0.01, 0.04, 0.03, 0.005, 0.2, 0.04};
  const std::vector<double> want{0.05, 0.12, 0.12, 0.03, 0.2, 0.12};
  const std::vector<double> got = holm_adjust(p);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << i;
  EXPECT_TRUE(holm_adjust(std::vector<double>{}).empty());
  EXPECT_EQ(holm_adjust(std::vector<double>{0.7, 0.6}), (std::vector<double>{1.0, 1.0}));
  EXPECT_THROW(holm_adjust(std::vector<double>{1.5}), Error);
}

TEST(EvalStats, ClusteringByProblemCountsEachProblemOnce) {
  // Problem 7 seen at three budgets, problem 2 at one: two clusters, means per problem.
  const std::vector<PairedOutcome> rows{{7, 1, 0}, {2, 1, 1}, {7, 1, 0}, {7, 0, 0}};
  const auto [a, b] = cluster_by_problem(rows);
  EXPECT_EQ(a, (std::vector<double>{1.0, 2.0 / 3}));
  EXPECT_EQ(b, (std::vector<double>{1.0, 0.0}));
  // Pooled, the sign test would count problem 7 twice (2 wins, p = 0.5); clustered it is one
  // problem with a > b (p = 1).
  EXPECT_EQ(paired_sign_test(a, b).n_pos, 1);
  EXPECT_EQ(paired_sign_test(a, b).p, 1.0);
}

}  // namespace
}  // namespace kvevict
