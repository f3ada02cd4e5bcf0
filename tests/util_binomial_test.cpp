// binomial_half_cdf (util/binomial.h), the tail both the sign test and the median's sign-test
// interval use. Expected values need no binomial code: sums written out, the edges of the
// support, and the symmetry of Binomial(n, 1/2), which puts exactly half its mass on X <= (n-1)/2
// for odd n (checked in both branches, n <= 16000 and above). The sign test's own cases are in
// eval_stats_test.cpp, the median interval's in bench_test.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "util/binomial.h"
#include "util/error.h"

namespace kvevict {
namespace {

TEST(UtilBinomial, SmallSumsWrittenOut) {
  EXPECT_DOUBLE_EQ(binomial_half_cdf(10, 1), (1.0 + 10) / 1024);
  EXPECT_DOUBLE_EQ(binomial_half_cdf(10, 2), (1.0 + 10 + 45) / 1024);
  EXPECT_DOUBLE_EQ(binomial_half_cdf(6, 0), 1.0 / 64);
  EXPECT_DOUBLE_EQ(binomial_half_cdf(1, 0), 0.5);
}

TEST(UtilBinomial, EdgesOfTheSupport) {
  EXPECT_EQ(binomial_half_cdf(10, -1), 0.0);
  EXPECT_EQ(binomial_half_cdf(10, 10), 1.0);
  EXPECT_EQ(binomial_half_cdf(10, 11), 1.0);
  EXPECT_EQ(binomial_half_cdf(0, 0), 1.0);
  EXPECT_THROW(binomial_half_cdf(-1, 0), Error);
}

TEST(UtilBinomial, HalfTheMassBelowTheMiddleForOddN) {
  for (int64_t n : {3, 101, 15999, 16001, 40001}) {
    EXPECT_NEAR(binomial_half_cdf(n, (n - 1) / 2), 0.5, 1e-9) << "n = " << n;
    // Past the middle (the log-space branch sums from the largest term, at n/2): 1 - P(X = n).
    EXPECT_NEAR(binomial_half_cdf(n, n - 1), 1.0 - std::ldexp(1.0, static_cast<int>(-n)), 1e-9) << "n = " << n;
  }
}

}  // namespace
}  // namespace kvevict
