// Matmul kernels (see matmul.h): integer Q8_0 activation dots for quantised weights, dot_row for
// float weights, OpenBLAS sgemm tiles for prefill.
#include "kernels/matmul.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>

#include "format/ggml_blocks.h"
#include "util/error.h"
#include "util/simd.h"
#include "util/thread_pool.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVEVICT_KERNELS_AVX2 1
#endif

namespace kvevict {
namespace {

constexpr int64_t kQK = ggml::kQK;
constexpr int64_t kQKK = ggml::kQKK;
using BlockQ8 = ggml::BlockQ8_0;
using BlockQ4 = ggml::BlockQ4_0;
using ggml::BlockQ8_K;

#ifdef KVEVICT_KERNELS_AVX2
// Σ a_i · b_i over 32 signed bytes as 8 int32 lanes (|a| · sign(b, a) keeps maddubs' unsigned
// operand non-negative; |q| <= 127 for Q8_0 so no int16 pair sum saturates, and Q4_0 values are
// in [-8, 7]).
inline __m256i dot_i8x32(__m256i a, __m256i b) {
  const __m256i ua = _mm256_sign_epi8(a, a);
  const __m256i sb = _mm256_sign_epi8(b, a);
  const __m256i pairs = _mm256_maddubs_epi16(ua, sb);
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// acc + Σ u_i · s_i of 32 unsigned by 32 signed bytes, in 8 int32 lanes (lane k: bytes 4k..4k+3,
// the grouping of dot_i8x32). One VNNI instruction where the CPU has it, else maddubs + madd,
// which is exact only while no int16 pair sum saturates: callers keep u <= 63 (2 · 63 · 127 < 2^15).
inline __m256i dpbusd_small(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// Σ over blocks 0..nb-1 of block(i, acc) (which returns acc plus block i's 8 float lanes), even
// blocks in one accumulator and odd blocks in another: two independent FMA chains (one chain
// bounds a row at 4 cycles per block); the scalar references add in the same order.
template <class Block>
inline float sum_two_chains(int64_t nb, const Block& block) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 1 < nb; i += 2) {
    acc0 = block(i, acc0);
    acc1 = block(i + 1, acc1);
  }
  if (i < nb) acc0 = block(i, acc0);
  return hsum8(_mm256_add_ps(acc0, acc1));
}

// Σ over the 32 signed bytes of a Q8_0 block as 8 int32 lanes (same grouping).
inline __m256i sum_i8x32(__m256i q) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
}
#endif

// Chunk of output rows one work item computes: at least kRowChunk rows and about kChunkBytes of
// weights, fixed by the shape (never by the thread count). Large chunks keep each thread's
// weight stream sequential for the hardware prefetcher: with 16-row (16 KiB) chunks two threads
// decoded SmolLM2-360M Q8_0 slower than one (26.1 vs 23.0 ms/token); with 256 KiB chunks two
// threads take 16.0 ms.
constexpr int64_t kRowChunk = 16;
constexpr int64_t kChunkBytes = int64_t{1} << 18;
constexpr int64_t kBlasMinRows = 16;
constexpr int64_t kBlasTile = 64;  // weight rows dequantised per sgemm call

void init_blas_once() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace

// Block sums are accumulated the way the AVX2 kernels do, so SIMD and scalar agree bit for bit:
// lane k (0..7) of a block's integer sum covers elements 4k..4k+3; each lane accumulates
// fma(d_w * d_x, lane sum, acc[k]) over the blocks, even blocks and odd blocks in two separate
// accumulators (two independent FMA chains: one chain bounds a row at 4 cycles per block),
// added lane by lane at the end; the 8 lanes are then added as
// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
namespace {
float reduce_lanes(const float (&acc)[2][8]) {
  float a[8];
  for (int k = 0; k < 8; ++k) a[k] = acc[0][k] + acc[1][k];
  const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
  return (s0 + s2) + (s1 + s3);
}
void accumulate_block_ref(float* acc, float d, const int8_t* a, const int8_t* b) {
  for (int k = 0; k < 8; ++k) {
    int32_t s = 0;
    for (int j = 4 * k; j < 4 * k + 4; ++j) s += int32_t{a[j]} * int32_t{b[j]};
    acc[k] = std::fma(d, static_cast<float>(s), acc[k]);
  }
}
}  // namespace

float dot_q8_0_q8_0_ref(const void* w, const void* xq, int64_t n) {
  const auto* a = static_cast<const BlockQ8*>(w);
  const auto* b = static_cast<const BlockQ8*>(xq);
  float acc[2][8] = {};
  for (int64_t i = 0; i < n / kQK; ++i)
    accumulate_block_ref(acc[i & 1], fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d), a[i].qs, b[i].qs);
  return reduce_lanes(acc);
}

