// Tiled integer matmul kernels (see qgemm.h).
//
// One kernel body per type family, written on a 64-byte "pair" vector (two 32-element blocks or
// chunks side by side): a zmm register on AVX-512, two ymm registers on AVX2. The per-type code
// (unpacking 32 weight values to unsigned bytes, block scales) is 256-bit AVX2 and shared by
// every variant; the 512-bit variant joins two such halves in one register.
//
// Legacy types (32-element blocks, Q8_0 activations): the one-row kernels add even blocks into
// one FMA chain and odd blocks into another; here block 2j sits in the low half and block 2j + 1
// in the high half of the pair, so the two chains are the two halves, reduced at the end as
// hsum8(low + high). An odd last block is paired with a zero block of scale 0, which adds exactly
// +0 to the high half (whose accumulator is never -0).
// K-quants (256-element blocks, Q8_K activations): 64 elements per step; the integer lane sums
// of the halves are added (exactly) before the block's single FMA.
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
#include <utility>

#include "format/ggml_blocks.h"
#include "kernels/activation_quant.h"
#include "util/error.h"
#include "util/simd.h"

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

bool qgemm_supports(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

void pack_activations_q8_0(const float* x, int64_t T, int64_t cols, PackedActivations& a) {
  ggml_check_row_length(GgmlType::Q8_0, cols, "pack_activations_q8_0");
  const int64_t nb = cols / ggml::kQK;
  a.T = T;
  a.cols = cols;
  a.q8.resize(static_cast<size_t>(T * cols));
  a.d8.resize(static_cast<size_t>(T * nb));
  a.ls8.resize(static_cast<size_t>(T * nb * 8));
  quantize_rows_q8_0_split(x, T, cols, a.q8.data(), a.d8.data(), a.ls8.data());
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
constexpr int64_t kQK = ggml::kQK;
constexpr int64_t kQKK = ggml::kQKK;

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline float f16(uint16_t h) { return _cvtsh_ss(h); }

// ---------------------------------------------------------------------------------------------
// Pair vectors. I: 16 int32 / 32 int16 / 64 int8 lanes; F: 16 floats. Low half = first block.

// dpbusd on 256 bits: acc + Σ4 u·s (u unsigned, s signed bytes), exact. With VNNI one
// instruction; otherwise maddubs + madd, exact only while u ≤ 128 (no int16 pair saturates
// against |s| ≤ 127), which the callers guarantee.
template <bool kVnni>
inline __m256i dpbusd256(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  if constexpr (kVnni) return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  if constexpr (kVnni) return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
template <bool kVnni>
inline __m256i dpwssd256(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  if constexpr (kVnni) return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
  if constexpr (kVnni) return _mm256_dpwssd_avx_epi32(acc, a, b);
#endif
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

// Two 256-bit halves (the AVX2 variants).
template <bool kVnni_>
struct V2x256 {
  static constexpr bool kVnni = kVnni_;
  struct I {
    __m256i lo, hi;
  };
  struct F {
    __m256 lo, hi;
  };
  static I zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  static F fzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static I load64(const void* p) { return {load32(p), load32(static_cast<const uint8_t*>(p) + 32)}; }
  static I load32z(const void* p) { return {load32(p), _mm256_setzero_si256()}; }
  static I pair(__m256i lo, __m256i hi) { return {lo, hi}; }
  static I dpbusd(I acc, I u, I s) { return {dpbusd256<kVnni>(acc.lo, u.lo, s.lo), dpbusd256<kVnni>(acc.hi, u.hi, s.hi)}; }
  // Σ4 a·b of signed bytes (|a|, |b| ≤ 127) by the sign trick: exact without VNNI.
  static I dot_signed(I a, I b) {
    const auto one = [](__m256i x, __m256i y) {
      const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
      return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    };
    return {one(a.lo, b.lo), one(a.hi, b.hi)};
  }
  static I maddubs(I u, I s) { return {_mm256_maddubs_epi16(u.lo, s.lo), _mm256_maddubs_epi16(u.hi, s.hi)}; }
  static I dpwssd(I acc, I a, I b) { return {dpwssd256<kVnni>(acc.lo, a.lo, b.lo), dpwssd256<kVnni>(acc.hi, a.hi, b.hi)}; }
  template <int kShift>
  static I neg_shl(I v) {
    const __m256i z = _mm256_setzero_si256();
    return {_mm256_sub_epi32(z, _mm256_slli_epi32(v.lo, kShift)), _mm256_sub_epi32(z, _mm256_slli_epi32(v.hi, kShift))};
  }
  static __m256i fold(I v) { return _mm256_add_epi32(v.lo, v.hi); }
  static F cvt(I v) { return {_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }
  static F mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static F fmadd(F a, F b, F c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
  static F scales(float a, float b) { return {_mm256_set1_ps(a), _mm256_set1_ps(b)}; }
  static float reduce(F v) { return hsum8(_mm256_add_ps(v.lo, v.hi)); }
  static float reduce2(F v, F m) { return hsum8(_mm256_add_ps(_mm256_add_ps(v.lo, v.hi), _mm256_add_ps(m.lo, m.hi))); }
};

#ifdef QG_AVX512
struct V512 {
  static constexpr bool kVnni = true;
  using I = __m512i;
  using F = __m512;
  static I zero() { return _mm512_setzero_si512(); }
  static F fzero() { return _mm512_setzero_ps(); }
  static I load64(const void* p) { return _mm512_loadu_si512(p); }
  static I load32z(const void* p) { return _mm512_zextsi256_si512(load32(p)); }
  static I pair(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1); }
  static I dpbusd(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
  static I dot_signed(I a, I b) {  // not used: kVnni
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), a, b);
  }
  static I maddubs(I u, I s) { return _mm512_maddubs_epi16(u, s); }
  static I dpwssd(I acc, I a, I b) { return _mm512_dpwssd_epi32(acc, a, b); }
  template <int kShift>
  static I neg_shl(I v) {
    return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(v, kShift));
  }
  static __m256i fold(I v) { return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F scales(float a, float b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_zextpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(a))),
                                               _mm256_castps_pd(_mm256_set1_ps(b)), 1));
  }
  static __m256 lo(F v) { return _mm512_castps512_ps256(v); }
  static __m256 hi(F v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
  static float reduce(F v) { return hsum8(_mm256_add_ps(lo(v), hi(v))); }
  static float reduce2(F v, F m) { return hsum8(_mm256_add_ps(_mm256_add_ps(lo(v), hi(v)), _mm256_add_ps(lo(m), hi(m)))); }
};
#endif

// ---------------------------------------------------------------------------------------------
// Legacy types: 32 weight values of a block as unsigned bytes (u = q + kOffset for the symmetric
// types, so Σ (u - offset) x = Σ u x - offset Σ x), and the block's float scale (and min).

// Low / high nibbles of 16 bytes as 32 bytes: elements 0..15 low nibbles, 16..31 high.
inline __m256i nibbles_32(const uint8_t* qs) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), _mm256_set1_epi8(0x0F));
}
// 32 bits (little-endian at p) spread to 32 bytes: 0xFF where bit i is set, byte i.
inline __m256i bytes_from_bits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i shuf =
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
  const __m256i mask = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, mask), mask);
}

