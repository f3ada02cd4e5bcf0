// The integer matmul kernels (kernels/qgemm.h) through matmul_jobs: bit-identical to the scalar
// reference dot_quantised (kernels/matmul.h, written from the block layouts, independently of
// the interleaved layout) for every quantised type, whatever the number of activation rows T,
// the thread count, the row split, the instruction-set variant and whether the weights were
// interleaved at load or on the fly; and within the activation quantisation error of the float64
// product of the dequantised weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/x16.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

const GgmlType kTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_1, GgmlType::Q5_1,
                           GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

std::string tname(GgmlType t) { return ggml_type_name(static_cast<uint32_t>(t)); }

std::vector<float> random_floats(int64_t n, uint64_t seed, float scale) {
  Rng rng(stream_id({seed, 1234}));
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>((2.0 * rng.uniform() - 1.0) * scale);
  return v;
}

struct Weights {
  GgmlType type;
  int64_t rows, cols;
  std::vector<uint8_t> bytes, x16;
  // With the interleaved copy (as the model loads them) or without (interleaved on the fly).
  WeightView view(bool interleaved = true) const {
    return {type, bytes.data(), rows, cols, ggml_row_bytes(type, cols), interleaved ? x16.data() : nullptr};
  }
};

// Rows of `type` quantised from random floats; every 7th row is scaled by 100 and every 5th
// block of it zeroed, so scales and zero blocks vary across the rows of one tile.
Weights make_weights(GgmlType type, int64_t rows, int64_t cols, uint64_t seed) {
  Weights w{type, rows, cols, {}, {}};
  const int64_t rb = ggml_row_bytes(type, cols);
  w.bytes.resize(static_cast<size_t>(rows * rb));
  for (int64_t r = 0; r < rows; ++r) {
    auto f = random_floats(cols, seed * 1000 + static_cast<uint64_t>(r), r % 7 == 3 ? 100.0f : 1.0f);
    if (r % 7 == 5)
      for (int64_t i = 0; i < cols; ++i)
        if ((i / 32) % 5 == 0) f[static_cast<size_t>(i)] = 0.0f;
    quantize_row(type, f.data(), w.bytes.data() + r * rb, cols);
  }
  w.x16 = x16_pack(type, w.bytes.data(), rows, cols, rb);
  return w;
}

// y[T, rows] through matmul_jobs with the given options.
std::vector<float> run(const Weights& w, const std::vector<float>& x, int64_t T, ThreadPool& pool,
                       const MatmulOptions& opt, bool interleaved = true) {
  std::vector<float> y(static_cast<size_t>(T * w.rows), std::nanf(""));
  MatmulScratch scratch;
  const MatmulJob job{w.view(interleaved), y.data()};
  matmul_jobs(std::span<const MatmulJob>(&job, 1), x.data(), T, pool, scratch, opt);
  return y;
}

// The scalar reference for every (row, activation row) on activations quantised as ggml blocks.
std::vector<float> reference_dots(const Weights& w, const std::vector<float>& x, int64_t T) {
  const bool k = activation_quant(w.type) == ActivationQuant::Q8_K;
  const int64_t xrb = k ? w.cols / 256 * 292 : w.cols / 32 * 34;
  std::vector<uint8_t> xq(static_cast<size_t>(T * xrb));
  if (k)
    quantize_rows_q8_k(x.data(), T, w.cols, xq.data());
  else
    quantize_rows_q8_0(x.data(), T, w.cols, xq.data());
  std::vector<float> y(static_cast<size_t>(T * w.rows));
  const WeightView v = w.view();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < w.rows; ++r)
      y[static_cast<size_t>(t * w.rows + r)] = dot_quantised(w.type, v.row(r), xq.data() + t * xrb, w.cols);
  return y;
}

// Bitwise equality (NaN-safe, -0 != +0): the outputs must be the very same floats.
::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b, int64_t rows) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "t " << static_cast<int64_t>(i) / rows << " r "
                                           << static_cast<int64_t>(i) % rows << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