float dot_q4_0_q8_0_ref(const void* w, const void* xq, int64_t n) {
  const auto* a = static_cast<const BlockQ4*>(w);
  const auto* b = static_cast<const BlockQ8*>(xq);
  float acc[2][8] = {};
  for (int64_t i = 0; i < n / kQK; ++i) {
    int8_t q[kQK];
    for (int j = 0; j < kQK / 2; ++j) {
      q[j] = static_cast<int8_t>((a[i].qs[j] & 0x0F) - 8);
      q[j + kQK / 2] = static_cast<int8_t>((a[i].qs[j] >> 4) - 8);
    }
    accumulate_block_ref(acc[i & 1], fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d), q, b[i].qs);
  }
  return reduce_lanes(acc);
}

float dot_q8_0_q8_0(const void* w, const void* xq, int64_t n) {
#ifdef KVEVICT_KERNELS_AVX2
  const auto* a = static_cast<const BlockQ8*>(w);
  const auto* b = static_cast<const BlockQ8*>(xq);
  const int64_t nb = n / kQK;
  const auto block = [&](int64_t i, __m256 acc) {
    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs));
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(a[i].d) * _cvtsh_ss(b[i].d));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8x32(qa, qb)), acc);
  };
  return sum_two_chains(nb, block);
#else
  return dot_q8_0_q8_0_ref(w, xq, n);
#endif
}

namespace {

// Scalar fallback of every integer dot below: dequantised weights times dequantised activations
// in float32 (not bit-identical to the AVX2 kernels; both are within the activation
// quantisation error of the float product, which is what the tests check).
float dot_dequantised(GgmlType wt, const void* w, ActivationQuant at, const void* xq, int64_t n) {
  const int64_t blk = at == ActivationQuant::Q8_K ? kQKK : kQK;
  const int64_t wbytes = ggml_block_bytes(wt) * (blk / ggml_block_elems(wt));
  float wf[kQKK], xf[kQKK];
  float sum = 0.0f;
  for (int64_t ib = 0; ib < n / blk; ++ib) {
    dequantize_row(wt, static_cast<const uint8_t*>(w) + ib * wbytes, wf, blk);
    if (at == ActivationQuant::Q8_K) {
      const BlockQ8_K& b = static_cast<const BlockQ8_K*>(xq)[ib];
      for (int j = 0; j < kQKK; ++j) xf[j] = b.d * static_cast<float>(b.qs[j]);
    } else {
      dequantize_row(GgmlType::Q8_0, static_cast<const BlockQ8*>(xq) + ib, xf, kQK);
    }
    for (int64_t j = 0; j < blk; ++j) sum += wf[j] * xf[j];
  }
  return sum;
}

#ifdef KVEVICT_KERNELS_AVX2
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

// Σ u_i · s_i of 32 unsigned (<= 63) by 32 signed bytes as 16 int16 pair sums (no saturation:
// 2 · 63 · 127 < 2^15).
inline __m256i dot_u8_i8_pairs(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }

// Pair sums of 16 int16 lanes times a per-16-elements scale: lanes 0..7 (elements 0..15) times
// a, lanes 8..15 (elements 16..31) times b, summed pairwise into 8 int32.
inline __m256i scale16(__m256i pairs, int a, int b) {
  return _mm256_madd_epi16(
      pairs, _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(b)), _mm_set1_epi16(static_cast<int16_t>(a))));
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Low / high nibbles of 16 bytes as 32 bytes: elements 0..15 low nibbles, 16..31 high.
inline __m256i nibbles_32(const uint8_t* qs) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), _mm256_set1_epi8(0x0F));
}
#endif

#ifdef KVEVICT_KERNELS_AVX2
// What the offset/affine kernels need of activation block i: its scale dx, its lane sums
// (sum_i8x32) and those times -8, computed from the block.
struct ActFromBlocks {
  const BlockQ8* x;
  float d(int64_t i) const { return _cvtsh_ss(x[i].d); }
  __m256i sums(int64_t i) const { return sum_i8x32(load32(x[i].qs)); }
  __m256i neg8(int64_t i) const { return times_minus8(sums(i)); }
  static __m256i times_minus8(__m256i v) { return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(v, 3)); }
};

