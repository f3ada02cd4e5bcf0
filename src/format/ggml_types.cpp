// Row kernels for the ggml tensor types kvevict reads (layouts: see ggml_types.h).
//
// Hot path: dot_row, called once per weight row per token by every matmul. It has an AVX2+FMA
// body (F16C for the fp16 loads) and a scalar twin; both accumulate in float32. Q8_0/Q4_0 sum
// each block's products in float and scale the block sum by d, as the header promises.
#include "format/ggml_types.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"
#include "util/simd.h"

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define KVEVICT_AVX2 1
#endif

namespace kvevict {
namespace {

constexpr int64_t kQK = 32;  // elements per Q8_0 / Q4_0 block (ggml's QK8_0 == QK4_0 == 32)

// ggml's block_q8_0: fp16 scale, then 32 signed quants; x = d * q.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
// ggml's block_q4_0: fp16 scale, then 16 bytes; byte j holds element j (low nibble) and
// element j + 16 (high nibble); x = d * (nibble - 8).
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18, "ggml block sizes");

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Rounds `v >> shift` to nearest, ties to even (shift >= 1).
uint32_t shift_round_even(uint32_t v, int shift) {
  const uint32_t q = v >> shift;
  const uint32_t rem = v & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1 : q;
}

// Throws unless n is a non-negative multiple of t's block size; `what` names the caller.
void check_row_length(GgmlType t, int64_t n, const char* what) {
  const int64_t blk = ggml_block_elems(t);
  if (n < 0 || n % blk != 0) {
    throw Error(std::string(what) + ": row of " + std::to_string(n) + " elements is not a multiple of the " +
                ggml_type_name(static_cast<uint32_t>(t)) + " block size " + std::to_string(blk));
  }
}

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
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(load8(i + 8 * k), _mm256_loadu_ps(x + i + 8 * k), acc[k]);
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
  auto load8 = [a](int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
  };
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

bool ggml_type_supported(uint32_t id) {
  switch (static_cast<GgmlType>(id)) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::Q4_0:
    case GgmlType::Q8_0:
    case GgmlType::BF16: return true;
  }
  return false;
}

std::string ggml_type_name(uint32_t id) {
  switch (static_cast<GgmlType>(id)) {
    case GgmlType::F32: return "f32";
    case GgmlType::F16: return "f16";
    case GgmlType::Q4_0: return "q4_0";
    case GgmlType::Q8_0: return "q8_0";
    case GgmlType::BF16: return "bf16";
  }
  return "type#" + std::to_string(id);
}

int64_t ggml_block_elems(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16: return 1;
    case GgmlType::Q4_0:
    case GgmlType::Q8_0: return kQK;
  }
  throw Error("ggml_block_elems: unknown ggml type id " + std::to_string(static_cast<uint32_t>(t)));
}

int64_t ggml_block_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 4;
    case GgmlType::F16:
    case GgmlType::BF16: return 2;
    case GgmlType::Q4_0: return sizeof(BlockQ4_0);
    case GgmlType::Q8_0: return sizeof(BlockQ8_0);
  }
  throw Error("ggml_block_bytes: unknown ggml type id " + std::to_string(static_cast<uint32_t>(t)));
}

int64_t ggml_row_bytes(GgmlType t, int64_t n) {
  check_row_length(t, n, "ggml_row_bytes");
  // n / blk * bytes <= n * 4 / 1 for every supported type; overflow only past 2^61 elements.
  if (n > INT64_MAX / 4)
    throw Error("ggml_row_bytes: row of " + std::to_string(n) + " elements is too large");
  return n / ggml_block_elems(t) * ggml_block_bytes(t);
}

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  int exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return float_of(sign | 0x7F800000u | (mant << 13));  // inf / nan (payload kept)
  if (exp == 0) {
    if (mant == 0) return float_of(sign);  // +-0
    // Subnormal mant * 2^-24: shift the leading 1 up to the implicit-bit position.
    exp = 1;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    mant &= 0x3FFu;
  }
  // Rebias the exponent from 15 to 127 (exp may be <= 0 here for subnormals; the sum stays > 0).
  return float_of(sign | (static_cast<uint32_t>(exp + 112) << 23) | (mant << 13));
}

