// Kernels (kernels/matmul.h, kernels/attention.h) against scalar references, f16 KV storage,
// batched decode vs sequential decode, and synthetic GGUF models (model/synth.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <tuple>

#include "engine/engine.h"
#include "format/gguf_writer.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "model/synth.h"
#include "model_fixture.h"
#include "test_tmp.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

std::vector<float> random_floats(int64_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(stream_id({seed, 77}));
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>((2.0 * rng.uniform() - 1.0) * scale);
  return v;
}

// Weight rows of `type` from floats, stored at byte offset `misalign` of the returned buffer.
std::vector<uint8_t> make_weights(GgmlType type, const std::vector<float>& w, int64_t rows, int64_t cols,
                                  size_t misalign) {
  const int64_t rb = ggml_row_bytes(type, cols);
  std::vector<uint8_t> buf(misalign + static_cast<size_t>(rb * rows));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = buf.data() + misalign + r * rb;
    const float* src = w.data() + r * cols;
    quantize_row(type, src, dst, cols);
  }
  return buf;
}

TEST(Kernels, IntegerDotsApproximateTheFloatProduct) {
  // Expected: the scalar reference of the integer products (dot_quantised, which the kernels
  // equal bit for bit: qgemm_test) is within the activation quantisation error of the float
  // product of the dequantised weights (|x| <= 0.5, q step <= 0.5 / 127) for Q8_0 and Q4_0 rows
  // of 1..33 blocks at every legal offset: block structs hold a 16-bit scale, so rows start on
  // any even byte (a GGUF row of 34-byte blocks is 2-aligned); odd offsets would be undefined
  // behaviour, not a test.
  for (int64_t nb : {1, 2, 3, 7, 32, 33}) {
    const int64_t n = nb * 32;
    for (size_t mis : {size_t{0}, size_t{2}, size_t{6}}) {
      const auto w = random_floats(n, static_cast<uint64_t>(nb), 2.0f);
      const auto x = random_floats(n, static_cast<uint64_t>(nb) + 100, 0.5f);
      std::vector<uint8_t> xq(mis + static_cast<size_t>(nb * 34));
      quantize_rows_q8_0(x.data(), 1, n, xq.data() + mis);
      for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0}) {
        const auto wq = make_weights(type, w, 1, n, mis);
        std::vector<float> wd(static_cast<size_t>(n));
        dequantize_row(type, wq.data() + mis, wd.data(), n);
        double exact = 0, bound = 0;
        for (int64_t i = 0; i < n; ++i) {
          exact += double{wd[static_cast<size_t>(i)]} * x[static_cast<size_t>(i)];
          bound += std::abs(wd[static_cast<size_t>(i)]) * (0.5 / 127);
        }
        EXPECT_NEAR(dot_quantised(type, wq.data() + mis, xq.data() + mis, n), exact, bound + 1e-4)
            << ggml_type_name(static_cast<uint32_t>(type)) << " blocks " << nb << " offset " << mis;
      }
    }
  }
}

TEST(Kernels, ActivationQuantiserEqualsFormatQuantiser) {
  // Expected: the vectorised activation quantiser (kernels/activation_quant.h) writes the same
  // bytes as format's scalar Q8_0 quantiser, its definition, for 4 rows of 8 blocks: random
  // values, exact halves of the step (x = (k + 0.5) s with max 127 s), and an all-zero block.
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t T = 4, n = 256;
    auto x = random_floats(T * n, static_cast<uint64_t>(trial) + 300, 3.0f);
    const float s = std::ldexp(1.0f, trial % 9 - 4);
    for (int64_t j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = (static_cast<float>((j * 37) % 254 - 127) + 0.5f) * s;
    x[5] = 127.0f * s;
    for (int64_t j = 64; j < 96; ++j) x[static_cast<size_t>(j)] = 0.0f;
    const int64_t rb = ggml_row_bytes(GgmlType::Q8_0, n);
    std::vector<uint8_t> got(static_cast<size_t>(T * rb)), want(got.size());
    quantize_rows_q8_0(x.data(), T, n, got.data());
    for (int64_t t = 0; t < T; ++t) quantize_row_q8_0(x.data() + t * n, want.data() + t * rb, n);
    ASSERT_EQ(got, want) << "trial " << trial;
  }
  float dummy[48] = {};
  uint8_t out[64];
  EXPECT_THROW(quantize_rows_q8_0(dummy, 1, 48, out), Error);
}