// Symmetric 32-element types (Q4_0: w = d · (q − 8), Q5_0: w = d · (q − 16), q unsigned): the
// integer sum Σ (q − o) x is computed as Σ q x − o Σ x, lane by lane, so it equals the
// dot_i8x32 lanes of the reference exactly and the float steps are the reference's.
// noinline: inlined into matmul_jobs' row loop, GCC 12 ran short of registers and kept the
// block pointers in vector registers (a loop-carried round trip per block, half the speed).
template <int kOffset, class Block, class Unpack, class Act>
[[gnu::noinline]] float dot_offset_q8_0(const Block* a, const BlockQ8* b, int64_t nb, Unpack unpack, Act act) {
  static_assert(kOffset == 8 || kOffset == 16);
  const auto block = [&](int64_t i, __m256 acc) {
    __m256i corr = act.neg8(i);
    if constexpr (kOffset == 16) corr = _mm256_add_epi32(corr, corr);
    const __m256i lanes = dpbusd_small(corr, unpack(a[i]), load32(b[i].qs));
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(a[i].d) * act.d(i));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc);
  };
  return sum_two_chains(nb, block);
}

// Affine 32-element types (Q4_1, Q5_1: w = d · q + m, q unsigned) against Q8_0 blocks:
// acc += d · dx · Σ q x, accm += m · dx · Σ x.
template <class Block, class Unpack, class Act>
[[gnu::noinline]] float dot_affine_q8_0(const Block* a, const BlockQ8* b, int64_t nb, Unpack unpack, Act act) {
  // acc += d · dx · Σ q x and accm += m · dx · Σ x, even and odd blocks in separate chains.
  const auto block = [&](int64_t i, __m256& acc, __m256& accm) {
    const float dx = act.d(i);
    const __m256i prod = dpbusd_small(_mm256_setzero_si256(), unpack(a[i]), load32(b[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(a[i].d) * dx), _mm256_cvtepi32_ps(prod), acc);
    accm = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(a[i].m) * dx), _mm256_cvtepi32_ps(act.sums(i)), accm);
  };
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), accm0 = _mm256_setzero_ps(),
         accm1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 1 < nb; i += 2) {
    block(i, acc0, accm0);
    block(i + 1, acc1, accm1);
  }
  if (i < nb) block(i, acc0, accm0);
  return hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(accm0, accm1)));
}

// Unsigned values (0..15 or 0..31) of one block.
struct UnpackQ4_0 {
  __m256i operator()(const BlockQ4& a) const { return nibbles_32(a.qs); }
};
struct UnpackQ4_1 {
  __m256i operator()(const ggml::BlockQ4_1& a) const { return nibbles_32(a.qs); }
};
template <class B>
struct UnpackQ5 {
  __m256i operator()(const B& a) const {
    return _mm256_or_si256(nibbles_32(a.qs), _mm256_and_si256(bytes_from_bits(a.qh), _mm256_set1_epi8(0x10)));
  }
};

// The four dots above for weight type t, with the activation blocks' sums and scales from `act`.
template <class Act>
float dot_q8_0_act(GgmlType t, const void* w, const BlockQ8* b, int64_t nb, Act act) {
  switch (t) {
    case GgmlType::Q4_0:
      return dot_offset_q8_0<8>(static_cast<const BlockQ4*>(w), b, nb, UnpackQ4_0{}, act);
    case GgmlType::Q5_0:
      return dot_offset_q8_0<16>(static_cast<const ggml::BlockQ5_0*>(w), b, nb, UnpackQ5<ggml::BlockQ5_0>{}, act);
    case GgmlType::Q4_1:
      return dot_affine_q8_0(static_cast<const ggml::BlockQ4_1*>(w), b, nb, UnpackQ4_1{}, act);
    case GgmlType::Q5_1:
      return dot_affine_q8_0(static_cast<const ggml::BlockQ5_1*>(w), b, nb, UnpackQ5<ggml::BlockQ5_1>{}, act);
    default:
      throw Error("dot_q8_0_act: not a 32-element offset/affine type");
  }
}

#endif

}  // namespace