uint16_t fp32_to_fp16(float f) {
  const uint32_t bits = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u | ((abs >> 13) & 0x3FFu);  // nan stays a (quiet) nan
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 (halfway past 65504) rounds to inf
  if (abs < 0x38800000u) {                        // below 2^-14: half subnormal or zero
    if (abs <= 0x33000000u) return sign;          // <= 2^-25 (half of 2^-24, ties to even) -> 0
    // value / 2^-24 = mant * 2^(exp - 126); a carry into bit 10 correctly yields 2^-14.
    const uint32_t exp = abs >> 23, mant = (abs & 0x7FFFFFu) | 0x800000u;
    return sign | static_cast<uint16_t>(shift_round_even(mant, static_cast<int>(126 - exp)));
  }
  // Normal: rebias 127 -> 15 and drop 13 mantissa bits; a carry may bump the exponent (to inf
  // only above the threshold handled earlier).
  return sign | static_cast<uint16_t>(shift_round_even(abs - (112u << 23), 13));
}

float bf16_to_fp32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

uint16_t fp32_to_bf16(float f) {
  const uint32_t bits = bits_of(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet nan
  // Round to nearest even on the low 16 bits; overflow carries into the exponent (-> inf).
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  check_row_length(t, n, "dequantize_row");
  switch (t) {
    case GgmlType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case GgmlType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
      return;
    }
    case GgmlType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
      return;
    }
    case GgmlType::Q8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t ib = 0; ib < n / kQK; ++ib, dst += kQK) {
        const float d = fp16_to_fp32(b[ib].d);
        for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(b[ib].qs[j]);
      }
      return;
    }
    case GgmlType::Q4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t ib = 0; ib < n / kQK; ++ib, dst += kQK) {
        const float d = fp16_to_fp32(b[ib].d);
        for (int j = 0; j < kQK / 2; ++j) {
          dst[j] = d * static_cast<float>((b[ib].qs[j] & 0x0F) - 8);
          dst[j + kQK / 2] = d * static_cast<float>((b[ib].qs[j] >> 4) - 8);
        }
      }
      return;
    }
  }
}

float dot_row(GgmlType t, const void* row, const float* x, int64_t n) {
  check_row_length(t, n, "dot_row");
  switch (t) {
    case GgmlType::F32: return dot_f32(static_cast<const float*>(row), x, n);
    case GgmlType::F16: return dot_f16(static_cast<const uint16_t*>(row), x, n);
    case GgmlType::BF16: return dot_bf16(static_cast<const uint16_t*>(row), x, n);
    case GgmlType::Q8_0: return dot_q8_0(static_cast<const BlockQ8_0*>(row), x, n);
    case GgmlType::Q4_0: return dot_q4_0(static_cast<const BlockQ4_0*>(row), x, n);
  }
  return 0.0f;  // unreachable: check_row_length rejected unknown types
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  check_row_length(GgmlType::Q8_0, n, "quantize_row_q8_0");
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t ib = 0; ib < n / kQK; ++ib, src += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(src[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;  // all-zero block -> d = 0, q = 0
    b[ib].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) b[ib].qs[j] = static_cast<int8_t>(std::round(src[j] * id));
  }
}

void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
  check_row_length(GgmlType::Q4_0, n, "quantize_row_q4_0");
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t ib = 0; ib < n / kQK; ++ib, src += kQK) {
    // ggml keeps the sign of the largest-magnitude element so that it maps exactly to -8.
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (std::fabs(src[j]) > amax) {
        amax = std::fabs(src[j]);
        max = src[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[ib].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      // +8.5 then truncation rounds to nearest on the 0..16 range; 16 is clamped to 15.
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(src[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(src[j + kQK / 2] * id + 8.5f)));
      b[ib].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

}  // namespace kvevict
