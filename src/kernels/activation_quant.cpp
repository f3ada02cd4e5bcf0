// Activation quantisation (see activation_quant.h): AVX2 bodies with the scalar arithmetic of
// their definitions (format/ggml_types.h's quantize_row_q8_0 for Q8_0), 8 lanes at a time.
#include "kernels/activation_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "format/ggml_blocks.h"
#include "util/error.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVEVICT_AVX2 1
#endif

namespace kvevict {
namespace {

using ggml::BlockQ8_0;
constexpr int64_t kQK = ggml::kQK;
constexpr int64_t kQKK = ggml::kQKK;

#ifdef KVEVICT_AVX2
// std::round (halves away from zero) on 8 floats, exactly: truncate, then add ±1 where the
// (exact) remainder is at least one half.
inline __m256 round_half_away(__m256 v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 ge = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  return _mm256_add_ps(t, _mm256_and_ps(ge, _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f))));
}

// One block of 32 floats to 32 values q and the fp16 scale, with the arithmetic of the scalar
// definition (max, one multiply, std::round) 8 lanes at a time: the activations of every
// quantised matmul go through here once per call.
uint16_t quantize_block_q8_0(const float* src, int8_t* qs) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 m = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(src + 8 * k);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;  // all-zero block -> d = 0, q = 0
  __m256i q[4];
  for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v[k], _mm256_set1_ps(id))));
  // Pack 32 int32 to int8 (values already in [-127, 127]); packs interleave 128-bit lanes,
  // the permute restores element order.
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return fp32_to_fp16(d);
}
#endif

}  // namespace

void quantize_rows_q8_0(const float* x, int64_t T, int64_t n, uint8_t* dst) {
  ggml_check_row_length(GgmlType::Q8_0, n, "quantize_rows_q8_0");
#ifdef KVEVICT_AVX2
  auto* b = reinterpret_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < T * (n / kQK); ++i) b[i].d = quantize_block_q8_0(x + i * kQK, b[i].qs);
#else
  quantize_row_q8_0(x, dst, T * n);  // rows are contiguous, blocks never straddle two
#endif
}

void quantize_rows_q8_0_split(const float* x, int64_t T, int64_t n, int8_t* q, float* d, int32_t* sums) {
  ggml_check_row_length(GgmlType::Q8_0, n, "quantize_rows_q8_0_split");
  for (int64_t i = 0; i < T * (n / kQK); ++i) {
    int8_t* qs = q + i * kQK;
#ifdef KVEVICT_AVX2
    d[i] = fp16_to_fp32(quantize_block_q8_0(x + i * kQK, qs));
#else
    BlockQ8_0 b;
    quantize_row_q8_0(x + i * kQK, &b, kQK);
    std::memcpy(qs, b.qs, kQK);
    d[i] = fp16_to_fp32(b.d);
#endif
    int32_t s = 0;
    for (int j = 0; j < kQK; ++j) s += qs[j];
    sums[i] = s;
  }
}

void quantize_row_q8_k(const float* src, void* dst, int64_t n) {
  if (n < 0 || n % kQKK != 0)
    throw Error("quantize_row_q8_k: row of " + std::to_string(n) + " elements is not a multiple of 256");
  auto* b = static_cast<ggml::BlockQ8_K*>(dst);
  for (int64_t ib = 0; ib < n / kQKK; ++ib, src += kQKK) {
#ifdef KVEVICT_AVX2
    // The scalar loop below, 8 lanes at a time (same max, multiply and rounding).
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < kQKK; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + j)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    b[ib].d = d;
    for (int g = 0; g < kQKK / 32; ++g) {  // 32 elements: two bsum groups
      __m256i q[4];
      for (int k = 0; k < 4; ++k)
        q[k] = _mm256_cvtps_epi32(
            round_half_away(_mm256_mul_ps(_mm256_loadu_ps(src + 32 * g + 8 * k), _mm256_set1_ps(id))));
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[ib].qs + 32 * g),
                          _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
      for (int h = 0; h < 2; ++h) {
        const __m256i s8 = _mm256_add_epi32(q[2 * h], q[2 * h + 1]);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
        b[ib].bsums[2 * g + h] = static_cast<int16_t>(_mm_cvtsi128_si32(s4));
      }
    }
#else
    float amax = 0.0f;
    for (int j = 0; j < kQKK; ++j) amax = std::fmax(amax, std::fabs(src[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    b[ib].d = d;
    for (int g = 0; g < kQKK / 16; ++g) {
      int sum = 0;
      for (int j = 16 * g; j < 16 * g + 16; ++j) {
        const int q = std::clamp(static_cast<int>(std::lround(src[j] * id)), -127, 127);
        b[ib].qs[j] = static_cast<int8_t>(q);
        sum += q;
      }
      b[ib].bsums[g] = static_cast<int16_t>(sum);
    }
#endif
  }
}

void quantize_rows_q8_k(const float* x, int64_t T, int64_t n, uint8_t* dst) {
  const int64_t row_bytes = n / kQKK * static_cast<int64_t>(sizeof(ggml::BlockQ8_K));
  for (int64_t t = 0; t < T; ++t) quantize_row_q8_k(x + t * n, dst + t * row_bytes, n);
}

ActivationQuant activation_quant(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
      return ActivationQuant::Q8_0;
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return ActivationQuant::Q8_K;
    default:
      return ActivationQuant::None;
  }
}

}  // namespace kvevict