float dot_q4_0_q8_0(const void* w, const void* xq, int64_t n) {
#ifdef KVEVICT_KERNELS_AVX2
  const auto* b = static_cast<const BlockQ8*>(xq);
  return dot_q8_0_act(GgmlType::Q4_0, w, b, n / kQK, ActFromBlocks{b});
#else
  return dot_q4_0_q8_0_ref(w, xq, n);
#endif
}

float dot_q4_1_q8_0(const void* w, const void* xq, int64_t n) {
#ifdef KVEVICT_KERNELS_AVX2
  const auto* b = static_cast<const BlockQ8*>(xq);
  return dot_q8_0_act(GgmlType::Q4_1, w, b, n / kQK, ActFromBlocks{b});
#else
  return dot_dequantised(GgmlType::Q4_1, w, ActivationQuant::Q8_0, xq, n);
#endif
}

float dot_q5_0_q8_0(const void* w, const void* xq, int64_t n) {
#ifdef KVEVICT_KERNELS_AVX2
  const auto* b = static_cast<const BlockQ8*>(xq);
  return dot_q8_0_act(GgmlType::Q5_0, w, b, n / kQK, ActFromBlocks{b});
#else
  return dot_dequantised(GgmlType::Q5_0, w, ActivationQuant::Q8_0, xq, n);
#endif
}

float dot_q5_1_q8_0(const void* w, const void* xq, int64_t n) {
#ifdef KVEVICT_KERNELS_AVX2
  const auto* b = static_cast<const BlockQ8*>(xq);
  return dot_q8_0_act(GgmlType::Q5_1, w, b, n / kQK, ActFromBlocks{b});
#else
  return dot_dequantised(GgmlType::Q5_1, w, ActivationQuant::Q8_0, xq, n);
#endif
}

float dot_q2_k_q8_k(const void* w, const void* xq, int64_t n) {
#ifdef KVEVICT_KERNELS_AVX2
  const auto* a = static_cast<const ggml::BlockQ2_K*>(w);
  const auto* b = static_cast<const BlockQ8_K*>(xq);
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const uint8_t* sc = a[i].scales;
    // Σ min_s bsum_s with the 16 mins (high nibbles) widened to int16.
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc));
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0F)));
    const __m256i summ = _mm256_madd_epi16(mins16, load32(b[i].bsums));
    accm = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(a[i].dmin) * b[i].d), _mm256_cvtepi32_ps(summ), accm);
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i q = load32(a[i].qs + 32 * h);
      const int8_t* y = b[i].qs + 128 * h;
      const uint8_t* s = sc + 8 * h;
      sumi =
          _mm256_add_epi32(sumi, scale16(dot_u8_i8_pairs(_mm256_and_si256(q, m3), load32(y)), s[0] & 0xF, s[1] & 0xF));
      sumi = _mm256_add_epi32(sumi,
                              scale16(dot_u8_i8_pairs(_mm256_and_si256(_mm256_srli_epi16(q, 2), m3), load32(y + 32)),
                                      s[2] & 0xF, s[3] & 0xF));
      sumi = _mm256_add_epi32(sumi,
                              scale16(dot_u8_i8_pairs(_mm256_and_si256(_mm256_srli_epi16(q, 4), m3), load32(y + 64)),
                                      s[4] & 0xF, s[5] & 0xF));
      sumi = _mm256_add_epi32(sumi,
                              scale16(dot_u8_i8_pairs(_mm256_and_si256(_mm256_srli_epi16(q, 6), m3), load32(y + 96)),
                                      s[6] & 0xF, s[7] & 0xF));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(a[i].d) * b[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc) - hsum8(accm);
#else
  return dot_dequantised(GgmlType::Q2_K, w, ActivationQuant::Q8_K, xq, n);
#endif
}