struct LQ8_0 {
  using Block = ggml::BlockQ8_0;
  static constexpr int kShift = 7;  // offset 128
  static constexpr bool kAffine = false;
  // VNNI: q + 128 as unsigned bytes; otherwise the signed values (sign-trick dot).
  template <bool kVnni>
  static __m256i unpack(const Block& b) {
    const __m256i q = load32(b.qs);
    return kVnni ? _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80))) : q;
  }
  static float d(const Block& b) { return f16(b.d); }
  static float m(const Block&) { return 0.0f; }
};
struct LQ4_0 {
  using Block = ggml::BlockQ4_0;
  static constexpr int kShift = 3;  // offset 8
  static constexpr bool kAffine = false;
  template <bool>
  static __m256i unpack(const Block& b) {
    return nibbles_32(b.qs);
  }
  static float d(const Block& b) { return f16(b.d); }
  static float m(const Block&) { return 0.0f; }
};
struct LQ5_0 {
  using Block = ggml::BlockQ5_0;
  static constexpr int kShift = 4;  // offset 16
  static constexpr bool kAffine = false;
  template <bool>
  static __m256i unpack(const Block& b) {
    return _mm256_or_si256(nibbles_32(b.qs), _mm256_and_si256(bytes_from_bits(b.qh), _mm256_set1_epi8(0x10)));
  }
  static float d(const Block& b) { return f16(b.d); }
  static float m(const Block&) { return 0.0f; }
};
struct LQ4_1 {
  using Block = ggml::BlockQ4_1;
  static constexpr int kShift = 0;
  static constexpr bool kAffine = true;
  template <bool>
  static __m256i unpack(const Block& b) {
    return nibbles_32(b.qs);
  }
  static float d(const Block& b) { return f16(b.d); }
  static float m(const Block& b) { return f16(b.m); }
};
struct LQ5_1 {
  using Block = ggml::BlockQ5_1;
  static constexpr int kShift = 0;
  static constexpr bool kAffine = true;
  template <bool>
  static __m256i unpack(const Block& b) {
    return _mm256_or_si256(nibbles_32(b.qs), _mm256_and_si256(bytes_from_bits(b.qh), _mm256_set1_epi8(0x10)));
  }
  static float d(const Block& b) { return f16(b.d); }
  static float m(const Block& b) { return f16(b.m); }
};

