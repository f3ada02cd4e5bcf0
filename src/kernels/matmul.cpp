// Matmul (see matmul.h): the integer kernels of kernels/qgemm.h for quantised weights, dot_row for
// float weights, OpenBLAS sgemm tiles for the prefill of float weights; the scalar reference of
// the integer products (dot_quantised).
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
#include "kernels/x16.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

constexpr int64_t kQK = ggml::kQK;
constexpr int64_t kQKK = ggml::kQKK;
using BlockQ8 = ggml::BlockQ8_0;
using ggml::BlockQ8_K;

// The largest run of rows a thread claims at once: about kChunkBytes of weights. Long runs keep
// each thread's weight stream sequential for the hardware prefetcher: with fixed 16-row (16 KiB)
// items two threads decoded SmolLM2-360M Q8_0 slower than one (26.1 vs 23.0 ms/token); with
// 256 KiB items two threads took 16.0 ms. Runs shrink towards the end of a call, to no less than
// kMinClaimBytes.
constexpr int64_t kChunkBytes = int64_t{1} << 18;
constexpr int64_t kMinClaimBytes = int64_t{1} << 15;
constexpr int64_t kBlasMinRows = 16;
constexpr int64_t kBlasTile = 64;  // weight rows per sgemm call

void init_blas_once() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Dequantised weights times dequantised activations in float32: an independent float reference
// (within the activation quantisation error of the integer products, not bit-identical to them).
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

}  // namespace