float dot_q3_k_q8_k(const void* w, const void* xq, int64_t n) {
#ifdef KVEVICT_KERNELS_AVX2
  const auto* a = static_cast<const ggml::BlockQ3_K*>(w);
  const auto* b = static_cast<const BlockQ8_K*>(xq);
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // The 16 scales (ggml::q3k_scale, four at a time from the 12 packed bytes), minus 32.
    uint32_t wd[3];
    std::memcpy(wd, a[i].scales, 12);
    const uint32_t lo4 = 0x0F0F0F0Fu, lo2 = 0x03030303u;
    const uint32_t s4[4] = {(wd[0] & lo4) | ((wd[2] & lo2) << 4), (wd[1] & lo4) | (((wd[2] >> 2) & lo2) << 4),
                            ((wd[0] >> 4) & lo4) | (((wd[2] >> 4) & lo2) << 4),
                            ((wd[1] >> 4) & lo4) | (((wd[2] >> 6) & lo2) << 4)};
    int8_t sc[16];
    std::memcpy(sc, s4, 16);
    for (int8_t& v : sc) v = static_cast<int8_t>(v - 32);
    // The stored value is u = q + 4 (0..7): Σ sc (u - 4) y = Σ sc u y - 4 Σ sc bsum, in int32 lanes.
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    __m256i sumi =
        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, load32(b[i].bsums)), 2));
    const __m256i hm = load32(a[i].hmask);
    for (int h = 0; h < 2; ++h) {
      const __m256i q = load32(a[i].qs + 32 * h);
      for (int j = 0; j < 4; ++j) {
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one), 2);
        const __m256i u = _mm256_or_si256(low, high);
        const int s = 8 * h + 2 * j;
        sumi =
            _mm256_add_epi32(sumi, scale16(dot_u8_i8_pairs(u, load32(b[i].qs + 128 * h + 32 * j)), sc[s], sc[s + 1]));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(a[i].d) * b[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc);
#else
  return dot_dequantised(GgmlType::Q3_K, w, ActivationQuant::Q8_K, xq, n);
#endif
}

namespace {
#ifdef KVEVICT_KERNELS_AVX2
// Q4_K and Q5_K (qh != nullptr: the fifth bits).
template <class Block>
float dot_k4_like(const Block* a, const BlockQ8_K* b, int64_t n) {
  constexpr bool five = requires { a->qh; };
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  __m128 accm = _mm_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // The 8 scales and 8 mins from the 12 packed bytes (ggml::k4_scale_min, four at a time).
    uint32_t wd[3];
    std::memcpy(wd, a[i].scales, 12);
    const uint32_t lo6 = 0x3F3F3F3Fu, lo4 = 0x0F0F0F0Fu, lo2 = 0x03030303u;
    const uint32_t s4[4] = {wd[0] & lo6, (wd[2] & lo4) | (((wd[0] >> 6) & lo2) << 4), wd[1] & lo6,
                            ((wd[2] >> 4) & lo4) | (((wd[1] >> 6) & lo2) << 4)};
    uint8_t sc[16];  // sc[0..7] scales, sc[8..15] mins
    std::memcpy(sc, s4, 16);
    // Σ_j min_j (bsum_2j + bsum_2j+1): pairwise sums of the 16 bsums times the 8 mins.
    const __m128i bs_lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].bsums));
    const __m128i bs_hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].bsums + 8));
    const __m128i mins16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8)));
    const __m128i summ = _mm_madd_epi16(mins16, _mm_hadd_epi16(bs_lo, bs_hi));
    accm = _mm_fmadd_ps(_mm_set1_ps(_cvtsh_ss(a[i].dmin) * b[i].d), _mm_cvtepi32_ps(summ), accm);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (five) qh = load32(a[i].qh);
    __m256i sumi = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i q = load32(a[i].qs + 32 * p);
      __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (five) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p + 1), one), 4));
      }
      const __m256i plo =
          _mm256_madd_epi16(dot_u8_i8_pairs(lo, load32(b[i].qs + 64 * p)), _mm256_set1_epi16(sc[2 * p]));
      const __m256i phi =
          _mm256_madd_epi16(dot_u8_i8_pairs(hi, load32(b[i].qs + 64 * p + 32)), _mm256_set1_epi16(sc[2 * p + 1]));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(a[i].d) * b[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc) - hsum8(_mm256_set_m128(_mm_setzero_ps(), accm));
}
#endif
}  // namespace

float dot_q4_k_q8_k(const void* w, const void* xq, int64_t n) {
#ifdef KVEVICT_KERNELS_AVX2
  return dot_k4_like(static_cast<const ggml::BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(xq), n);
#else
  return dot_dequantised(GgmlType::Q4_K, w, ActivationQuant::Q8_K, xq, n);
#endif
}

float dot_q5_k_q8_k(const void* w, const void* xq, int64_t n) {
#ifdef KVEVICT_KERNELS_AVX2
  return dot_k4_like(static_cast<const ggml::BlockQ5_K*>(w), static_cast<const BlockQ8_K*>(xq), n);
#else
  return dot_dequantised(GgmlType::Q5_K, w, ActivationQuant::Q8_K, xq, n);
#endif
}