// Where a tile reads and writes: R weight rows (pointers, the padding rows of a partial tile
// repeat the last real one), C activation rows from t0, outputs y[c * ldy + r] for r < n_rows.
struct Tile {
  const uint8_t* const* w;
  int64_t t0;
  float* y;
  int64_t ldy;
  int n_rows;
};

// The legacy kernel: acc[r][c] over block pairs, the two halves being the even / odd chains.
template <class V, class Ty, int R, int C>
[[gnu::noinline]] void legacy_tile(const Tile& tile, const PackedActivations& x) {
  using I = typename V::I;
  using F = typename V::F;
  using Block = typename Ty::Block;
  const int64_t cols = x.cols, nb = cols / kQK;
  const Block* blk[R];
  for (int r = 0; r < R; ++r) blk[r] = reinterpret_cast<const Block*>(tile.w[r]);
  const int8_t* xq[C];
  const float* xd[C];
  const int32_t* xls[C];
  for (int c = 0; c < C; ++c) {
    const int64_t t = tile.t0 + c;
    xq[c] = x.q8.data() + t * cols;
    xd[c] = x.d8.data() + t * nb;
    xls[c] = x.ls8.data() + t * nb * 8;
  }
  F acc[R][C], accm[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = accm[r][c] = V::fzero();

  // Blocks i and i + 1 (kTwo) or block i and a zero block of scale 0 (the odd last block).
  const auto step = [&]<bool kTwo>(int64_t i) {
    I u[R];
    F dw[R], mw[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i u0 = Ty::template unpack<V::kVnni>(blk[r][i]);
      u[r] = V::pair(u0, kTwo ? Ty::template unpack<V::kVnni>(blk[r][i + 1]) : _mm256_setzero_si256());
      dw[r] = V::scales(Ty::d(blk[r][i]), kTwo ? Ty::d(blk[r][i + 1]) : 0.0f);
      if constexpr (Ty::kAffine) mw[r] = V::scales(Ty::m(blk[r][i]), kTwo ? Ty::m(blk[r][i + 1]) : 0.0f);
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const I xs = kTwo ? V::load64(xq[c] + i * kQK) : V::load32z(xq[c] + i * kQK);
      const F dx = V::scales(xd[c][i], kTwo ? xd[c][i + 1] : 0.0f);
      const I ls = kTwo ? V::load64(xls[c] + i * 8) : V::load32z(xls[c] + i * 8);
      if constexpr (Ty::kAffine) {
        const F lsf = V::cvt(ls);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const I prod = V::dpbusd(V::zero(), u[r], xs);
          acc[r][c] = V::fmadd(V::mul(dw[r], dx), V::cvt(prod), acc[r][c]);
          accm[r][c] = V::fmadd(V::mul(mw[r], dx), lsf, accm[r][c]);
        }
      } else if constexpr (Ty::kShift == 7 && !V::kVnni) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          acc[r][c] = V::fmadd(V::mul(dw[r], dx), V::cvt(V::dot_signed(u[r], xs)), acc[r][c]);
      } else {
        const I corr = V::template neg_shl<Ty::kShift>(ls);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          acc[r][c] = V::fmadd(V::mul(dw[r], dx), V::cvt(V::dpbusd(corr, u[r], xs)), acc[r][c]);
      }
    }
  };
  int64_t i = 0;
  for (; i + 1 < nb; i += 2) step.template operator()<true>(i);
  if (i < nb) step.template operator()<false>(i);
  for (int r = 0; r < tile.n_rows; ++r)
    for (int c = 0; c < C; ++c)
      tile.y[c * tile.ldy + r] = Ty::kAffine ? V::reduce2(acc[r][c], accm[r][c]) : V::reduce(acc[r][c]);
}

