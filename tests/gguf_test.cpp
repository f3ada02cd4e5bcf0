// Tests for the GGUF reader (format/gguf.h) and the ggml row kernels (format/ggml_types.h).
//
// Sources of expected values: the real stories260K file (figures cross-checked against llama.cpp's
// own Python reader, the PyPI `gguf` package, via tests/gguf_dump_reference.py); synthetic files
// built byte by byte by the small writer below, following the GGUF spec (ggml docs/gguf.md); IEEE
// 754 bit patterns; and scalar/double-precision reference code written here, independent of the
// library's kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "format/ggml_types.h"
#include "format/gguf.h"
#include "kernels/dot_row.h"
#include "test_paths.h"
#include "test_tmp.h"
#include "util/error.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using VT = GgufValueType;

// ------------------------------------------------------------------------------------------------
// A minimal GGUF writer (spec: ggml docs/gguf.md), used to build valid and broken files.

using Bytes = std::vector<uint8_t>;

template <class T>
void put(Bytes& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}
void put_str(Bytes& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

// One encoded metadata value: its type id and payload (without the type id, so the same
// encoding serves as an array element).
struct Enc {
  VT type;
  Bytes payload;
};
template <class T>
Enc scalar(VT t, T v) {
  Enc e{t, {}};
  put(e.payload, v);
  return e;
}
Enc str(const std::string& s) {
  Enc e{VT::STRING, {}};
  put_str(e.payload, s);
  return e;
}
Enc arr(VT elem, const std::vector<Enc>& items) {
  Enc e{VT::ARRAY, {}};
  put<uint32_t>(e.payload, static_cast<uint32_t>(elem));
  put<uint64_t>(e.payload, items.size());
  for (const Enc& i : items) e.payload.insert(e.payload.end(), i.payload.begin(), i.payload.end());
  return e;
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  Bytes data;
  std::optional<uint64_t> offset;  // overrides the computed (aligned) offset
};

struct GgufBuilder {
  std::string magic = "GGUF";
  uint32_t version = 3;
  uint64_t alignment = 32;  // layout only; add a general.alignment key to change the reader's view
  std::vector<std::pair<std::string, Enc>> kvs;
  std::vector<TensorSpec> tensors;
  // Section boundaries of the last build(): [0, header_end) header, then metadata, tensor infos,
  // padding, data from data_start.
  size_t header_end = 0, kv_end = 0, infos_end = 0, data_start = 0;

  Bytes build() {
    Bytes b(magic.begin(), magic.end());
    put<uint32_t>(b, version);
    put<uint64_t>(b, tensors.size());
    put<uint64_t>(b, kvs.size());
    header_end = b.size();
    for (const auto& [key, v] : kvs) {
      put_str(b, key);
      put<uint32_t>(b, static_cast<uint32_t>(v.type));
      b.insert(b.end(), v.payload.begin(), v.payload.end());
    }
    kv_end = b.size();
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const TensorSpec& t : tensors) {
      next = (next + alignment - 1) / alignment * alignment;
      offsets.push_back(next);
      next += t.data.size();
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorSpec& t = tensors[i];
      put_str(b, t.name);
      put<uint32_t>(b, static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) put<uint64_t>(b, d);
      put<uint32_t>(b, t.type);
      put<uint64_t>(b, t.offset.value_or(offsets[i]));
    }
    infos_end = b.size();
    b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
    data_start = b.size();
    for (size_t i = 0; i < tensors.size(); ++i) {
      b.resize(data_start + offsets[i], 0);  // no padding after the last tensor
      b.insert(b.end(), tensors[i].data.begin(), tensors[i].data.end());
    }
    return b;
  }
};

template <class T>
Bytes raw_bytes(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Hand-built quantised rows, decoded by hand in the tests (ggml block layouts, ggml_types.h).
Bytes q8_0_block(uint16_t d, int first_q) {  // q[j] = first_q + j
  Bytes b;
  put<uint16_t>(b, d);
  for (int j = 0; j < 32; ++j) b.push_back(static_cast<uint8_t>(static_cast<int8_t>(first_q + j)));
  return b;
}
Bytes q4_0_block(uint16_t d) {  // element j (< 16) has nibble j, element j + 16 has nibble 15 - j
  Bytes b;
  put<uint16_t>(b, d);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  return b;
}

// A file using every metadata value type and every supported tensor type.
GgufBuilder sample_builder() {
  GgufBuilder g;
  g.alignment = 64;
  g.kvs = {
      {"general.architecture", str("llama")},
      {"general.alignment", scalar<uint32_t>(VT::UINT32, 64)},
      {"t.u8", scalar<uint8_t>(VT::UINT8, 200)},
      {"t.i8", scalar<int8_t>(VT::INT8, -100)},
      {"t.u16", scalar<uint16_t>(VT::UINT16, 60000)},
      {"t.i16", scalar<int16_t>(VT::INT16, -30000)},
      {"t.u32", scalar<uint32_t>(VT::UINT32, 4000000000u)},
      {"t.i32", scalar<int32_t>(VT::INT32, -2000000000)},
      {"t.f32", scalar<float>(VT::FLOAT32, 0.1f)},
      {"t.bool", scalar<uint8_t>(VT::BOOL, 1)},
      {"t.string", str("h\xC3\xA9llo\n")},
      {"t.u64", scalar<uint64_t>(VT::UINT64, 18000000000000000000ull)},
      {"t.i64", scalar<int64_t>(VT::INT64, -9000000000000000000ll)},
      {"t.f64", scalar<double>(VT::FLOAT64, -1.0 / 3.0)},
      {"t.strings", arr(VT::STRING, {str("a"), str(""), str("<0x0A>")})},
      {"t.floats", arr(VT::FLOAT32, {scalar<float>(VT::FLOAT32, 1.5f), scalar<float>(VT::FLOAT32, -2.0f)})},
      {"t.ints", arr(VT::INT32, {scalar<int32_t>(VT::INT32, -7), scalar<int32_t>(VT::INT32, 9)})},
      {"t.empty", arr(VT::UINT8, {})},
      {"t.nested",
       arr(VT::ARRAY,
           {arr(VT::INT16, {scalar<int16_t>(VT::INT16, 1), scalar<int16_t>(VT::INT16, -2)}), arr(VT::INT16, {}),
            arr(VT::INT16, {scalar<int16_t>(VT::INT16, 3)})})},
  };
  std::vector<float> f32(16);
  for (int i = 0; i < 16; ++i) f32[i] = static_cast<float>(i) - 7.5f;
  // fp16 bit patterns from IEEE 754: 1.0, -2.0, 65504 (max), 2^-24 (min subnormal), 0.5, -0, inf, 0.
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x3800, 0x8000, 0x7C00, 0x0000};
  // bf16 = top half of float32: 1.0, -2.0, 0.5, 3.0.
  const std::vector<uint16_t> bf16 = {0x3F80, 0xC000, 0x3F00, 0x4040};
  Bytes q8 = q8_0_block(0x3800, -16);    // d = 0.5
  Bytes q8b = q8_0_block(0xBC00, -128);  // d = -1, q = -128..-97
  q8.insert(q8.end(), q8b.begin(), q8b.end());
  g.tensors = {
      {"w.f32", {8, 2}, 0, raw_bytes(f32), {}},       {"w.f16", {8}, 1, raw_bytes(f16), {}},
      {"w.bf16", {2, 2}, 30, raw_bytes(bf16), {}},    {"w.q8_0", {64}, 8, q8, {}},
      {"w.q4_0", {32, 1}, 2, q4_0_block(0x4000), {}},  // d = 2
  };
  return g;
}

