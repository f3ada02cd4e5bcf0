#include "model/attention.h"

#include "kernels/attention.h"

namespace kvevict {

std::atomic<int64_t> g_attention_probability_rows{0};

void attend_online(const float* q, const float* K, const float* V, int64_t n_slots, int head_dim,
                   float scale, float* out) {
  attend_group(q, 1, K, V, n_slots, head_dim, scale, out);
}

void attend_with_probs(const float* q, const float* K, const float* V, int64_t n_slots,
                       int head_dim, float scale, float* out, float* probs) {
  attend_probs(q, K, V, n_slots, head_dim, scale, out, probs);
  g_attention_probability_rows.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace kvevict
