// Quantised tensor types (format/ggml_types.h, format/ggml_blocks.h) and their integer dot
// kernels (kernels/matmul.h).
//
// Reference values: llama.cpp's own Python package (PyPI `gguf`: gguf.quants.dequantize and
// quantize, GGUFReader), driven through tests/quant_reference.py, on the real quantised tensors
// of ../shared/models/tiny-random (written by llama.cpp's quantiser) and on blocks made by our
// quantiser and by gguf.quants.quantize. Dot kernels are checked against a float64 dot of the
// dequantised weights (dequantisation itself being checked against gguf-py) within the error
// the activation quantisation allows.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "bench/bench.h"
#include "format/ggml_blocks.h"
#include "format/gguf.h"
#include "kernels/matmul.h"
#include "model/synth.h"
#include "test_paths.h"
#include "test_tmp.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const GgmlType kQuantTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                                GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

std::string tname(GgmlType t) { return ggml_type_name(static_cast<uint32_t>(t)); }

// True when python3 can import gguf. Under CI=true a missing package is a failure (the
// reference tests must run there), elsewhere the caller skips.
bool python_gguf(std::string& why) {
  if (std::system("python3 -c 'import gguf, numpy' >/dev/null 2>&1") == 0) return true;
  why =
      "python3 with the `gguf` and `numpy` packages not found (pip install gguf numpy; scripts/setup.sh installs them)";
  const char* ci = std::getenv("CI");
  if (ci && std::string(ci) == "true") ADD_FAILURE() << why << " — required under CI=true";
  return false;
}

#define REQUIRE_PYTHON_GGUF()   \
  do {                          \
    std::string why_;           \
    if (!python_gguf(why_)) {   \
      if (HasFailure()) return; \
      GTEST_SKIP() << why_;     \
    }                           \
  } while (0)

fs::path script() { return fs::path(kvevict::test::source_path("tests/quant_reference.py")); }

void run_script(const std::string& args) {
  const std::string cmd = "python3 '" + script().string() + "' " + args;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

std::vector<uint8_t> from_hex(const std::string& h) {
  std::vector<uint8_t> out(h.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

std::vector<float> floats_of(const std::vector<uint8_t>& bytes) {
  std::vector<float> f(bytes.size() / 4);
  std::memcpy(f.data(), bytes.data(), f.size() * 4);
  return f;
}

void write_file(const fs::path& p, const void* data, size_t n) {
  std::ofstream f(p, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// Bitwise equality of two float arrays, reporting the first difference.
void expect_same_floats(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], 4) != 0) {
      ADD_FAILURE() << what << ": element " << i << " = " << got[i] << ", gguf-py " << want[i];
      return;
    }
  }
}

// Weight values with per-block variety: mostly uniform, some blocks all zero, all equal,
// one-signed, or with an outlier, so scales, mins and clamping are all exercised.
std::vector<float> test_weights(int64_t n, uint64_t seed) {
  Rng rng(stream_id({seed, 0x717561ULL}));
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t b = 0; b < n / 32; ++b) {
    const int kind = static_cast<int>(b % 7);
    const float scale = static_cast<float>(std::pow(10.0, 2.0 * rng.uniform() - 1.5));
    for (int64_t j = 0; j < 32; ++j) {
      float x = static_cast<float>(2.0 * rng.uniform() - 1.0) * scale;
      if (kind == 1) x = 0.0f;
      if (kind == 2) x = 0.25f * scale;
      if (kind == 3) x = std::fabs(x);
      if (kind == 4) x = -std::fabs(x);
      if (kind == 5 && j == 7) x = 20.0f * scale;
      v[static_cast<size_t>(b * 32 + j)] = x;
    }
  }
  return v;
}

std::vector<float> random_floats(int64_t n, uint64_t seed, float scale) {
  Rng rng(stream_id({seed, 0x78ULL}));
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>((2.0 * rng.uniform() - 1.0) * scale);
  return v;
}