struct MatmulCase {
  GgmlType type;
  int64_t rows, cols, T;
};

TEST(Kernels, MatmulMatchesReferenceAndIgnoresThreadCount) {
  // Expected: y = x · Wᵀ against a float64 reference on the dequantised weights (float types:
  // 1e-5 relative; quantised types: the Q8_0 activation error bound), and bit-identical results
  // for 1, 2 and 3 threads. Odd row counts (not a multiple of the 16-row chunk), T = 1, 3 and
  // 20 (T >= 16 takes the BLAS path when allowed, for float weights; quantised weights always
  // take the integer kernels, so their bound is the activation quantisation error either way).
  const std::vector<MatmulCase> cases = {
      {GgmlType::F32, 37, 24, 1},
      {GgmlType::F32, 37, 24, 3},
      {GgmlType::F32, 50, 40, 20},
      {GgmlType::F16, 19, 72, 3},
      {GgmlType::BF16, 17, 16, 2},
      {GgmlType::Q8_0, 37, 96, 1},
      {GgmlType::Q8_0, 70, 64, 20},
      {GgmlType::Q4_0, 33, 128, 3},
      {GgmlType::Q4_0, 40, 64, 17},
      // Above ThreadPool::kMinParallelWork, so 2 and 3 threads really split the rows.
      {GgmlType::Q8_0, 517, 512, 4},
      {GgmlType::Q4_0, 517, 512, 4},
      {GgmlType::F32, 1031, 1024, 1},
  };
  for (const MatmulCase& c : cases) {
    for (bool blas : {false, true}) {
      SCOPED_TRACE(::testing::Message() << ggml_type_name(static_cast<uint32_t>(c.type)) << " rows " << c.rows
                                        << " cols " << c.cols << " T " << c.T << " blas " << blas);
      const auto wf = random_floats(c.rows * c.cols, 5, 1.0f);
      const auto x = random_floats(c.T * c.cols, 6, 1.0f);
      const auto wb = make_weights(c.type, wf, c.rows, c.cols, 0);
      const WeightView W{c.type, wb.data(), c.rows, c.cols, ggml_row_bytes(c.type, c.cols)};
      std::vector<float> wd(static_cast<size_t>(c.rows * c.cols));
      for (int64_t r = 0; r < c.rows; ++r)
        dequantize_row(c.type, W.data + r * W.row_bytes, wd.data() + r * c.cols, c.cols);
      std::vector<std::vector<float>> ys;
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        MatmulScratch scratch;
        std::vector<float> y(static_cast<size_t>(c.T * c.rows));
        const MatmulJob job{W, y.data()};
        matmul_jobs(std::span<const MatmulJob>(&job, 1), x.data(), c.T, pool, scratch, blas);
        ys.push_back(y);
      }
      EXPECT_EQ(ys[0], ys[1]);
      EXPECT_EQ(ys[0], ys[2]);
      const bool quant = c.type == GgmlType::Q8_0 || c.type == GgmlType::Q4_0;
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t r = 0; r < c.rows; ++r) {
          double ref = 0, mag = 0;
          for (int64_t i = 0; i < c.cols; ++i) {
            ref += double{wd[static_cast<size_t>(r * c.cols + i)]} * x[static_cast<size_t>(t * c.cols + i)];
            mag += std::abs(wd[static_cast<size_t>(r * c.cols + i)]);
          }
          const double tol = quant ? mag * (1.0 / 127) + 1e-4 : 1e-5 * (mag + 1);
          EXPECT_NEAR(ys[0][static_cast<size_t>(t * c.rows + r)], ref, tol) << "t " << t << " r " << r;
        }
    }
  }
}

TEST(Kernels, QuantisedMatmulEqualsScalarReference) {
  // Expected: the matmul's integer kernels give every output bit-identical to the scalar
  // reference dot_quantised on the Q8_0-quantised activations.
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    const int64_t rows = 46, cols = 96, T = 3;
    const auto wb = make_weights(type, random_floats(rows * cols, 10), rows, cols, 0);
    const WeightView W{type, wb.data(), rows, cols, ggml_row_bytes(type, cols)};
    const auto x = random_floats(T * cols, 11);
    std::vector<uint8_t> xq(static_cast<size_t>(T * ggml_row_bytes(GgmlType::Q8_0, cols)));
    quantize_rows_q8_0(x.data(), T, cols, xq.data());
    ThreadPool pool(1);
    MatmulScratch scratch;
    std::vector<float> y(static_cast<size_t>(T * rows));
    const MatmulJob job{W, y.data()};
    matmul_jobs(std::span<const MatmulJob>(&job, 1), x.data(), T, pool, scratch);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* xr = xq.data() + t * ggml_row_bytes(GgmlType::Q8_0, cols);
        const float want = dot_quantised(type, W.row(r), xr, cols);
        EXPECT_EQ(y[static_cast<size_t>(t * rows + r)], want)
            << ggml_type_name(static_cast<uint32_t>(type)) << " t " << t << " r " << r;
      }
  }
}

