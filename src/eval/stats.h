// Statistics of the accuracy harness: Wilson score intervals for one policy's accuracy,
// problem-clustered percentile bootstrap for paired differences, the exact two-sided sign test,
// equivalence tests (two one-sided tests, TOST) with their power, per-problem clustering of
// outcomes pooled over seeds and budgets, and Holm's correction for the tests of one report.
//
// Equivalence ("A ~ B"): a difference is shown to lie within +-margin only by rejecting both
// H0: diff <= -margin and H0: diff >= +margin (Schuirmann, "A comparison of the two one-sided
// tests procedure and the power approach for assessing the equivalence of average
// bioavailability", J. Pharmacokinet. Biopharm. 15 (1987)). A ceiling (both at 1.00 on a few
// problems) is not equivalence: with n problems and no discordant pair the test still needs
// n > (1 - margin) / margin * z^2 (about 51 at margin 0.05, alpha 0.05) to conclude it.
//   - Binary per-problem outcomes (one rollout): Tango's score test for the difference of
//     paired proportions (T. Tango, "Equivalence test and confidence interval for the
//     difference in proportions for the paired-sample design", Statistics in Medicine 17
//     (1998) 891-908, eq. 3 with the restricted maximum-likelihood estimate of eq. 5); its power
//     by exact enumeration of the multinomial (discordant counts) distribution.
//   - Per-problem means (several rollouts, or outcomes pooled over seeds and budgets): the
//     paired t TOST on the per-problem differences, one value per problem (the cluster), so the
//     same problem is never counted twice; its power by the normal approximation (S.-C. Chow,
//     J. Shao, H. Wang, "Sample Size Calculations in Clinical Research", 2nd ed. (2008), §3.2.3).
// Holm: S. Holm, "A simple sequentially rejective multiple test procedure", Scand. J. Statist.
// 6 (1979) 65-70. Student's t distribution through the regularized incomplete beta function
// (Abramowitz & Stegun 26.7.1 and 26.5.8, continued fraction evaluated by the modified Lentz
// method: Press et al., "Numerical Recipes", 3rd ed., §6.4).
//
// Wilson score interval: E. B. Wilson, "Probable inference, the law of succession, and
// statistical inference", JASA 22 (1927); recommended over the Wald and percentile intervals
// near 0 and 1 by Brown, Cai & DasGupta, "Interval Estimation for a Binomial Proportion",
// Statistical Science 16 (2001) §4. A percentile bootstrap of a mean of all-0 or all-1 values
// has zero width, which is why a single policy's accuracy does not use it.
//
// Source: the paper's protocol (docs/eviction-spec.md §4): accuracy is first averaged over the
// rollouts of each problem; a difference between two policies gets a paired, problem-clustered
// percentile bootstrap 95% CI (10,000 resamples) and an exact sign test. The bootstrap is
// Efron & Tibshirani, "An Introduction to the Bootstrap" (1993) ch. 13 (percentile interval);
// quantiles interpolate linearly between order statistics (Hyndman & Fan 1996, type 7).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvevict {

/// Means of `resamples` bootstrap resamples of the paired differences a[i] - b[i]: each
/// resample draws n = a.size() problem indices uniformly with replacement (the same indices for
/// a and b, which is what makes it paired and problem-clustered). Draw j uses the stream
/// Rng(stream_id({seed, j})), so the result does not depend on threads or call order.
/// a, b: [n] per-problem mean accuracies (any reals). Returns [resamples].
/// Throws kvevict::Error when a.size() != b.size(), n == 0 or resamples < 1.
std::vector<double> bootstrap_mean_diffs(std::span<const double> a, std::span<const double> b, int resamples,
                                         uint64_t seed);

/// Type-7 quantile of `sorted` (ascending, non-empty) at q in [0, 1]: with h = (m - 1) q,
/// sorted[floor h] + (h - floor h) (sorted[floor h + 1] - sorted[floor h]).
double quantile_sorted(std::span<const double> sorted, double q);

/// A percentile bootstrap interval for mean(a - b).
struct BootstrapCi {
  double mean_diff = 0;   ///< mean(a) - mean(b) over the paired problems
  double lo = 0, hi = 0;  ///< percentile interval at `level`
  int64_t n = 0;          ///< problems
};