std::vector<uint8_t> quantize(GgmlType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(static_cast<size_t>(ggml_row_bytes(t, static_cast<int64_t>(x.size()))));
  quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

std::vector<float> dequantize(GgmlType t, const uint8_t* q, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row(t, q, y.data(), n);
  return y;
}

class QuantReference : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::fresh_dir("quant"); }
  void TearDown() override { fs::remove_all(dir_); }

  // Checks every quantised tensor of `model` (first and last 4096 elements) against gguf-py;
  // returns the types seen.
  std::map<std::string, int> check_file(const std::string& model) {
    std::map<std::string, int> seen;
    const fs::path out = dir_ / "tensors.json";
    run_script("tensors '" + model + "' 4096 '" + out.string() + "'");
    std::ifstream in(out);
    const json ref = json::parse(in);
    const GgufFile f = GgufFile::open(model);
    for (const json& r : ref) {
      const std::string name = r.at("name");
      const GgufTensor& t = f.tensor(name);
      EXPECT_EQ(t.type, r.at("type").get<uint32_t>()) << name;
      const GgmlType type = t.ggml_type();
      ++seen[tname(type)];
      const int64_t n = r.at("n_elements"), take = r.at("head_elems");
      if (t.n_elements() != n) {
        ADD_FAILURE() << name << ": " << t.n_elements() << " elements, gguf-py " << n;
        continue;
      }
      const int64_t tail_byte = ggml_row_bytes(type, n - take);
      expect_same_floats(dequantize(type, t.data, take), floats_of(from_hex(r.at("head"))), name + " head");
      expect_same_floats(dequantize(type, t.data + tail_byte, take), floats_of(from_hex(r.at("tail"))), name + " tail");
    }
    return seen;
  }

  fs::path dir_;
};

TEST_F(QuantReference, RealTensorsDequantiseLikeGgufPy) {
  // Expected: the dequantised values of llama.cpp-quantised tensors equal gguf-py's, bit for bit
  // (both compute the block formulas in float32 in the same order).
  REQUIRE_PYTHON_GGUF();
  const auto km = check_file(test::shared_path("models/tiny-random/tiny-random-phi3-q4_k_m.gguf"));
  // The file's types (gguf-py's listing): Q5_0, Q8_0, Q4_K and Q6_K must all have been checked.
  for (const char* t : {"q5_0", "q8_0", "q4_k", "q6_k"}) EXPECT_GT(km.count(t), 0u) << t;
  const auto q8 = check_file(test::shared_path("models/tiny-random/tiny-random-phi3-q8_0.gguf"));
  EXPECT_GT(q8.count("q8_0"), 0u);
}

TEST_F(QuantReference, OwnQuantiserBlocksDequantiseLikeGgufPy) {
  // Expected: blocks written by kvevict's quantiser (every type; rows of several blocks with
  // zero, constant, one-signed and outlier blocks) dequantise to gguf-py's values bit for bit,
  // and reproduce the weights within twice an ideal round-to-nearest quantiser's RMS error on
  // uniform data (step / sqrt(12) relative to RMS = 1 / levels for an affine [min, max] grid,
  // 1 / (2 levels) ... 2 / levels for the symmetric ones); the bounds below are those, doubled.
  REQUIRE_PYTHON_GGUF();
  const std::map<std::string, double> max_rel_rms = {
      {"q2_k", 2.0 / 3}, {"q3_k", 0.25},     {"q4_0", 0.125},    {"q4_1", 2.0 / 15}, {"q4_k", 2.0 / 15},
      {"q5_0", 0.0625},  {"q5_1", 2.0 / 31}, {"q5_k", 2.0 / 31}, {"q6_k", 0.032},    {"q8_0", 0.016}};
  for (GgmlType t : kQuantTypes) {
    SCOPED_TRACE(tname(t));
    const int64_t n = 256 * 7;
    const auto x = test_weights(n, static_cast<uint64_t>(t));
    const auto q = quantize(t, x);
    write_file(dir_ / "in.bin", q.data(), q.size());
    run_script("dequant " + tname(t) + " '" + (dir_ / "in.bin").string() + "' '" + (dir_ / "out.bin").string() + "'");
    const auto ours = dequantize(t, q.data(), n);
    expect_same_floats(ours, floats_of(read_file(dir_ / "out.bin")), "own blocks");
    // Reconstruction error on uniform weights of one scale (test_weights mixes scales over
    // three decades inside a super-block, which a K-quant's 6-bit sub-block scales cannot span).
    const auto u = random_floats(n, 5, 1.0f);
    const auto uq = dequantize(t, quantize(t, u).data(), n);
    double err = 0, ref = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      err += std::pow(uq[i] - u[i], 2);
      ref += std::pow(u[i], 2);
    }
    EXPECT_LT(std::sqrt(err / ref), max_rel_rms.at(tname(t)));
  }
}