// ------------------------------------------------------------------------------------------------
// Fixture: a fresh temp directory per test.

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_dir(std::string("gguf_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const Bytes& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  // Opens `path`, expects kvevict::Error whose message starts with the path and contains every
  // word; returns the message.
  static std::string expect_error(const std::string& path, const std::vector<std::string>& words) {
    try {
      GgufFile::open(path);
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;
      for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "want '" << w << "' in: " << msg;
      return msg;
    }
    ADD_FAILURE() << path << ": expected kvevict::Error";
    return "";
  }

  fs::path dir_;
};

Bytes read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// ------------------------------------------------------------------------------------------------
// The real stories260K file.

// Expected: the stories260K config (llama2.c: dim 64, 5 layers, 8 heads, 4 kv heads, vocab 512),
// as printed by gguf-py's GGUFReader for this exact file (48 tensors, version 3).
TEST_F(GgufTest, Stories260kHeaderMetadataAndTensors) {
  const GgufFile f = GgufFile::open(test::stories260k());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.tensors().size(), 48u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_uint("llama.block_count"), 5u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count"), 8u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(f.get_uint("llama.embedding_length"), 64u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 512u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens")[1], "<s>");
  EXPECT_EQ(f.get_float_array("tokenizer.ggml.scores").size(), 512u);
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type").size(), 512u);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(f.alignment(), 32u);  // no general.alignment key: the spec default
  EXPECT_EQ(f.data_offset() % 32, 0u);
  const GgufTensor& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.dims, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(emb.ggml_type(), GgmlType::F32);
  EXPECT_EQ(emb.n_elements(), 64 * 512);
  EXPECT_EQ(emb.n_bytes, 64 * 512 * 4);
  for (const GgufTensor& t : f.tensors()) {  // every tensor lies inside the file (the reader checks)
    EXPECT_NE(t.data, nullptr) << t.name;
    EXPECT_LE(f.data_offset() + t.offset + static_cast<uint64_t>(t.n_bytes), f.file_size()) << t.name;
  }
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
}

bool python_gguf_available() { return std::system("python3 -c 'import gguf' >/dev/null 2>&1") == 0; }

std::string hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

// Runs tests/gguf_dump_reference.py (gguf-py) on `gguf` and returns its JSON.
json python_dump(const std::string& gguf, const fs::path& dir) {
  const fs::path script = fs::path(kvevict::test::source_path("tests/gguf_dump_reference.py"));
  const fs::path out = dir / "reference.json";
  const std::string cmd = "python3 '" + script.string() + "' '" + gguf + "' '" + out.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  return json::parse(in);
}

void expect_value_eq(const GgufValue& v, const json& j, const std::string& where) {
  ASSERT_EQ(gguf_value_type_name(v.type), j.at("type").get<std::string>()) << where;
  const json& jv = j.at("value");
  switch (v.type) {
    case VT::ARRAY:
      EXPECT_EQ(gguf_value_type_name(v.elem_type), j.at("elem_type").get<std::string>()) << where;
      ASSERT_EQ(v.array.size(), jv.size()) << where;
      for (size_t i = 0; i < v.array.size(); ++i)
        expect_value_eq(v.array[i], jv[i], where + "[" + std::to_string(i) + "]");
      break;
    case VT::STRING: {
      const auto& s = std::get<std::string>(v.scalar);
      EXPECT_EQ(hex(reinterpret_cast<const uint8_t*>(s.data()), s.size()), jv.get<std::string>()) << where;
      break;
    }
    case VT::BOOL:
      EXPECT_EQ(std::get<bool>(v.scalar), jv.get<bool>()) << where;
      break;
    case VT::FLOAT32:
    case VT::FLOAT64:
      EXPECT_EQ(std::get<double>(v.scalar), jv.get<double>()) << where;
      break;
    case VT::UINT8:
    case VT::UINT16:
    case VT::UINT32:
    case VT::UINT64:
      EXPECT_EQ(std::get<uint64_t>(v.scalar), jv.get<uint64_t>()) << where;
      break;
    default:
      EXPECT_EQ(std::get<int64_t>(v.scalar), jv.get<int64_t>()) << where;
      break;
  }
}