// ---------------------------------------------------------------------------------------------
// K-quants: chunk k (elements 32k .. 32k + 31) of a block as unsigned bytes, the int16 scale of
// each element pair, the block's integer correction (offset types) and its min sums.

struct KQ4_K {
  using Block = ggml::BlockQ4_K;
  static constexpr bool kMins = true;
  struct Row {
    uint8_t sc[16];  // scales 0..7, mins 8..15
  };
  static Row row(const Block& b) { return row_from(b.scales); }
  // The 8 scales and 8 mins from the 12 packed bytes (ggml::k4_scale_min, four at a time).
  static Row row_from(const uint8_t* scales) {
    uint32_t wd[3];
    std::memcpy(wd, scales, 12);
    const uint32_t lo6 = 0x3F3F3F3Fu, lo4 = 0x0F0F0F0Fu, lo2 = 0x03030303u;
    const uint32_t s4[4] = {wd[0] & lo6, (wd[2] & lo4) | (((wd[0] >> 6) & lo2) << 4), wd[1] & lo6,
                            ((wd[2] >> 4) & lo4) | (((wd[1] >> 6) & lo2) << 4)};
    Row r;
    std::memcpy(r.sc, s4, 16);
    return r;
  }
  static __m256i u(const Block& b, int k) {
    const __m256i q = load32(b.qs + 32 * (k / 2));
    return _mm256_and_si256(k % 2 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0x0F));
  }
  static __m256i sc(const Row& r, int k) { return _mm256_set1_epi16(r.sc[k]); }
  static __m256i init(const Block&, const Row&, const BlockQ8_K&) { return _mm256_setzero_si256(); }
  // Σ_j min_j (bsum_2j + bsum_2j+1): 4 int32 lanes (upper 4 zero).
  static __m256i mins(const Row& r, const BlockQ8_K& x) {
    const __m128i bs_lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsums));
    const __m128i bs_hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsums + 8));
    const __m128i mins16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(r.sc + 8)));
    return _mm256_zextsi128_si256(_mm_madd_epi16(mins16, _mm_hadd_epi16(bs_lo, bs_hi)));
  }
  static float d(const Block& b) { return f16(b.d); }
  static float dmin(const Block& b) { return f16(b.dmin); }
};
struct KQ5_K : KQ4_K {
  using Block = ggml::BlockQ5_K;
  static Row row(const Block& b) { return row_from(b.scales); }
  static __m256i u(const Block& b, int k) {
    const __m256i q = load32(b.qs + 32 * (k / 2));
    const __m256i lo = _mm256_and_si256(k % 2 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0x0F));
    const __m256i h = _mm256_and_si256(_mm256_srli_epi16(load32(b.qh), k), _mm256_set1_epi8(1));
    return _mm256_or_si256(lo, _mm256_slli_epi16(h, 4));
  }
  static __m256i init(const Block&, const Row&, const BlockQ8_K&) { return _mm256_setzero_si256(); }
  static float d(const Block& b) { return f16(b.d); }
  static float dmin(const Block& b) { return f16(b.dmin); }
};
struct KQ6_K {
  using Block = ggml::BlockQ6_K;
  static constexpr bool kMins = false;
  struct Row {};
  static Row row(const Block&) { return {}; }
  static __m256i u(const Block& b, int k) {
    const int h = k / 4, g = k % 4;
    const __m256i l = load32(b.ql + 64 * h + 32 * (g % 2));
    const __m256i nib = _mm256_and_si256(g < 2 ? l : _mm256_srli_epi16(l, 4), _mm256_set1_epi8(0x0F));
    const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(load32(b.qh + 32 * h), 2 * g), _mm256_set1_epi8(3));
    return _mm256_or_si256(nib, _mm256_slli_epi16(hb, 4));
  }
  static __m256i sc(const Row&, const Block& b, int k) {
    return _mm256_set_m128i(_mm_set1_epi16(b.scales[2 * k + 1]), _mm_set1_epi16(b.scales[2 * k]));
  }
  // Stored u = q + 32: Σ sc (u - 32) y = Σ sc u y - 32 Σ sc bsum.
  static __m256i init(const Block& b, const Row&, const BlockQ8_K& x) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, load32(x.bsums)), 5));
  }
  static __m256i mins(const Row&, const BlockQ8_K&) { return _mm256_setzero_si256(); }
  static float d(const Block& b) { return f16(b.d); }
  static float dmin(const Block&) { return 0.0f; }
};
struct KQ3_K {
  using Block = ggml::BlockQ3_K;
  static constexpr bool kMins = false;
  struct Row {
    int8_t sc[16];  // scale - 32
  };
  static Row row(const Block& b) {
    uint32_t wd[3];
    std::memcpy(wd, b.scales, 12);
    const uint32_t lo4 = 0x0F0F0F0Fu, lo2 = 0x03030303u;
    const uint32_t s4[4] = {(wd[0] & lo4) | ((wd[2] & lo2) << 4), (wd[1] & lo4) | (((wd[2] >> 2) & lo2) << 4),
                            ((wd[0] >> 4) & lo4) | (((wd[2] >> 4) & lo2) << 4),
                            ((wd[1] >> 4) & lo4) | (((wd[2] >> 6) & lo2) << 4)};
    Row r;
    std::memcpy(r.sc, s4, 16);
    for (int8_t& v : r.sc) v = static_cast<int8_t>(v - 32);
    return r;
  }
  static __m256i u(const Block& b, int k) {
    const int h = k / 4, j = k % 4;
    const __m256i low = _mm256_and_si256(_mm256_srli_epi16(load32(b.qs + 32 * h), 2 * j), _mm256_set1_epi8(3));
    const __m256i high =
        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(load32(b.hmask), 4 * h + j), _mm256_set1_epi8(1)), 2);
    return _mm256_or_si256(low, high);
  }
  static __m256i sc(const Row& r, const Block&, int k) {
    return _mm256_set_m128i(_mm_set1_epi16(r.sc[2 * k + 1]), _mm_set1_epi16(r.sc[2 * k]));
  }
  // Stored u = q + 4: Σ sc (u - 4) y = Σ sc u y - 4 Σ sc bsum.
  static __m256i init(const Block&, const Row& r, const BlockQ8_K& x) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.sc)));
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, load32(x.bsums)), 2));
  }
  static __m256i mins(const Row&, const BlockQ8_K&) { return _mm256_setzero_si256(); }
  static float d(const Block& b) { return f16(b.d); }
  static float dmin(const Block&) { return 0.0f; }
};
struct KQ2_K {
  using Block = ggml::BlockQ2_K;
  static constexpr bool kMins = true;
  struct Row {};
  static Row row(const Block&) { return {}; }
  static __m256i u(const Block& b, int k) {
    const int h = k / 4, j = k % 4;
    return _mm256_and_si256(_mm256_srli_epi16(load32(b.qs + 32 * h), 2 * j), _mm256_set1_epi8(3));
  }
  static __m256i sc(const Row&, const Block& b, int k) {
    return _mm256_set_m128i(_mm_set1_epi16(b.scales[2 * k + 1] & 0xF), _mm_set1_epi16(b.scales[2 * k] & 0xF));
  }
  static __m256i init(const Block&, const Row&, const BlockQ8_K&) { return _mm256_setzero_si256(); }
  // Σ min_s bsum_s with the 16 mins (high nibbles): 8 int32 lanes.
  static __m256i mins_of(const Block& b, const BlockQ8_K& x) {
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0F)));
    return _mm256_madd_epi16(mins16, load32(x.bsums));
  }
  static float d(const Block& b) { return f16(b.d); }
  static float dmin(const Block& b) { return f16(b.dmin); }
};