/// Paired, problem-clustered percentile bootstrap CI of mean(a - b) at `level` (e.g. 0.95):
/// the (1-level)/2 and (1+level)/2 type-7 quantiles of bootstrap_mean_diffs. Pass b = zeros
/// for a CI of mean(a) alone. Throws as bootstrap_mean_diffs, or for level outside (0, 1).
BootstrapCi paired_bootstrap_ci(std::span<const double> a, std::span<const double> b, int resamples, uint64_t seed,
                                double level = 0.95);

/// Problems below which a report warns that its intervals are wide and its approximations
/// (Wilson's normal score, the bootstrap's percentiles) rough.
inline constexpr int64_t kSmallSampleProblems = 30;

/// Standard normal quantile z with P(|Z| <= z) = level, for level in (0, 1) (e.g. 1.959964 at
/// 0.95). Found by bisection on std::erfc to within 1e-12. Throws kvevict::Error outside (0, 1).
double normal_two_sided_z(double level);

/// A confidence interval for a proportion.
struct ProportionCi {
  double lo = 0, hi = 1;  ///< interval at the requested level, inside [0, 1]
  int64_t n = 0;          ///< trials (problems)
};

/// Wilson score interval for a proportion p_hat observed over n trials at `level`:
/// (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n). Never collapses at p = 0 or 1
/// (p = 1, n = 1 gives [0.206, 1] at 95%). Used for an accuracy that is a mean over n problems of
/// per-problem means in [0, 1]: their variance is at most p(1-p)/n, so the interval is
/// conservative when there are several rollouts per problem. n = 0 gives [0, 1]. Throws
/// kvevict::Error for p_hat outside [0, 1], n < 0 or level outside (0, 1).
ProportionCi wilson_interval(double p_hat, int64_t n, double level = 0.95);

/// Exact two-sided sign test p-value for n_pos successes and n_neg failures (ties already
/// dropped): min(1, 2 P(X <= min(n_pos, n_neg))) with X ~ Binomial(n_pos + n_neg, 1/2);
/// 1 when n_pos + n_neg == 0. The tail is util/binomial.h's binomial_half_cdf (exact for small n).
double sign_test_p(int64_t n_pos, int64_t n_neg);

/// Per-problem sign test of a against b.
struct SignTest {
  int64_t n_pos = 0;   ///< problems with a > b
  int64_t n_neg = 0;   ///< problems with a < b
  int64_t n_ties = 0;  ///< problems with a == b (dropped)
  double p = 1;        ///< sign_test_p(n_pos, n_neg)
};

/// Sign test of the paired per-problem values a, b ([n] each). Throws kvevict::Error when the
/// sizes differ.
SignTest paired_sign_test(std::span<const double> a, std::span<const double> b);

/// Standard normal CDF Phi(z) = erfc(-z / sqrt 2) / 2.
double normal_cdf(double z);

/// Regularized incomplete beta function I_x(a, b) for a, b > 0 and x in [0, 1]; accurate to
/// about 1e-13 (continued fraction, Numerical Recipes §6.4). Throws kvevict::Error outside the
/// domain.
double incomplete_beta(double a, double b, double x);

/// Student's t CDF P(T <= t) with `df` > 0 degrees of freedom: 1 - I_{df/(df+t^2)}(df/2, 1/2)/2
/// for t >= 0 (symmetric below). t = +-infinity gives 1 / 0. Throws kvevict::Error for df <= 0.
double student_t_cdf(double t, double df);

/// Student's t quantile: the t with student_t_cdf(t, df) = p, p in (0, 1), by bisection to
/// 1e-12. Throws kvevict::Error outside (0, 1) or for df <= 0.
double student_t_quantile(double p, double df);

/// A two one-sided tests (TOST) equivalence test of a paired difference mean(a - b) within
/// +-margin. Equivalence is shown at level alpha when both one-sided p-values are below alpha
/// (equivalently: the 1 - 2 alpha confidence interval lies inside (-margin, margin)).
struct Equivalence {
  std::string method;        ///< "tango-score" (binary outcomes) or "paired-t" (per-problem means)
  double margin = 0;         ///< the equivalence margin (accuracy units: 0.05 = 5 points)
  double alpha = 0.05;       ///< level of each one-sided test
  int64_t n = 0;             ///< paired problems (clusters)
  double mean_diff = 0;      ///< mean(a) - mean(b)
  double ci_lo = 0, ci_hi = 0;  ///< 1 - 2 alpha interval of the difference (paired-t: t interval;
                                ///< tango-score: the score interval, both bounds found by bisection)
  double p_lower = 1;        ///< H0: diff <= -margin
  double p_upper = 1;        ///< H0: diff >= +margin
  double p = 1;              ///< max(p_lower, p_upper): the TOST p-value
  bool equivalent = false;   ///< p < alpha
  /// Probability that this test shows equivalence with these n when the true difference is 0
  /// and the spread is as observed (tango-score: discordance rate (n10 + n01) / n split evenly,
  /// exact; paired-t: the observed SD, normal approximation). 0 when the observed spread is 0
  /// for paired-t (nothing to plan with).
  double power = 0;
  int64_t n10 = 0, n01 = 0;  ///< tango-score: problems with a right and b wrong, and the reverse
};

