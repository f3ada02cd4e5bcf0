#include "kernels/rmsnorm.h"

#include <cmath>

namespace kvevict {

void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

}  // namespace kvevict
