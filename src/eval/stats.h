// Statistics of the accuracy harness: Wilson score intervals for one policy's accuracy,
// problem-clustered percentile bootstrap for paired differences, and the exact two-sided sign test.
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
/// 1 when n_pos + n_neg == 0. Summed term by term in long double up to n = 16000 (exact for
/// small n), in log space beyond.
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

}  // namespace kvevict
