// The lower tail of Binomial(n, 1/2), shared by the sign test (eval/stats) and the sign-test
// interval of a median (bench/common): one code for both, below both layers.
#pragma once

#include <cstdint>

namespace kvevict {

/// P(X <= k) for X ~ Binomial(n, 1/2): the exact sum of C(n, i) 2^-n over i = 0..k, term by term
/// in long double up to n = 16000 (each step exact while C(n, i) (n - i) fits the 64-bit
/// mantissa, so small cases give the exact binomial sum), in log space from the largest term
/// beyond. k < 0 gives 0, k >= n gives 1. Throws kvevict::Error for n < 0.
double binomial_half_cdf(int64_t n, int64_t k);

}  // namespace kvevict
