// Shared by the Hugging Face checkpoint tests (tests/tokenizer_hf_test.cpp,
// tests/hf_checkpoint_test.cpp): paths, the Python reference helper tests/hf_reference.py (NumPy
// forward pass, the `tokenizers` package, GGUF -> checkpoint conversion), the tokenizer test
// strings and the comparison against `tokenizers`.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_run.h"
#include "model/tokenizer.h"
#include "test_paths.h"
#include "test_tmp.h"

namespace kvevict::test::hf {

namespace fs = std::filesystem;
using nlohmann::json;

inline std::string tinystories_dir() { return shared_path("models/tinystories-656k"); }
inline std::string reference_script() { return kvevict::test::source_path("tests/hf_reference.py"); }

/// The test program's temporary folder (test_tmp.h), removed when the program ends.
inline fs::path temp_root() { return fs::path(test::tmp_dir()); }

// The Python references need numpy, safetensors and tokenizers (scripts/setup.sh installs
// them); missing ones skip locally and fail under CI.
inline bool python_ready(const char* modules) {
  static std::map<std::string, bool> cache;
  auto it = cache.find(modules);
  if (it == cache.end()) {
    const std::string cmd = std::string("python3 -c 'import ") + modules + "' >/dev/null 2>&1";
    it = cache.emplace(modules, std::system(cmd.c_str()) == 0).first;
  }
  return it->second;
}
#define REQUIRE_PYTHON(modules)                                                                     \
  if (!::kvevict::test::hf::python_ready(modules)) {                                                \
    if (::kvevict::test::in_ci())                                                                   \
      GTEST_FAIL() << "python3 modules " << modules << " missing under CI=true (scripts/setup.sh)"; \
    GTEST_SKIP() << "python3 modules " << modules << " not installed";                              \
  }
#define REQUIRE_TINYSTORIES()                                                                  \
  if (!std::filesystem::exists(::kvevict::test::hf::tinystories_dir() + "/model.safetensors")) \
  KVEVICT_SKIP_UNLESS_CI(::kvevict::test::hf::tinystories_dir() << " not found")

inline std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(id);
  }
  return s;
}

inline json run_reference(const std::string& args) {
  const CliResult r = run_shell("python3 '" + reference_script() + "' " + args + " 2>&1");
  if (r.code != 0) throw std::runtime_error("hf_reference.py " + args + " failed: " + r.out);
  return json::parse(r.out);
}

// The strings of the existing tokenizer tests (reference/stories260K.json and the 58 family
// strings of reference/tiny-random-qwen2.json) plus Unicode and whitespace edge cases.
inline std::vector<std::string> tokenizer_strings() {
  std::vector<std::string> out;
  for (const char* rel : {"reference/stories260K.json", "reference/tiny-random-qwen2.json"}) {
    std::ifstream in(shared_path(rel));
    if (!in) continue;
    const json j = json::parse(in);
    for (const json& e : j.at("tokenize")) out.push_back(e.at("text").get<std::string>());
  }
  for (const char* s : {"",
                        " ",
                        "  ",
                        "   ",
                        "\n",
                        "\t",
                        " \n ",
                        "a",
                        " a",
                        "a ",
                        "  a  b  ",
                        "x\u00a0y",
                        "x\u3000y",
                        "zero\u200bwidth",
                        "e\u0301 vs \u00e9",
                        "\u01c4 \ufb01 \u2126",
                        "\U0001F469\u200D\U0001F4BB",
                        "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
                        "\r\n\r\n",
                        "tab\tsep\tvalues",
                        "<|start_story|>",
                        "<|end_story|>",
                        "x <|end_story|> y",
                        "a<|end_story|>b",
                        "<|start_story|>Once<|end_story|>",
                        "<unk>",
                        "<s></s>",
                        "<|im_start|>user\nhi<|im_end|>",
                        "<think>\n</think>",
                        "\u2581already escaped",
                        "~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./"})
    out.emplace_back(s);
  return out;
}

/// Strings and individual id comparisons made by check_tokenizer_against_package.
struct TokCounts {
  int strings = 0, checks = 0;
};

// Our tokenizer against the tokenizers package on `dir`/tokenizer.json: three settings per
// string (add_special with specials parsed; no add_special; specials not parsed).
inline TokCounts check_tokenizer_against_package(const Tokenizer& t, const std::string& dir,
                                                 const std::vector<std::string>& strings) {
  const fs::path in = temp_root() / "strings.json", out = temp_root() / "ids.json";
  std::ofstream(in) << json(strings).dump();
  const CliResult r = run_shell("python3 '" + reference_script() + "' tokenize '" + dir + "' '" + in.string() + "' '" +
                                out.string() + "' 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  TokCounts c;
  if (r.code != 0) return c;
  std::ifstream ins(out);
  for (const json& e : json::parse(ins)) {
    const std::string text = e.at("text").get<std::string>();
    ++c.strings;
    EXPECT_EQ(t.encode(text, true, true), e.at("ids_add_special").get<std::vector<int32_t>>()) << dir << ": " << text;
    EXPECT_EQ(t.encode(text, false, true), e.at("ids").get<std::vector<int32_t>>()) << dir << ": " << text;
    EXPECT_EQ(t.encode(text, false, false), e.at("ids_no_parse_special").get<std::vector<int32_t>>())
        << dir << " (specials not parsed): " << text;
    c.checks += 3;
  }
  return c;
}

struct Family {
  std::string family, stem;
};
inline void PrintTo(const Family& f, std::ostream* os) { *os << f.stem; }

// Converted once per build tree and cached (the conversion reads 25 MB GGUFs); the cache key is
// the converter's text and the GGUF's size, so editing hf_reference.py regenerates it.
inline std::string converted_dir(const std::string& stem) {
  const std::string gguf = shared_path("models/tiny-random/" + stem + ".gguf");
  std::ifstream script(reference_script());
  std::stringstream ss;
  ss << script.rdbuf() << fs::file_size(gguf);
  const fs::path cache = fs::path(kvevict::test::kvevict_binary()).parent_path() / "test-fixtures" /
      (stem + "-" + std::to_string(std::hash<std::string>{}(ss.str()) % 1000000007));
  if (fs::exists(cache / "config.json")) return cache.string();
  fs::create_directories(cache.parent_path());
  const fs::path tmp = cache.string() + ".tmp" + std::to_string(::getpid());
  const CliResult r =
      run_shell("python3 '" + reference_script() + "' convert '" + gguf + "' '" + tmp.string() + "' 2>&1");
  if (r.code != 0) throw std::runtime_error("hf_reference.py convert " + stem + " failed: " + r.out);
  std::error_code ec;
  fs::rename(tmp, cache, ec);  // another test process may have won the race: use its copy
  if (ec) fs::remove_all(tmp, ec);
  return cache.string();
}

}  // namespace kvevict::test::hf