TEST(Kernels, MatmulRowsDoNotDependOnBatch) {
  // Expected: without BLAS, row t of a T-row product equals the 1-row product of x[t] exactly
  // (what makes batched decode equal sequential decode).
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0}) {
    const int64_t rows = 45, cols = 64, T = 5;
    const auto wb = make_weights(type, random_floats(rows * cols, 8), rows, cols, 0);
    const WeightView W{type, wb.data(), rows, cols, ggml_row_bytes(type, cols)};
    const auto x = random_floats(T * cols, 9);
    ThreadPool pool(2);
    MatmulScratch scratch;
    std::vector<float> all(static_cast<size_t>(T * rows)), one(static_cast<size_t>(rows));
    MatmulJob job{W, all.data()};
    matmul_jobs(std::span<const MatmulJob>(&job, 1), x.data(), T, pool, scratch);
    for (int64_t t = 0; t < T; ++t) {
      job.y = one.data();
      matmul_jobs(std::span<const MatmulJob>(&job, 1), x.data() + t * cols, 1, pool, scratch);
      EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + t * rows))
          << ggml_type_name(static_cast<uint32_t>(type));
    }
  }
}

TEST(Kernels, MatmulRejectsMismatchedJobs) {
  const std::vector<uint8_t> b(64 * 34);
  ThreadPool pool(1);
  MatmulScratch scratch;
  std::vector<float> y(64), x(64);
  const MatmulJob jobs[2] = {{{GgmlType::F32, b.data(), 2, 8, 32}, y.data()},
                             {{GgmlType::F32, b.data(), 2, 16, 64}, y.data()}};
  EXPECT_THROW(matmul_jobs(jobs, x.data(), 1, pool, scratch), Error);
}

// float64 softmax attention of one head.
std::vector<double> naive_attention(const float* q, const std::vector<float>& K, const std::vector<float>& V, int64_t n,
                                    int hd, float scale) {
  std::vector<double> s(static_cast<size_t>(n)), out(static_cast<size_t>(hd), 0.0);
  double m = -1e300, l = 0;
  for (int64_t j = 0; j < n; ++j) {
    double d = 0;
    for (int i = 0; i < hd; ++i) d += double{q[i]} * K[static_cast<size_t>(j * hd + i)];
    s[static_cast<size_t>(j)] = d * scale;
    m = std::max(m, s[static_cast<size_t>(j)]);
  }
  for (int64_t j = 0; j < n; ++j) l += std::exp(s[static_cast<size_t>(j)] - m);
  for (int64_t j = 0; j < n; ++j)
    for (int i = 0; i < hd; ++i)
      out[static_cast<size_t>(i)] += std::exp(s[static_cast<size_t>(j)] - m) / l * V[static_cast<size_t>(j * hd + i)];
  return out;
}

