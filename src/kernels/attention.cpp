// Tiled online-softmax attention (see attention.h).
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "format/ggml_types.h"
#include "util/simd.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVEVICT_ATT_AVX2 1
#endif

namespace kvevict {
namespace {

// Slots per online-softmax step. 256 rather than 32: with the cache streamed from DRAM (batched
// decode), fewer, longer K and V passes were 10% faster per step (SmolLM2-135M shape, batch 16,
// 1088 slots: 161 vs 178 ms); a 256 x 128-dim f32 key tile still fits L2.
constexpr int kTile = 256;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;  // ln 2 split so n * hi is exact
constexpr float kLn2Lo = 1.428606765330187e-06f;
constexpr float kExpMin = -87.3f, kExpMax = 88.3f;
// Taylor coefficients of e^r, r in [-ln2/2, ln2/2].
constexpr float kC2 = 0.5f, kC3 = 1.0f / 6, kC4 = 1.0f / 24, kC5 = 1.0f / 120, kC6 = 1.0f / 720;

inline float exp_scalar(float x) {
  x = std::min(std::max(x, kExpMin), kExpMax);
  const float n = std::nearbyint(x * kLog2e);
  const float r = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
  float p = std::fma(kC6, r, kC5);
  p = std::fma(p, r, kC4);
  p = std::fma(p, r, kC3);
  p = std::fma(p, r, kC2);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  return p * scale;
}

#ifdef KVEVICT_ATT_AVX2
inline __m256 exp_ps(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpMin)), _mm256_set1_ps(kExpMax));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(kC6), r, _mm256_set1_ps(kC5));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif

inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return fp16_to_fp32(*p); }

// Where slot j's key and value rows lie. The kernels below address rows only through these, so
// a cache stored in two parts computes exactly what the same rows stored contiguously would.
template <class E>
struct ContigRows {
  using Elem = E;
  const E* K;
  const E* V;
  int64_t hd;
  const E* k(int64_t j) const { return K + j * hd; }
  const E* v(int64_t j) const { return V + j * hd; }
};
template <class E>
struct SplitRows {
  using Elem = E;
  SplitKv<E> kv;
  int64_t off;  // slot of row 0 (a chunk of a split row)
  int64_t hd;
  const E* k(int64_t j) const {
    j += off;
    return j < kv.n_shared ? kv.K0 + j * hd : kv.K1 + (j - kv.n_shared) * hd;
  }
  const E* v(int64_t j) const {
    j += off;
    return j < kv.n_shared ? kv.V0 + j * hd : kv.V1 + (j - kv.n_shared) * hd;
  }
};

// dot(q[hd], k[hd]) with 8-lane FMA accumulation then a scalar tail; fixed order.
template <class E>
inline float dot_qk(const float* q, const E* k, int hd) {
  int d = 0;
  float s = 0.0f;
#ifdef KVEVICT_ATT_AVX2
  if (hd >= 8) {
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), load8(k));
    for (d = 8; d + 8 <= hd; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(k + d), acc);
    s = hsum8(acc);
  }
#endif
  for (; d < hd; ++d) s += q[d] * load1(k + d);
  return s;
}

// s[j] = dot(q, K[s0 + j]) * scale for j < n. With AVX2 and hd % 8 == 0, eight slots at a time:
// eight 8-lane accumulators reduced together by a horizontal-add tree (one reduction per 8
// slots instead of one per slot); other slots use dot_qk.
template <class R>
inline void scores(const float* q, const R& rows, int64_t s0, int n, int hd, float scale, float* s) {
  int j = 0;
#ifdef KVEVICT_ATT_AVX2
  if (hd % 8 == 0) {
    for (; j + 8 <= n; j += 8) {
      __m256 acc[8];
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
      for (int d = 0; d < hd; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(qv, load8(rows.k(s0 + j + r) + d), acc[r]);
      }
      const __m256 t0 = _mm256_hadd_ps(acc[0], acc[1]), t1 = _mm256_hadd_ps(acc[2], acc[3]);
      const __m256 t2 = _mm256_hadd_ps(acc[4], acc[5]), t3 = _mm256_hadd_ps(acc[6], acc[7]);
      const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
      // u0 = [s0l s1l s2l s3l | s0h s1h s2h s3h] (l/h: the two 128-bit halves of each row's sum).
      const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
      _mm256_storeu_ps(s + j, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
    }
  }
#endif
  for (; j < n; ++j) s[j] = dot_qk(q, rows.k(s0 + j), hd) * scale;
}

// out[hd] = out * c + Σ_j p[j] v_{s0 + j} over the tile (c = rescale of what was accumulated).
template <class R>
inline void accumulate_values(float* out, float c, const float* p, const R& rows, int64_t s0, int n, int hd) {
  int d = 0;
#ifdef KVEVICT_ATT_AVX2
  // 64 dims (8 registers) at a time with the slot loop inside: 8 independent FMA chains.
  for (; d + 64 <= hd; d += 64) {
    __m256 acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_mul_ps(_mm256_loadu_ps(out + d + 8 * r), _mm256_set1_ps(c));
    for (int j = 0; j < n; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      const auto* v = rows.v(s0 + j) + d;
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(pj, load8(v + 8 * r), acc[r]);
    }
    for (int r = 0; r < 8; ++r) _mm256_storeu_ps(out + d + 8 * r, acc[r]);
  }
  for (; d + 8 <= hd; d += 8) {
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(out + d), _mm256_set1_ps(c));
    for (int j = 0; j < n; ++j) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), load8(rows.v(s0 + j) + d), acc);
    _mm256_storeu_ps(out + d, acc);
  }
