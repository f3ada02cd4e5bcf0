#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvevict {

std::atomic<int64_t> g_attention_probability_rows{0};

namespace {
inline float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace

void attend_online(const float* q, const float* K, const float* V, int64_t n_slots, int head_dim,
                   float scale, float* out) {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.0f;
  std::fill(out, out + head_dim, 0.0f);
  for (int64_t s = 0; s < n_slots; ++s) {
    const float x = dot(q, K + s * head_dim, head_dim) * scale;
    const float* v = V + s * head_dim;
    if (x > m) {
      // New maximum: rescale what was accumulated so far by exp(m_old - m_new).
      const float c = std::exp(m - x);
      l *= c;
      for (int d = 0; d < head_dim; ++d) out[d] = out[d] * c + v[d];
      l += 1.0f;
      m = x;
    } else {
      const float e = std::exp(x - m);
      l += e;
      for (int d = 0; d < head_dim; ++d) out[d] += e * v[d];
    }
  }
  const float inv = 1.0f / l;
  for (int d = 0; d < head_dim; ++d) out[d] *= inv;
}

void attend_with_probs(const float* q, const float* K, const float* V, int64_t n_slots,
                       int head_dim, float scale, float* out, float* probs) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < n_slots; ++s) {
    probs[s] = dot(q, K + s * head_dim, head_dim) * scale;
    m = std::max(m, probs[s]);
  }
  float l = 0.0f;
  for (int64_t s = 0; s < n_slots; ++s) {
    probs[s] = std::exp(probs[s] - m);
    l += probs[s];
  }
  const float inv = 1.0f / l;
  std::fill(out, out + head_dim, 0.0f);
  for (int64_t s = 0; s < n_slots; ++s) {
    probs[s] *= inv;
    const float* v = V + s * head_dim;
    for (int d = 0; d < head_dim; ++d) out[d] += probs[s] * v[d];
  }
  g_attention_probability_rows.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace kvevict