TEST(Kernels, AttentionMatchesFloat64Softmax) {
  // Expected: the tiled online-softmax kernel (f32 and f16 storage, G query heads at once) and
  // the two-pass probability kernel agree with a float64 softmax to 2e-6 (f32) on tile edges
  // (1, 31, 32, 33, 100 slots) and head dims that are not multiples of 8. f16 storage is
  // compared against the float64 result on the f16-rounded keys/values (same bound).
  for (int hd : {8, 12, 64}) {
    for (int64_t n : {1, 31, 32, 33, 100}) {
      for (int G : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << "hd " << hd << " n " << n << " G " << G);
        const auto q = random_floats(int64_t{G} * hd, 11, 2.0f);
        auto K = random_floats(n * hd, 12, 2.0f), V = random_floats(n * hd, 13);
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        std::vector<uint16_t> Kh(K.size()), Vh(V.size());
        fp32_to_fp16_row(K.data(), Kh.data(), static_cast<int64_t>(K.size()));
        fp32_to_fp16_row(V.data(), Vh.data(), static_cast<int64_t>(V.size()));
        std::vector<float> Kr(K.size()), Vr(V.size());
        fp16_to_fp32_row(Kh.data(), Kr.data(), static_cast<int64_t>(K.size()));
        fp16_to_fp32_row(Vh.data(), Vr.data(), static_cast<int64_t>(V.size()));
        std::vector<float> out(static_cast<size_t>(G * hd)), outh(out.size()), outp(static_cast<size_t>(hd)),
            probs(static_cast<size_t>(n));
        attend_group(q.data(), G, K.data(), V.data(), n, hd, scale, out.data());
        attend_group(q.data(), G, Kh.data(), Vh.data(), n, hd, scale, outh.data());
        for (int g = 0; g < G; ++g) {
          const auto ref = naive_attention(q.data() + g * hd, K, V, n, hd, scale);
          const auto refh = naive_attention(q.data() + g * hd, Kr, Vr, n, hd, scale);
          attend_probs(q.data() + g * hd, K.data(), V.data(), n, hd, scale, outp.data(), probs.data());
          double psum = 0;
          for (float p : probs) psum += p;
          EXPECT_NEAR(psum, 1.0, 1e-5);
          for (int i = 0; i < hd; ++i) {
            EXPECT_NEAR(out[static_cast<size_t>(g * hd + i)], ref[static_cast<size_t>(i)], 2e-6);
            EXPECT_NEAR(outp[static_cast<size_t>(i)], ref[static_cast<size_t>(i)], 2e-6);
            EXPECT_NEAR(outh[static_cast<size_t>(g * hd + i)], refh[static_cast<size_t>(i)], 2e-6);
          }
        }
      }
    }
  }
}

TEST(Kernels, SplitAttentionMergesToTheWholeRange) {
  // Expected: partial softmaxes over chunks [0, 512), [512, 1024), [1024, 1500) merged by
  // attend_merge agree with the one-pass kernel and the float64 softmax to 2e-6; merging a
  // single chunk reproduces attend_group bit for bit.
  const int hd = 64, G = 3;
  const int64_t n = 1500;
  const auto q = random_floats(G * hd, 31, 2.0f), K = random_floats(n * hd, 32, 2.0f), V = random_floats(n * hd, 33);
  std::vector<float> whole(G * hd), merged(G * hd), acc(3 * G * hd), m(3 * G), l(3 * G);
  attend_group(q.data(), G, K.data(), V.data(), n, hd, 0.125f, whole.data());
  const int64_t bounds[4] = {0, 512, 1024, n};
  for (int c = 0; c < 3; ++c)
    attend_group_partial(q.data(), G, K.data() + bounds[c] * hd, V.data() + bounds[c] * hd, bounds[c + 1] - bounds[c],
                         hd, 0.125f, acc.data() + c * G * hd, m.data() + c * G, l.data() + c * G);
  attend_merge(3, G, hd, acc.data(), G * hd, m.data(), l.data(), merged.data());
  for (int g = 0; g < G; ++g) {
    const auto ref = naive_attention(q.data() + g * hd, K, V, n, hd, 0.125f);
    for (int d = 0; d < hd; ++d) {
      EXPECT_NEAR(merged[static_cast<size_t>(g * hd + d)], ref[static_cast<size_t>(d)], 2e-6);
      EXPECT_NEAR(whole[static_cast<size_t>(g * hd + d)], ref[static_cast<size_t>(d)], 2e-6);
    }
  }
  attend_group_partial(q.data(), G, K.data(), V.data(), 300, hd, 0.125f, acc.data(), m.data(), l.data());
  attend_merge(1, G, hd, acc.data(), 0, m.data(), l.data(), merged.data());
  attend_group(q.data(), G, K.data(), V.data(), 300, hd, 0.125f, whole.data());
  EXPECT_EQ(merged, whole);
}

TEST(Kernels, FastExpRelativeError) {
  // Expected: relative error < 3e-7 (about 2 float ulps) against std::exp over [-87, 88].
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 0.00731) {
    const double e = std::exp(x);
    worst = std::max(
        worst, std::abs(fast_exp(static_cast<float>(x)) - std::exp(static_cast<double>(static_cast<float>(x)))) / e);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(fast_exp(-1000.0f) < 1e-37f, true);
}