// Uniform accessors over the five K types (some read the block, some the decoded Row).
template <class Ty>
inline __m256i k_sc(const typename Ty::Row& r, const typename Ty::Block& b, int k) {
  if constexpr (requires { Ty::sc(r, k); })
    return Ty::sc(r, k);
  else
    return Ty::sc(r, b, k);
}
template <class Ty>
inline __m256i k_mins(const typename Ty::Row& r, const typename Ty::Block& b, const BlockQ8_K& x) {
  if constexpr (requires { Ty::mins_of(b, x); })
    return Ty::mins_of(b, x);
  else
    return Ty::mins(r, x);
}

// The K-quant kernel: per block, integer lane sums of every (row, activation) pair over four
// 64-element steps, then one FMA per pair (and one for the min term), as the one-row kernels.
template <class V, class Ty, int R, int C>
[[gnu::noinline]] void kquant_tile(const Tile& tile, const PackedActivations& x) {
  using I = typename V::I;
  using Block = typename Ty::Block;
  const int64_t nbk = x.cols / kQKK;
  const Block* blk[R];
  for (int r = 0; r < R; ++r) blk[r] = reinterpret_cast<const Block*>(tile.w[r]);
  const BlockQ8_K* xb[C];
  for (int c = 0; c < C; ++c) xb[c] = reinterpret_cast<const BlockQ8_K*>(x.qk.data()) + (tile.t0 + c) * nbk;
  __m256 acc[R][C], accm[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = accm[r][c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nbk; ++i) {
    typename Ty::Row row[R];
    for (int r = 0; r < R; ++r) row[r] = Ty::row(blk[r][i]);
    I sum[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) sum[r][c] = V::zero();
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const I u = V::pair(Ty::u(blk[r][i], 2 * m), Ty::u(blk[r][i], 2 * m + 1));
        const I sc = V::pair(k_sc<Ty>(row[r], blk[r][i], 2 * m), k_sc<Ty>(row[r], blk[r][i], 2 * m + 1));
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) sum[r][c] = V::dpwssd(sum[r][c], V::maddubs(u, V::load64(xb[c][i].qs + 64 * m)), sc);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float dw = Ty::d(blk[r][i]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        const BlockQ8_K& xc = xb[c][i];
        const __m256i sumi = _mm256_add_epi32(Ty::init(blk[r][i], row[r], xc), V::fold(sum[r][c]));
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xc.d), _mm256_cvtepi32_ps(sumi), acc[r][c]);
        if constexpr (Ty::kMins)
          accm[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(Ty::dmin(blk[r][i]) * xc.d),
                                       _mm256_cvtepi32_ps(k_mins<Ty>(row[r], blk[r][i], xc)), accm[r][c]);
      }
    }
  }
  for (int r = 0; r < tile.n_rows; ++r)
    for (int c = 0; c < C; ++c)
      tile.y[c * tile.ldy + r] = Ty::kMins ? hsum8(acc[r][c]) - hsum8(accm[r][c]) : hsum8(acc[r][c]);
}