// Compares everything the reader parsed with gguf-py's view of the same file.
void expect_matches_reference(const GgufFile& f, const json& ref) {
  EXPECT_EQ(f.version(), ref.at("version").get<uint32_t>());
  EXPECT_EQ(f.alignment(), ref.at("alignment").get<uint64_t>());
  EXPECT_EQ(f.data_offset(), ref.at("data_offset").get<uint64_t>());
  const json& md = ref.at("metadata");
  EXPECT_EQ(f.metadata().size(), md.size());
  for (const auto& [key, node] : md.items()) {
    ASSERT_TRUE(f.has(key)) << key;
    expect_value_eq(f.get(key), node, key);
  }
  const json& ts = ref.at("tensors");
  ASSERT_EQ(f.tensors().size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const GgufTensor& t = f.tensors()[i];
    const json& r = ts[i];
    EXPECT_EQ(t.name, r.at("name").get<std::string>());
    std::vector<int64_t> dims = r.at("dims").get<std::vector<int64_t>>();
    EXPECT_EQ(t.dims, dims) << t.name;
    EXPECT_EQ(t.type, r.at("type").get<uint32_t>()) << t.name;
    EXPECT_EQ(t.offset, r.at("offset").get<uint64_t>()) << t.name;
    EXPECT_EQ(t.n_bytes, r.at("n_bytes").get<int64_t>()) << t.name;
    const size_t k = std::min<size_t>(16, static_cast<size_t>(t.n_bytes));
    EXPECT_EQ(hex(t.data, k), r.at("head").get<std::string>()) << t.name;
    EXPECT_EQ(hex(t.data + t.n_bytes - k, k), r.at("tail").get<std::string>()) << t.name;
  }
}

// Expected: llama.cpp's Python reader (PyPI gguf) on the same file.
TEST_F(GgufTest, Stories260kMatchesGgufPy) {
  if (!python_gguf_available()) GTEST_SKIP() << "python3 with the `gguf` package not found (pip install gguf numpy)";
  const GgufFile f = GgufFile::open(test::stories260k());
  expect_matches_reference(f, python_dump(test::stories260k(), dir_));
}

// Expected: llama.cpp's Python reader on a synthetic file with every value and tensor type.
TEST_F(GgufTest, SyntheticMatchesGgufPy) {
  if (!python_gguf_available()) GTEST_SKIP() << "python3 with the `gguf` package not found (pip install gguf numpy)";
  GgufBuilder g = sample_builder();
  const std::string path = write("sample.gguf", g.build());
  const GgufFile f = GgufFile::open(path);
  expect_matches_reference(f, python_dump(path, dir_));
}

// ------------------------------------------------------------------------------------------------
// Synthetic files: every value type and tensor type. Expected values are the ones written.

TEST_F(GgufTest, SyntheticAllValueTypes) {
  GgufBuilder g = sample_builder();
  const GgufFile f = GgufFile::open(write("sample.gguf", g.build()));
  EXPECT_EQ(f.metadata().size(), g.kvs.size());
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset(), g.data_start);
  EXPECT_EQ(f.get_uint("t.u8"), 200u);
  EXPECT_EQ(std::get<int64_t>(f.get("t.i8").scalar), -100);
  EXPECT_EQ(f.get_uint("t.u16"), 60000u);
  EXPECT_EQ(std::get<int64_t>(f.get("t.i16").scalar), -30000);
  EXPECT_EQ(f.get_uint("t.u32"), 4000000000u);
  EXPECT_EQ(std::get<int64_t>(f.get("t.i32").scalar), -2000000000);
  EXPECT_EQ(f.get_float("t.f32"), static_cast<double>(0.1f));
  EXPECT_EQ(f.get("t.f32").type, VT::FLOAT32);
  EXPECT_TRUE(std::get<bool>(f.get("t.bool").scalar));
  EXPECT_EQ(f.get_string("t.string"), "h\xC3\xA9llo\n");
  EXPECT_EQ(f.get_uint("t.u64"), 18000000000000000000ull);
  EXPECT_EQ(std::get<int64_t>(f.get("t.i64").scalar), -9000000000000000000ll);
  EXPECT_EQ(f.get_float("t.f64"), -1.0 / 3.0);
  EXPECT_EQ(f.get_float("t.u32"), 4e9);  // integers convert
  EXPECT_EQ(f.get_string_array("t.strings"), (std::vector<std::string>{"a", "", "<0x0A>"}));
  EXPECT_EQ(f.get_float_array("t.floats"), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(f.get_int_array("t.ints"), (std::vector<int64_t>{-7, 9}));
  EXPECT_TRUE(f.get_int_array("t.empty").empty());
  const GgufValue& nested = f.get("t.nested");
  ASSERT_EQ(nested.type, VT::ARRAY);
  EXPECT_EQ(nested.elem_type, VT::ARRAY);
  ASSERT_EQ(nested.array.size(), 3u);
  EXPECT_EQ(nested.array[0].elem_type, VT::INT16);
  ASSERT_EQ(nested.array[0].array.size(), 2u);
  EXPECT_EQ(std::get<int64_t>(nested.array[0].array[1].scalar), -2);
  EXPECT_TRUE(nested.array[1].array.empty());
  EXPECT_EQ(std::get<int64_t>(nested.array[2].array[0].scalar), 3);
  EXPECT_EQ(f.get_uint_or("absent", 7), 7u);
  EXPECT_EQ(f.get_float_or("absent", 2.5), 2.5);
  EXPECT_EQ(f.get_uint_or("t.u8", 7), 200u);
}

TEST_F(GgufTest, GetterErrorsNameKeyAndTypes) {
  GgufBuilder g = sample_builder();
  const std::string path = write("sample.gguf", g.build());
  const GgufFile f = GgufFile::open(path);
  auto expect_msg = [&](auto&& fn, const std::vector<std::string>& words) {
    try {
      fn();
      ADD_FAILURE() << "expected kvevict::Error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;
      for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "want '" << w << "' in: " << msg;
    }
  };
  expect_msg([&] { f.get_uint("llama.block_count"); }, {"missing required key 'llama.block_count'"});
  expect_msg([&] { f.get_string("t.u32"); }, {"'t.u32'", "uint32", "string"});
  expect_msg([&] { f.get_uint("t.string"); }, {"'t.string'", "string", "unsigned"});
  expect_msg([&] { f.get_uint("t.i8"); }, {"'t.i8'", "negative"});
  expect_msg([&] { f.get_float("t.strings"); }, {"array of string"});
  expect_msg([&] { f.get_string_array("t.ints"); }, {"array of int32", "array of string"});
  expect_msg([&] { f.get_int_array("t.floats"); }, {"array of float32"});
  expect_msg([&] { f.get_float_array("t.nested"); }, {"array of array"});
  expect_msg([&] { f.get_uint_or("t.string", 1); }, {"'t.string'"});  // present but wrong type
  expect_msg([&] { f.tensor("output.weight"); }, {"missing tensor 'output.weight'"});
}