TEST(KvCacheF16, StoresHalvesAndCompactsInPlace) {
  // Expected: an f16 cache takes half the key/value bytes; stored rows read back as the fp16
  // rounding of what was stored (float32 view through the const mirror); compaction moves rows
  // within the same allocation.
  const KvShape s32{2, 2, 16, KvType::F32}, s16{2, 2, 16, KvType::F16};
  SequenceKv a(s32, 10), b(s16, 10);
  EXPECT_EQ(b.allocated_bytes() - 2 * 2 * 10 * 4, (a.allocated_bytes() - 2 * 2 * 10 * 4) / 2);
  const auto rows = random_floats(10 * 16, 21);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h) {
      for (int64_t slot = 0; slot < 10; ++slot) {
        b.store(l, h, slot, rows.data() + slot * 16, rows.data() + (9 - slot) * 16);
        b.positions(l, h)[slot] = static_cast<int32_t>(slot * 3);
      }
      b.set_length(l, 10);
    }
  const SequenceKv& cb = b;
  const float* k = cb.keys(1, 1);
  for (int i = 0; i < 10 * 16; ++i) EXPECT_EQ(k[i], fp16_to_fp32(fp32_to_fp16(rows[static_cast<size_t>(i)])));
  EXPECT_THROW(b.keys(0, 0), Error);  // mutable float access needs f32
  EXPECT_THROW(a.keys_f16(0, 0), Error);
  const uint16_t* before = b.keys_f16(1, 0);
  const std::vector<int32_t> keep = {0, 2, 3, 9};
  b.compact(1, 0, keep);
  EXPECT_EQ(b.keys_f16(1, 0), before);
  for (size_t j = 0; j < keep.size(); ++j) {
    EXPECT_EQ(b.positions(1, 0)[j], keep[j] * 3);
    for (int i = 0; i < 16; ++i)
      EXPECT_EQ(b.values_f16(1, 0)[j * 16 + static_cast<size_t>(i)],
                fp32_to_fp16(rows[static_cast<size_t>((9 - keep[j]) * 16 + i)]));
  }
  EXPECT_THROW(parse_kv_type("f8"), Error);
}

TEST(KvCacheF16, LogitsCloseToF32Cache) {
  KVEVICT_REQUIRE_MODEL(m);
  // Expected: decoding with an f16 cache stays within 1e-2 of the largest |logit| of the f32
  // cache run (fp16 keeps 11 significant bits of each key and value), with the same argmax on
  // at least 95% of steps; under eviction (random, B = 48) the caches keep the same slots
  // (the keep-sets do not depend on the cached values).
  const auto ids = m->tokenizer().encode(
      "Once upon a time, there was a little girl named Lily. She liked to play outside with her dog. One day, "
      "they went to the park and saw a big red ball. Lily was very happy and they played all day long.",
      true);
  Engine e32(*m, 2, KvType::F32), e16(*m, 2, KvType::F16);
  EvictionConfig cfg;
  cfg.budget = 24;
  cfg.recent = 8;
  for (const std::string pol : {"full", "random"}) {
    const Policy p = make_policy(pol);
    auto a = e32.new_sequence(0, p, cfg, 4, static_cast<int64_t>(ids.size()));
    auto b = e16.new_sequence(0, p, cfg, 4, static_cast<int64_t>(ids.size()));
    std::vector<float> la, lb;
    e32.prefill(*a, std::span<const int32_t>(ids).first(4), la);
    e16.prefill(*b, std::span<const int32_t>(ids).first(4), lb);
    int same_argmax = 0, steps = 0;
    for (size_t t = 4; t < ids.size(); ++t) {
      e32.decode(*a, ids[t], la);
      e16.decode(*b, ids[t], lb);
      float scale = 0, worst = 0;
      for (size_t i = 0; i < la.size(); ++i) {
        scale = std::max(scale, std::abs(la[i]));
        worst = std::max(worst, std::abs(la[i] - lb[i]));
      }
      EXPECT_LE(worst, 1e-2 * scale) << pol << " step " << t;
      same_argmax +=
          std::max_element(la.begin(), la.end()) - la.begin() == std::max_element(lb.begin(), lb.end()) - lb.begin();
      ++steps;
      EXPECT_EQ(a->kv.length(0), b->kv.length(0));
      EXPECT_TRUE(std::equal(a->kv.positions(0, 0), a->kv.positions(0, 0) + a->kv.length(0), b->kv.positions(0, 0)));
    }
    EXPECT_GE(same_argmax, steps * 95 / 100);
    if (pol == "random") {
      EXPECT_GT(a->stats.rounds, 0);
    }
  }
}

