// Integer matmul kernels on the row-interleaved weight layout (see qgemm.h, x16.h).
//
// A kernel call computes one group of 16 weight rows against C activation rows: per block, each
// group of 4 weight bytes of the 16 rows (one 64-byte load, unpacked to unsigned bytes) is
// multiplied with 4 activation bytes of one activation row broadcast to every lane, so lane r
// accumulates row r's exact integer dot product (VNNI vpdpbusd; maddubs/madd without VNNI). Each
// weight load serves C activation rows; each block then costs every (row, activation row) pair
// one float FMA. The 16 lanes are one zmm on AVX-512 and two ymm (rows 0..7, 8..15) on AVX2.
//
// The integer values are exact and every lane does the float steps of qgemm.h's definition in
// the same order, so the variants, the tile shapes and the number of activation rows cannot
// change a result.

// GCC 12's AVX-512 intrinsic headers initialise their "undefined" operands from themselves, which
// -Wmaybe-uninitialized reports wherever they are inlined (GCC bug 105593, fixed in GCC 13); the
// warning is silenced in this file (before the headers are read).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "kernels/qgemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "format/ggml_blocks.h"
#include "kernels/activation_quant.h"
#include "kernels/x16.h"
#include "util/error.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QG_AVX2 1
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define QG_VNNI256 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define QG_AVX512 1
#endif
#endif

namespace kvevict {

std::vector<KernelIsa> compiled_kernel_isas() {
  std::vector<KernelIsa> v;
#ifdef QG_AVX2
  v.push_back(KernelIsa::Avx2);
#endif
#ifdef QG_VNNI256
  v.push_back(KernelIsa::Avx2Vnni);
#endif
#ifdef QG_AVX512
  v.push_back(KernelIsa::Avx512);
#endif
  return v;
}

const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Avx2:
      return "avx2";
    case KernelIsa::Avx2Vnni:
      return "avx2-vnni";
    case KernelIsa::Avx512:
      return "avx512";
  }
  return "?";
}

bool qgemm_supports(GgmlType type) { return x16_block_bytes(type) > 0; }

void pack_activations_q8_0(const float* x, int64_t T, int64_t cols, PackedActivations& a) {
  ggml_check_row_length(GgmlType::Q8_0, cols, "pack_activations_q8_0");
  const int64_t nb = cols / ggml::kQK;
  a.T = T;
  a.cols = cols;
  a.q8.resize(static_cast<size_t>(T * cols));
  a.d8.resize(static_cast<size_t>(T * nb));
  a.s8.resize(static_cast<size_t>(T * nb));
  quantize_rows_q8_0_split(x, T, cols, a.q8.data(), a.d8.data(), a.s8.data());
}

void pack_activations_q8_k(const float* x, int64_t T, int64_t cols, PackedActivations& a) {
  if (cols % ggml::kQKK != 0)
    throw Error(fmt::format("pack_activations_q8_k: row of {} elements is not a multiple of 256", cols));
  a.T = T;
  a.cols = cols;
  a.qk.resize(static_cast<size_t>(T * (cols / ggml::kQKK)) * sizeof(ggml::BlockQ8_K));
  quantize_rows_q8_k(x, T, cols, a.qk.data());
}

#ifdef QG_AVX2
namespace {

using ggml::BlockQ8_K;

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline int32_t ld32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 32 bits (little-endian at p) spread to 32 bytes: 0xFF where bit i is set, byte i.
inline __m256i bytes_from_bits(const uint8_t* p) {
  const __m256i shuf =
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(ld32(p)), shuf);
  const __m256i mask = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, mask), mask);
}

// ---------------------------------------------------------------------------------------------
// 16-lane vectors (lane r = row r of the group): I holds 16 int32 / 64 bytes, F 16 floats.