#endif
  for (; d < hd; ++d) {
    float acc = out[d] * c;
    for (int j = 0; j < n; ++j) acc = std::fma(p[j], load1(rows.v(s0 + j) + d), acc);
    out[d] = acc;
  }
}

// p[j] = exp(s[j] - m) for j < n; returns Σ p (fixed order: 8-lane partial sums, then tail).
inline float exp_shift(float* p, const float* s, int n, float m) {
  int j = 0;
  float sum = 0.0f;
#ifdef KVEVICT_ATT_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(m)));
    _mm256_storeu_ps(p + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  sum = hsum8(acc);
#endif
  for (; j < n; ++j) {
    p[j] = exp_scalar(s[j] - m);
    sum += p[j];
  }
  return sum;
}

// Unnormalised tiled online softmax over [0, n_slots) for gn <= kMaxG heads (see header).
template <class R>
void attend_partial_impl(const float* q, int G, const R& rows, int64_t n_slots, int hd, float scale, float* acc,
                         float* m, float* l) {
  alignas(32) float s[kTile], p[kTile];
  for (int g = 0; g < G; ++g) {
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.0f;
  }
  std::fill(acc, acc + int64_t{G} * hd, 0.0f);
  for (int64_t s0 = 0; s0 < n_slots; s0 += kTile) {
    const int n = static_cast<int>(std::min<int64_t>(kTile, n_slots - s0));
    for (int g = 0; g < G; ++g) {
      const float* qg = q + int64_t{g} * hd;
      scores(qg, rows, s0, n, hd, scale, s);
      float tile_max = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < n; ++j) tile_max = std::max(tile_max, s[j]);
      const float m_new = std::max(m[g], tile_max);
      const float c = m[g] == -std::numeric_limits<float>::infinity() ? 0.0f : exp_scalar(m[g] - m_new);
      const float sum = exp_shift(p, s, n, m_new);
      l[g] = l[g] * c + sum;
      m[g] = m_new;
      accumulate_values(acc + int64_t{g} * hd, c, p, rows, s0, n, hd);
    }
  }
}

template <class R>
void attend_group_impl(const float* q, int G, const R& rows, int64_t n_slots, int hd, float scale, float* out) {
  constexpr int kMaxG = 64;
  float m[kMaxG], l[kMaxG];
  for (int g0 = 0; g0 < G; g0 += kMaxG) {
    const int gn = std::min(kMaxG, G - g0);
    float* o = out + int64_t{g0} * hd;
    attend_partial_impl(q + int64_t{g0} * hd, gn, rows, n_slots, hd, scale, o, m, l);
    attend_merge(1, gn, hd, o, 0, m, l, o);
  }
}

template <class R>
void attend_probs_impl(const float* q, const R& rows, int64_t n_slots, int hd, float scale, float* out,
                       float* probs) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < n_slots; ++s) {
    probs[s] = dot_qk(q, rows.k(s), hd) * scale;
    m = std::max(m, probs[s]);
  }
  float l = 0.0f;
  for (int64_t s0 = 0; s0 < n_slots; s0 += kTile) {
    const int n = static_cast<int>(std::min<int64_t>(kTile, n_slots - s0));
    l += exp_shift(probs + s0, probs + s0, n, m);
  }
  const float inv = 1.0f / l;
  for (int64_t s = 0; s < n_slots; ++s) probs[s] *= inv;
  std::fill(out, out + hd, 0.0f);
  for (int64_t s0 = 0; s0 < n_slots; s0 += kTile) {
    const int n = static_cast<int>(std::min<int64_t>(kTile, n_slots - s0));
    accumulate_values(out, 1.0f, probs + s0, rows, s0, n, hd);
  }
}

}  // namespace

