// Reproducers of small reliability faults: each input below used to run silently (or score a
// single chunk); each now gets a one-line error or a warning. Expected behaviour: llama.cpp's
// perplexity tool for the 2 x n_ctx rule, eviction-spec.md / the policies' sources otherwise.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "cli_run.h"
#include "eval/perplexity.h"
#include "eviction/registry.h"
#include "eviction/schedule.h"
#include "model/model.h"
#include "model_fixture.h"
#include "test_paths.h"
#include "test_tmp.h"
#include "util/error.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;

TEST(Reliability, StreamingWithoutSinksAndVaseBelowItsSinksAreRefused) {
  EvictionConfig cfg;
  cfg.budget = 128;
  cfg.recent = 64;
  EXPECT_NO_THROW(validate_eviction(cfg, make_policy("streaming")));  // 4 sinks by default
  try {
    validate_eviction(cfg, make_policy("streaming", std::nullopt, 0));
    ADD_FAILURE() << "streaming --sinks 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recency"), std::string::npos) << e.what();
  }
  cfg.budget = 67;  // K_sel = 3 < VaSE's 4 sinks
  try {
    validate_eviction(cfg, make_policy("vase"));
    ADD_FAILURE() << "vase with K_sel 3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("K_sel = B - r = 3"), std::string::npos) << e.what();
  }
  cfg.budget = 68;
  EXPECT_NO_THROW(validate_eviction(cfg, make_policy("vase")));
}

class PerplexityCli : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::fresh_dir("rel"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  fs::path dir_;
};

TEST_F(PerplexityCli, ChunkedModeNeedsTwoChunksAndRefusesCsv) {
  KVEVICT_REQUIRE_MODEL(m);
  // A text of 129..255 tokens (counted with the model's own tokenizer): llama-perplexity refuses
  // it at -c 128 ("you need at least 256 tokens"); kvevict scored one chunk.
  std::string text;
  const std::string sentence = "Once upon a time there was a little dog who liked to play in the park. ";
  while (m->tokenizer().encode(text + sentence, true).size() < 200) text += sentence;
  const size_t n = m->tokenizer().encode(text, true).size();
  ASSERT_GT(n, 128u);
  ASSERT_LT(n, 256u);
  const std::string file = write("short.txt", text);
  const std::string model = test::stories260k();
  auto r = test::run_cli("perplexity -m " + model + " -f " + file + " -c 128");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("at least 2 x -c = 256"), std::string::npos) << r.out;
  r = test::run_cli("perplexity -m " + model + " -f " + file + " -c 64 --csv " + (dir_ / "x.csv").string());
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--csv"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "x.csv"));
}

TEST_F(PerplexityCli, DirectoryMissingMarkersAndLongContextAreReported) {
  KVEVICT_REQUIRE_MODEL(m);
  const std::string model = test::stories260k();
  auto r = test::run_cli("perplexity -m " + model + " -f " + dir_.string());
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("directory"), std::string::npos) << r.out;  // CLI11: "File is actually a directory"
  // No "*** START OF" / "*** END OF" lines: a warning, and the whole file is scored.
  std::string text;
  for (int i = 0; i < 8; ++i) text += "The cat sat on the mat and looked at the bird in the tree. ";
  const std::string file = write("plain.txt", text);
  r = test::run_cli("perplexity -m " + model + " -f " + file + " --gutenberg-body --policy full");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("no Project Gutenberg START/END markers"), std::string::npos) << r.out;
  // -c beyond the model's trained context (stories260K states it in its GGUF): a warning.
  const int64_t ctx = m->config().context_length * 2;
  std::string longer;
  while (static_cast<int64_t>(m->tokenizer().encode(longer, true).size()) < 2 * ctx + 8) longer += text;
  const std::string long_file = write("long.txt", longer);
  r = test::run_cli("perplexity -m " + model + " -f " + long_file + " -c " + std::to_string(ctx) + " --chunks 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("exceeds the model's trained context"), std::string::npos) << r.out;
}

}  // namespace

TEST(GutenbergBody, BothMarkerSpellingsAndAWrappedTitle) {
  // Expected values written by hand from the two marker forms in ../shared's PG-19 books:
  // "*** START OF ... ***" on one line (10321.txt) and "***START OF ... IN\nST. PAUL***" (10146.txt).
  EXPECT_EQ(gutenberg_body("head\n*** START OF THE BOOK ***\nbody line\n*** END OF THE BOOK ***\nlicence"),
            "body line\n");
  EXPECT_EQ(gutenberg_body("head\n***START OF THE EBOOK REMINISCENCES IN\nST. PAUL***\n\nbody\n***END OF THE EBOOK\nx"),
            "\nbody\n");
  // A START line without closing stars: the body starts on the next line, not at a later "***".
  EXPECT_EQ(gutenberg_body("***START OF X\nbody\n* * *\nmore *** stars\n***END OF X"), "body\n* * *\nmore *** stars\n");
  EXPECT_EQ(gutenberg_body("no markers here"), "no markers here");
}

TEST(GutenbergBody, SharedBookWithUnspacedMarkersIsStripped) {
  const std::string path = test::shared_dir() + "/data/gutenberg-pg19-test-books/10146.txt";
  std::ifstream in(path);
  if (!in) KVEVICT_SKIP_UNLESS_CI("missing " + path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string body = gutenberg_body(text);
  EXPECT_LT(body.size(), text.size());
  EXPECT_EQ(body.find("Project Gutenberg License"), std::string::npos);  // the licence is outside the body
  EXPECT_EQ(body.find("START OF THE PROJECT"), std::string::npos);
}

}  // namespace kvevict