// Two ymm halves (rows 0..7, rows 8..15): the AVX2 variants.
template <bool kVnni_>
struct W256 {
  static constexpr bool kVnni = kVnni_;
  struct I {
    __m256i a, b;
  };
  struct F {
    __m256 a, b;
  };
  template <class Op>
  static I map(I x, I y, Op op) {
    return {op(x.a, y.a), op(x.b, y.b)};
  }
  static I zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  static I load(const uint8_t* p) { return {load32(p), load32(p + 32)}; }
  static I bcast(int32_t v) {
    const __m256i x = _mm256_set1_epi32(v);
    return {x, x};
  }
  static I set8(int v) {
    const __m256i x = _mm256_set1_epi8(static_cast<char>(v));
    return {x, x};
  }
  static I set32(int v) { return bcast(v); }
  static I and_(I x, I y) { return map(x, y, [](__m256i p, __m256i q) { return _mm256_and_si256(p, q); }); }
  static I or_(I x, I y) { return map(x, y, [](__m256i p, __m256i q) { return _mm256_or_si256(p, q); }); }
  static I xor_(I x, I y) { return map(x, y, [](__m256i p, __m256i q) { return _mm256_xor_si256(p, q); }); }
  static I add(I x, I y) { return map(x, y, [](__m256i p, __m256i q) { return _mm256_add_epi32(p, q); }); }
  static I mullo(I x, I y) { return map(x, y, [](__m256i p, __m256i q) { return _mm256_mullo_epi32(p, q); }); }
  static I srl16(I x, int n) { return {_mm256_srli_epi16(x.a, n), _mm256_srli_epi16(x.b, n)}; }
  static I sll16(I x, int n) { return {_mm256_slli_epi16(x.a, n), _mm256_slli_epi16(x.b, n)}; }
  static I srl32(I x, int n) { return {_mm256_srli_epi32(x.a, n), _mm256_srli_epi32(x.b, n)}; }
  // acc + Σ4 u·s, u unsigned and s signed bytes; exact (without VNNI while u <= 128).
  static __m256i dpbusd1(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    if constexpr (kVnni) return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
    if constexpr (kVnni) return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
  static I dpbusd(I acc, I u, I s) { return {dpbusd1(acc.a, u.a, s.a), dpbusd1(acc.b, u.b, s.b)}; }
  // acc + Σ4 w·x of signed bytes (|w|, |x| <= 127), exact: |w| times x with w's sign.
  static I dot_signed(I acc, I w, I x) {
    const auto one = [](__m256i c, __m256i p, __m256i q) {
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(p, p), _mm256_sign_epi8(q, p));
      return _mm256_add_epi32(c, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
    };
    return {one(acc.a, w.a, x.a), one(acc.b, w.b, x.b)};
  }
  static I zext8(const uint8_t* p) {
    return {_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)))};
  }
  static I sext8(const uint8_t* p) {
    return {_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)))};
  }
  // 64-bit mask at p (bit 4r + i) to bytes (0xFF where set).
  static I mask_bytes(const uint8_t* p) { return {bytes_from_bits(p), bytes_from_bits(p + 4)}; }
  static F fzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static F cvt(I x) { return {_mm256_cvtepi32_ps(x.a), _mm256_cvtepi32_ps(x.b)}; }
  static F cvtph(const uint8_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
  }
  static F set1(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
  static F mul(F x, F y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
  static F add(F x, F y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
  static F sub(F x, F y) { return {_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)}; }
  static F fmadd(F x, F y, F z) { return {_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)}; }
  static void store(float* y, F v) {
    _mm256_storeu_ps(y, v.a);
    _mm256_storeu_ps(y + 8, v.b);
  }
};