namespace {

// One weight block in integers, as the definition of matmul.h uses it: the quantised value of
// every element (the offset of the symmetric types removed), the integer scale and min of every
// sub-block, and the float block scales. Read through the block layouts of format/ggml_blocks.h
// (independently of the interleaved layout the kernels read).
struct IntBlock {
  enum Kind { Symmetric, Affine, Mins } kind = Symmetric;
  int n_sub = 1, sub = 32;  // sub-blocks and their elements
  int32_t q[256] = {};
  int32_t sc[16] = {}, mn[16] = {};
  float d = 0, m = 0;  // m: Q4_1/Q5_1 min, or the K-quants' dmin
};

IntBlock int_block(GgmlType t, const uint8_t* p) {
  IntBlock b;
  const auto legacy = [&](uint16_t d, const uint8_t* qs, const uint8_t* qh, int offset) {
    b.d = fp16_to_fp32(d);
    b.sc[0] = 1;
    uint32_t h = 0;
    if (qh) std::memcpy(&h, qh, 4);
    for (int j = 0; j < 16; ++j) {
      b.q[j] = (qs[j] & 0xF) + (qh ? static_cast<int>((h >> j) & 1) << 4 : 0) - offset;
      b.q[j + 16] = (qs[j] >> 4) + (qh ? static_cast<int>((h >> (j + 16)) & 1) << 4 : 0) - offset;
    }
  };
  switch (t) {
    case GgmlType::Q8_0: {
      const auto& a = *reinterpret_cast<const ggml::BlockQ8_0*>(p);
      b.d = fp16_to_fp32(a.d);
      b.sc[0] = 1;
      for (int e = 0; e < 32; ++e) b.q[e] = a.qs[e];
      break;
    }
    case GgmlType::Q4_0: {
      const auto& a = *reinterpret_cast<const ggml::BlockQ4_0*>(p);
      legacy(a.d, a.qs, nullptr, 8);
      break;
    }
    case GgmlType::Q5_0: {
      const auto& a = *reinterpret_cast<const ggml::BlockQ5_0*>(p);
      legacy(a.d, a.qs, a.qh, 16);
      break;
    }
    case GgmlType::Q4_1: {
      const auto& a = *reinterpret_cast<const ggml::BlockQ4_1*>(p);
      legacy(a.d, a.qs, nullptr, 0);
      b.kind = IntBlock::Affine;
      b.m = fp16_to_fp32(a.m);
      break;
    }
    case GgmlType::Q5_1: {
      const auto& a = *reinterpret_cast<const ggml::BlockQ5_1*>(p);
      legacy(a.d, a.qs, a.qh, 0);
      b.kind = IntBlock::Affine;
      b.m = fp16_to_fp32(a.m);
      break;
    }
    case GgmlType::Q2_K: {
      const auto& a = *reinterpret_cast<const ggml::BlockQ2_K*>(p);
      b.kind = IntBlock::Mins;
      b.n_sub = 16;
      b.sub = 16;
      b.d = fp16_to_fp32(a.d);
      b.m = fp16_to_fp32(a.dmin);
      for (int s = 0; s < 16; ++s) {
        b.sc[s] = a.scales[s] & 0xF;
        b.mn[s] = a.scales[s] >> 4;
      }
      for (int e = 0; e < 256; ++e) b.q[e] = (a.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      break;
    }
    case GgmlType::Q3_K: {
      const auto& a = *reinterpret_cast<const ggml::BlockQ3_K*>(p);
      b.n_sub = 16;
      b.sub = 16;
      b.d = fp16_to_fp32(a.d);
      for (int s = 0; s < 16; ++s) b.sc[s] = ggml::q3k_scale(a.scales, s);
      for (int e = 0; e < 256; ++e) {
        const int low = (a.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        const bool high = (a.hmask[e % 32] >> (e / 32)) & 1;
        b.q[e] = low - (high ? 0 : 4);
      }
      break;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      // Q4_K's fields are Q5_K's minus qh.
      const auto& a = *reinterpret_cast<const ggml::BlockQ4_K*>(p);
      const uint8_t* qs = t == GgmlType::Q4_K ? a.qs : reinterpret_cast<const ggml::BlockQ5_K*>(p)->qs;
      const uint8_t* qh = t == GgmlType::Q5_K ? reinterpret_cast<const ggml::BlockQ5_K*>(p)->qh : nullptr;
      b.kind = IntBlock::Mins;
      b.n_sub = 8;
      b.d = fp16_to_fp32(a.d);
      b.m = fp16_to_fp32(a.dmin);
      for (int s = 0; s < 8; ++s) {
        uint8_t sc, m;
        ggml::k4_scale_min(a.scales, s, sc, m);
        b.sc[s] = sc;
        b.mn[s] = m;
      }
      for (int e = 0; e < 256; ++e) {
        const uint8_t byte = qs[32 * (e / 64) + e % 32];
        b.q[e] = (e % 64 < 32 ? byte & 0xF : byte >> 4) + (qh ? ((qh[e % 32] >> (e / 32)) & 1) << 4 : 0);
      }
      break;
    }
    case GgmlType::Q6_K: {
      const auto& a = *reinterpret_cast<const ggml::BlockQ6_K*>(p);
      b.n_sub = 16;
      b.sub = 16;
      b.d = fp16_to_fp32(a.d);
      for (int s = 0; s < 16; ++s) b.sc[s] = a.scales[s];
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, g = (e % 128) / 32, l = e % 32;
        const uint8_t lb = a.ql[64 * h + 32 * (g % 2) + l];
        const int low = g < 2 ? (lb & 0xF) : (lb >> 4);
        const int high = (a.qh[32 * h + l] >> (2 * g)) & 3;
        b.q[e] = (low | (high << 4)) - 32;
      }
      break;
    }
    default:
      throw Error("dot_quantised: " + ggml_type_name(static_cast<uint32_t>(t)) + " is not a quantised type");
  }
  return b;
}

}  // namespace

float dot_quantised(GgmlType t, const void* w, const void* xq, int64_t n) {
  const bool k = activation_quant(t) == ActivationQuant::Q8_K;
  if (k && n % kQKK != 0) throw Error(fmt::format("dot_quantised: {} elements are not a multiple of 256", n));
  ggml_check_row_length(t, n, "dot_quantised");
  const int64_t blk = k ? kQKK : kQK, wbytes = ggml_block_bytes(t);
  float acc = 0.0f, accm = 0.0f;
  IntBlock::Kind kind = IntBlock::Symmetric;
  for (int64_t ib = 0; ib < n / blk; ++ib) {
    const IntBlock b = int_block(t, static_cast<const uint8_t*>(w) + ib * wbytes);
    kind = b.kind;
    int8_t xv[kQKK];
    float dx;
    if (k) {
      const BlockQ8_K& xb = static_cast<const BlockQ8_K*>(xq)[ib];
      std::memcpy(xv, xb.qs, kQKK);
      dx = xb.d;
    } else {
      const BlockQ8& xb = static_cast<const BlockQ8*>(xq)[ib];
      std::memcpy(xv, xb.qs, kQK);
      dx = fp16_to_fp32(xb.d);
    }
    // Exact integer sums (int64, then int32: every type's block sum fits).
    int64_t s = 0, summ = 0, xsum = 0;
    for (int j = 0; j < b.n_sub; ++j) {
      int64_t part = 0, xs = 0;
      for (int e = j * b.sub; e < (j + 1) * b.sub; ++e) {
        part += int64_t{b.q[e]} * xv[e];
        xs += xv[e];
      }
      s += b.sc[j] * part;
      summ += b.mn[j] * xs;
      xsum += xs;
    }
    acc = std::fma(b.d * dx, static_cast<float>(static_cast<int32_t>(s)), acc);
    if (b.kind == IntBlock::Affine) accm = std::fma(b.m * dx, static_cast<float>(static_cast<int32_t>(xsum)), accm);
    if (b.kind == IntBlock::Mins) accm = std::fma(b.m * dx, static_cast<float>(static_cast<int32_t>(summ)), accm);
  }
  return kind == IntBlock::Affine ? acc + accm : kind == IntBlock::Mins ? acc - accm : acc;
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
  bool need_q8_0 = false, need_q8_k = false, all_float = true;
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
    all_float &= aq == ActivationQuant::None;
  }
  const std::vector<KernelIsa> isas = compiled_kernel_isas();
  const bool kernels = !isas.empty();
  const KernelIsa isa = options.isa.value_or(kernels ? isas.back() : KernelIsa::Avx2);
  if (options.isa && std::find(isas.begin(), isas.end(), isa) == isas.end())
    throw Error(fmt::format("matmul: kernel variant {} is not compiled into this build", kernel_isa_name(isa)));
  // sgemm only for float weights: for quantised ones the integer kernels are faster than
  // dequantising tiles for sgemm (cache-resident 128 x 2048, one thread, T = 512: 107-147 vs
  // 53-60 G multiply-adds/s for Q8_0 / Q4_0 / Q5_0 / Q4_K / Q6_K, bench/kernels_bench.cpp), and
  // they keep prefill bit-identical to decode.
  const bool blas = options.allow_blas && T >= kBlasMinRows && all_float;
  if (blas) init_blas_once();
  const int64_t q_row_bytes = cols / kQK * static_cast<int64_t>(sizeof(BlockQ8));
  const int64_t qk_row_bytes = cols / kQKK * static_cast<int64_t>(sizeof(BlockQ8_K));
  if (need_q8_0) {
    if (kernels) {
      pack_activations_q8_0(x, T, cols, scratch.act);
    } else {
      scratch.xq.resize(static_cast<size_t>(T * q_row_bytes));
      quantize_rows_q8_0(x, T, cols, scratch.xq.data());
    }
  }
  if (need_q8_k) {
    if (kernels) {
      pack_activations_q8_k(x, T, cols, scratch.act);
    } else {
      scratch.xqk.resize(static_cast<size_t>(T * qk_row_bytes));
      quantize_rows_q8_k(x, T, cols, scratch.xqk.data());
    }
  }
  scratch.act.T = T;
  scratch.act.cols = cols;