TEST_F(QuantReference, GgufPyQuantisedBlocksDequantiseAlike) {
  // Expected: blocks made by gguf.quants.quantize (the types it can quantise) dequantise in
  // kvevict exactly as in gguf-py.
  REQUIRE_PYTHON_GGUF();
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0}) {
    SCOPED_TRACE(tname(t));
    const int64_t n = 32 * 40;
    const auto x = test_weights(n, 100 + static_cast<uint64_t>(t));
    write_file(dir_ / "x.bin", x.data(), x.size() * 4);
    run_script("quantize " + tname(t) + " '" + (dir_ / "x.bin").string() + "' '" + (dir_ / "q.bin").string() + "'");
    const auto q = read_file(dir_ / "q.bin");
    ASSERT_EQ(static_cast<int64_t>(q.size()), ggml_row_bytes(t, n));
    run_script("dequant " + tname(t) + " '" + (dir_ / "q.bin").string() + "' '" + (dir_ / "y.bin").string() + "'");
    expect_same_floats(dequantize(t, q.data(), n), floats_of(read_file(dir_ / "y.bin")), "gguf-py blocks");
  }
}

TEST(QuantTypes, TableMatchesGgufPy) {
  // Expected: ids, block elements and bytes of gguf-py's GGML_QUANT_SIZES table
  // (gguf/constants.py): id (elements, bytes).
  struct Row {
    uint32_t id;
    const char* name;
    int64_t elems, bytes;
  };
  const Row rows[] = {{0, "f32", 1, 4},       {1, "f16", 1, 2},       {2, "q4_0", 32, 18},    {3, "q4_1", 32, 20},
                      {6, "q5_0", 32, 22},    {7, "q5_1", 32, 24},    {8, "q8_0", 32, 34},    {10, "q2_k", 256, 84},
                      {11, "q3_k", 256, 110}, {12, "q4_k", 256, 144}, {13, "q5_k", 256, 176}, {14, "q6_k", 256, 210},
                      {30, "bf16", 1, 2}};
  for (const Row& r : rows) {
    EXPECT_TRUE(ggml_type_supported(r.id)) << r.name;
    EXPECT_EQ(ggml_type_name(r.id), r.name);
    EXPECT_EQ(ggml_block_elems(static_cast<GgmlType>(r.id)), r.elems) << r.name;
    EXPECT_EQ(ggml_block_bytes(static_cast<GgmlType>(r.id)), r.bytes) << r.name;
    EXPECT_EQ(ggml_row_bytes(static_cast<GgmlType>(r.id), r.elems * 3), r.bytes * 3) << r.name;
  }
  // Unsupported ggml types keep their names (for the loader's refusal) and are not supported.
  for (const auto& [id, name] : std::vector<std::pair<uint32_t, std::string>>{
           {9, "q8_1"}, {16, "iq2_xxs"}, {20, "iq4_nl"}, {23, "iq4_xs"}, {29, "iq1_m"}, {34, "tq1_0"}, {35, "tq2_0"}}) {
    EXPECT_FALSE(ggml_type_supported(id)) << name;
    EXPECT_EQ(ggml_type_name(id), name);
  }
  EXPECT_THROW(ggml_row_bytes(GgmlType::Q4_K, 128), Error);
  EXPECT_THROW(ggml_block_bytes(static_cast<GgmlType>(16)), Error);
}

// Float64 dot of the dequantised weight row with x, and the bound on the activation
// quantisation error: each x_i is replaced by d * round(x_i / d) with d = max|x| / 127 over its
// activation block (32 elements for legacy types, 256 for K-quants), an error of at most d / 2,
// so |kernel - exact| <= Σ |w_i| d(i) / 2, plus float32 accumulation slack (1e-5 of Σ |w_i x_i|).
struct DotRef {
  double exact = 0, bound = 0;
};
DotRef dot_reference(GgmlType t, const uint8_t* w, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t blk = activation_quant(t) == ActivationQuant::Q8_K ? 256 : 32;
  const auto wd = dequantize(t, w, n);
  DotRef r;
  double mag = 0;
  for (int64_t b = 0; b < n / blk; ++b) {
    double amax = 0;
    for (int64_t i = b * blk; i < (b + 1) * blk; ++i)
      amax = std::max(amax, std::fabs(double{x[static_cast<size_t>(i)]}));
    for (int64_t i = b * blk; i < (b + 1) * blk; ++i) {
      const double wi = wd[static_cast<size_t>(i)], xi = x[static_cast<size_t>(i)];
      r.exact += wi * xi;
      r.bound += std::fabs(wi) * amax / 127 / 2;
      mag += std::fabs(wi * xi);
    }
  }
  r.bound = r.bound * 1.001 + 1e-5 * mag + 1e-6;
  return r;
}