#ifdef QG_AVX512
struct W512 {
  static constexpr bool kVnni = true;
  using I = __m512i;
  using F = __m512;
  static I zero() { return _mm512_setzero_si512(); }
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I bcast(int32_t v) { return _mm512_set1_epi32(v); }
  static I set8(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
  static I set32(int v) { return _mm512_set1_epi32(v); }
  static I and_(I x, I y) { return _mm512_and_si512(x, y); }
  static I or_(I x, I y) { return _mm512_or_si512(x, y); }
  static I xor_(I x, I y) { return _mm512_xor_si512(x, y); }
  static I add(I x, I y) { return _mm512_add_epi32(x, y); }
  static I mullo(I x, I y) { return _mm512_mullo_epi32(x, y); }
  static I srl16(I x, int n) { return _mm512_srli_epi16(x, static_cast<unsigned>(n)); }
  static I sll16(I x, int n) { return _mm512_slli_epi16(x, static_cast<unsigned>(n)); }
  static I srl32(I x, int n) { return _mm512_srli_epi32(x, static_cast<unsigned>(n)); }
  static I dpbusd(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
  static I dot_signed(I acc, I w, I x) {  // unused: kVnni (Q8_0 takes the offset form)
    return _mm512_dpbusd_epi32(acc, w, x);
  }
  static I zext8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I sext8(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I mask_bytes(const uint8_t* p) {
    uint64_t m;
    std::memcpy(&m, p, 8);
    return _mm512_movm_epi8(_cvtu64_mask64(m));
  }
  static F fzero() { return _mm512_setzero_ps(); }
  static F cvt(I x) { return _mm512_cvtepi32_ps(x); }
  static F cvtph(const uint8_t* p) { return _mm512_cvtph_ps(load32(p)); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F mul(F x, F y) { return _mm512_mul_ps(x, y); }
  static F add(F x, F y) { return _mm512_add_ps(x, y); }
  static F sub(F x, F y) { return _mm512_sub_ps(x, y); }
  static F fmadd(F x, F y, F z) { return _mm512_fmadd_ps(x, y, z); }
  static void store(float* y, F v) { _mm512_storeu_ps(y, v); }
};
#endif

// Byte-wise shift of every byte's bit `from` to bit `to` position (other bits garbage: mask after).
template <class V>
inline typename V::I move_bit(typename V::I x, int from, int to) {
  return from >= to ? V::srl16(x, from - to) : V::sll16(x, to - from);
}

// ---------------------------------------------------------------------------------------------
// Per-type block kernels. Token c's activations: legacy types read q (the block's 32 values),
// d and the block sum; K-quants a ggml::BlockQ8_K. Each adds the block to acc (and accm).

struct XLeg {
  const int8_t* q;
  float d;
  int32_t sum;
};

enum class Final { Acc, AccPlusM, AccMinusM };

struct TQ8_0 {
  static constexpr bool kK = false;
  static constexpr Final kFinal = Final::Acc;
  template <class V, int C>
  static void block(const uint8_t* p, const XLeg (&x)[C], typename V::F (&acc)[C], typename V::F (&)[C]) {
    using I = typename V::I;
    I s[C];
    // VNNI: unsigned q + 128 against the activations, minus 128 Σ x; otherwise signed bytes.
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) s[c] = V::kVnni ? V::bcast(-128 * x[c].sum) : V::zero();
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      I w = V::load(p + 32 + 64 * g);
      if constexpr (V::kVnni) w = V::xor_(w, V::set8(0x80));
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        const I xv = V::bcast(ld32(x[c].q + 4 * g));
        s[c] = V::kVnni ? V::dpbusd(s[c], w, xv) : V::dot_signed(s[c], w, xv);
      }
    }
    const typename V::F dw = V::cvtph(p);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[c] = V::fmadd(V::mul(dw, V::set1(x[c].d)), V::cvt(s[c]), acc[c]);
  }
};

// Q4_0, Q5_0 (symmetric: u - kOffset) and Q4_1, Q5_1 (affine: d u + m); kFive: fifth-bit masks.
template <int kOffset, bool kFive, bool kAffine>
struct TQ4Like {
  static constexpr bool kK = false;
  static constexpr Final kFinal = kAffine ? Final::AccPlusM : Final::Acc;
  template <class V, int C>
  static void block(const uint8_t* p, const XLeg (&x)[C], typename V::F (&acc)[C], typename V::F (&accm)[C]) {
    using I = typename V::I;
    const uint8_t* masks = p + (kAffine ? 64 : 32);
    const uint8_t* qs = masks + (kFive ? 64 : 0);
    I s[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) s[c] = kAffine ? V::zero() : V::bcast(-kOffset * x[c].sum);
    const I m4 = V::set8(0x0F);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const I w = V::load(qs + 64 * k);
      I lo = V::and_(w, m4), hi = V::and_(V::srl16(w, 4), m4);
      if constexpr (kFive) {
        lo = V::or_(lo, V::and_(V::mask_bytes(masks + 8 * k), V::set8(0x10)));
        hi = V::or_(hi, V::and_(V::mask_bytes(masks + 8 * (k + 4)), V::set8(0x10)));
      }
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        s[c] = V::dpbusd(s[c], lo, V::bcast(ld32(x[c].q + 4 * k)));
        s[c] = V::dpbusd(s[c], hi, V::bcast(ld32(x[c].q + 16 + 4 * k)));
      }
    }
    const typename V::F dw = V::cvtph(p);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[c] = V::fmadd(V::mul(dw, V::set1(x[c].d)), V::cvt(s[c]), acc[c]);
    if constexpr (kAffine) {
      const typename V::F mw = V::cvtph(p + 32);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c)
        accm[c] = V::fmadd(V::mul(mw, V::set1(x[c].d)), V::set1(static_cast<float>(x[c].sum)), accm[c]);
    }
  }
};