// Expected: the values written by sample_builder(), decoded by hand from the ggml block layouts.
TEST_F(GgufTest, SyntheticTensorTypesAndData) {
  GgufBuilder g = sample_builder();
  GgufFile f = GgufFile::open(write("sample.gguf", g.build()));
  GgufFile moved = std::move(f);  // data pointers survive a move (the mapping moves with them)
  const GgufTensor& f32 = moved.tensor("w.f32");
  EXPECT_EQ(f32.dims, (std::vector<int64_t>{8, 2}));
  EXPECT_EQ(f32.n_bytes, 64);
  std::vector<float> out(64);
  dequantize_row(GgmlType::F32, f32.data, out.data(), 16);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[i], static_cast<float>(i) - 7.5f);

  const GgufTensor& f16 = moved.tensor("w.f16");
  EXPECT_EQ(f16.n_bytes, 16);
  EXPECT_EQ(f16.offset % 64, 0u);
  dequantize_row(GgmlType::F16, f16.data, out.data(), 8);
  const std::vector<float> want16 = {1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), 0.5f, -0.0f, INFINITY, 0.0f};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], want16[i]) << i;
  EXPECT_TRUE(std::signbit(out[5]));

  const GgufTensor& bf = moved.tensor("w.bf16");
  EXPECT_EQ(bf.n_bytes, 8);
  dequantize_row(GgmlType::BF16, bf.data, out.data(), 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.5f);
  EXPECT_EQ(out[3], 3.0f);

  const GgufTensor& q8 = moved.tensor("w.q8_0");
  EXPECT_EQ(q8.n_bytes, 2 * 34);
  dequantize_row(GgmlType::Q8_0, q8.data, out.data(), 64);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 0.5f * static_cast<float>(j - 16)) << j;
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[32 + j], -1.0f * static_cast<float>(j - 128)) << j;

  const GgufTensor& q4 = moved.tensor("w.q4_0");
  EXPECT_EQ(q4.n_bytes, 18);
  EXPECT_EQ(q4.dims, (std::vector<int64_t>{32, 1}));
  dequantize_row(GgmlType::Q4_0, q4.data, out.data(), 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 2.0f * static_cast<float>(j - 8)) << j;
    EXPECT_EQ(out[16 + j], 2.0f * static_cast<float>(15 - j - 8)) << j;
  }
}

TEST_F(GgufTest, Version2AndDefaultAlignment) {
  GgufBuilder g;  // spec: versions 2 and 3 share the layout; alignment defaults to 32
  g.version = 2;
  g.tensors = {{"a", {3}, 0, raw_bytes(std::vector<float>{1, 2, 3}), {}},
               {"b", {1}, 0, raw_bytes(std::vector<float>{4}), {}}};
  const GgufFile f = GgufFile::open(write("v2.gguf", g.build()));
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset(), g.data_start);
  EXPECT_EQ(f.tensor("b").offset, 32u);
  float v;
  std::memcpy(&v, f.tensor("b").data, 4);
  EXPECT_EQ(v, 4.0f);
}

// ------------------------------------------------------------------------------------------------
// Broken files: each must give a kvevict::Error naming the path and the problem.

TEST_F(GgufTest, RejectsBadMagic) {
  GgufBuilder g = sample_builder();
  g.magic = "GGML";
  expect_error(write("magic.gguf", g.build()), {"not a GGUF file", "47 47 4d 4c"});
  expect_error(write("empty.gguf", {}), {"truncated", "magic", "file size is 0"});
}

TEST_F(GgufTest, RejectsUnsupportedVersions) {
  for (uint32_t v : {1u, 99u}) {  // spec: v1 used 32-bit counts; 99 does not exist
    GgufBuilder g = sample_builder();
    g.version = v;
    expect_error(write("v.gguf", g.build()), {"unsupported GGUF version " + std::to_string(v), "supported: 2, 3"});
  }
  GgufBuilder g = sample_builder();
  g.version = 0x03000000;  // version 3 written big-endian
  expect_error(write("be.gguf", g.build()), {"version", "big-endian"});
}

TEST_F(GgufTest, RejectsTruncationAtEveryByte) {
  GgufBuilder g = sample_builder();
  const Bytes full = g.build();
  // Every proper prefix is missing part of some structure or of the last tensor's data.
  for (size_t n = 0; n < full.size(); ++n) {
    const std::string path = write("cut.gguf", Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)));
    try {
      GgufFile::open(path);
      ADD_FAILURE() << "prefix of " << n << " bytes opened";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;
      const bool data_cut = n >= g.infos_end;
      EXPECT_NE(msg.find(data_cut ? "outside the file" : "truncated"), std::string::npos) << n << ": " << msg;
    }
  }
}

TEST_F(GgufTest, RejectsTruncatedStories260k) {
  const Bytes full = read_all(test::stories260k());
  const GgufFile f = GgufFile::open(test::stories260k());
  // Tensor infos start where the first tensor's name (with its uint64 length prefix) appears.
  Bytes first;
  put_str(first, f.tensors().front().name);
  const auto it = std::search(full.begin() + 24, full.end(), first.begin(), first.end());
  ASSERT_NE(it, full.end());
  const size_t infos = static_cast<size_t>(it - full.begin()), data = f.data_offset();
  struct Cut {
    size_t n;
    std::vector<std::string> words;
  };
  const std::vector<Cut> cuts = {
      {2, {"truncated", "magic", "byte offset 0", "file size is 2"}},
      {12, {"truncated", "tensor count", "header", "byte offset 8"}},
      {(24 + infos) / 2, {"truncated", "key '"}},                                         // inside the metadata
      {infos + first.size() + 2, {"truncated", "n_dims", "tensor 'token_embd.weight'"}},  // first tensor info
      {data - 40, {"truncated", "tensor"}},                                               // inside the last tensor info
      {data + 1000, {"outside the file", "token_embd.weight"}},                           // inside the data
      {full.size() - 1, {"outside the file", "(size " + std::to_string(full.size() - 1) + ")"}},
  };
  for (const Cut& c : cuts) {
    expect_error(write("cut.gguf", Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(c.n))), c.words);
  }
}