TEST(BatchedDecode, EqualsSequentialDecodeWithJoinAndLeave) {
  KVEVICT_REQUIRE_MODEL(m);
  // Expected: decode_batch gives every sequence bit-identical logits and caches to decode()
  // of that sequence alone, while sequences join (after their own prefill) and leave between
  // steps, with different policies and budgets (random B = 32, recency B = 40, full), and in an
  // f16 cache.
  for (KvType kvt : {KvType::F32, KvType::F16}) {
    Engine batched(*m, 2, kvt), single(*m, 3, kvt);
    const std::vector<std::string> policies = {"random", "recency", "full", "random"};
    const std::vector<int64_t> budgets = {32, 40, 0, 48};
    const int n = 4, steps = 90;
    std::vector<std::unique_ptr<Sequence>> A, S;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<float> la, ls;
    for (int i = 0; i < n; ++i) {
      EvictionConfig cfg;
      cfg.budget = budgets[static_cast<size_t>(i)];
      cfg.recent = 8;
      cfg.seed = 5;
      const Policy p = make_policy(policies[static_cast<size_t>(i)]);
      A.push_back(batched.new_sequence(static_cast<uint64_t>(i), p, cfg, 3 + i, steps));
      S.push_back(single.new_sequence(static_cast<uint64_t>(i), p, cfg, 3 + i, steps));
      std::vector<int32_t> pr;
      for (int j = 0; j < 3 + i; ++j)
        pr.push_back(static_cast<int32_t>(1 + (j * 37 + i * 11) % (m->config().n_vocab - 1)));
      prompts.push_back(pr);
    }
    std::vector<int32_t> next(static_cast<size_t>(n), 0);
    std::vector<bool> joined(static_cast<size_t>(n), false);
    for (int step = 0; step < steps; ++step) {
      // Sequence i joins at step 7 * i; sequence 1 leaves at step 60.
      std::vector<Sequence*> batch;
      std::vector<int32_t> toks;
      for (int i = 0; i < n; ++i) {
        if (step == 7 * i) {
          batched.prefill(*A[static_cast<size_t>(i)], prompts[static_cast<size_t>(i)], la);
          single.prefill(*S[static_cast<size_t>(i)], prompts[static_cast<size_t>(i)], ls);
          ASSERT_EQ(la, ls);
          next[static_cast<size_t>(i)] = static_cast<int32_t>(std::max_element(la.begin(), la.end()) - la.begin());
          joined[static_cast<size_t>(i)] = true;
        }
        if (joined[static_cast<size_t>(i)] && !(i == 1 && step >= 60)) {
          batch.push_back(A[static_cast<size_t>(i)].get());
          toks.push_back(next[static_cast<size_t>(i)]);
        }
      }
      batched.decode_batch(batch, toks, la);
      const int64_t V = m->config().n_vocab;
      for (size_t j = 0; j < batch.size(); ++j) {
        const auto i = static_cast<size_t>(batch[j]->id);
        single.decode(*S[i], toks[j], ls);
        ASSERT_TRUE(std::equal(ls.begin(), ls.end(), la.begin() + static_cast<int64_t>(j) * V))
            << "step " << step << " sequence " << i;
        next[i] = static_cast<int32_t>(std::max_element(ls.begin(), ls.end()) - ls.begin());
        ASSERT_EQ(A[i]->kv.length(0), S[i]->kv.length(0));
        ASSERT_EQ(A[i]->stats.rounds, S[i]->stats.rounds);
        for (int l = 0; l < m->config().n_layers; ++l)
          for (int h = 0; h < m->config().n_kv_heads; ++h)
            ASSERT_TRUE(std::equal(A[i]->kv.positions(l, h), A[i]->kv.positions(l, h) + A[i]->kv.length(l),
                                   S[i]->kv.positions(l, h)));
      }
    }
    EXPECT_GT(A[0]->stats.rounds, 0);
    const std::vector<Sequence*> twice = {A[0].get(), A[0].get()};
    const std::vector<int32_t> t2 = {1, 2};
    EXPECT_THROW(batched.decode_batch(twice, t2, la), Error);
    const std::vector<int32_t> t1 = {1};
    EXPECT_THROW(batched.decode_batch(twice, t1, la), Error);
  }
}