// Σ_j min_j · (activation sum of sub-block j) for K-quants with mins: mins[j][16] bytes.
template <class V, int C, int kSub>
inline void k_mins(const uint8_t* mins, bool nibble_high, const BlockQ8_K* const (&xb)[C], typename V::I (&m)[C]) {
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) m[c] = V::zero();
  for (int j = 0; j < kSub; ++j) {
    typename V::I mv = V::zext8(mins + 16 * j);
    if (nibble_high) mv = V::srl32(mv, 4);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      const int32_t xs = kSub == 8 ? xb[c]->bsums[2 * j] + xb[c]->bsums[2 * j + 1] : xb[c]->bsums[j];
      m[c] = V::add(m[c], V::mullo(mv, V::bcast(xs)));
    }
  }
}

// Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins.
template <bool kFive>
struct TQ45K {
  static constexpr bool kK = true;
  static constexpr Final kFinal = Final::AccMinusM;
  template <class V, int C>
  static void block(const uint8_t* p, const BlockQ8_K* const (&xb)[C], typename V::F (&acc)[C],
                    typename V::F (&accm)[C]) {
    using I = typename V::I;
    const uint8_t* sc = p + 64;
    const uint8_t* mn = p + 192;
    const uint8_t* qs = p + 320;
    const uint8_t* qh = p + 2368;
    const I m4 = V::set8(0x0F);
    I s[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) s[c] = V::zero();
    for (int j = 0; j < 8; ++j) {
      I part[C];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) part[c] = V::zero();
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const I w = V::load(qs + 512 * (j / 2) + 64 * k);
        I u = V::and_(j % 2 ? V::srl16(w, 4) : w, m4);
        if constexpr (kFive) u = V::or_(u, V::and_(move_bit<V>(V::load(qh + 64 * k), j, 4), V::set8(0x10)));
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) part[c] = V::dpbusd(part[c], u, V::bcast(ld32(xb[c]->qs + 32 * j + 4 * k)));
      }
      const I scv = V::zext8(sc + 16 * j);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) s[c] = V::add(s[c], V::mullo(part[c], scv));
    }
    I m[C];
    k_mins<V, C, 8>(mn, false, xb, m);
    const typename V::F dw = V::cvtph(p), dm = V::cvtph(p + 32);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      const typename V::F dx = V::set1(xb[c]->d);
      acc[c] = V::fmadd(V::mul(dw, dx), V::cvt(s[c]), acc[c]);
      accm[c] = V::fmadd(V::mul(dm, dx), V::cvt(m[c]), accm[c]);
    }
  }
};

