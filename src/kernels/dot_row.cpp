// Float-activation row dots (see dot_row.h): AVX2 + FMA bodies with F16C loads, scalar twins.
#include "kernels/dot_row.h"

#include "format/ggml_blocks.h"
#include "util/simd.h"

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define KVEVICT_AVX2 1
#endif

namespace kvevict {
namespace {

using ggml::BlockQ4_0;
using ggml::BlockQ8_0;
constexpr int64_t kQK = ggml::kQK;
constexpr int64_t kQKK = ggml::kQKK;

// Block scale as float. Exact either way; F16C is just faster than the bit-twiddling version.
inline float scale_of(uint16_t d) {
#if defined(__F16C__)
  return _cvtsh_ss(d);
#else
  return fp16_to_fp32(d);
#endif
}

#ifdef KVEVICT_AVX2

// Eight int8 (the low 8 bytes of v) widened to floats.
inline __m256 i8x8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

// Dot product of a row of 16-/32-bit elements with x: load8(i) returns row elements i..i+7 as
// floats, load1(i) element i. Four independent accumulators hide the FMA latency.
template <class Load8, class Load1>
float dot_lanes(int64_t n, const float* x, Load8 load8, Load1 load1) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_ps(load8(i + 8 * k), _mm256_loadu_ps(x + i + 8 * k), acc[k]);
  }
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load8(i), _mm256_loadu_ps(x + i), acc[0]);
  float sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += load1(i) * x[i];
  return sum;
}
#else
template <class Load8, class Load1>
float dot_lanes(int64_t n, const float* x, Load8 /*load8*/, Load1 load1) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += load1(i) * x[i];
  return sum;
}
#endif

float dot_f32(const float* a, const float* x, int64_t n) {
#ifdef KVEVICT_AVX2
  auto load8 = [a](int64_t i) { return _mm256_loadu_ps(a + i); };
#else
  auto load8 = nullptr;
#endif
  return dot_lanes(n, x, load8, [a](int64_t i) { return a[i]; });
}

float dot_f16(const uint16_t* a, const float* x, int64_t n) {
#if defined(KVEVICT_AVX2) && defined(__F16C__)
  auto load8 = [a](int64_t i) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i))); };
  return dot_lanes(n, x, load8, [a](int64_t i) { return _cvtsh_ss(a[i]); });
#else
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += fp16_to_fp32(a[i]) * x[i];
  return sum;
#endif
}

float dot_bf16(const uint16_t* a, const float* x, int64_t n) {
#ifdef KVEVICT_AVX2
  // bf16 is the top half of an f32: widen to 32 bits and shift into place.
  auto load8 = [a](int64_t i) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  };
#else
  auto load8 = nullptr;
#endif
  return dot_lanes(n, x, load8, [a](int64_t i) { return bf16_to_fp32(a[i]); });
}

float dot_q8_0(const BlockQ8_0* b, const float* x, int64_t n) {
  const int64_t nb = n / kQK;
#ifdef KVEVICT_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (int64_t ib = 0; ib < nb; ++ib, x += kQK) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[ib].qs));       // q[0..15]
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[ib].qs + 16));  // q[16..31]
    __m256 s = _mm256_mul_ps(i8x8_to_ps(lo), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(i8x8_to_ps(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(i8x8_to_ps(hi), _mm256_loadu_ps(x + 16), s);
    s = _mm256_fmadd_ps(i8x8_to_ps(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), s);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(scale_of(b[ib].d)), s, acc);
  }
  return hsum8(acc);
#else
  float sum = 0.0f;
  for (int64_t ib = 0; ib < nb; ++ib, x += kQK) {
    float s = 0.0f;
    for (int j = 0; j < kQK; ++j) s += static_cast<float>(b[ib].qs[j]) * x[j];
    sum += scale_of(b[ib].d) * s;
  }
  return sum;
#endif
}

float dot_q4_0(const BlockQ4_0* b, const float* x, int64_t n) {
  const int64_t nb = n / kQK;
#ifdef KVEVICT_AVX2
  const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t ib = 0; ib < nb; ++ib, x += kQK) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[ib].qs));
    // Low nibbles are elements 0..15, high nibbles 16..31; both centred on 8.
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), eight);
    __m256 s = _mm256_mul_ps(i8x8_to_ps(lo), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(i8x8_to_ps(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(i8x8_to_ps(hi), _mm256_loadu_ps(x + 16), s);
    s = _mm256_fmadd_ps(i8x8_to_ps(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), s);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(scale_of(b[ib].d)), s, acc);
  }
  return hsum8(acc);
#else
  float sum = 0.0f;
  for (int64_t ib = 0; ib < nb; ++ib, x += kQK) {
    float s = 0.0f;
    for (int j = 0; j < kQK / 2; ++j) {
      s += static_cast<float>((b[ib].qs[j] & 0x0F) - 8) * x[j];
      s += static_cast<float>((b[ib].qs[j] >> 4) - 8) * x[j + kQK / 2];
    }
    sum += scale_of(b[ib].d) * s;
  }
  return sum;
#endif
}

}  // namespace

float dot_row(GgmlType t, const void* row, const float* x, int64_t n) {
  ggml_check_row_length(t, n, "dot_row");
  switch (t) {
    case GgmlType::F32:
      return dot_f32(static_cast<const float*>(row), x, n);
    case GgmlType::F16:
      return dot_f16(static_cast<const uint16_t*>(row), x, n);
    case GgmlType::BF16:
      return dot_bf16(static_cast<const uint16_t*>(row), x, n);
    case GgmlType::Q8_0:
      return dot_q8_0(static_cast<const BlockQ8_0*>(row), x, n);
    case GgmlType::Q4_0:
      return dot_q4_0(static_cast<const BlockQ4_0*>(row), x, n);
    default:
      break;
  }
  // Other quantised types: one block at a time through a float buffer (not a hot path).
  const int64_t blk = ggml_block_elems(t), bytes = ggml_block_bytes(t);
  float buf[kQKK];
  float sum = 0.0f;
  for (int64_t ib = 0; ib < n / blk; ++ib) {
    dequantize_row(t, static_cast<const uint8_t*>(row) + ib * bytes, buf, blk);
    sum += dot_f32(buf, x + ib * blk, blk);
  }
  return sum;
}

}  // namespace kvevict