TEST(QuantMatmul, EqualsScalarReferenceForEveryTypeTAndVariant) {
  // Expected: for every quantised type, T in 1..17, 32, 64 and every compiled kernel variant,
  // each output equals dot_quantised's bit for bit. 37 rows (groups of 16 leave a partial one);
  // 512 columns (16 legacy blocks, 2 K-quant blocks) and, for the legacy types, 96 (3 blocks).
  // T = 1, 5 and 17 also without the interleaved copy (interleaved on the fly per group).
  const auto isas = compiled_kernel_isas();
  ASSERT_FALSE(isas.empty()) << "no kernel variant compiled";
  std::vector<int64_t> Ts;
  for (int64_t T = 1; T <= 17; ++T) Ts.push_back(T);
  Ts.push_back(32);
  Ts.push_back(64);
  ThreadPool pool(1);
  for (GgmlType type : kTypes) {
    const bool kq = activation_quant(type) == ActivationQuant::Q8_K;
    for (int64_t cols : kq ? std::vector<int64_t>{512} : std::vector<int64_t>{512, 96}) {
      const Weights w = make_weights(type, 37, cols, static_cast<uint64_t>(type) + 10 * static_cast<uint64_t>(cols));
      const auto x = random_floats(64 * cols, 7 + static_cast<uint64_t>(cols), 2.0f);
      const auto want_all = reference_dots(w, x, 64);
      for (int64_t T : Ts) {
        const std::vector<float> want(want_all.begin(), want_all.begin() + T * w.rows);
        for (KernelIsa isa : isas) {
          MatmulOptions opt;
          opt.isa = isa;
          EXPECT_TRUE(same_bits(run(w, x, T, pool, opt), want, w.rows))
              << tname(type) << " cols " << cols << " T " << T << " " << kernel_isa_name(isa);
          if (T == 1 || T == 5 || T == 17) {
            EXPECT_TRUE(same_bits(run(w, x, T, pool, opt, false), want, w.rows))
                << tname(type) << " cols " << cols << " T " << T << " " << kernel_isa_name(isa) << " on the fly";
          }
        }
      }
    }
  }
}

TEST(QuantMatmul, IndependentOfThreadsAndRowSplit) {
  // Expected: bit-identical outputs for 1, 2 and 3 threads and work items of 16, 32, 48 rows and
  // the default (other splits of the rows over work items and threads), for every type at T = 1,
  // 5 and 17.
  const std::vector<int64_t> chunks = {0, 16, 32, 48};
  for (GgmlType type : kTypes) {
    const Weights w = make_weights(type, 75, 512, 99 + static_cast<uint64_t>(type));
    for (int64_t T : {1, 5, 17}) {
      const auto x = random_floats(T * 512, 50 + static_cast<uint64_t>(T), 1.0f);
      ThreadPool one(1);
      const auto base = run(w, x, T, one, {});
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        for (int64_t chunk : chunks) {
          MatmulOptions opt;
          opt.row_chunk = chunk;
          EXPECT_TRUE(same_bits(run(w, x, T, pool, opt), base, w.rows))
              << tname(type) << " T " << T << " threads " << threads << " chunk " << chunk;
        }
      }
    }
  }
}

TEST(QuantMatmul, WithinActivationQuantisationErrorOfTheFloatProduct) {
  // Expected: |y - Σ w x| <= Σ |w| · (max|x| of the block / 127) / 2 · 1.01 + 1e-4 against a
  // float64 product of the dequantised weights: the error of rounding each activation to its
  // block's step (max|x| / 127, halves), for T = 9 rows with values of mixed magnitude.
  const int64_t T = 9, cols = 512;
  ThreadPool pool(2);
  for (GgmlType type : kTypes) {
    const Weights w = make_weights(type, 29, cols, 300 + static_cast<uint64_t>(type));
    auto x = random_floats(T * cols, 301, 1.0f);
    for (int64_t i = 0; i < T * cols; i += 13) x[static_cast<size_t>(i)] *= 20.0f;
    const auto y = run(w, x, T, pool, {});
    const int64_t blk = activation_quant(type) == ActivationQuant::Q8_K ? 256 : 32;
    std::vector<float> wd(static_cast<size_t>(cols));
    for (int64_t r = 0; r < w.rows; ++r) {
      dequantize_row(type, w.view().row(r), wd.data(), cols);
      for (int64_t t = 0; t < T; ++t) {
        double ref = 0, bound = 0;
        for (int64_t b = 0; b < cols / blk; ++b) {
          double amax = 0;
          for (int64_t i = b * blk; i < (b + 1) * blk; ++i) amax = std::max(amax, std::abs(double{x[static_cast<size_t>(t * cols + i)]}));
          for (int64_t i = b * blk; i < (b + 1) * blk; ++i) {
            ref += double{wd[static_cast<size_t>(i)]} * x[static_cast<size_t>(t * cols + i)];
            bound += std::abs(double{wd[static_cast<size_t>(i)]}) * amax / 127 / 2;
          }
        }
        EXPECT_NEAR(y[static_cast<size_t>(t * w.rows + r)], ref, bound * 1.01 + 1e-4) << tname(type) << " t " << t << " r " << r;
      }
    }
  }
}

TEST(QuantMatmul, RefusesAVariantThisBuildLacks) {
  // Expected: asking for a variant that is not compiled in is an error naming it, not a silent
  // fallback (only checkable in a build that lacks one).
  const auto isas = compiled_kernel_isas();
  for (KernelIsa isa : {KernelIsa::Avx2, KernelIsa::Avx2Vnni, KernelIsa::Avx512}) {
    if (std::find(isas.begin(), isas.end(), isa) != isas.end()) continue;
    const Weights w = make_weights(GgmlType::Q8_0, 4, 32, 1);
    const auto x = random_floats(32, 2, 1.0f);
    ThreadPool pool(1);
    MatmulOptions opt;
    opt.isa = isa;
    EXPECT_THROW(run(w, x, 1, pool, opt), Error) << kernel_isa_name(isa);
  }
}

}  // namespace
}  // namespace kvevict
