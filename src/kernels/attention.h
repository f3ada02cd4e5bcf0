// Attention kernels over one KV head's slots, for float32 or IEEE-half (fp16) cache storage.
//
// Source: "Attention Is All You Need" §3.2.1 (scaled dot product); the one-pass form with a
// running maximum is the online softmax of Milakov & Gimelshein (arXiv 1805.02867), applied per
// tile of slots as in FlashAttention (Dao et al., arXiv 2205.14135, Alg. 1) but on the CPU:
// scores of a tile of 32 slots, one rescale per tile, then the weighted sum of the tile's values.
// Grouped-query attention (Ainslie et al., arXiv 2305.13245): the G query heads that share a
// KV head are processed together so K and V are streamed from memory once per group.
// exp is a degree-6 polynomial on a Cody-Waite reduced argument (relative error < 3e-7).
#pragma once

#include <cstdint>

namespace kvevict {

/// out[G, head_dim] = softmax(q[g] · K[s] * scale over s < n_slots) · V for each of G query
/// heads. q: [G, head_dim]; K, V: [n_slots, head_dim] row-major, float32 or fp16 bits;
/// n_slots >= 1; no probabilities are stored. Deterministic (fixed tile order).
void attend_group(const float* q, int G, const float* K, const float* V, int64_t n_slots, int head_dim, float scale,
                  float* out);
void attend_group(const float* q, int G, const uint16_t* K, const uint16_t* V, int64_t n_slots, int head_dim,
                  float scale, float* out);

/// Unnormalised partial of attend_group over slots [0, n_slots) of K/V (a chunk of a longer
/// range): acc[G, head_dim] = Σ exp(s - m[g]) v, m[g] = max score, l[g] = Σ exp(s - m[g]).
/// Chunks are combined with attend_merge; attend_group == one chunk merged.
void attend_group_partial(const float* q, int G, const float* K, const float* V, int64_t n_slots, int head_dim,
                          float scale, float* acc, float* m, float* l);
void attend_group_partial(const float* q, int G, const uint16_t* K, const uint16_t* V, int64_t n_slots, int head_dim,
                          float scale, float* acc, float* m, float* l);

/// Combines n_chunks partials (chunk c: acc + c * acc_stride, m + c * G, l + c * G) in chunk
/// order into out[G, head_dim] (flash-decoding's split-K reduction, Dao et al. 2023). For one
/// chunk the result equals attend_group's bit for bit.
void attend_merge(int n_chunks, int G, int head_dim, const float* acc, int64_t acc_stride, const float* m,
                  const float* l, float* out);

/// One query head, also writing the softmax probabilities probs[n_slots] (two passes over K).
void attend_probs(const float* q, const float* K, const float* V, int64_t n_slots, int head_dim, float scale,
                  float* out, float* probs);
void attend_probs(const float* q, const uint16_t* K, const uint16_t* V, int64_t n_slots, int head_dim, float scale,
                  float* out, float* probs);

/// K/V rows of one KV head stored in two parts: slots [0, n_shared) at K0/V0 (a prompt segment
/// shared by several sequences, kvcache/kv_cache.h) and slots [n_shared, n_slots) at K1/V1 (the
/// sequence's own rows; row 0 = slot n_shared). E: float or fp16 bits.
template <class E>
struct SplitKv {
  const E* K0;
  const E* V0;
  int64_t n_shared;
  const E* K1;
  const E* V1;
};

/// attend_group, attend_group_partial (slots [begin, begin + n_slots)) and attend_probs over a
/// split cache. The kernels address rows only through the slot index, so each result equals
/// the contiguous call's on the same rows bit for bit (E = float or uint16_t).
template <class E>
void attend_group(const float* q, int G, const SplitKv<E>& kv, int64_t n_slots, int head_dim, float scale,
                  float* out);
template <class E>
void attend_group_partial(const float* q, int G, const SplitKv<E>& kv, int64_t begin, int64_t n_slots, int head_dim,
                          float scale, float* acc, float* m, float* l);
template <class E>
void attend_probs(const float* q, const SplitKv<E>& kv, int64_t n_slots, int head_dim, float scale, float* out,
                  float* probs);

/// exp(x) by the kernels' polynomial (for tests: relative error < 3e-7 on [-87, 88]).
float fast_exp(float x);

/// Converts n floats to fp16 bits (round to nearest even) and back; F16C when available.
void fp32_to_fp16_row(const float* src, uint16_t* dst, int64_t n);
void fp16_to_fp32_row(const uint16_t* src, float* dst, int64_t n);

}  // namespace kvevict