/// Tango's score statistic for H0: p10 - p01 = delta0 with n10, n01 discordant pairs among n
/// (Tango 1998 eq. 3): (n10 - n01 - n delta0) / sqrt(n (2 q + delta0 (1 - delta0))), q the
/// restricted MLE of p01 under H0 (the root in [max(0, -delta0), (1 - delta0) / 2] of the score
/// equation, eq. 5). Requires |delta0| < 1 and 0 <= n10 + n01 <= n, n >= 1; a zero denominator
/// (only at delta0 = 0 with no discordant pair) gives 0. Throws kvevict::Error otherwise.
double tango_score_z(int64_t n10, int64_t n01, int64_t n, double delta0);

/// TOST of paired binary outcomes (a[i], b[i] in {0, 1}; [n] each) with Tango's score test.
/// Throws kvevict::Error when sizes differ, n == 0, a value is not 0 or 1, margin is not in
/// (0, 1) or alpha not in (0, 0.5).
Equivalence tango_tost(std::span<const double> a, std::span<const double> b, double margin, double alpha = 0.05);

/// Exact power of tango_tost: the probability that it shows equivalence for n pairs whose
/// discordant probabilities are p10 and p01 (p10 + p01 <= 1), summed over every (n10, n01).
/// O(n^2) terms. Throws kvevict::Error for invalid probabilities, n < 1 or n > 5000.
double tango_tost_power(int64_t n, double p10, double p01, double margin, double alpha = 0.05);

/// TOST of paired per-problem values (any reals; typically per-problem mean accuracies) with the
/// paired t test on the differences (n - 1 degrees of freedom). With zero spread in the
/// differences nothing can be concluded: p = 1, not equivalent. Throws kvevict::Error when sizes
/// differ, n < 2, margin <= 0 or alpha not in (0, 0.5).
Equivalence paired_t_tost(std::span<const double> a, std::span<const double> b, double margin, double alpha = 0.05);

/// Normal-approximation power of a TOST whose difference estimate has standard error
/// sd / sqrt(n), at true difference `true_diff`: max(0, Phi((margin - d)/se - z) + Phi((margin +
/// d)/se - z) - 1), z = the 1 - alpha normal quantile (Chow, Shao & Wang §3.2.3). Throws
/// kvevict::Error for n < 1, sd <= 0, margin <= 0 or alpha not in (0, 0.5).
double tost_power_normal(int64_t n, double sd, double margin, double alpha = 0.05, double true_diff = 0);

/// The TOST that fits the data: tango_tost when every value is 0 or 1, else paired_t_tost.
Equivalence equivalence_test(std::span<const double> a, std::span<const double> b, double margin,
                             double alpha = 0.05);

/// Holm-adjusted p-values, in the input order: with p sorted ascending p_(1) <= ... <= p_(m),
/// adjusted p_(i) = min(1, max_{j <= i} (m - j + 1) p_(j)). Rejecting where adjusted < alpha
/// controls the family-wise error rate of the m tests at alpha. Empty in, empty out. Throws
/// kvevict::Error for a p outside [0, 1].
std::vector<double> holm_adjust(std::span<const double> p);

/// One outcome of a paired comparison, before clustering: which problem it belongs to and the
/// two policies' values (correctness, or a mean over rollouts) for one seed / budget / rollout.
struct PairedOutcome {
  int64_t problem = 0;
  double a = 0, b = 0;
};

/// Per-problem means of paired outcomes pooled over seeds, budgets or rollouts: one (a, b) pair
/// per distinct problem, in ascending problem order, so a paired test on the result counts each
/// problem once (the problem is the cluster). Returns {a means, b means}.
std::pair<std::vector<double>, std::vector<double>> cluster_by_problem(std::span<const PairedOutcome> outcomes);

}  // namespace kvevict
