// Tests for the safetensors reader (format/safetensors.h).
//
// Sources of expected values: files written by the reference implementation (the PyPI
// `safetensors` package, tests/safetensors_reference.py write) whose values the test knows
// independently (a fixed formula), the real TinyStories-656K checkpoint (header inspected with
// the same package), and hand-built byte strings following the format specification
// (github.com/huggingface/safetensors README "Format") for every refusal.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "format/ggml_types.h"
#include "format/safetensors.h"
#include "test_paths.h"
#include "test_tmp.h"
#include "util/error.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;

std::string temp_file(const std::string& name) { return test::tmp_path("st_" + name); }

// An 8-byte little-endian header size N, the header text, then `data`.
std::string write_raw(const std::string& name, uint64_t n, const std::string& header, const std::string& data) {
  const std::string path = temp_file(name);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
  return path;
}
std::string write_st(const std::string& name, const std::string& header, const std::string& data) {
  return write_raw(name, header.size(), header, data);
}

std::string open_error(const std::string& path) {
  try {
    (void)SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Expected: the header written by hand — names, dtypes, shapes, offsets, metadata, data pointers.
TEST(Safetensors, ReadsHandWrittenFile) {
  std::string data(4 * 6 + 2 * 2, '\0');
  const float f[6] = {1, 2, 3, 4, 5, 6};
  std::memcpy(data.data(), f, sizeof f);
  const uint16_t h[2] = {0x3C00, 0xC000};  // IEEE half 1.0, -2.0
  std::memcpy(data.data() + 24, h, sizeof h);
  // Padded with trailing spaces, as the reference writer pads to 8 bytes.
  const std::string header =
      R"({"__metadata__":{"format":"pt","a":"b"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("h":{"dtype":"F16","shape":[2],"data_offsets":[24,28]},"e":{"dtype":"BF16","shape":[0,5],"data_offsets":[28,28]}}   )";
  const std::string path = write_st("ok.safetensors", header, data);
  const SafetensorsFile st = SafetensorsFile::open(path);
  EXPECT_EQ(st.header_size(), header.size());
  EXPECT_EQ(st.metadata().at("format"), "pt");
  EXPECT_EQ(st.metadata().at("a"), "b");
  ASSERT_EQ(st.tensors().size(), 3u);
  const SafetensorsTensor* w = st.find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, "F32");
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->n_elements(), 6);
  float got[6];
  std::memcpy(got, w->data, sizeof got);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i], f[i]);
  const SafetensorsTensor* hh = st.find("h");
  ASSERT_NE(hh, nullptr);
  uint16_t hv[2];
  std::memcpy(hv, hh->data, 4);
  EXPECT_EQ(fp16_to_fp32(hv[0]), 1.0f);
  EXPECT_EQ(fp16_to_fp32(hv[1]), -2.0f);
  EXPECT_EQ(st.find("e")->n_elements(), 0);
  EXPECT_EQ(st.find("missing"), nullptr);
}

// Expected: the spec allows a header with no tensors ("{}") and an empty buffer.
TEST(Safetensors, EmptyHeader) {
  const SafetensorsFile st = SafetensorsFile::open(write_st("empty.safetensors", "{}", ""));
  EXPECT_TRUE(st.tensors().empty());
}

// Expected (reference writer): the PyPI safetensors package writes F32/F16/BF16 arrays whose
// values are i * 0.25 - 3 (exact in all three types); we read the same values back.
TEST(Safetensors, ReadsReferenceWriterOutput) {
  if (std::system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") != 0) {
    if (test::in_ci()) FAIL() << "python3 safetensors/numpy missing under CI=true (scripts/setup.sh installs them)";
    GTEST_SKIP() << "python3 safetensors not installed (pip install safetensors)";
  }
  const std::string path = temp_file("ref.safetensors");
  const std::string cmd =
      "python3 '" + kvevict::test::source_path("tests/safetensors_reference.py") + "' write '" + path + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const SafetensorsFile st = SafetensorsFile::open(path);
  EXPECT_EQ(st.metadata().at("writer"), "safetensors_reference.py");
  int checked = 0;
  for (const char* name : {"f32", "f16", "bf16"}) {
    const SafetensorsTensor* t = st.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, (std::vector<int64_t>{3, 5})) << name;
    for (int64_t i = 0; i < 15; ++i) {
      float v = 0;
      if (t->dtype == "F32") {
        std::memcpy(&v, t->data + 4 * i, 4);
      } else {
        uint16_t u;
        std::memcpy(&u, t->data + 2 * i, 2);
        v = t->dtype == "F16" ? fp16_to_fp32(u) : bf16_to_fp32(u);
      }
      EXPECT_EQ(v, static_cast<float>(i) * 0.25f - 3.0f) << name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 45);
  EXPECT_EQ(st.find("i64")->dtype, "I64");  // other dtypes open; the model loader refuses them
}