TEST_F(GgufTest, RejectsTensorOutsideFile) {
  GgufBuilder g = sample_builder();
  g.tensors[1].offset = 1ull << 20;  // aligned, but far past the end
  const Bytes b = g.build();
  expect_error(write("out.gguf", b),
               {"tensor 'w.f16'", "outside the file", "(size " + std::to_string(b.size()) + ")",
                "[" + std::to_string(g.data_start + (1ull << 20)) + ", "});
  g.tensors[1].offset = 0xFFFFFFFFFFFFFFC0ull;  // offset + data_start overflows uint64
  expect_error(write("wrap.gguf", g.build()), {"tensor 'w.f16'", "outside the file"});
  g.tensors[1].offset.reset();
  g.tensors[1].dims = {8, 1ull << 40};  // size far larger than the file
  expect_error(write("big.gguf", g.build()), {"tensor 'w.f16'", "outside the file"});
  g.tensors[1].dims = {1ull << 40, 1ull << 40};  // element count overflows int64
  expect_error(write("huge.gguf", g.build()), {"tensor 'w.f16'", "overflow"});
}

TEST_F(GgufTest, RejectsUnknownTensorType) {
  // Ids and names from gguf-py's GGMLQuantizationType: 16 = IQ2_XXS, 34 = TQ1_0 (real ggml types
  // kvevict does not implement); 1000 is no ggml type at all.
  const std::pair<uint32_t, std::string> cases[] = {{16u, "iq2_xxs"}, {34u, "tq1_0"}, {1000u, "type#1000"}};
  for (const auto& [id, name] : cases) {
    GgufBuilder g = sample_builder();
    g.tensors[0].type = id;
    expect_error(write("type.gguf", g.build()),
                 {"tensor 'w.f32'", "type " + name + " (id " + std::to_string(id) + ")"});
  }
}

TEST_F(GgufTest, RejectsHugeStringLength) {
  GgufBuilder g = sample_builder();
  g.kvs[2].second = str("x");
  const uint64_t huge = 1ull << 62;
  std::memcpy(g.kvs[2].second.payload.data(), &huge, 8);
  expect_error(write("str.gguf", g.build()), {"string length " + std::to_string(huge), "key 't.u8'", "file size"});
  GgufBuilder h = sample_builder();
  h.tensors[0].name = std::string(5000, 'n');  // longer than the whole (cut) file
  Bytes b = h.build();
  b.resize(h.kv_end + 100);
  expect_error(write("name.gguf", b), {"string length 5000", "tensor info #0", "truncated"});
}

TEST_F(GgufTest, RejectsHugeCounts) {
  GgufBuilder g = sample_builder();
  Bytes b = g.build();
  const uint64_t huge = 1ull << 60;
  std::memcpy(b.data() + 8, &huge, 8);  // tensor count (spec: header byte 8)
  expect_error(write("nt.gguf", b), {"tensor count 1152921504606846976", "header"});
  b = g.build();
  std::memcpy(b.data() + 16, &huge, 8);  // metadata count (spec: header byte 16)
  expect_error(write("nkv.gguf", b), {"metadata key/value count", "header"});
  GgufBuilder h = sample_builder();
  h.kvs[16].second = arr(VT::UINT64, {});  // then overwrite its count
  std::memcpy(h.kvs[16].second.payload.data() + 4, &huge, 8);
  expect_error(write("arr.gguf", h.build()), {"array length 1152921504606846976", "key 't.ints'"});
}

TEST_F(GgufTest, RejectsBadNDims) {
  for (uint32_t n : {0u, 5u, 1000000u}) {  // ggml: GGML_MAX_DIMS = 4
    GgufBuilder g = sample_builder();
    Bytes b = g.build();
    // n_dims of the first tensor follows its name: infos start at kv_end with u64 len + "w.f32".
    std::memcpy(b.data() + g.kv_end + 8 + 5, &n, 4);
    expect_error(write("ndims.gguf", b), {"tensor 'w.f32'", "n_dims " + std::to_string(n)});
  }
}

TEST_F(GgufTest, RejectsMisalignedOffset) {
  GgufBuilder g = sample_builder();
  g.tensors[2].offset = 64 + 4;  // in the file, but not a multiple of general.alignment = 64
  expect_error(write("mis.gguf", g.build()), {"tensor 'w.bf16'", "offset 68", "alignment 64"});
}

TEST_F(GgufTest, RejectsBadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {  // spec: must be a non-zero power of two
    GgufBuilder g = sample_builder();
    g.kvs[1].second = scalar<uint32_t>(VT::UINT32, a);
    expect_error(write("align.gguf", g.build()), {"general.alignment = " + std::to_string(a), "power of two"});
  }
  GgufBuilder g = sample_builder();
  g.kvs[1].second = str("64");
  expect_error(write("align.gguf", g.build()), {"general.alignment", "string"});
}

// Spec enforcement (GGUF spec, docs/gguf.md): each file below loaded before.
TEST_F(GgufTest, RejectsAlignmentOutsideSpec) {
  // 1 and 4: powers of two but not multiples of 8 (1 let float rows sit misaligned); 2^31: absurd.
  for (uint32_t a : {1u, 4u, 1u << 31}) {
    GgufBuilder g = sample_builder();
    g.kvs[1].second = scalar<uint32_t>(VT::UINT32, a);
    expect_error(write("align.gguf", g.build()), {"general.alignment = " + std::to_string(a), "multiple of 8"});
  }
}