TEST(BatchedDecode, LongContextSplitAttentionMatchesPrefill) {
  KVEVICT_REQUIRE_MODEL(m);
  // Expected: past 512 slots decode attention is split into chunks merged afterwards; the
  // decoded logits still match a one-pass prefill of the same tokens (1e-4 of the largest
  // |logit|), and a batch of two long sequences equals their sequential decode exactly.
  std::vector<int32_t> ids;
  for (int i = 0; i < 700; ++i) ids.push_back(static_cast<int32_t>(1 + (i * 131 + i / 7) % (m->config().n_vocab - 1)));
  Engine engine(*m, 2), other(*m, 1);
  auto full = engine.new_sequence(0, make_policy("full"), {}, 700, 0);
  std::vector<float> all, la, lb;
  engine.prefill(*full, ids, all, true);
  auto a = engine.new_sequence(1, make_policy("full"), {}, 600, 100);
  auto b = engine.new_sequence(2, make_policy("full"), {}, 650, 100);
  auto a1 = other.new_sequence(1, make_policy("full"), {}, 600, 100);
  engine.prefill(*a, std::span<const int32_t>(ids).first(600), la);
  engine.prefill(*b, std::span<const int32_t>(ids).first(650), lb);
  other.prefill(*a1, std::span<const int32_t>(ids).first(600), lb);
  const int64_t V = m->config().n_vocab;
  for (size_t t = 600; t < 650; ++t) {
    std::vector<Sequence*> batch = {a.get(), b.get()};
    const std::vector<int32_t> toks = {ids[t], ids[t + 50]};
    engine.decode_batch(batch, toks, la);
    other.decode(*a1, ids[t], lb);
    ASSERT_TRUE(std::equal(lb.begin(), lb.end(), la.begin())) << "token " << t;
    float scale = 0, worst = 0;
    for (int64_t i = 0; i < V; ++i) {
      const float ref = all[static_cast<size_t>(static_cast<int64_t>(t) * V + i)];
      scale = std::max(scale, std::abs(ref));
      worst = std::max(worst, std::abs(la[static_cast<size_t>(i)] - ref));
    }
    EXPECT_LE(worst, 1e-4 * scale) << "token " << t;
  }
}

TEST(SynthGguf, WritesLoadableModelsOfEveryType) {
  // Expected: `tiny` written in each type loads through Model::load with the declared
  // shape, tokenizes through its byte vocabulary, and prefill + decode give finite logits;
  // the same seed gives the same file, another seed a different one.
  // K-quants need rows of whole 256-element super-blocks (else they fall back, see
  // SynthTypes), so they are written at a 256-wide variant of `tiny`; "wq" names the type of
  // attn_q, which no mix promotes.
  const std::string dir = test::tmp_dir();
  const SynthShape tiny = synth_shape("tiny");
  SynthShape tiny256 = tiny;
  tiny256.name = "tiny-256";
  tiny256.dim = 256;
  tiny256.hidden_dim = 512;
  const std::vector<std::tuple<std::string, SynthShape, std::string>> cases = {
      {"f32", tiny, "f32"},      {"f16", tiny, "f16"},        {"bf16", tiny, "bf16"},      {"q8_0", tiny, "q8_0"},
      {"q4_0", tiny, "q4_0"},    {"q4_1", tiny, "q4_1"},      {"q5_0", tiny, "q5_0"},      {"q5_1", tiny, "q5_1"},
      {"q2_k", tiny256, "q2_k"}, {"q3_k", tiny256, "q3_k"},   {"q4_k", tiny256, "q4_k"},   {"q5_k", tiny256, "q5_k"},
      {"q6_k", tiny256, "q6_k"}, {"q4_k_m", tiny256, "q4_k"}, {"q5_k_m", tiny256, "q5_k"}, {"q4_k_m", tiny, "q5_0"}};
  for (const auto& [type, shape, wq] : cases) {
    SCOPED_TRACE(type + " " + shape.name);
    const std::string path = dir + "/synth_" + type + ".gguf";
    write_synth_gguf(shape, parse_synth_types(type), 7, path);
    const auto m = Model::load(path);
    EXPECT_EQ(m->config().n_vocab, shape.n_vocab);
    EXPECT_EQ(m->config().dim, shape.dim);
    EXPECT_EQ(m->config().n_kv_heads, shape.n_kv_heads);
    EXPECT_EQ(m->config().hidden_dim, shape.hidden_dim);
    EXPECT_EQ(ggml_type_name(static_cast<uint32_t>(m->weight_type())), wq);
    const auto ids = m->tokenizer().encode("héllo", true);
    EXPECT_EQ(m->tokenizer().decode(ids), " héllo");
    Engine engine(*m, 2);
    auto seq = engine.new_sequence(0, make_policy("full"), {}, static_cast<int64_t>(ids.size()), 4);
    std::vector<float> logits;
    engine.prefill(*seq, ids, logits);
    engine.decode(*seq, 5, logits);
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  }
  const SynthShape shape = tiny;
  const std::string a = dir + "/s1.gguf", b = dir + "/s2.gguf", c = dir + "/s3.gguf";
  write_synth_gguf(shape, GgmlType::Q8_0, 1, a);
  write_synth_gguf(shape, GgmlType::Q8_0, 1, b);
  write_synth_gguf(shape, GgmlType::Q8_0, 2, c);
  const auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_EQ(slurp(a), slurp(b));
  EXPECT_NE(slurp(a), slurp(c));
  EXPECT_THROW(synth_shape("gpt5"), Error);
  EXPECT_THROW(parse_synth_type("iq2_xxs"), Error);
}

