// Pre-tokenizer regexes on PCRE2 against the Python `regex` package (the engine family HF
// tokenizers' patterns are written for), on the 58 reference strings plus case / contraction /
// path cases. This is the only check of the GPT-4o (Phi-4-mini) pattern: no tiny-random file uses
// it. The Qwen2 and Llama-3 patterns are also covered end to end by tokenizer_bpe_test.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/tokenizer/bpe.h"
#include "test_paths.h"
#include "test_tmp.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<std::string> texts() {
  std::ifstream in(test::shared_path("reference/tiny-random-qwen2.json"));
  if (!in) throw std::runtime_error("cannot open reference/tiny-random-qwen2.json");
  std::vector<std::string> out;
  const json ref = json::parse(in);  // named: a range-for over parse(in).at(...) would outlive the temporary
  for (const json& e : ref.at("tokenize")) out.push_back(e.at("text").get<std::string>());
  for (const char* t : {"HelloWorld ABCdef XMLHttpRequest", "I'M HERE, don't WON'T you'll", "path/to\n/file //x",
                        "Ünïcödé ÇA ça", "numbers 1234567 and 3.14159", "tabs\t\tand  \n\n  spaces   ",
                        "combining e\xCC\x81 marks", "日本語のテキスト", "한국어 텍스트"}) {
    out.emplace_back(t);
  }
  return out;
}

bool regex_available() { return std::system("python3 -c 'import regex' >/dev/null 2>&1") == 0; }

void check(tok::BpePre pre, const std::string& name) {
  if (!regex_available()) {
    const char* ci = std::getenv("CI");
    if (ci && std::string(ci) == "true")
      FAIL() << "python3 regex missing under CI=true (scripts/setup.sh installs python3-regex)";
    GTEST_SKIP() << "python3 regex not installed (apt-get install python3-regex)";
  }
  const std::vector<std::string> ts = texts();
  const fs::path dir = test::fresh_dir("regex_" + name);
  std::ofstream(dir / "in.json") << json{{"pre", name}, {"texts", ts}}.dump();
  const std::string cmd = "python3 '" + kvevict::test::source_path("tests/bpe_regex_reference.py") + "' '" +
      (dir / "in.json").string() + "' '" + (dir / "out.json").string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream out(dir / "out.json");
  const auto want = json::parse(out).get<std::vector<std::vector<std::string>>>();
  fs::remove_all(dir);
  ASSERT_EQ(want.size(), ts.size());
  const tok::BpeModel model(tok::PieceIndex{}, {}, pre, false, "test");
  for (size_t i = 0; i < ts.size(); ++i) {
    std::vector<std::string> got;
    for (const std::string_view w : model.pre_tokenize(ts[i])) got.emplace_back(w);
    EXPECT_EQ(got, want[i]) << name << ": " << ts[i];
  }
}

TEST(TokenizerRegex, Qwen2MatchesPythonRegex) { check(tok::BpePre::Qwen2, "qwen2"); }
TEST(TokenizerRegex, Llama3MatchesPythonRegex) { check(tok::BpePre::Llama3, "llama3"); }
TEST(TokenizerRegex, Gpt4oMatchesPythonRegex) { check(tok::BpePre::Gpt4o, "gpt4o"); }

}  // namespace
}  // namespace kvevict
