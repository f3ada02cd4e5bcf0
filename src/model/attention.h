// Attention of one query head over one KV head's live slots (float32 cache); thin wrappers over
// the tiled kernels of kernels/attention.h, kept for callers and tests of the single-head form.
//
// Source: "Attention Is All You Need" §3.2.1 (scaled dot product); the one-pass form with a
// running maximum is the online softmax of Milakov & Gimelshein (arXiv 1805.02867).
#pragma once

#include <atomic>
#include <cstdint>

namespace kvevict {

/// Number of attention-probability rows written since start (one per query head and token).
/// Only the two-pass kernel increments it; tests use it to prove that policies which need no
/// scores never cause probabilities to be computed or stored (issue 3).
extern std::atomic<int64_t> g_attention_probability_rows;

/// out[head_dim] = softmax(q · K[s] * scale for s < n_slots) · V, one pass, no probabilities
/// stored. q: [head_dim]; K, V: [n_slots, head_dim] row-major; n_slots >= 1.
void attend_online(const float* q, const float* K, const float* V, int64_t n_slots, int head_dim,
                   float scale, float* out);

/// Same result as attend_online, but also writes the softmax probabilities to probs[n_slots]
/// (for selectors that score with attention weights). Two passes over K.
void attend_with_probs(const float* q, const float* K, const float* V, int64_t n_slots,
                       int head_dim, float scale, float* out, float* probs);

}  // namespace kvevict
