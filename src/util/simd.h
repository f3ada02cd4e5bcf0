// Small AVX helpers shared by the compute kernels (kernels/). Only defined when the translation
// unit is compiled with AVX.
#pragma once

#if defined(__AVX__)
#include <immintrin.h>

namespace kvevict {

/// Sum of the 8 float lanes of v (the order is fixed, so results are reproducible).
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace kvevict
#endif
