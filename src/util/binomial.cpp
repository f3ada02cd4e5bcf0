#include "util/binomial.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "util/error.h"

namespace kvevict {

double binomial_half_cdf(int64_t n, int64_t k) {
  if (n < 0) throw Error(fmt::format("binomial tail: n = {} is negative", n));
  if (k < 0) return 0.0;
  if (k >= n) return 1.0;
  long double sum = 0;
  if (n <= 16000) {
    // t_{i+1} = t_i (n - i) / (i + 1) from t_0 = 2^-n, representable in long double for these n.
    long double t = std::ldexp(1.0L, static_cast<int>(-n));
    for (int64_t i = 0; i <= k; ++i) {
      sum += t;
      t = t * static_cast<long double>(n - i) / static_cast<long double>(i + 1);
    }
  } else {
    // Log space from the largest term of the sum down (terms grow with i for i <= n/2; beyond,
    // the largest is at n/2).
    const auto log_term = [&](int64_t i) {
      return std::lgamma(static_cast<long double>(n) + 1) - std::lgamma(static_cast<long double>(i) + 1) -
          std::lgamma(static_cast<long double>(n - i) + 1) + static_cast<long double>(n) * std::log(0.5L);
    };
    const long double top = log_term(std::min(k, n / 2));
    for (int64_t i = 0; i <= k; ++i) sum += std::exp(log_term(i) - top);
    sum *= std::exp(top);
  }
  return std::min(1.0, static_cast<double>(sum));
}

}  // namespace kvevict