TEST_F(GgufTest, RejectsZeroDimsAndEmptyOrInvalidNames) {
  GgufBuilder g = sample_builder();
  g.tensors[1].dims = {8, 0};
  g.tensors[1].data.clear();
  expect_error(write("zerodim.gguf", g.build()), {"tensor 'w.f16'", "dimension 1 = 0"});
  g = sample_builder();
  g.tensors[2].name = "";
  expect_error(write("noname.gguf", g.build()), {"tensor info #2", "empty name"});
  g = sample_builder();
  g.tensors[2].name = "w.\xC3(";  // a lead byte without its continuation
  expect_error(write("badname.gguf", g.build()), {"tensor info #2", "not valid UTF-8"});
  g = sample_builder();
  g.kvs[4].first = "";
  expect_error(write("nokey.gguf", g.build()), {"metadata entry #4", "empty key"});
  g = sample_builder();
  g.kvs[4].first = std::string("t.\xED\xA0\x80");  // UTF-8-encoded surrogate U+D800
  expect_error(write("badkey.gguf", g.build()), {"metadata entry #4", "not valid UTF-8"});
}

TEST_F(GgufTest, RejectsOverlappingTensors) {
  // An F32 [16] tensor retyped to F16 with its offset moved inside its neighbour's bytes.
  GgufBuilder g = sample_builder();
  g.tensors[1].offset = 0;  // w.f16 (16 bytes) at the start of w.f32's 64 bytes
  expect_error(write("overlap.gguf", g.build()), {"tensors 'w.f32'", "'w.f16'", "overlap"});
}

TEST_F(GgufTest, RejectsMistypedTokenizerArrays) {
  GgufBuilder g = sample_builder();
  g.kvs.push_back({"tokenizer.ggml.scores", arr(VT::UINT8, {scalar<uint8_t>(VT::UINT8, 1)})});
  expect_error(write("scores.gguf", g.build()), {"tokenizer.ggml.scores", "array of uint8", "array of float32"});
  g = sample_builder();
  g.kvs.push_back({"tokenizer.ggml.token_type", arr(VT::INT8, {scalar<int8_t>(VT::INT8, 1)})});
  expect_error(write("types.gguf", g.build()), {"tokenizer.ggml.token_type", "array of int8", "array of int32"});
  g = sample_builder();
  g.kvs.push_back({"tokenizer.ggml.tokens", str("a")});
  expect_error(write("tokens.gguf", g.build()), {"tokenizer.ggml.tokens", "string", "array of string"});
}

TEST_F(GgufTest, RejectsStructuralCorruption) {
  GgufBuilder g = sample_builder();
  g.kvs[3].first = g.kvs[2].first;
  expect_error(write("dupkey.gguf", g.build()), {"duplicate", "key 't.u8'"});
  g = sample_builder();
  g.tensors[1].name = g.tensors[0].name;
  expect_error(write("duptensor.gguf", g.build()), {"duplicate", "tensor 'w.f32'"});
  g = sample_builder();
  g.kvs[2].second.type = static_cast<VT>(13);
  expect_error(write("vtype.gguf", g.build()), {"key 't.u8'", "unknown value type id 13"});
  g = sample_builder();
  g.tensors[3].dims = {48};  // ggml: Q8_0 rows hold whole 32-element blocks
  expect_error(write("blk.gguf", g.build()), {"tensor 'w.q8_0'", "dims[0] = 48", "block size 32"});
  g = sample_builder();
  Enc deep = arr(VT::UINT8, {});
  for (int i = 0; i < 40; ++i) deep = arr(VT::ARRAY, {deep});
  g.kvs.push_back({"t.deep", deep});
  expect_error(write("deep.gguf", g.build()), {"key 't.deep'", "nests arrays"});
  expect_error((dir_ / "missing.gguf").string(), {"cannot open", "No such file"});
  expect_error(dir_.string(), {"not a regular file"});
}

// Random corruption of the header/metadata/infos: the reader either opens the file with every
// tensor inside it or throws kvevict::Error; never crashes (run under ASan/UBSan to be sure).
TEST_F(GgufTest, SurvivesRandomCorruption) {
  GgufBuilder g = sample_builder();
  const Bytes full = g.build();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<size_t> pos(0, g.infos_end - 1);
  std::uniform_int_distribution<int> byte(0, 255), count(1, 4);
  int opened = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    Bytes b = full;
    for (int k = count(rng); k > 0; --k) b[pos(rng)] = static_cast<uint8_t>(byte(rng));
    const std::string path = write("fuzz.gguf", b);
    try {
      const GgufFile f = GgufFile::open(path);
      ++opened;
      for (const GgufTensor& t : f.tensors()) {
        ASSERT_LE(f.data_offset() + t.offset + static_cast<uint64_t>(t.n_bytes), f.file_size()) << t.name;
      }
    } catch (const Error& e) {
      ASSERT_EQ(std::string(e.what()).rfind(path, 0), 0u) << e.what();
    }
  }
  EXPECT_GT(opened, 0);  // some flips only change values
}

// ------------------------------------------------------------------------------------------------
// ggml_types: conversions.

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Expected: IEEE 754 binary16 encodings.
TEST(GgmlTypes, Fp16KnownBitPatterns) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(fp32_to_fp16(INFINITY), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(-INFINITY), 0xFC00);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp16_to_fp32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(fp16_to_fp32(0x7C00), INFINITY);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7C01)));  // signalling nan stays nan
  const uint16_t nan16 = fp32_to_fp16(NAN);
  EXPECT_EQ(nan16 & 0x7C00, 0x7C00);
  EXPECT_NE(nan16 & 0x03FF, 0);
  // Round to nearest, ties to even: halfway cases pick the even mantissa.
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie 1 | 1+2^-10 -> 1
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie -> even 0x3C02
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7BFF);                          // below the halfway point
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);                          // tie with 65536 -> inf
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie 0 | 2^-24 -> 0
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25) * 1.0001f), 0x0001);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);     // tie 1 | 2 -> 2
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1023.5f, -24)), 0x0400);  // subnormal rounds up to normal
  EXPECT_EQ(fp32_to_fp16(1e-30f), 0x0000);
}