// The 16-element sub-block types: Q2_K (2-bit, scale and min nibbles), Q3_K (3-bit, offset 4,
// signed scales), Q6_K (6-bit, offset 32, signed scales).
struct TQ2_K {
  static constexpr bool kK = true;
  static constexpr Final kFinal = Final::AccMinusM;
  template <class V, int C>
  static void block(const uint8_t* p, const BlockQ8_K* const (&xb)[C], typename V::F (&acc)[C],
                    typename V::F (&accm)[C]) {
    using I = typename V::I;
    const uint8_t* sc = p + 64;
    const uint8_t* qs = p + 320;
    I s[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) s[c] = V::zero();
    for (int sb = 0; sb < 16; ++sb) {
      const int h = sb / 8, j = (sb % 8) / 2, half = sb % 2;
      I part[C];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) part[c] = V::zero();
#pragma GCC unroll 4
      for (int kk = 0; kk < 4; ++kk) {
        const I u = V::and_(V::srl16(V::load(qs + 512 * h + 64 * (4 * half + kk)), 2 * j), V::set8(3));
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) part[c] = V::dpbusd(part[c], u, V::bcast(ld32(xb[c]->qs + 16 * sb + 4 * kk)));
      }
      const I scv = V::and_(V::zext8(sc + 16 * sb), V::set32(0x0F));
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) s[c] = V::add(s[c], V::mullo(part[c], scv));
    }
    I m[C];
    k_mins<V, C, 16>(sc, true, xb, m);
    const typename V::F dw = V::cvtph(p), dm = V::cvtph(p + 32);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      const typename V::F dx = V::set1(xb[c]->d);
      acc[c] = V::fmadd(V::mul(dw, dx), V::cvt(s[c]), acc[c]);
      accm[c] = V::fmadd(V::mul(dm, dx), V::cvt(m[c]), accm[c]);
    }
  }
};

template <bool kSix>
struct TQ36K {
  static constexpr bool kK = true;
  static constexpr Final kFinal = Final::Acc;
  template <class V, int C>
  static void block(const uint8_t* p, const BlockQ8_K* const (&xb)[C], typename V::F (&acc)[C],
                    typename V::F (&)[C]) {
    using I = typename V::I;
    constexpr int kOffset = kSix ? 32 : 4;
    const uint8_t* sc = p + 32;
    const uint8_t* lo = p + (kSix ? 288 : 800);   // Q6_K ql / Q3_K qs
    const uint8_t* hi = p + (kSix ? 2336 : 288);  // Q6_K qh / Q3_K hmask
    I s[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) s[c] = V::zero();
    for (int sb = 0; sb < 16; ++sb) {
      const int h = sb / 8, g = (sb % 8) / 2, half = sb % 2;
      I part[C];
      // Stored u = q + kOffset: Σ (u - kOffset) x = Σ u x - kOffset · (sub-block activation sum).
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) part[c] = V::bcast(-kOffset * xb[c]->bsums[sb]);
#pragma GCC unroll 4
      for (int kk = 0; kk < 4; ++kk) {
        const int k = 4 * half + kk;
        I u;
        if constexpr (kSix) {
          const I l = V::load(lo + 1024 * h + 512 * (g % 2) + 64 * k);
          const I nib = V::and_(g < 2 ? l : V::srl16(l, 4), V::set8(0x0F));
          const I hb = V::and_(V::srl16(V::load(hi + 512 * h + 64 * k), 2 * g), V::set8(3));
          u = V::or_(nib, V::sll16(hb, 4));
        } else {
          const I low = V::and_(V::srl16(V::load(lo + 512 * h + 64 * k), 2 * g), V::set8(3));
          const I high = V::and_(move_bit<V>(V::load(hi + 64 * k), 4 * h + g, 2), V::set8(4));
          u = V::or_(low, high);
        }
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) part[c] = V::dpbusd(part[c], u, V::bcast(ld32(xb[c]->qs + 16 * sb + 4 * kk)));
      }
      const I scv = V::sext8(sc + 16 * sb);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) s[c] = V::add(s[c], V::mullo(part[c], scv));
    }
    const typename V::F dw = V::cvtph(p);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[c] = V::fmadd(V::mul(dw, V::set1(xb[c]->d)), V::cvt(s[c]), acc[c]);
  }
};