// Expected: the TinyStories-656K header as the safetensors package reports it (19 tensors, the
// tied-embedding alias in __metadata__, lm_head [2048, 128] F32 at offset 0).
TEST(Safetensors, TinyStories656KHeader) {
  const std::string path = test::shared_path("models/tinystories-656k/model.safetensors");
  if (!fs::exists(path)) KVEVICT_SKIP_UNLESS_CI(path << " not found");
  const SafetensorsFile st = SafetensorsFile::open(path);
  EXPECT_EQ(st.header_size(), 2160u);
  EXPECT_EQ(st.tensors().size(), 20u);
  EXPECT_EQ(st.metadata().at("model.embed_tokens.weight"), "lm_head.weight");
  const SafetensorsTensor* lm = st.find("lm_head.weight");
  ASSERT_NE(lm, nullptr);
  EXPECT_EQ(lm->shape, (std::vector<int64_t>{2048, 128}));
  EXPECT_EQ(lm->begin, 0u);
  EXPECT_EQ(lm->end, 1048576u);
}

struct BadCase {
  const char* name;
  std::string header;
  std::string data;
  const char* expect;  // substring of the one-line error
};

// Expected: each malformed header is refused with a one-line error naming the file and the
// field (spec rules in format/safetensors.h).
TEST(Safetensors, RefusesMalformedHeaders) {
  const std::string d8(8, '\0');
  const std::vector<BadCase> cases = {
      {"not_object", "[1,2]", "", "does not start with '{'"},
      {"bad_json", "{\"a\":", "", "not valid JSON"},
      {"trailing_garbage", "{} x", "", "not valid JSON"},
      {"dup_tensor",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       d8, "duplicate key 'a'"},
      {"dup_field", R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", "1234",
       "tensor 'a': duplicate key 'dtype'"},
      {"unknown_dtype", R"({"a":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}})", "1234",
       "tensor 'a': unknown dtype 'F17'"},
      {"missing_field", R"({"a":{"dtype":"F32","shape":[1]}})", "1234", "tensor 'a': missing field 'data_offsets'"},
      {"unknown_field", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", "1234",
       "tensor 'a': unknown field 'x'"},
      {"negative_dim", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "1234",
       "tensor 'a': shape holds the negative number -1"},
      {"float_dim", R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "1234",
       "tensor 'a': shape holds the non-integer number 1.5"},
      {"three_offsets", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", "1234",
       "tensor 'a': data_offsets has 3 entries"},
      {"nested", R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", "1234",
       "tensor 'a': shape holds an array"},
      {"shape_string", R"({"a":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", "1234",
       "tensor 'a': shape is a string"},
      {"meta_number", R"({"__metadata__":{"k":1}})", "", "__metadata__ value of 'k' is a number"},
      {"entry_string", R"({"a":"x"})", "", "header entry 'a' is a string"},
      {"empty_name", R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "1234", "empty name"},
      {"wrong_size", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "1234",
       "tensor 'a': data_offsets [0, 4] hold 4 bytes, but shape [2] of F32 needs 8"},
      {"end_before_begin", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", "1234",
       "end before they begin"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       d8, "overlap"},
      {"hole", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8, "belong to no tensor"},
      {"out_of_range", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d8, "(truncated file)"},
      {"trailing_bytes", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8, "(trailing bytes)"},
      {"huge_offsets",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551616]}})", "",
       "data_offsets entry 18446744073709551612 is too large"},
      {"overflow_shape", R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", d8,
       "overflows 64 bits"},
      {"bits_overflow", R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", d8,
       "overflow 64 bits"},
      {"sub_byte", R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", std::string(1, '\0'), "and 4 bits"},
  };
  for (const BadCase& c : cases) {
    const std::string path = write_st(std::string(c.name) + ".safetensors", c.header, c.data);
    const std::string err = open_error(path);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
    EXPECT_EQ(err.rfind(path + ": ", 0), 0u) << c.name << " does not start with the path: " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.name << ": " << err;
  }
}

// Expected: the size field itself is checked before anything is read (spec: N is the header size;
// the reference caps it at 100,000,000 bytes).
TEST(Safetensors, RefusesBadHeaderSizes) {
  const std::string short_path = temp_file("short.safetensors");
  std::ofstream(short_path, std::ios::binary) << "abc";
  EXPECT_NE(open_error(short_path).find("truncated file: 3 bytes"), std::string::npos);
  EXPECT_NE(open_error(write_raw("huge.safetensors", 100'000'001, "{}", "")).find("exceeds the limit of 100000000"),
            std::string::npos);
  EXPECT_NE(open_error(write_raw("past.safetensors", 1000, "{}", "")).find("runs past the end of the file"),
            std::string::npos);
  EXPECT_NE(open_error(write_raw("zero.safetensors", 0, "", "")).find("does not start with '{'"), std::string::npos);
  EXPECT_NE(open_error(test::tmp_dir()).find("cannot read: not a regular file"), std::string::npos);
  EXPECT_NE(open_error(temp_file("nonexistent.safetensors")).find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace kvevict