TEST(QuantKernels, DotsMatchDequantisedFloatDot) {
  // Expected: every quantised dot kernel (AVX2 and its scalar fallback) is within the activation
  // quantisation bound of the float64 dot of the dequantised weights, for rows of 1, 2, 3 and 5
  // blocks at byte offsets 0, 2 and 6 (activations: 0, 4 and 12). Offsets keep the blocks'
  // fp16 / float fields naturally aligned, as GGUF data and our buffers always are (every block
  // size is even, Q8_K's a multiple of 4), so a sanitizer build sees no misaligned field access;
  // the vector loads are unaligned either way.
  for (GgmlType t : kQuantTypes) {
    const int64_t blk = ggml_block_elems(t) == 256 ? 256 : 32;
    for (int64_t nb : {1, 2, 3, 5}) {
      const int64_t n = nb * std::max<int64_t>(blk, 32);
      for (size_t mis : {size_t{0}, size_t{2}, size_t{6}}) {
        SCOPED_TRACE(::testing::Message() << tname(t) << " n " << n << " misalign " << mis);
        const auto wf = test_weights(n, 7 * nb + mis);
        const auto x = random_floats(n, 11 * nb + mis, 1.5f);
        std::vector<uint8_t> w(mis + static_cast<size_t>(ggml_row_bytes(t, n)));
        quantize_row(t, wf.data(), w.data() + mis, n);
        const bool k = activation_quant(t) == ActivationQuant::Q8_K;
        const size_t xmis = 2 * mis;
        std::vector<uint8_t> xq(xmis + static_cast<size_t>(k ? n / 256 * 292 : n / 32 * 34));
        if (k)
          quantize_rows_q8_k(x.data(), 1, n, xq.data() + xmis);
        else
          quantize_rows_q8_0(x.data(), 1, n, xq.data() + xmis);
        const DotRef ref = dot_reference(t, w.data() + mis, x);
        EXPECT_NEAR(dot_quantised(t, w.data() + mis, xq.data() + xmis, n), ref.exact, ref.bound);
        EXPECT_NEAR(dot_quantised_ref(t, w.data() + mis, xq.data() + xmis, n), ref.exact, ref.bound);
      }
    }
  }
}

TEST(QuantKernels, Q8KActivationsMatchTheirDefinition) {
  // Expected: Q8_K blocks hold d = max|x| / 127, q = round(x / d) and the 16-element sums of q
  // (computed here from the definition).
  const auto x = random_floats(512, 3, 2.0f);
  std::vector<ggml::BlockQ8_K> b(2);
  quantize_row_q8_k(x.data(), b.data(), 512);
  for (int ib = 0; ib < 2; ++ib) {
    float amax = 0;
    for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[static_cast<size_t>(256 * ib + j)]));
    EXPECT_FLOAT_EQ(b[static_cast<size_t>(ib)].d, amax / 127);
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 16 * g; j < 16 * g + 16; ++j) {
        const int q = b[static_cast<size_t>(ib)].qs[j];
        EXPECT_LE(std::fabs(q * b[static_cast<size_t>(ib)].d - x[static_cast<size_t>(256 * ib + j)]),
                  b[static_cast<size_t>(ib)].d / 2 * 1.0001);
        sum += q;
      }
      EXPECT_EQ(b[static_cast<size_t>(ib)].bsums[g], sum);
    }
  }
  EXPECT_THROW(quantize_row_q8_k(x.data(), b.data(), 100), Error);
}

