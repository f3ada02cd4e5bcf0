#include "eval/stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>

#include "util/binomial.h"
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
  return std::min(1.0, 2 * binomial_half_cdf(n, std::min(n_pos, n_neg)));
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

double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

namespace {

/// Continued fraction of the incomplete beta function (Numerical Recipes 3rd ed. §6.4, betacf),
/// evaluated by the modified Lentz method.
double beta_continued_fraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300, kEps = 1e-15;
  const double qab = a + b, qap = a + 1, qam = a - 1;
  double c = 1, d = 1 - qab * x / qap;
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 10000; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < kEps) break;
  }
  return h;
}

void check_margin_alpha(double margin, double alpha, const char* what) {
  if (!(margin > 0 && margin < 1)) throw Error(fmt::format("{}: margin {} outside (0, 1)", what, margin));
  if (!(alpha > 0 && alpha < 0.5)) throw Error(fmt::format("{}: alpha {} outside (0, 0.5)", what, alpha));
}

/// The 1 - alpha standard normal quantile (one-sided).
double normal_upper_z(double alpha) { return normal_two_sided_z(1 - 2 * alpha); }

/// Whether Tango's TOST shows equivalence for these counts (both one-sided score tests reject).
bool tango_rejects(int64_t n10, int64_t n01, int64_t n, double margin, double z) {
  return tango_score_z(n10, n01, n, -margin) > z && tango_score_z(n10, n01, n, margin) < -z;
}

}  // namespace

double incomplete_beta(double a, double b, double x) {
  if (!(a > 0 && b > 0)) throw Error(fmt::format("incomplete beta: a = {}, b = {} (both must be > 0)", a, b));
  if (!(x >= 0 && x <= 1)) throw Error(fmt::format("incomplete beta: x = {} outside [0, 1]", x));
  if (x == 0 || x == 1) return x;
  // Prefactor x^a (1-x)^b / (a B(a, b)), in logs (A&S 26.5.8); the fraction converges fast for
  // x < (a + 1) / (a + b + 2), else use the symmetry I_x(a, b) = 1 - I_{1-x}(b, a).
  const double lbt = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x);
  if (x < (a + 1) / (a + b + 2)) return std::exp(lbt) * beta_continued_fraction(a, b, x) / a;
  return 1 - std::exp(lbt) * beta_continued_fraction(b, a, 1 - x) / b;
}

double student_t_cdf(double t, double df) {
  if (!(df > 0)) throw Error(fmt::format("Student t: {} degrees of freedom (need > 0)", df));
  if (std::isinf(t)) return t > 0 ? 1.0 : 0.0;
  // A&S 26.7.1: P(|T| > |t|) = I_{df/(df+t^2)}(df/2, 1/2).
  const double tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t));
  return t >= 0 ? 1 - tail : tail;
}