TEST(SynthGguf, RealShapesHaveTheirParameterCounts) {
  // Expected: parameter counts of the published models (SmolLM2-135M: 134.5M; SmolLM2-360M:
  // 361.8M; TinyLlama-1.1B: 1100.0M), which pins every dimension of the table.
  EXPECT_NEAR(static_cast<double>(synth_shape("smollm2-135m").n_params()) / 1e6, 134.5, 0.1);
  EXPECT_NEAR(static_cast<double>(synth_shape("smollm2-360m").n_params()) / 1e6, 361.8, 0.1);
  EXPECT_NEAR(static_cast<double>(synth_shape("tinyllama-1.1b").n_params()) / 1e6, 1100.0, 0.1);
}

TEST(GgufWriter, RoundTripsMetadataAndTensors) {
  // Expected: every value written reads back through GgufFile with its type; tensor data sits at
  // aligned offsets; repeated keys and bad tensors are errors.
  const std::string path = test::tmp_path("writer.gguf");
  GgufWriter w(64);
  w.add_string("general.architecture", "test");
  w.add_uint32("a.u32", 7);
  w.add_int32("a.i32", -7);
  w.add_uint64("a.u64", 1ull << 40);
  w.add_float32("a.f32", 0.25f);
  w.add_bool("a.bool", true);
  w.add_string_array("a.strs", {"x", "", "yz"});
  w.add_float32_array("a.fl", {1.5f, -2.0f});
  w.add_int32_array("a.ints", {3, -4});
  EXPECT_THROW(w.add_uint32("a.u32", 1), Error);
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  w.add_tensor("t.f32", {3, 2}, GgmlType::F32,
               [&](uint8_t* d, int64_t n) { std::memcpy(d, v.data(), static_cast<size_t>(n)); });
  w.add_tensor("t.q8", {32}, GgmlType::Q8_0, [&](uint8_t* d, int64_t n) { std::memset(d, 1, static_cast<size_t>(n)); });
  EXPECT_THROW(w.add_tensor("t.bad", {33}, GgmlType::Q8_0, nullptr), Error);
  EXPECT_THROW(w.add_tensor("t.f32", {1}, GgmlType::F32, nullptr), Error);
  w.write(path);
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.get_string("general.architecture"), "test");
  EXPECT_EQ(f.get_uint("a.u32"), 7u);
  EXPECT_EQ(std::get<int64_t>(f.get("a.i32").scalar), -7);
  EXPECT_EQ(f.get_uint("a.u64"), 1ull << 40);
  EXPECT_EQ(f.get_float("a.f32"), 0.25);
  EXPECT_EQ(std::get<bool>(f.get("a.bool").scalar), true);
  EXPECT_EQ(f.get_string_array("a.strs"), (std::vector<std::string>{"x", "", "yz"}));
  EXPECT_EQ(f.get_float_array("a.fl"), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(f.get_int_array("a.ints"), (std::vector<int64_t>{3, -4}));
  const GgufTensor& t = f.tensor("t.f32");
  EXPECT_EQ(t.dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(std::memcmp(t.data, v.data(), 24), 0);
  EXPECT_EQ(f.tensor("t.q8").offset % 64, 0u);
  EXPECT_EQ(f.tensor("t.q8").data[0], 1);
  EXPECT_THROW(GgufWriter(24), Error);
}

}  // namespace
}  // namespace kvevict