// Every finite half survives half -> float -> half (the conversion up is exact).
TEST(GgmlTypes, Fp16RoundTripAllPatterns) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if ((h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0) {
      EXPECT_TRUE(std::isnan(f)) << h;
      continue;
    }
    EXPECT_EQ(fp32_to_fp16(f), h) << std::hex << h;
  }
}

#if defined(__F16C__)
// Expected: the CPU's own IEEE conversion (F16C vcvtph2ps / vcvtps2ph, round to nearest even).
TEST(GgmlTypes, Fp16MatchesHardware) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float want = _cvtsh_ss(static_cast<uint16_t>(h));
    if (std::isnan(want)) continue;
    EXPECT_EQ(bits(fp16_to_fp32(static_cast<uint16_t>(h))), bits(want)) << std::hex << h;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const float f = from_bits(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)) << std::hex << bits(f);
  }
}
#endif

// Expected: bfloat16 is the top 16 bits of a float32 (1.0 = 0x3F80), rounded to nearest even.
TEST(GgmlTypes, Bf16KnownBitPatterns) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_fp32(0x3F80), 1.0f);
  EXPECT_EQ(bits(bf16_to_fp32(0xBF80)), 0xBF800000u);  // -1.0: the low half is zero
  EXPECT_EQ(fp32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808000)), 0x3F80);  // tie -> even
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F818000)), 0x3F82);  // tie -> even
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808001)), 0x3F81);  // above the tie
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7F7FFFFF)), 0x7F80);  // FLT_MAX rounds up to inf
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00000001)), 0x0000);  // smallest float subnormal -> 0
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(from_bits(0x7F800001)))));  // nan payload in low bits
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(fp32_to_bf16(f), h);
    }
  }
}

// Expected: ggml's block sizes (ggml.c type_traits: blck_size / type_size).
TEST(GgmlTypes, BlockSizesAndNames) {
  EXPECT_EQ(ggml_block_bytes(GgmlType::F32), 4);
  EXPECT_EQ(ggml_block_bytes(GgmlType::F16), 2);
  EXPECT_EQ(ggml_block_bytes(GgmlType::BF16), 2);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q8_0), 34);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q4_0), 18);
  EXPECT_EQ(ggml_block_elems(GgmlType::Q8_0), 32);
  EXPECT_EQ(ggml_block_elems(GgmlType::BF16), 1);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_0, 4096), 128 * 18);
  EXPECT_EQ(ggml_row_bytes(GgmlType::F16, 3), 6);
  EXPECT_THROW(ggml_row_bytes(GgmlType::Q8_0, 33), Error);
  EXPECT_THROW(ggml_row_bytes(GgmlType::F32, -1), Error);
  EXPECT_EQ(ggml_type_name(8), "q8_0");
  EXPECT_EQ(ggml_type_name(3), "q4_1");
  EXPECT_EQ(ggml_type_name(4), "type#4");  // removed from ggml (Q4_2)
  EXPECT_TRUE(ggml_type_supported(30));
  EXPECT_FALSE(ggml_type_supported(16));  // IQ2_XXS
}

// ------------------------------------------------------------------------------------------------
// ggml_types: kernels against scalar references written here.

// Reference dequantiser: reads the block bytes directly (layout from ggml_types.h).
std::vector<double> ref_dequant(GgmlType t, const Bytes& row, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  const uint8_t* p = row.data();
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    switch (t) {
      case GgmlType::F32: {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        out[i] = f;
        break;
      }
      case GgmlType::F16:
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = fp16_to_fp32(h);
        break;
      case GgmlType::BF16:
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = from_bits(uint32_t{h} << 16);
        break;
      case GgmlType::Q8_0: {
        const uint8_t* blk = p + 34 * (i / 32);
        std::memcpy(&h, blk, 2);
        out[i] = double{fp16_to_fp32(h)} * static_cast<int8_t>(blk[2 + i % 32]);
        break;
      }
      case GgmlType::Q4_0: {
        const uint8_t* blk = p + 18 * (i / 32);
        std::memcpy(&h, blk, 2);
        const int j = static_cast<int>(i % 32);
        const int nib = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
        out[i] = double{fp16_to_fp32(h)} * (nib - 8);
        break;
      }
      default:
        throw std::logic_error("ref_dequant: no reference for this type here (see quant_test.cpp)");
    }
  }
  return out;
}

// A random row of type t holding roughly N(0,1) values (quantised rows via the quantisers).
Bytes random_row(GgmlType t, int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = nd(rng);
  Bytes row(static_cast<size_t>(ggml_row_bytes(t, n)));
  switch (t) {
    case GgmlType::F32:
      std::memcpy(row.data(), v.data(), row.size());
      break;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(v[i]);
        std::memcpy(&row[2 * i], &h, 2);
      }
      break;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(v[i]);
        std::memcpy(&row[2 * i], &h, 2);
      }
      break;
    case GgmlType::Q8_0:
      quantize_row_q8_0(v.data(), row.data(), n);
      break;
    case GgmlType::Q4_0:
      quantize_row_q4_0(v.data(), row.data(), n);
      break;
    default:
      quantize_row(t, v.data(), row.data(), n);
      break;
  }
  return row;
}

const GgmlType kAllTypes[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0};

TEST(GgmlTypes, DequantizeMatchesScalarReference) {
  std::mt19937 rng(42);
  for (GgmlType t : kAllTypes) {
    for (int64_t n : {32, 64, 256}) {
      Bytes row = random_row(t, n, rng);
      if (t == GgmlType::Q8_0 || t == GgmlType::Q4_0) {  // arbitrary quant bytes, finite scales
        const int64_t bb = ggml_block_bytes(t);
        for (size_t i = 0; i < row.size(); ++i) {
          if (i % bb >= 2) row[i] = static_cast<uint8_t>(rng());
        }
      }
      std::vector<float> got(static_cast<size_t>(n));
      dequantize_row(t, row.data(), got.data(), n);
      const std::vector<double> want = ref_dequant(t, row, n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[i], static_cast<float>(want[i])) << ggml_type_name(uint32_t(t)) << " " << i;
    }
  }
}

