// Google Benchmark micro-benchmarks of kvevict's kernels (not part of ctest):
//   make -C build kvevict_microbench && build/kvevict_microbench
// Matrix-vector products per weight type (bytes/s = weight bytes streamed), GQA attention over
// f32/f16 slots, and compaction of one (layer, KV head) block.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "engine/sampler.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/x16.h"
#include "kvcache/kv_cache.h"
#include "util/rng.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

std::vector<float> random_floats(int64_t n, uint64_t seed) {
  Rng rng(stream_id({seed, 99}));
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(2.0 * rng.uniform() - 1.0);
  return v;
}

// Args: weight type id, rows, cols, T (activation rows), threads.
void BM_Matmul(benchmark::State& st) {
  const auto type = static_cast<GgmlType>(st.range(0));
  const int64_t rows = st.range(1), cols = st.range(2), T = st.range(3);
  const int threads = static_cast<int>(st.range(4));
  const auto wf = random_floats(rows * cols, 1);
  const int64_t rb = ggml_row_bytes(type, cols);
  std::vector<uint8_t> w(static_cast<size_t>(rb * rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, wf.data() + r * cols, w.data() + r * rb, cols);
  const auto x = random_floats(T * cols, 2);
  std::vector<float> y(static_cast<size_t>(T * rows));
  ThreadPool pool(threads);
  MatmulScratch scratch;
  // Quantised weights get their interleaved copy, as the model loader gives them.
  const std::vector<uint8_t> x16 =
      x16_block_bytes(type) > 0 ? x16_pack(type, w.data(), rows, cols, rb) : std::vector<uint8_t>{};
  const MatmulJob job{{type, w.data(), rows, cols, rb, x16.empty() ? nullptr : x16.data()}, y.data()};
  for (auto _ : st) {
    matmul_jobs(std::span<const MatmulJob>(&job, 1), x.data(), T, pool, scratch);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * rb * rows);
}

void matmul_args(benchmark::internal::Benchmark* b) {
  // Cache-resident weights (128 rows x 2048): the kernels' compute speed per type, one thread.
  for (int type : {8, 2, 3, 6, 7, 10, 11, 12, 13, 14}) b->Args({type, 128, 2048, 1, 1});
  for (int type : {0, 1, 8, 2, 6, 12, 13, 14})
    for (int threads : {1, 2}) {
      b->Args({type, 2048, 2048, 1, threads});
      b->Args({type, 5632, 2048, 1, threads});
    }
  for (int T : {4, 16}) b->Args({8, 2048, 2048, T, 2});
}
BENCHMARK(BM_Matmul)->Apply(matmul_args)->ArgNames({"type", "rows", "cols", "T", "threads"})->UseRealTime();

// Integer kernels by type, activation rows T and variant, cache-resident weights (128 rows x
// 2048 columns, interleaved as at load), one thread; the activation quantisation is included.
// Args: weight type id, T, variant (-1: the scalar reference dot_quantised per (row, token);
// -2: dequantise + OpenBLAS sgemm, the prefill path before the integer kernels; else a
// KernelIsa). items/s = multiply-adds.
void BM_QuantMatmul(benchmark::State& st) {
  const auto type = static_cast<GgmlType>(st.range(0));
  const int64_t T = st.range(1), variant = st.range(2), rows = 128, cols = 2048;
  const auto isas = compiled_kernel_isas();
  if (variant >= 0 && std::find(isas.begin(), isas.end(), static_cast<KernelIsa>(variant)) == isas.end()) {
    st.SkipWithError("variant not compiled");
    return;
  }
  const auto wf = random_floats(rows * cols, 1);
  const int64_t rb = ggml_row_bytes(type, cols);
  std::vector<uint8_t> w(static_cast<size_t>(rb * rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, wf.data() + r * cols, w.data() + r * rb, cols);
  const std::vector<uint8_t> x16 = x16_pack(type, w.data(), rows, cols, rb);
  const WeightView W{type, w.data(), rows, cols, rb, x16.data()};
  const auto x = random_floats(T * cols, 2);
  std::vector<float> y(static_cast<size_t>(T * rows)), tile(static_cast<size_t>(rows * cols));
  const bool k = activation_quant(type) == ActivationQuant::Q8_K;
  const int64_t xrb = k ? cols / 256 * 292 : cols / 32 * 34;
  std::vector<uint8_t> xq(static_cast<size_t>(T * xrb));
  PackedActivations act;
  for (auto _ : st) {
    if (variant == -1) {
      if (k)
        quantize_rows_q8_k(x.data(), T, cols, xq.data());
      else
        quantize_rows_q8_0(x.data(), T, cols, xq.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t t = 0; t < T; ++t)
          y[static_cast<size_t>(t * rows + r)] = dot_quantised(type, w.data() + r * rb, xq.data() + t * xrb, cols);
    } else if (variant == -2) {
      for (int64_t r = 0; r < rows; ++r) dequantize_row(type, w.data() + r * rb, tile.data() + r * cols, cols);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(T), static_cast<int>(rows),
                  static_cast<int>(cols), 1.0f, x.data(), static_cast<int>(cols), tile.data(), static_cast<int>(cols),
                  0.0f, y.data(), static_cast<int>(rows));
    } else {
      if (k)
        pack_activations_q8_k(x.data(), T, cols, act);
      else
        pack_activations_q8_0(x.data(), T, cols, act);
      qgemm_groups(static_cast<KernelIsa>(variant), W, 0, rows / 16, act, y.data(), rows);
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * rows * cols * T);
}
BENCHMARK(BM_QuantMatmul)
    ->ArgsProduct({{8, 2, 6, 12, 13, 14, 3, 7, 10, 11}, {1, 4, 16, 64}, {-1, 0, 1, 2}})
    ->ArgNames({"type", "T", "variant"});
// Prefill-sized products against dequantise + sgemm (one thread; T = 128, 512).
BENCHMARK(BM_QuantMatmul)
    ->ArgsProduct({{8, 2, 6, 12, 14}, {128, 512}, {-2, 2}})
    ->ArgNames({"type", "T", "variant"});

// Args: slots, G (query heads per KV head), f16 (0/1). head_dim 64.
void BM_Attention(benchmark::State& st) {
  const int64_t n = st.range(0);
  const int G = static_cast<int>(st.range(1));
  const bool f16 = st.range(2) != 0;
  const int hd = 64;
  const auto q = random_floats(int64_t{G} * hd, 3), K = random_floats(n * hd, 4), V = random_floats(n * hd, 5);
  std::vector<uint16_t> Kh(K.size()), Vh(V.size());
  fp32_to_fp16_row(K.data(), Kh.data(), static_cast<int64_t>(K.size()));
  fp32_to_fp16_row(V.data(), Vh.data(), static_cast<int64_t>(V.size()));
  std::vector<float> out(static_cast<size_t>(G * hd));
  for (auto _ : st) {
    if (f16)
      attend_group(q.data(), G, Kh.data(), Vh.data(), n, hd, 0.125f, out.data());
    else
      attend_group(q.data(), G, K.data(), V.data(), n, hd, 0.125f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * n * hd * 2 * (f16 ? 2 : 4));
}
BENCHMARK(BM_Attention)->ArgsProduct({{1088, 8192}, {1, 3, 8}, {0, 1}})->ArgNames({"slots", "G", "f16"});

// Args: capacity (B + r), f16. Keeps every other slot of one block, then refills (untimed).
void BM_Compact(benchmark::State& st) {
  const int64_t cap = st.range(0);
  const KvShape shape{1, 1, 64, st.range(1) ? KvType::F16 : KvType::F32};
  SequenceKv kv(shape, cap);
  std::vector<int32_t> keep;
  for (int64_t i = 0; i < cap; i += 2) keep.push_back(static_cast<int32_t>(i));
  for (auto _ : st) {
    kv.set_length(0, cap);
    kv.compact(0, 0, keep);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_Compact)->ArgsProduct({{320, 1088, 4160}, {0, 1}})->ArgNames({"capacity", "f16"});

// Args: vocabulary size (SmolLM2 49,152; Qwen 151,936), top_k (0 = off). One draw at
// temperature 0.6, top-p 0.95 (the serve default of many clients) from near-flat logits (a
// random-weight model's: top-p keeps most of the vocabulary, the worst case for the sort).
void BM_SampleToken(benchmark::State& st) {
  const auto n = static_cast<size_t>(st.range(0));
  std::vector<float> logits(n);
  Rng rng(7);
  for (float& v : logits) v = static_cast<float>(rng.uniform() * 0.5);
  SamplerConfig cfg{.temperature = 0.6f, .top_p = 0.95f, .top_k = static_cast<int>(st.range(1))};
  uint64_t i = 0;
  for (auto _ : st) {
    Rng r(stream_id({1, i++}));
    benchmark::DoNotOptimize(sample_token(logits, cfg, r));
  }
}
BENCHMARK(BM_SampleToken)->ArgsProduct({{49152, 151936}, {0, 40}})->ArgNames({"vocab", "top_k"});

}  // namespace
}  // namespace kvevict