void attend_group(const float* q, int G, const float* K, const float* V, int64_t n_slots, int head_dim, float scale,
                  float* out) {
  attend_group_impl(q, G, ContigRows<float>{K, V, head_dim}, n_slots, head_dim, scale, out);
}
void attend_group(const float* q, int G, const uint16_t* K, const uint16_t* V, int64_t n_slots, int head_dim,
                  float scale, float* out) {
  attend_group_impl(q, G, ContigRows<uint16_t>{K, V, head_dim}, n_slots, head_dim, scale, out);
}
void attend_probs(const float* q, const float* K, const float* V, int64_t n_slots, int head_dim, float scale,
                  float* out, float* probs) {
  attend_probs_impl(q, ContigRows<float>{K, V, head_dim}, n_slots, head_dim, scale, out, probs);
}
void attend_probs(const float* q, const uint16_t* K, const uint16_t* V, int64_t n_slots, int head_dim, float scale,
                  float* out, float* probs) {
  attend_probs_impl(q, ContigRows<uint16_t>{K, V, head_dim}, n_slots, head_dim, scale, out, probs);
}

void attend_group_partial(const float* q, int G, const float* K, const float* V, int64_t n_slots, int head_dim,
                          float scale, float* acc, float* m, float* l) {
  attend_partial_impl(q, G, ContigRows<float>{K, V, head_dim}, n_slots, head_dim, scale, acc, m, l);
}
void attend_group_partial(const float* q, int G, const uint16_t* K, const uint16_t* V, int64_t n_slots, int head_dim,
                          float scale, float* acc, float* m, float* l) {
  attend_partial_impl(q, G, ContigRows<uint16_t>{K, V, head_dim}, n_slots, head_dim, scale, acc, m, l);
}

template <class E>
void attend_group(const float* q, int G, const SplitKv<E>& kv, int64_t n_slots, int head_dim, float scale,
                  float* out) {
  attend_group_impl(q, G, SplitRows<E>{kv, 0, head_dim}, n_slots, head_dim, scale, out);
}
template <class E>
void attend_group_partial(const float* q, int G, const SplitKv<E>& kv, int64_t begin, int64_t n_slots, int head_dim,
                          float scale, float* acc, float* m, float* l) {
  attend_partial_impl(q, G, SplitRows<E>{kv, begin, head_dim}, n_slots, head_dim, scale, acc, m, l);
}
template <class E>
void attend_probs(const float* q, const SplitKv<E>& kv, int64_t n_slots, int head_dim, float scale, float* out,
                  float* probs) {
  attend_probs_impl(q, SplitRows<E>{kv, 0, head_dim}, n_slots, head_dim, scale, out, probs);
}
template void attend_group(const float*, int, const SplitKv<float>&, int64_t, int, float, float*);
template void attend_group(const float*, int, const SplitKv<uint16_t>&, int64_t, int, float, float*);
template void attend_group_partial(const float*, int, const SplitKv<float>&, int64_t, int64_t, int, float, float*,
                                   float*, float*);
template void attend_group_partial(const float*, int, const SplitKv<uint16_t>&, int64_t, int64_t, int, float, float*,
                                   float*, float*);
template void attend_probs(const float*, const SplitKv<float>&, int64_t, int, float, float*, float*);
template void attend_probs(const float*, const SplitKv<uint16_t>&, int64_t, int, float, float*, float*);

void attend_merge(int n_chunks, int G, int head_dim, const float* acc, int64_t acc_stride, const float* m,
                  const float* l, float* out) {
  for (int g = 0; g < G; ++g) {
    float M = -std::numeric_limits<float>::infinity();
    for (int c = 0; c < n_chunks; ++c) M = std::max(M, m[c * G + g]);
    float L = 0.0f;
    float w[64];
    const int nw = std::min(n_chunks, 64);
    for (int c = 0; c < nw; ++c) {
      w[c] = n_chunks == 1 ? 1.0f : exp_scalar(m[c * G + g] - M);
      L += l[c * G + g] * w[c];
    }
    const float inv = 1.0f / L;
    float* o = out + int64_t{g} * head_dim;
    for (int d = 0; d < head_dim; ++d) {
      float v = acc[int64_t{g} * head_dim + d] * w[0];
      for (int c = 1; c < nw; ++c) v += acc[c * acc_stride + int64_t{g} * head_dim + d] * w[c];
      o[d] = v * inv;
    }
  }
}

float fast_exp(float x) { return exp_scalar(x); }

void fp32_to_fp16_row(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
#ifdef KVEVICT_ATT_AVX2
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}

void fp16_to_fp32_row(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef KVEVICT_ATT_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(src + i));
#endif
  for (; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

}  // namespace kvevict