// ---------------------------------------------------------------------------------------------
// One group of 16 rows against activation rows t0 .. t0 + C - 1: y[c * ldy + r], r < n_rows.

template <class V, class Ty, int C>
[[gnu::noinline]] void group_tile(const uint8_t* grp, int64_t block_bytes, const PackedActivations& x, int64_t t0,
                                  float* y, int64_t ldy, int n_rows) {
  using F = typename V::F;
  F acc[C], accm[C];
  for (int c = 0; c < C; ++c) acc[c] = accm[c] = V::fzero();
  if constexpr (Ty::kK) {
    const int64_t nb = x.cols / ggml::kQKK;
    const auto* xk = reinterpret_cast<const BlockQ8_K*>(x.qk.data());
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ8_K* xb[C];
      for (int c = 0; c < C; ++c) xb[c] = xk + (t0 + c) * nb + b;
      Ty::template block<V, C>(grp + b * block_bytes, xb, acc, accm);
    }
  } else {
    const int64_t nb = x.cols / ggml::kQK;
    for (int64_t b = 0; b < nb; ++b) {
      XLeg xl[C];
      for (int c = 0; c < C; ++c) {
        const int64_t i = (t0 + c) * nb + b;
        xl[c] = {x.q8.data() + i * ggml::kQK, x.d8[static_cast<size_t>(i)], x.s8[static_cast<size_t>(i)]};
      }
      Ty::template block<V, C>(grp + b * block_bytes, xl, acc, accm);
    }
  }
  for (int c = 0; c < C; ++c) {
    const F out = Ty::kFinal == Final::Acc        ? acc[c]
                  : Ty::kFinal == Final::AccPlusM ? V::add(acc[c], accm[c])
                                                  : V::sub(acc[c], accm[c]);
    if (n_rows == static_cast<int>(kX16Rows)) {
      V::store(y + c * ldy, out);
    } else {
      alignas(64) float tmp[kX16Rows];
      V::store(tmp, out);
      std::copy(tmp, tmp + n_rows, y + c * ldy);
    }
  }
}

using GroupFn = void (*)(const uint8_t*, int64_t, const PackedActivations&, int64_t, float*, int64_t, int);

// Activation rows per call: 8 on AVX-512 (their accumulators fit the 32 registers), 4 on AVX2;
// the rows of a partial last tile are taken 4, 2, 1 at a time (fewer instantiations).
template <class V>
constexpr int kMaxC = 4;
#ifdef QG_AVX512
template <>
constexpr int kMaxC<W512> = 8;
#endif

template <class V, class Ty>
constexpr std::array<GroupFn, 4> group_fns() {
  return {&group_tile<V, Ty, 1>, &group_tile<V, Ty, 2>, &group_tile<V, Ty, 4>,
          &group_tile<V, Ty, kMaxC<V> == 8 ? 8 : 4>};
}