TEST(QuantKernels, Q8_0ActivationsRoundHalvesAwayFromZero) {
  // Expected: the vectorised Q8_0 quantiser equals its definition (d = max|x| / 127, q =
  // std::round(x / d), halves away from zero) on rows built to hit exact halves: x = (k + 0.5) s
  // with max 127 s, so x / d lands on .5 whenever the float arithmetic is exact.
  Rng rng(stream_id({9, 9}));
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(64);
    const float s = static_cast<float>(std::pow(2.0, static_cast<int>(rng() % 12) - 6));
    for (size_t j = 0; j < x.size(); ++j) x[j] = (static_cast<float>(static_cast<int>(rng() % 254) - 127) + 0.5f) * s;
    x[3] = 127.0f * s;
    x[40] = -127.0f * s;
    std::vector<ggml::BlockQ8_0> b(2);
    quantize_rows_q8_0(x.data(), 1, 64, reinterpret_cast<uint8_t*>(b.data()));
    for (int ib = 0; ib < 2; ++ib) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(32 * ib + j)]));
      const float d = amax / 127.0f, id = 1.0f / d;
      ASSERT_EQ(b[static_cast<size_t>(ib)].d, fp32_to_fp16(d));
      for (int j = 0; j < 32; ++j)
        ASSERT_EQ(b[static_cast<size_t>(ib)].qs[j],
                  static_cast<int8_t>(std::round(x[static_cast<size_t>(32 * ib + j)] * id)))
            << "trial " << trial << " element " << 32 * ib + j;
    }
  }
}

TEST(QuantKernels, MultithreadedMatmulEqualsPerRowDots) {
  // Expected: matmul_jobs over every quantised type, with 1, 2 and 3 threads (shapes above the
  // parallel-work threshold, row counts not a multiple of the chunk) gives every output
  // bit-identical to the one-row kernel on the same quantised activations.
  const int64_t rows = 300, cols = 768, T = 3;
  for (GgmlType t : kQuantTypes) {
    SCOPED_TRACE(tname(t));
    const auto wf = test_weights(rows * cols, 21);
    std::vector<uint8_t> wb(static_cast<size_t>(rows * ggml_row_bytes(t, cols)));
    for (int64_t r = 0; r < rows; ++r)
      quantize_row(t, wf.data() + r * cols, wb.data() + r * ggml_row_bytes(t, cols), cols);
    const WeightView W{t, wb.data(), rows, cols, ggml_row_bytes(t, cols)};
    const auto x = random_floats(T * cols, 22, 1.0f);
    const bool k = activation_quant(t) == ActivationQuant::Q8_K;
    const int64_t xrow = k ? cols / 256 * 292 : cols / 32 * 34;
    std::vector<uint8_t> xq(static_cast<size_t>(T * xrow));
    if (k)
      quantize_rows_q8_k(x.data(), T, cols, xq.data());
    else
      quantize_rows_q8_0(x.data(), T, cols, xq.data());
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      MatmulScratch scratch;
      std::vector<float> y(static_cast<size_t>(T * rows));
      const MatmulJob job{W, y.data()};
      matmul_jobs(std::span<const MatmulJob>(&job, 1), x.data(), T, pool, scratch);
      for (int64_t tt = 0; tt < T; ++tt)
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_EQ(y[static_cast<size_t>(tt * rows + r)], dot_quantised(t, W.row(r), xq.data() + tt * xrow, cols))
              << "threads " << threads << " t " << tt << " r " << r;
    }
  }
}

TEST(QuantKernels, MatmulRejectsKQuantRowsOfPartialBlocks) {
  // Expected: a K-quant matrix whose rows are not whole 256-element blocks is an error naming
  // the type and block size (GGUF files cannot hold one; a hand-built view can).
  const std::vector<uint8_t> b(4096);
  ThreadPool pool(1);
  MatmulScratch scratch;
  std::vector<float> y(4), x(128);
  const MatmulJob job{{GgmlType::Q4_K, b.data(), 2, 128, 72}, y.data()};
  try {
    matmul_jobs(std::span<const MatmulJob>(&job, 1), x.data(), 1, pool, scratch);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q4_k block size 256"), std::string::npos) << e.what();
  }
}