float dot_q6_k_q8_k(const void* w, const void* xq, int64_t n) {
#ifdef KVEVICT_KERNELS_AVX2
  const auto* a = static_cast<const ggml::BlockQ6_K*>(w);
  const auto* b = static_cast<const BlockQ8_K*>(xq);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const int8_t* sc = a[i].scales;
    // Stored u = q + 32 (0..63): Σ sc (u - 32) y = Σ sc u y - 32 Σ sc bsum, all in int32 lanes.
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    __m256i sumi = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load32(b[i].bsums)), 5);
    sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = load32(a[i].ql + 64 * h), l1 = load32(a[i].ql + 64 * h + 32), qh = load32(a[i].qh + 32 * h);
      const __m256i u[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4)),
          _mm256_or_si256(_mm256_and_si256(l1, m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4)),
      };
      for (int g = 0; g < 4; ++g) {
        const int s = 8 * h + 2 * g;
        sumi = _mm256_add_epi32(sumi,
                                scale16(dot_u8_i8_pairs(u[g], load32(b[i].qs + 128 * h + 32 * g)), sc[s], sc[s + 1]));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(a[i].d) * b[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc);
#else
  return dot_dequantised(GgmlType::Q6_K, w, ActivationQuant::Q8_K, xq, n);
#endif
}

float dot_quantised(GgmlType t, const void* w, const void* xq, int64_t n) {
  switch (t) {
    case GgmlType::Q8_0:
      return dot_q8_0_q8_0(w, xq, n);
    case GgmlType::Q4_0:
      return dot_q4_0_q8_0(w, xq, n);
    case GgmlType::Q4_1:
      return dot_q4_1_q8_0(w, xq, n);
    case GgmlType::Q5_0:
      return dot_q5_0_q8_0(w, xq, n);
    case GgmlType::Q5_1:
      return dot_q5_1_q8_0(w, xq, n);
    case GgmlType::Q2_K:
      return dot_q2_k_q8_k(w, xq, n);
    case GgmlType::Q3_K:
      return dot_q3_k_q8_k(w, xq, n);
    case GgmlType::Q4_K:
      return dot_q4_k_q8_k(w, xq, n);
    case GgmlType::Q5_K:
      return dot_q5_k_q8_k(w, xq, n);
    case GgmlType::Q6_K:
      return dot_q6_k_q8_k(w, xq, n);
    default:
      break;
  }
  throw Error("dot_quantised: " + ggml_type_name(static_cast<uint32_t>(t)) + " is not a quantised type");
}

float dot_quantised_ref(GgmlType t, const void* w, const void* xq, int64_t n) {
  return dot_dequantised(t, w, activation_quant(t), xq, n);
}

void matmul_jobs(std::span<const MatmulJob> jobs, const float* x, int64_t T, ThreadPool& pool, MatmulScratch& scratch,
                 bool allow_blas) {
  MatmulOptions options;
  options.allow_blas = allow_blas;
  matmul_jobs(jobs, x, T, pool, scratch, options);
}