  // Work: units of `unit` rows of each job (groups of 16 for the integer kernels, sgemm tiles,
  // or the test's row_chunk), concatenated over the jobs. Threads claim runs of consecutive
  // units from a shared counter: a thread that is descheduled on a busy machine does not hold up
  // the others. A claim takes 1 / (2 · threads) of what is left, between kMinClaimBytes and
  // kChunkBytes of weights: long sequential streams for the prefetcher first, small claims at
  // the end so the threads finish together. Which thread computes a row never changes its result.
  const int64_t want = options.row_chunk > 0 ? options.row_chunk : blas ? kBlasTile : kX16Rows;
  const int64_t unit = (want + kX16Rows - 1) / kX16Rows * kX16Rows;
  const bool guided = options.row_chunk <= 0 && !blas;
  const int64_t unit_bytes = unit * std::max<int64_t>(1, jobs[0].w.row_bytes);
  const int64_t max_claim = guided ? std::max<int64_t>(1, kChunkBytes / unit_bytes) : 1;
  const int64_t min_claim = guided ? std::clamp<int64_t>(kMinClaimBytes / unit_bytes, 1, max_claim) : 1;
  std::vector<int64_t> first_unit(jobs.size() + 1, 0);
  for (size_t j = 0; j < jobs.size(); ++j) first_unit[j + 1] = first_unit[j] + (jobs[j].w.rows + unit - 1) / unit;
  const int64_t n_units = first_unit.back();