template <class V, class Ty>
void run_groups(GgmlType type, const WeightView& w, int64_t g0, int64_t g1, const PackedActivations& x, float* y,
                int64_t ldy) {
  constexpr int C = kMaxC<V>;
  static constexpr auto fns = group_fns<V, Ty>();
  const int64_t block_bytes = x16_block_bytes(type), gb = x16_group_bytes(type, w.cols);
  // Without an interleaved copy, the groups are interleaved here (once per call).
  thread_local std::vector<uint8_t> packed;
  const uint8_t* base = w.x16 ? w.x16 : nullptr;
  if (!base) {
    packed.resize(static_cast<size_t>((g1 - g0) * gb));
    for (int64_t g = g0; g < g1; ++g)
      x16_pack_group(type, w.data + g * kX16Rows * w.row_bytes, w.row_bytes,
                     static_cast<int>(std::min(kX16Rows, w.rows - g * kX16Rows)), w.cols, packed.data() + (g - g0) * gb);
    base = packed.data() - g0 * gb;
  }
  // Activation rows in chunks of kTokenChunk (their quantised values stay in L2 while the
  // chunk's groups pass over them); decode-sized calls are one chunk, so each group's weights
  // are read from memory once.
  constexpr int64_t kTokenChunk = 64;
  for (int64_t tc = 0; tc < x.T; tc += kTokenChunk) {
    const int64_t tend = std::min(x.T, tc + kTokenChunk);
    for (int64_t g = g0; g < g1; ++g) {
      const int n_rows = static_cast<int>(std::min(kX16Rows, w.rows - g * kX16Rows));
      const uint8_t* grp = base + g * gb;
      for (int64_t t0 = tc; t0 < tend;) {
        const int64_t left = tend - t0;
        const int k = left >= C ? 3 : left >= 4 ? 2 : left >= 2 ? 1 : 0;  // C, 4, 2 or 1 rows
        fns[static_cast<size_t>(k)](grp, block_bytes, x, t0, y + t0 * ldy + g * kX16Rows, ldy, n_rows);
        t0 += k == 3 ? C : int64_t{1} << k;
      }
    }
  }
}

template <class V>
void run_type(GgmlType type, const WeightView& w, int64_t g0, int64_t g1, const PackedActivations& x, float* y,
              int64_t ldy) {
  switch (type) {
    case GgmlType::Q8_0:
      return run_groups<V, TQ8_0>(type, w, g0, g1, x, y, ldy);
    case GgmlType::Q4_0:
      return run_groups<V, TQ4Like<8, false, false>>(type, w, g0, g1, x, y, ldy);
    case GgmlType::Q5_0:
      return run_groups<V, TQ4Like<16, true, false>>(type, w, g0, g1, x, y, ldy);
    case GgmlType::Q4_1:
      return run_groups<V, TQ4Like<0, false, true>>(type, w, g0, g1, x, y, ldy);
    case GgmlType::Q5_1:
      return run_groups<V, TQ4Like<0, true, true>>(type, w, g0, g1, x, y, ldy);
    case GgmlType::Q2_K:
      return run_groups<V, TQ2_K>(type, w, g0, g1, x, y, ldy);
    case GgmlType::Q3_K:
      return run_groups<V, TQ36K<false>>(type, w, g0, g1, x, y, ldy);
    case GgmlType::Q4_K:
      return run_groups<V, TQ45K<false>>(type, w, g0, g1, x, y, ldy);
    case GgmlType::Q5_K:
      return run_groups<V, TQ45K<true>>(type, w, g0, g1, x, y, ldy);
    case GgmlType::Q6_K:
      return run_groups<V, TQ36K<true>>(type, w, g0, g1, x, y, ldy);
    default:
      throw Error("qgemm_groups: " + ggml_type_name(static_cast<uint32_t>(type)) + " is not a quantised type");
  }
}

}  // namespace
#endif  // QG_AVX2

void qgemm_groups(KernelIsa isa, const WeightView& w, int64_t g0, int64_t g1, const PackedActivations& x, float* y,
                  int64_t ldy) {
  if (g0 >= g1 || x.T <= 0) return;
  const GgmlType type = w.type;
  switch (isa) {
#ifdef QG_AVX2
    case KernelIsa::Avx2:
      return run_type<W256<false>>(type, w, g0, g1, x, y, ldy);
#endif
#ifdef QG_VNNI256
    case KernelIsa::Avx2Vnni:
      return run_type<W256<true>>(type, w, g0, g1, x, y, ldy);
#endif
#ifdef QG_AVX512
    case KernelIsa::Avx512:
      return run_type<W512>(type, w, g0, g1, x, y, ldy);
#endif
    default:
      break;
  }
  throw Error(std::string("qgemm_groups: kernel variant ") + kernel_isa_name(isa) +
              " is not compiled into this build");
}

}  // namespace kvevict
