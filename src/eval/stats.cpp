#include "eval/stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "util/error.h"
#include "util/rng.h"

namespace kvevict {

std::vector<double> bootstrap_mean_diffs(std::span<const double> a, std::span<const double> b, int resamples,
                                         uint64_t seed) {
  if (a.size() != b.size())
    throw Error(fmt::format("bootstrap: {} values against {} (the pairs must match)", a.size(), b.size()));
  if (a.empty()) throw Error("bootstrap: no paired problems");
  if (resamples < 1) throw Error(fmt::format("bootstrap: {} resamples (need >= 1)", resamples));
  const size_t n = a.size();
  std::vector<double> d(n);
  for (size_t i = 0; i < n; ++i) d[i] = a[i] - b[i];
  std::vector<double> out(static_cast<size_t>(resamples));
  for (int j = 0; j < resamples; ++j) {
    Rng rng(stream_id({seed, static_cast<uint64_t>(j)}));
    double sum = 0;
    for (size_t i = 0; i < n; ++i) {
      const auto k = std::min(n - 1, static_cast<size_t>(rng.uniform() * static_cast<double>(n)));
      sum += d[k];
    }
    out[static_cast<size_t>(j)] = sum / static_cast<double>(n);
  }
  return out;
}

double quantile_sorted(std::span<const double> sorted, double q) {
  if (sorted.empty()) throw Error("quantile of an empty sample");
  const double h = static_cast<double>(sorted.size() - 1) * q;
  const auto lo = static_cast<size_t>(std::floor(h));
  if (lo + 1 >= sorted.size()) return sorted.back();
  return sorted[lo] + (h - static_cast<double>(lo)) * (sorted[lo + 1] - sorted[lo]);
}

BootstrapCi paired_bootstrap_ci(std::span<const double> a, std::span<const double> b, int resamples, uint64_t seed,
                                double level) {
  if (!(level > 0 && level < 1)) throw Error(fmt::format("bootstrap: confidence level {} outside (0, 1)", level));
  std::vector<double> diffs = bootstrap_mean_diffs(a, b, resamples, seed);
  std::sort(diffs.begin(), diffs.end());
  BootstrapCi ci;
  ci.n = static_cast<int64_t>(a.size());
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] - b[i];
  ci.mean_diff = sum / static_cast<double>(a.size());
  ci.lo = quantile_sorted(diffs, (1 - level) / 2);
  ci.hi = quantile_sorted(diffs, (1 + level) / 2);
  return ci;
}

double normal_two_sided_z(double level) {
  if (!(level > 0 && level < 1)) throw Error(fmt::format("confidence level {} outside (0, 1)", level));
  // P(|Z| > z) = erfc(z / sqrt 2) falls monotonically in z.
  double lo = 0, hi = 40;
  for (int i = 0; i < 200 && hi - lo > 1e-13; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (std::erfc(mid / std::sqrt(2.0)) > 1 - level)
      lo = mid;
    else
      hi = mid;
  }
  return 0.5 * (lo + hi);
}

ProportionCi wilson_interval(double p_hat, int64_t n, double level) {
  if (!(p_hat >= 0 && p_hat <= 1)) throw Error(fmt::format("Wilson interval: proportion {} outside [0, 1]", p_hat));
  if (n < 0) throw Error(fmt::format("Wilson interval: {} trials", n));
  const double z = normal_two_sided_z(level);
  ProportionCi ci;
  ci.n = n;
  if (n == 0) return ci;
  const double nn = static_cast<double>(n), z2 = z * z;
  const double centre = (p_hat + z2 / (2 * nn)) / (1 + z2 / nn);
  const double half = z * std::sqrt(p_hat * (1 - p_hat) / nn + z2 / (4 * nn * nn)) / (1 + z2 / nn);
  ci.lo = std::max(0.0, centre - half);
  ci.hi = std::min(1.0, centre + half);
  return ci;
}

double sign_test_p(int64_t n_pos, int64_t n_neg) {
  if (n_pos < 0 || n_neg < 0) throw Error("sign test: negative counts");
  const int64_t n = n_pos + n_neg;
  if (n == 0) return 1.0;
  const int64_t k = std::min(n_pos, n_neg);
  long double sum = 0;
  if (n <= 16000) {
    // P(X <= k) = sum_i C(n, i) 2^-n by the recurrence t_{i+1} = t_i (n - i) / (i + 1) from
    // t_0 = 2^-n (representable in long double for these n). While C(n, i) (n - i) fits in the
    // 64-bit mantissa every step is exact, so small cases give the exact binomial sum.
    long double t = std::ldexp(1.0L, static_cast<int>(-n));
    for (int64_t i = 0; i <= k; ++i) {
      sum += t;
      t = t * static_cast<long double>(n - i) / static_cast<long double>(i + 1);
    }
  } else {
    // Log space from the largest term down (terms grow with i for i <= n/2).
    const auto log_term = [&](int64_t i) {
      return std::lgamma(static_cast<long double>(n) + 1) - std::lgamma(static_cast<long double>(i) + 1) -
          std::lgamma(static_cast<long double>(n - i) + 1) + static_cast<long double>(n) * std::log(0.5L);
    };
    const long double top = log_term(k);
    for (int64_t i = 0; i <= k; ++i) sum += std::exp(log_term(i) - top);
    sum *= std::exp(top);
  }
  return std::min(1.0, static_cast<double>(2 * sum));
}

SignTest paired_sign_test(std::span<const double> a, std::span<const double> b) {
  if (a.size() != b.size())
    throw Error(fmt::format("sign test: {} values against {} (the pairs must match)", a.size(), b.size()));
  SignTest t;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] > b[i])
      ++t.n_pos;
    else if (a[i] < b[i])
      ++t.n_neg;
    else
      ++t.n_ties;
  }
  t.p = sign_test_p(t.n_pos, t.n_neg);
  return t;
}

}  // namespace kvevict