  // Units [u0, u1) of job j (rows u0 * unit .. min(rows, u1 * unit)).
  const auto run_units = [&](size_t j, int64_t u0, int64_t u1) {
    const WeightView& W = jobs[j].w;
    float* y = jobs[j].y;
    const int64_t r0 = u0 * unit, r1 = std::min(W.rows, u1 * unit);
    if (blas) {
      thread_local std::vector<float> tile;
      for (int64_t t0 = r0; t0 < r1; t0 += unit) {
        const int64_t t1 = std::min(r1, t0 + unit);
        const float* wt;
        if (W.type == GgmlType::F32) {
          wt = reinterpret_cast<const float*>(W.data + t0 * W.row_bytes);
        } else {
          tile.resize(static_cast<size_t>(unit * cols));
          for (int64_t r = t0; r < t1; ++r)
            dequantize_row(W.type, W.data + r * W.row_bytes, tile.data() + (r - t0) * cols, cols);
          wt = tile.data();
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(T), static_cast<int>(t1 - t0),
                    static_cast<int>(cols), 1.0f, x, static_cast<int>(cols), wt, static_cast<int>(cols), 0.0f, y + t0,
                    static_cast<int>(W.rows));
      }
      return;
    }
    if (kernels && qgemm_supports(W.type)) {
      qgemm_groups(isa, W, r0 / kX16Rows, (r1 + kX16Rows - 1) / kX16Rows, scratch.act, y, W.rows);
      return;
    }
    const ActivationQuant aq = activation_quant(W.type);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* w = W.data + r * W.row_bytes;
      for (int64_t t = 0; t < T; ++t) {
        float& out = y[t * W.rows + r];
        if (aq == ActivationQuant::Q8_0)
          out = dot_quantised(W.type, w, scratch.xq.data() + t * q_row_bytes, cols);
        else if (aq == ActivationQuant::Q8_K)
          out = dot_quantised(W.type, w, scratch.xqk.data() + t * qk_row_bytes, cols);
        else
          out = dot_row(W.type, w, x + t * cols, cols);
      }
    }
  };
  const int n_threads = pool.size();
  std::atomic<int64_t> next{0};
  const auto claim = [&](int64_t& u0, int64_t& u1) {
    int64_t cur = next.load(std::memory_order_relaxed), n;
    do {
      if (cur >= n_units) return false;
      n = std::clamp<int64_t>((n_units - cur) / (2 * n_threads), min_claim, max_claim);
    } while (!next.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
    u0 = cur;
    u1 = std::min(n_units, cur + n);
    return true;
  };
  int64_t work = 0;
  for (const MatmulJob& j : jobs) work += j.w.rows * cols * T;
  pool.parallel_for(
      n_threads,
      [&](int64_t, int64_t) {
        int64_t u0, u1;
        while (claim(u0, u1)) {
          // A claim may span the end of one job and the start of the next.
          size_t j = static_cast<size_t>(std::upper_bound(first_unit.begin(), first_unit.end(), u0) - first_unit.begin() - 1);
          for (int64_t u = u0; u < u1; ++j) {
            const int64_t end = std::min(u1, first_unit[j + 1]);
            run_units(j, u - first_unit[j], end - first_unit[j]);
            u = end;
          }
        }
      },
      work);
}

}  // namespace kvevict
