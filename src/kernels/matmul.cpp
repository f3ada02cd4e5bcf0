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

#include "util/error.h"
#include "util/simd.h"
#include "util/thread_pool.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVEVICT_KERNELS_AVX2 1
#endif

namespace kvevict {
namespace {

constexpr int64_t kQK = 32;
struct BlockQ8 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ4 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ8) == 34 && sizeof(BlockQ4) == 18, "ggml block sizes");

inline float half_to_float(uint16_t h) {
#ifdef KVEVICT_KERNELS_AVX2
  return _cvtsh_ss(h);
#else
  return fp16_to_fp32(h);
#endif
}

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

void quantize_rows_q8_0(const float* x, int64_t T, int64_t n, uint8_t* dst) {
  const int64_t row_bytes = n / kQK * static_cast<int64_t>(sizeof(BlockQ8));
  for (int64_t t = 0; t < T; ++t) quantize_row_q8_0(x + t * n, dst + t * row_bytes, n);
}

// Block sums are accumulated the way the AVX2 kernels do, so SIMD and scalar agree bit for bit:
// lane k (0..7) of a block's integer sum covers elements 4k..4k+3; each lane accumulates
// fma(d_w * d_x, lane sum, acc[k]) over the blocks; the 8 lanes are then added as
// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
namespace {
float reduce_lanes(const float* a) {
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
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n / kQK; ++i) accumulate_block_ref(acc, fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d), a[i].qs, b[i].qs);
  return reduce_lanes(acc);
}

float dot_q4_0_q8_0_ref(const void* w, const void* xq, int64_t n) {
  const auto* a = static_cast<const BlockQ4*>(w);
  const auto* b = static_cast<const BlockQ8*>(xq);
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n / kQK; ++i) {
    int8_t q[kQK];
    for (int j = 0; j < kQK / 2; ++j) {
      q[j] = static_cast<int8_t>((a[i].qs[j] & 0x0F) - 8);
      q[j + kQK / 2] = static_cast<int8_t>((a[i].qs[j] >> 4) - 8);
    }
    accumulate_block_ref(acc, fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d), q, b[i].qs);
  }
  return reduce_lanes(acc);
}

float dot_q8_0_q8_0(const void* w, const void* xq, int64_t n) {
#ifdef KVEVICT_KERNELS_AVX2
  const auto* a = static_cast<const BlockQ8*>(w);
  const auto* b = static_cast<const BlockQ8*>(xq);
  const int64_t nb = n / kQK;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs));
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(a[i].d) * _cvtsh_ss(b[i].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8x32(qa, qb)), acc);
  }
  return hsum8(acc);
#else
  return dot_q8_0_q8_0_ref(w, xq, n);
#endif
}

float dot_q4_0_q8_0(const void* w, const void* xq, int64_t n) {
#ifdef KVEVICT_KERNELS_AVX2
  const auto* a = static_cast<const BlockQ4*>(w);
  const auto* b = static_cast<const BlockQ8*>(xq);
  const int64_t nb = n / kQK;
  const __m256i mask = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[i].qs));
    // Low 128 bits: low nibbles (elements 0..15); high 128 bits: high nibbles (16..31).
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes);
    const __m256i qa = _mm256_sub_epi8(_mm256_and_si256(both, mask), eight);
    const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs));
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(a[i].d) * _cvtsh_ss(b[i].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8x32(qa, qb)), acc);
  }
  return hsum8(acc);
#else
  return dot_q4_0_q8_0_ref(w, xq, n);
#endif
}

void matmul_jobs(std::span<const MatmulJob> jobs, const float* x, int64_t T, ThreadPool& pool,
                 MatmulScratch& scratch, bool allow_blas) {
  if (jobs.empty() || T <= 0) return;
  const int64_t cols = jobs[0].w.cols;
  bool any_quant = false;
  for (const MatmulJob& j : jobs) {
    if (j.w.cols != cols)
      throw Error(fmt::format("matmul: fused jobs need equal column counts ({} vs {})", j.w.cols, cols));
    if (j.w.type == GgmlType::Q8_0 || j.w.type == GgmlType::Q4_0) {
      if (cols % kQK != 0) throw Error(fmt::format("matmul: {} columns are not a multiple of 32", cols));
      any_quant = true;
    }
  }
  const bool blas = allow_blas && T >= kBlasMinRows;
  if (blas) init_blas_once();
  const int64_t q_row_bytes = cols / kQK * static_cast<int64_t>(sizeof(BlockQ8));
  if (any_quant && !blas) {
    scratch.xq.resize(static_cast<size_t>(T * q_row_bytes));
    quantize_rows_q8_0(x, T, cols, scratch.xq.data());
  }
  const uint8_t* xq = scratch.xq.data();

  // Work items: fixed chunks of rows of each job, concatenated.
  const int64_t chunk = blas ? kBlasTile : std::max(kRowChunk, kChunkBytes / std::max<int64_t>(1, jobs[0].w.row_bytes));
  std::vector<int64_t> first_item(jobs.size() + 1, 0);
  for (size_t j = 0; j < jobs.size(); ++j)
    first_item[j + 1] = first_item[j] + (jobs[j].w.rows + chunk - 1) / chunk;
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
          for (int64_t r = r0; r < r1; ++r) dequantize_row(W.type, W.data + r * W.row_bytes, tile.data() + (r - r0) * cols, cols);
          wt = tile.data();
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(T), static_cast<int>(r1 - r0),
                    static_cast<int>(cols), 1.0f, x, static_cast<int>(cols), wt, static_cast<int>(cols), 0.0f,
                    y + r0, static_cast<int>(W.rows));
        continue;
      }
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* w = W.data + r * W.row_bytes;
        switch (W.type) {
          case GgmlType::Q8_0:
            for (int64_t t = 0; t < T; ++t) y[t * W.rows + r] = dot_q8_0_q8_0(w, xq + t * q_row_bytes, cols);
            break;
          case GgmlType::Q4_0:
            for (int64_t t = 0; t < T; ++t) y[t * W.rows + r] = dot_q4_0_q8_0(w, xq + t * q_row_bytes, cols);
            break;
          default:
            for (int64_t t = 0; t < T; ++t) y[t * W.rows + r] = dot_row(W.type, w, x + t * cols, cols);
        }
      }
    }
  };
  int64_t work = 0;
  for (const MatmulJob& j : jobs) work += j.w.rows * cols * T;
  // Threads claim items from a shared counter (not a static split): a thread that is
  // descheduled on a busy machine does not hold up the others. Which thread computes an item
  // never changes its result.
  std::atomic<int64_t> next{0};
  pool.parallel_for(pool.size(), [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n_items; i = next.fetch_add(1, std::memory_order_relaxed))
      body(i, i + 1);
  }, work);
}

}  // namespace kvevict