void matmul_jobs(std::span<const MatmulJob> jobs, const float* x, int64_t T, ThreadPool& pool, MatmulScratch& scratch,
                 const MatmulOptions& options) {
  if (jobs.empty() || T <= 0) return;
  const int64_t cols = jobs[0].w.cols;
  bool need_q8_0 = false, need_q8_k = false;
  for (const MatmulJob& j : jobs) {
    if (j.w.cols != cols)
      throw Error(fmt::format("matmul: fused jobs need equal column counts ({} vs {})", j.w.cols, cols));
    const ActivationQuant aq = activation_quant(j.w.type);
    const int64_t blk = aq == ActivationQuant::Q8_K ? kQKK : kQK;
    if (aq != ActivationQuant::None && cols % blk != 0)
      throw Error(fmt::format("matmul: {} columns are not a multiple of the {} block size {}", cols,
                              ggml_type_name(static_cast<uint32_t>(j.w.type)), blk));
    need_q8_0 |= aq == ActivationQuant::Q8_0;
    need_q8_k |= aq == ActivationQuant::Q8_K;
  }
  const std::vector<KernelIsa> isas = compiled_kernel_isas();
  const bool tiled = !isas.empty();
  const KernelIsa isa = options.isa.value_or(tiled ? isas.back() : KernelIsa::Avx2);
  if (options.isa && std::find(isas.begin(), isas.end(), isa) == isas.end())
    throw Error(fmt::format("matmul: kernel variant {} is not compiled into this build", kernel_isa_name(isa)));
  const bool blas = options.allow_blas && T >= kBlasMinRows;
  if (blas) init_blas_once();
  const int64_t q_row_bytes = cols / kQK * static_cast<int64_t>(sizeof(BlockQ8));
  const int64_t qk_row_bytes = cols / kQKK * static_cast<int64_t>(sizeof(BlockQ8_K));
  if (need_q8_0 && !blas) {
    if (tiled) {
      pack_activations_q8_0(x, T, cols, scratch.act);
    } else {
      scratch.xq.resize(static_cast<size_t>(T * q_row_bytes));
      quantize_rows_q8_0(x, T, cols, scratch.xq.data());
    }
  }
  if (need_q8_k && !blas) {
    if (tiled) {
      pack_activations_q8_k(x, T, cols, scratch.act);
    } else {
      scratch.xqk.resize(static_cast<size_t>(T * qk_row_bytes));
      quantize_rows_q8_k(x, T, cols, scratch.xqk.data());
    }
  }
  scratch.act.T = T;
  scratch.act.cols = cols;

  // Work items: fixed chunks of rows of each job, concatenated.
  const int64_t chunk =
      options.row_chunk > 0 ? options.row_chunk
      : blas                ? kBlasTile
                            : std::max(kRowChunk, kChunkBytes / std::max<int64_t>(1, jobs[0].w.row_bytes));
  std::vector<int64_t> first_item(jobs.size() + 1, 0);
  for (size_t j = 0; j < jobs.size(); ++j) first_item[j + 1] = first_item[j] + (jobs[j].w.rows + chunk - 1) / chunk;
  const int64_t n_items = first_item.back();

  const auto body = [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> tile;
    size_t j = static_cast<size_t>(std::upper_bound(first_item.begin(), first_item.end(), i0) - first_item.begin() - 1);
    for (int64_t item = i0; item < i1; ++item) {
      while (item >= first_item[j + 1]) ++j;
      const WeightView& W = jobs[j].w;
      float* y = jobs[j].y;
      const int64_t r0 = (item - first_item[j]) * chunk, r1 = std::min(W.rows, r0 + chunk);
      if (blas) {
        const float* wt;
        if (W.type == GgmlType::F32) {
          wt = reinterpret_cast<const float*>(W.data + r0 * W.row_bytes);
        } else {
          tile.resize(static_cast<size_t>(chunk * cols));
          for (int64_t r = r0; r < r1; ++r)
            dequantize_row(W.type, W.data + r * W.row_bytes, tile.data() + (r - r0) * cols, cols);
          wt = tile.data();
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(T), static_cast<int>(r1 - r0),
                    static_cast<int>(cols), 1.0f, x, static_cast<int>(cols), wt, static_cast<int>(cols), 0.0f, y + r0,
                    static_cast<int>(W.rows));
        continue;
      }
      if (tiled && qgemm_supports(W.type)) {
        qgemm_rows(isa, W.type, W.data, W.row_bytes, r0, r1, scratch.act, y, W.rows);
        continue;
      }
      const ActivationQuant aq = activation_quant(W.type);
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* w = W.data + r * W.row_bytes;
        for (int64_t t = 0; t < T; ++t)
          y[t * W.rows + r] = aq == ActivationQuant::Q8_0   ? dot_quantised(W.type, w, scratch.xq.data() + t * q_row_bytes, cols)
                              : aq == ActivationQuant::Q8_K ? dot_quantised(W.type, w, scratch.xqk.data() + t * qk_row_bytes, cols)
                                                            : dot_row(W.type, w, x + t * cols, cols);
      }
    }
  };
  int64_t work = 0;
  for (const MatmulJob& j : jobs) work += j.w.rows * cols * T;
  // Threads claim items from a shared counter (not a static split): a thread that is
  // descheduled on a busy machine does not hold up the others. Which thread computes an item
  // never changes its result.
  std::atomic<int64_t> next{0};
  pool.parallel_for(
      pool.size(),
      [&](int64_t, int64_t) {
        for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n_items;
             i = next.fetch_add(1, std::memory_order_relaxed))
          body(i, i + 1);
      },
      work);
}

}  // namespace kvevict