TEST(SynthTypes, Q4KMMixMatchesLlamaCppFile) {
  // Expected: the q4_k_m mix picks, for every matrix of tiny-random-phi3-q4_k_m.gguf (quantised
  // by llama.cpp: 2 layers, 64-wide rows fall back from K-quants), the type llama.cpp chose.
  const GgufFile f = GgufFile::open(test::shared_path("models/tiny-random/tiny-random-phi3-q4_k_m.gguf"));
  const SynthTypes mix = parse_synth_types("q4_k_m");
  int checked = 0;
  for (const GgufTensor& t : f.tensors()) {
    if (t.dims.size() != 2) continue;
    std::string kind = t.name.substr(0, t.name.size() - 7);  // drop ".weight"
    int layer = -1;
    if (kind.rfind("blk.", 0) == 0) {
      const size_t dot = kind.find('.', 4);
      layer = std::stoi(kind.substr(4, dot - 4));
      kind = kind.substr(dot + 1);
    }
    EXPECT_EQ(tname(mix.tensor_type(kind, layer, 2, t.dims[0], false)), ggml_type_name(t.type)) << t.name;
    ++checked;
  }
  EXPECT_GE(checked, 10);
  // Rows of whole super-blocks keep their K-quant; use_more_bits promotes the first and last
  // eighth of the layers and every third between (llama.cpp's rule), here of 24 layers.
  const SynthTypes m5 = parse_synth_types("q5_k_m");
  std::string promoted;
  for (int l = 0; l < 24; ++l) promoted += m5.tensor_type("ffn_down", l, 24, 1024, true) == GgmlType::Q6_K ? 'x' : '.';
  EXPECT_EQ(promoted, "xxx..x..x..x..x..x..xxxx");
  EXPECT_EQ(m5.tensor_type("attn_q", 5, 24, 1024, true), GgmlType::Q5_K);
  EXPECT_EQ(m5.tensor_type("token_embd", -1, 24, 1024, true), GgmlType::Q6_K);  // tied: the output
  EXPECT_EQ(m5.tensor_type("token_embd", -1, 24, 1024, false), GgmlType::Q5_K);
  EXPECT_EQ(m5.tensor_type("attn_q", 5, 24, 960, true), GgmlType::Q5_1);
  EXPECT_THROW(parse_synth_types("iq2_xxs"), Error);
}

TEST(BenchDecode, ComparesTypesOfOneShapeInOneRun) {
  // Expected: `bench decode --shape tiny --type q8_0,q4_k_m,q6_k` writes one model per type,
  // reports one decode row and one prefill row per type and prompt length, in the order given,
  // with the matrix-type mix each file holds (tiny's 64-wide rows: q4_k_m falls back to q5_0
  // with q8_0 output, q6_k to q8_0), and rejects an unknown type before writing anything.
  DecodeBenchConfig cfg;
  cfg.shape = "tiny";
  cfg.types = {"q8_0", "q4_k_m", "q6_k"};
  cfg.synth_dir = test::tmp_path("bench_types");
  cfg.prefill_lengths = {8, 16};
  cfg.common.reps = 1;
  cfg.common.threads = 1;
  cfg.steps = 2;
  const json out = bench_decode(cfg);
  ASSERT_EQ(out.at("decode").size(), 3u);
  EXPECT_EQ(out["decode"][0]["type"], "q8_0");
  EXPECT_EQ(out["decode"][0]["mix"], "q8_0 100%");
  EXPECT_EQ(out["decode"][1]["type"], "q4_k_m");
  EXPECT_NE(out["decode"][1]["mix"].get<std::string>().find("q5_0"), std::string::npos);
  EXPECT_EQ(out["decode"][2]["mix"], "q8_0 100%");
  for (const json& r : out["decode"]) EXPECT_GT(r["tok_per_s"].get<double>(), 0) << r.dump();
  ASSERT_EQ(out.at("prefill").size(), 6u);
  EXPECT_EQ(out["prefill"][1]["prompt_tokens"], 16);
  EXPECT_EQ(out["prefill"][5]["type"], "q6_k");
  EXPECT_TRUE(fs::exists(cfg.synth_dir + "/tiny-q4_k_m-s0.gguf"));
  cfg.types = {"q8_0", "iq2_xxs"};
  cfg.synth_dir += "_bad";
  EXPECT_THROW(bench_decode(cfg), Error);
  EXPECT_FALSE(fs::exists(cfg.synth_dir));
  fs::remove_all(cfg.synth_dir.substr(0, cfg.synth_dir.size() - 4));
}

}  // namespace
}  // namespace kvevict
