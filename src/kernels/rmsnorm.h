// RMSNorm (Zhang & Sennrich, arXiv 1910.07467 §3): out = x / sqrt(mean(x²) + eps) * w.
#pragma once

#include <cstdint>

namespace kvevict {

/// out[n] = x[n] / sqrt(mean(x²) + eps) * w[n], accumulated in float32 in index order. out may
/// alias x (per-head Q/K norms normalise in place).
void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out);

}  // namespace kvevict