// dot_row against a double-precision sum of the same products. Tolerance 1e-5 relative to
// sum |a_i x_i| (the condition-independent scale of float32 summation error; a plain relative
// error is meaningless when the sum cancels).
TEST(GgmlTypes, DotRowMatchesDoubleReference) {
  std::mt19937 rng(99);
  std::normal_distribution<float> nd;
  for (GgmlType t : kAllTypes) {
    std::vector<int64_t> lengths;
    for (int64_t n = 32; n <= 4096; n = n * 2 + 32) lengths.push_back(n);
    lengths.push_back(4096);
    if (ggml_block_elems(t) == 1) lengths.insert(lengths.end(), {1, 7, 33, 100, 4095});  // SIMD tails
    for (int64_t n : lengths) {
      const Bytes row = random_row(t, n, rng);
      std::vector<float> xbuf(static_cast<size_t>(n) + 1);
      for (float& v : xbuf) v = nd(rng);
      const float* x = xbuf.data() + 1;  // deliberately not 32-byte aligned
      const std::vector<double> a = ref_dequant(t, row, n);
      double want = 0, scale = 0;
      for (int64_t i = 0; i < n; ++i) {
        want += a[i] * x[i];
        scale += std::fabs(a[i] * x[i]);
      }
      const float got = dot_row(t, row.data(), x, n);
      EXPECT_NEAR(got, want, 1e-5 * scale + 1e-30) << ggml_type_name(uint32_t(t)) << " n=" << n;
    }
  }
  float dummy[64] = {};
  EXPECT_THROW(dot_row(GgmlType::Q4_0, dummy, dummy, 48), Error);
}

// Expected: ggml's quantisers by hand. Block x_j = j - 16 (j = 0..31).
// Q8_0: d = 16/127, q = round(x * 127/16), half away from zero: x = 8 -> 63.5 -> 64.
// Q4_0: max-by-abs is -16, d = -16/-8 = 2, q = min(15, trunc(x/2 + 8.5)) = min(15, (j+1)/2).
TEST(GgmlTypes, QuantizeMatchesGgmlByHand) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  Bytes q8(34), q4(18);
  quantize_row_q8_0(x.data(), q8.data(), 32);
  quantize_row_q4_0(x.data(), q4.data(), 32);
  uint16_t d;
  std::memcpy(&d, q8.data(), 2);
  EXPECT_EQ(d, fp32_to_fp16(16.0f / 127.0f));
  EXPECT_EQ(static_cast<int8_t>(q8[2 + 0]), -127);
  EXPECT_EQ(static_cast<int8_t>(q8[2 + 24]), 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(static_cast<int8_t>(q8[2 + j]), static_cast<int>(std::round((j - 16) * 127.0 / 16.0))) << j;
  }
  std::memcpy(&d, q4.data(), 2);
  EXPECT_EQ(d, 0x4000);  // 2.0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(q4[2 + j] & 15, std::min(15, (j + 1) / 2)) << j;
    EXPECT_EQ(q4[2 + j] >> 4, std::min(15, (j + 17) / 2)) << j;
  }
  // The sign of the largest-magnitude element is kept: max +10 gives d = -1.25, q = 0 for it.
  std::vector<float> y(32, 1.0f);
  y[5] = 10.0f;
  quantize_row_q4_0(y.data(), q4.data(), 32);
  std::memcpy(&d, q4.data(), 2);
  EXPECT_EQ(fp16_to_fp32(d), -1.25f);
  EXPECT_EQ(q4[2 + 5] & 15, 0);
  // All-zero block: d = 0, every element decodes to 0.
  std::vector<float> z(32, 0.0f), back(32, 1.0f);
  quantize_row_q4_0(z.data(), q4.data(), 32);
  dequantize_row(GgmlType::Q4_0, q4.data(), back.data(), 32);
  for (float v : back) EXPECT_EQ(v, 0.0f);
  quantize_row_q8_0(z.data(), q8.data(), 32);
  dequantize_row(GgmlType::Q8_0, q8.data(), back.data(), 32);
  for (float v : back) EXPECT_EQ(v, 0.0f);
}

// Error bounds: Q8_0 rounds to the nearest of 255 levels (|err| <= d/2, plus the fp16 rounding
// of d times |q| <= 127: <= 127 * d * 2^-11); Q4_0 likewise with 16 levels, except that the
// clamp 16 -> 15 can cost a full step d on the side opposite the maximum.
TEST(GgmlTypes, QuantizeDequantizeErrorBounds) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int64_t n = 32 * 64;
  std::vector<float> x(n), back(n);
  for (float& v : x) v = nd(rng) * 3.0f;
  Bytes q8(static_cast<size_t>(ggml_row_bytes(GgmlType::Q8_0, n))),
      q4(static_cast<size_t>(ggml_row_bytes(GgmlType::Q4_0, n)));
  quantize_row_q8_0(x.data(), q8.data(), n);
  dequantize_row(GgmlType::Q8_0, q8.data(), back.data(), n);
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const double d = amax / 127.0;
    for (int j = 0; j < 32; ++j) {
      ASSERT_LE(std::fabs(back[b * 32 + j] - x[b * 32 + j]), d * (0.5 + 127.0 / 2048) + 1e-6) << b << " " << j;
    }
  }
  quantize_row_q4_0(x.data(), q4.data(), n);
  dequantize_row(GgmlType::Q4_0, q4.data(), back.data(), n);
  double mean_err = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const double d = amax / 8.0;
    for (int j = 0; j < 32; ++j) {
      const double err = std::fabs(back[b * 32 + j] - x[b * 32 + j]);
      ASSERT_LE(err, d * (1.0 + 8.0 / 2048) + 1e-6) << b << " " << j;
      mean_err += err / d;
    }
  }
  EXPECT_LT(mean_err / n, 0.3);  // uniform rounding error averages d/4
}

}  // namespace
}  // namespace kvevict