// ---------------------------------------------------------------------------------------------
// Driver: rows in panels (weights of a panel stay in L2 while every group of activation rows
// passes over them), activation rows in groups of up to C, weight rows in tiles of R.

using TileFn = void (*)(const Tile&, const PackedActivations&);

template <class V, class Ty, int R, int C>
struct TileTable {
  template <int... Cs>
  static constexpr auto make(std::integer_sequence<int, Cs...>) {
    return std::array<TileFn, sizeof...(Cs)>{&run<Cs + 1>...};
  }
  template <int Cn>
  static void run(const Tile& t, const PackedActivations& x) {
    if constexpr (requires { Ty::kShift; })
      legacy_tile<V, Ty, R, Cn>(t, x);
    else
      kquant_tile<V, Ty, R, Cn>(t, x);
  }
};

// Tile shapes per variant: the accumulators of an R × C tile must fit the register file (16
// ymm on AVX2, where a pair takes two registers; 32 zmm on AVX-512).
template <class V>
struct Shape;
template <bool kVnni>
struct Shape<V2x256<kVnni>> {
  static constexpr int kLegacyR = 2, kLegacyC = 2, kKR = 1, kKC = 2;
};
#ifdef QG_AVX512
template <>
struct Shape<V512> {
  static constexpr int kLegacyR = 4, kLegacyC = 4, kKR = 2, kKC = 4;
};
#endif