double student_t_quantile(double p, double df) {
  if (!(p > 0 && p < 1)) throw Error(fmt::format("Student t quantile: p = {} outside (0, 1)", p));
  if (!(df > 0)) throw Error(fmt::format("Student t: {} degrees of freedom (need > 0)", df));
  double lo = -1e3, hi = 1e3;
  while (student_t_cdf(lo, df) > p) lo *= 2;
  while (student_t_cdf(hi, df) < p) hi *= 2;
  for (int i = 0; i < 400 && hi - lo > 1e-12 * std::max(1.0, std::fabs(lo)); ++i) {
    const double mid = 0.5 * (lo + hi);
    (student_t_cdf(mid, df) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double tango_score_z(int64_t n10, int64_t n01, int64_t n, double delta0) {
  if (n < 1 || n10 < 0 || n01 < 0 || n10 + n01 > n)
    throw Error(fmt::format("Tango score test: counts n10 = {}, n01 = {} of n = {} are impossible", n10, n01, n));
  if (!(delta0 > -1 && delta0 < 1)) throw Error(fmt::format("Tango score test: delta0 {} outside (-1, 1)", delta0));
  const double b = static_cast<double>(n10), c = static_cast<double>(n01), nn = static_cast<double>(n);
  // Restricted MLE of p01 under p10 - p01 = delta0 (Tango 1998 eq. 5): the positive root of
  // 2n q^2 + (-(b + c) + (2n - b + c) delta0) q - c delta0 (1 - delta0) = 0.
  const double qa = 2 * nn, qb = -(b + c) + (2 * nn - b + c) * delta0, qc = -c * delta0 * (1 - delta0);
  double q = (-qb + std::sqrt(std::max(0.0, qb * qb - 4 * qa * qc))) / (2 * qa);
  // The profile likelihood lives on max(0, -delta0) <= q <= (1 - delta0) / 2.
  q = std::clamp(q, std::max(0.0, -delta0), (1 - delta0) / 2);
  const double var = nn * (2 * q + delta0 * (1 - delta0));
  const double num = b - c - nn * delta0;
  if (var <= 0) return num == 0 ? 0.0 : (num > 0 ? std::numeric_limits<double>::infinity()
                                                 : -std::numeric_limits<double>::infinity());
  return num / std::sqrt(var);
}

Equivalence tango_tost(std::span<const double> a, std::span<const double> b, double margin, double alpha) {
  if (a.size() != b.size())
    throw Error(fmt::format("equivalence test: {} values against {} (the pairs must match)", a.size(), b.size()));
  if (a.empty()) throw Error("equivalence test: no paired problems");
  check_margin_alpha(margin, alpha, "Tango TOST");
  Equivalence e;
  e.method = "tango-score";
  e.margin = margin;
  e.alpha = alpha;
  e.n = static_cast<int64_t>(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    for (double v : {a[i], b[i]})
      if (v != 0 && v != 1) throw Error(fmt::format("Tango TOST: value {} is not a binary outcome (0 or 1)", v));
    e.n10 += a[i] > b[i];
    e.n01 += a[i] < b[i];
  }
  e.mean_diff = static_cast<double>(e.n10 - e.n01) / static_cast<double>(e.n);
  const double z = normal_upper_z(alpha);
  e.p_lower = 1 - normal_cdf(tango_score_z(e.n10, e.n01, e.n, -margin));
  e.p_upper = normal_cdf(tango_score_z(e.n10, e.n01, e.n, margin));
  e.p = std::max(e.p_lower, e.p_upper);
  e.equivalent = e.p < alpha;
  // Score interval: Z(delta0) falls as delta0 rises; the bounds are where it crosses +-z.
  const auto crossing = [&](double target) {
    double lo = -1 + 1e-9, hi = 1 - 1e-9;
    for (int i = 0; i < 200 && hi - lo > 1e-10; ++i) {
      const double mid = 0.5 * (lo + hi);
      (tango_score_z(e.n10, e.n01, e.n, mid) > target ? lo : hi) = mid;
    }
    return 0.5 * (lo + hi);
  };
  e.ci_lo = crossing(z);
  e.ci_hi = crossing(-z);
  const double disc = static_cast<double>(e.n10 + e.n01) / static_cast<double>(e.n);
  e.power = e.n <= 5000 ? tango_tost_power(e.n, disc / 2, disc / 2, margin, alpha) : 0;
  return e;
}

double tango_tost_power(int64_t n, double p10, double p01, double margin, double alpha) {
  if (n < 1 || n > 5000) throw Error(fmt::format("Tango TOST power: n = {} outside [1, 5000]", n));
  if (!(p10 >= 0 && p01 >= 0 && p10 + p01 <= 1 + 1e-12))
    throw Error(fmt::format("Tango TOST power: discordant probabilities {} and {} are impossible", p10, p01));
  check_margin_alpha(margin, alpha, "Tango TOST power");
  const double z = normal_upper_z(alpha);
  const double rest = std::max(0.0, 1 - p10 - p01);
  const auto xlogp = [](int64_t k, double p) { return k == 0 ? 0.0 : static_cast<double>(k) * std::log(p); };
  const double lfn = std::lgamma(static_cast<double>(n) + 1);
  double power = 0;
  for (int64_t i = 0; i <= n; ++i) {
    if (p10 == 0 && i > 0) break;
    for (int64_t j = 0; i + j <= n; ++j) {
      if (p01 == 0 && j > 0) break;
      if (rest == 0 && i + j < n) continue;
      if (!tango_rejects(i, j, n, margin, z)) continue;
      power += std::exp(lfn - std::lgamma(static_cast<double>(i) + 1) - std::lgamma(static_cast<double>(j) + 1) -
                        std::lgamma(static_cast<double>(n - i - j) + 1) + xlogp(i, p10) + xlogp(j, p01) +
                        xlogp(n - i - j, rest));
    }
  }
  return std::min(1.0, power);
}

Equivalence paired_t_tost(std::span<const double> a, std::span<const double> b, double margin, double alpha) {
  if (a.size() != b.size())
    throw Error(fmt::format("equivalence test: {} values against {} (the pairs must match)", a.size(), b.size()));
  if (a.size() < 2) throw Error(fmt::format("paired t TOST: {} paired problems (need >= 2)", a.size()));
  if (!(margin > 0)) throw Error(fmt::format("paired t TOST: margin {} must be > 0", margin));
  if (!(alpha > 0 && alpha < 0.5)) throw Error(fmt::format("paired t TOST: alpha {} outside (0, 0.5)", alpha));
  Equivalence e;
  e.method = "paired-t";
  e.margin = margin;
  e.alpha = alpha;
  e.n = static_cast<int64_t>(a.size());
  const double n = static_cast<double>(e.n);
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] - b[i];
  e.mean_diff = sum / n;
  double ss = 0;
  for (size_t i = 0; i < a.size(); ++i) ss += (a[i] - b[i] - e.mean_diff) * (a[i] - b[i] - e.mean_diff);
  const double sd = std::sqrt(ss / (n - 1)), df = n - 1;
  if (sd == 0) {
    // No spread: the t statistics are undefined; nothing is shown (a ceiling is not equivalence).
    e.ci_lo = e.ci_hi = e.mean_diff;
    return e;
  }
  const double se = sd / std::sqrt(n);
  e.p_lower = 1 - student_t_cdf((e.mean_diff + margin) / se, df);
  e.p_upper = student_t_cdf((e.mean_diff - margin) / se, df);
  e.p = std::max(e.p_lower, e.p_upper);
  e.equivalent = e.p < alpha;
  const double tq = student_t_quantile(1 - alpha, df);
  e.ci_lo = e.mean_diff - tq * se;
  e.ci_hi = e.mean_diff + tq * se;
  e.power = tost_power_normal(e.n, sd, margin, alpha, 0);
  return e;
}

double tost_power_normal(int64_t n, double sd, double margin, double alpha, double true_diff) {
  if (n < 1) throw Error(fmt::format("TOST power: n = {} (need >= 1)", n));
  if (!(sd > 0)) throw Error(fmt::format("TOST power: standard deviation {} (need > 0)", sd));
  if (!(margin > 0)) throw Error(fmt::format("TOST power: margin {} must be > 0", margin));
  if (!(alpha > 0 && alpha < 0.5)) throw Error(fmt::format("TOST power: alpha {} outside (0, 0.5)", alpha));
  const double se = sd / std::sqrt(static_cast<double>(n)), z = normal_upper_z(alpha);
  return std::max(0.0, normal_cdf((margin - true_diff) / se - z) + normal_cdf((margin + true_diff) / se - z) - 1);
}

Equivalence equivalence_test(std::span<const double> a, std::span<const double> b, double margin, double alpha) {
  const auto binary = [](std::span<const double> v) {
    return std::all_of(v.begin(), v.end(), [](double x) { return x == 0 || x == 1; });
  };
  if (binary(a) && binary(b)) return tango_tost(a, b, margin, alpha);
  return paired_t_tost(a, b, margin, alpha);
}

std::vector<double> holm_adjust(std::span<const double> p) {
  for (double v : p)
    if (!(v >= 0 && v <= 1)) throw Error(fmt::format("Holm adjustment: p-value {} outside [0, 1]", v));
  const size_t m = p.size();
  std::vector<size_t> order(m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) { return p[i] < p[j]; });
  std::vector<double> out(m);
  double running = 0;
  for (size_t r = 0; r < m; ++r) {
    running = std::max(running, std::min(1.0, static_cast<double>(m - r) * p[order[r]]));
    out[order[r]] = running;
  }
  return out;
}

std::pair<std::vector<double>, std::vector<double>> cluster_by_problem(std::span<const PairedOutcome> outcomes) {
  std::map<int64_t, std::tuple<double, double, int64_t>> acc;  // problem -> (sum a, sum b, count)
  for (const PairedOutcome& o : outcomes) {
    auto& [sa, sb, k] = acc[o.problem];
    sa += o.a;
    sb += o.b;
    ++k;
  }
  std::pair<std::vector<double>, std::vector<double>> out;
  for (const auto& [problem, v] : acc) {
    const auto& [sa, sb, k] = v;
    out.first.push_back(sa / static_cast<double>(k));
    out.second.push_back(sb / static_cast<double>(k));
  }
  return out;
}

}  // namespace kvevict