constexpr int64_t kPanelRows = 64;

template <class V, class Ty>
void run_rows(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const PackedActivations& x, float* y,
              int64_t ldy) {
  constexpr bool kLegacy = requires { Ty::kShift; };
  constexpr int R = kLegacy ? Shape<V>::kLegacyR : Shape<V>::kKR;
  constexpr int C = kLegacy ? Shape<V>::kLegacyC : Shape<V>::kKC;
  static constexpr auto fns = TileTable<V, Ty, R, C>::make(std::make_integer_sequence<int, C>{});
  const int64_t T = x.T;
  for (int64_t p0 = r0; p0 < r1; p0 += kPanelRows) {
    const int64_t p1 = std::min(r1, p0 + kPanelRows);
    for (int64_t t0 = 0; t0 < T; t0 += C) {
      const int cn = static_cast<int>(std::min<int64_t>(C, T - t0));
      for (int64_t r = p0; r < p1; r += R) {
        const uint8_t* rows[R];
        const int n_rows = static_cast<int>(std::min<int64_t>(R, p1 - r));
        for (int k = 0; k < R; ++k) rows[k] = w + (r + std::min(k, n_rows - 1)) * row_bytes;
        const Tile tile{rows, t0, y + t0 * ldy + r, ldy, n_rows};
        fns[static_cast<size_t>(cn - 1)](tile, x);
      }
    }
  }
}

template <class V>
void run_type(GgmlType type, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const PackedActivations& x,
              float* y, int64_t ldy) {
  switch (type) {
    case GgmlType::Q8_0:
      return run_rows<V, LQ8_0>(w, row_bytes, r0, r1, x, y, ldy);
    case GgmlType::Q4_0:
      return run_rows<V, LQ4_0>(w, row_bytes, r0, r1, x, y, ldy);
    case GgmlType::Q5_0:
      return run_rows<V, LQ5_0>(w, row_bytes, r0, r1, x, y, ldy);
    case GgmlType::Q4_1:
      return run_rows<V, LQ4_1>(w, row_bytes, r0, r1, x, y, ldy);
    case GgmlType::Q5_1:
      return run_rows<V, LQ5_1>(w, row_bytes, r0, r1, x, y, ldy);
    case GgmlType::Q2_K:
      return run_rows<V, KQ2_K>(w, row_bytes, r0, r1, x, y, ldy);
    case GgmlType::Q3_K:
      return run_rows<V, KQ3_K>(w, row_bytes, r0, r1, x, y, ldy);
    case GgmlType::Q4_K:
      return run_rows<V, KQ4_K>(w, row_bytes, r0, r1, x, y, ldy);
    case GgmlType::Q5_K:
      return run_rows<V, KQ5_K>(w, row_bytes, r0, r1, x, y, ldy);
    case GgmlType::Q6_K:
      return run_rows<V, KQ6_K>(w, row_bytes, r0, r1, x, y, ldy);
    default:
      throw Error("qgemm_rows: " + ggml_type_name(static_cast<uint32_t>(type)) + " is not a quantised type");
  }
}

}  // namespace
#endif  // QG_AVX2

void qgemm_rows(KernelIsa isa, GgmlType type, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1,
                const PackedActivations& x, float* y, int64_t ldy) {
  if (r0 >= r1 || x.T <= 0) return;
  switch (isa) {
#ifdef QG_AVX2
    case KernelIsa::Avx2:
      return run_type<V2x256<false>>(type, w, row_bytes, r0, r1, x, y, ldy);
#endif
#ifdef QG_VNNI256
    case KernelIsa::Avx2Vnni:
      return run_type<V2x256<true>>(type, w, row_bytes, r0, r1, x, y, ldy);
#endif
#ifdef QG_AVX512
    case KernelIsa::Avx512:
      return run_type<V512>(type, w, row_bytes, r0, r1, x, y, ldy);
#endif
    default:
      break;
  }
  throw Error(std::string("qgemm_rows: kernel variant ") + kernel_isa_name(isa) + " is not compiled into this build");
}

}  // namespace kvevict
