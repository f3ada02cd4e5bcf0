// Tokenizer parity on the tiny-random GGUFs (real Qwen2/R1-Distill, Qwen3, Llama-3 BPE and Phi-3
// SentencePiece vocabularies). Expected ids come from shared/reference/tiny-random-<family>.json,
// written by llama.cpp (unslothai/llama.cpp d32676d7) under three settings:
//   ids                            llama_tokenize(add_special=false, parse_special=false)
//   ids_parse_special              llama_tokenize(add_special=false, parse_special=true)
//   ids_add_special_parse_special  llama_tokenize(add_special=true,  parse_special=true)
// plus, independently, the ids of llama.cpp's own .out test files (original HF tokenizers) and
// tiktoken; the reference README records that llama.cpp agrees with those on its strings.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/tokenizer.h"
#include "test_paths.h"
#include "util/error.h"

namespace kvevict {
namespace {

using nlohmann::json;

json family_json(const std::string& family) {
  std::ifstream in(test::shared_path("reference/tiny-random-" + family + ".json"));
  if (!in) throw std::runtime_error("cannot open reference/tiny-random-" + family + ".json");
  return json::parse(in);
}

// Tokenizers are loaded once per file (the BPE vocabularies carry 150k-280k merges).
const Tokenizer& tokenizer_for(const std::string& stem) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(stem);
  if (it == cache.end()) {
    const std::string path = test::shared_path("models/tiny-random/" + stem + ".gguf");
    it = cache.emplace(stem, Tokenizer::from_gguf(GgufFile::open(path))).first;
  }
  return it->second;
}

struct Counts {
  int strings = 0, checks = 0;
};

// Every reference string under every stored setting, plus decode(encode(s)) == s.
Counts check_family(const std::string& family, const std::string& stem) {
  const json ref = family_json(family);
  const Tokenizer& t = tokenizer_for(stem);
  Counts c;
  for (const json& e : ref.at("tokenize")) {
    const std::string text = e.at("text").get<std::string>();
    ++c.strings;
    const auto ids = t.encode(text, false, false);
    EXPECT_EQ(ids, e.at("ids").get<std::vector<int32_t>>()) << stem << " ids: " << text;
    const auto ids_ps = t.encode(text, false, true);
    EXPECT_EQ(ids_ps, e.at("ids_parse_special").get<std::vector<int32_t>>()) << stem << " parse_special: " << text;
    EXPECT_EQ(t.encode(text, true, true), e.at("ids_add_special_parse_special").get<std::vector<int32_t>>())
        << stem << " add_special+parse_special: " << text;
    c.checks += 3;
    if (e.contains("expected_from_llama.cpp_.out_file")) {
      // Independent: ids the original HF tokenizer produced (llama.cpp's .out test files).
      EXPECT_EQ(ids, e.at("expected_from_llama.cpp_.out_file").get<std::vector<int32_t>>())
          << stem << " .out: " << text;
      ++c.checks;
    }
    // Round trip: BPE decodes to the exact bytes; SentencePiece adds its prefix space in front
    // of the text (and after each user-defined token, whose fragment gets a prefix too).
    if (t.kind() == Tokenizer::Kind::BPE) {
      EXPECT_TRUE(t.decode(ids) == text) << stem << " round trip: " << text;
      ++c.checks;
    } else if (!text.empty()) {
      bool user_defined = false;
      for (const int32_t id : ids) user_defined |= t.type(id) == TokenType::USER_DEFINED;
      if (!user_defined) {
        EXPECT_TRUE(t.decode(ids) == " " + text) << stem << " round trip: " << text;
        ++c.checks;
      }
    }
  }
  std::printf("[tokenizer parity] %s: %d strings, %d checks\n", stem.c_str(), c.strings, c.checks);
  return c;
}

// Expected: all 58 strings x 3 settings equal llama.cpp's ids (reference JSON), .out ids equal.
TEST(TokenizerBpeParity, Qwen2DeepSeekR1) { EXPECT_EQ(check_family("qwen2", "tiny-random-qwen2-f16").strings, 58); }
TEST(TokenizerBpeParity, Qwen3) { EXPECT_EQ(check_family("qwen3", "tiny-random-qwen3-f16").strings, 58); }
TEST(TokenizerBpeParity, Llama3) { EXPECT_EQ(check_family("llama3", "tiny-random-llama3-f16").strings, 58); }
TEST(TokenizerBpeParity, Phi3Spm) {
  for (const char* stem : {"tiny-random-phi3-f16", "tiny-random-phi3-q8_0"})
    EXPECT_EQ(check_family("phi3", stem).strings, 58);
}
// The Q4_K_M copy holds Q5_0/Q4_K/Q6_K tensors; until the GGUF reader accepts those types the
// file does not open at all, and this test says so instead of passing.
TEST(TokenizerBpeParity, Phi3SpmQ4KM) {
  try {
    (void)GgufFile::open(test::shared_path("models/tiny-random/tiny-random-phi3-q4_k_m.gguf"));
  } catch (const Error& e) {
    if (std::string(e.what()).find("unknown type id") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  EXPECT_EQ(check_family("phi3", "tiny-random-phi3-q4_k_m").strings, 58);
}

// Expected (README-families.md, GGUF metadata): which files add BOS; qwen3 has
// add_bos_token=false so add_special adds nothing even though it has a BOS id (151643).
TEST(TokenizerBpeMetadata, AddBosFromMetadata) {
  EXPECT_TRUE(tokenizer_for("tiny-random-qwen2-f16").add_bos());
  EXPECT_EQ(tokenizer_for("tiny-random-qwen2-f16").bos_id(), 151646);
  EXPECT_FALSE(tokenizer_for("tiny-random-qwen3-f16").add_bos());
  EXPECT_EQ(tokenizer_for("tiny-random-qwen3-f16").bos_id(), 151643);
  EXPECT_TRUE(tokenizer_for("tiny-random-llama3-f16").add_bos());
  EXPECT_TRUE(tokenizer_for("tiny-random-phi3-f16").add_bos());
  for (const char* stem : {"tiny-random-qwen2-f16", "tiny-random-qwen3-f16", "tiny-random-llama3-f16"}) {
    EXPECT_FALSE(tokenizer_for(stem).add_eos()) << stem;
  }
  // The two-argument encode used by prompts follows the metadata too.
  const Tokenizer& q3 = tokenizer_for("tiny-random-qwen3-f16");
  EXPECT_EQ(q3.encode("Hello", true), q3.encode("Hello", false));
  const Tokenizer& q2 = tokenizer_for("tiny-random-qwen2-f16");
  EXPECT_EQ(q2.encode("Hello", true).front(), 151646);
}

// Expected ids: README-families.md (per-family EOS / end-of-generation tokens and their ids).
TEST(TokenizerBpeMetadata, EndOfGeneration) {
  const Tokenizer& q2 = tokenizer_for("tiny-random-qwen2-f16");
  EXPECT_TRUE(q2.is_eog(151643));   // <｜end▁of▁sentence｜> (EOS)
  EXPECT_FALSE(q2.is_eog(151648));  // <think>
  const Tokenizer& q3 = tokenizer_for("tiny-random-qwen3-f16");
  EXPECT_TRUE(q3.is_eog(151645));  // <|im_end|> (EOS)
  EXPECT_TRUE(q3.is_eog(151643));  // <|endoftext|>
  EXPECT_EQ(q3.token_id("<|im_end|>"), 151645);
  EXPECT_EQ(q3.token_id("</think>"), 151668);
  EXPECT_FALSE(q3.is_eog(q3.token_id("<|im_start|>")));
  const Tokenizer& l3 = tokenizer_for("tiny-random-llama3-f16");
  EXPECT_TRUE(l3.is_eog(128009));   // <|eot_id|> (EOS)
  EXPECT_TRUE(l3.is_eog(128001));   // <|end_of_text|>
  EXPECT_TRUE(l3.is_eog(128008));   // <|eom_id|>
  EXPECT_FALSE(l3.is_eog(128000));  // <|begin_of_text|>
  const Tokenizer& p3 = tokenizer_for("tiny-random-phi3-f16");
  EXPECT_TRUE(p3.is_eog(32000));   // <|endoftext|> (EOS)
  EXPECT_TRUE(p3.is_eog(32007));   // <|end|>
  EXPECT_FALSE(p3.is_eog(32010));  // <|user|>
}

// Expected: the streamed text equals the whole decode, and no chunk ends inside a UTF-8
// character even when byte tokens split one (emoji / CJK in the reference strings).
TEST(TokenizerBpeStream, HoldsBackPartialUtf8) {
  const Tokenizer& t = tokenizer_for("tiny-random-llama3-f16");
  const std::string text = "emoji 🦙🫠 and 漢字 and ZWJ 👨‍👩‍👧 done";
  const auto ids = t.encode(text, false, false);
  TokenTextStream stream(t);
  std::string joined;
  bool split_seen = false;
  for (const int32_t id : ids) {
    const std::string piece = t.piece(id);
    const std::string chunk = stream.push(id);
    split_seen |= chunk != piece;
    if (!chunk.empty()) {
      const auto last = static_cast<unsigned char>(chunk.back());
      EXPECT_TRUE(last < 0x80 || (last & 0xC0) == 0x80) << "chunk ends on a lead byte";
    }
    joined += chunk;
  }
  joined += stream.finish();
  EXPECT_EQ(joined, text);
  EXPECT_TRUE(split_seen) << "test text no longer splits a character across tokens";
}

// Expected: bytes survive encode+decode even where the text is not valid UTF-8 (the byte
// alphabet covers all 256 bytes) or holds a 200,000-space run (regex backtracking depth).
TEST(TokenizerBpeRobustness, InvalidUtf8AndLongRuns) {
  for (const char* stem : {"tiny-random-qwen3-f16", "tiny-random-llama3-f16"}) {
    const Tokenizer& t = tokenizer_for(stem);
    const std::string bad = std::string("ok \xff\xfe mid \xc3") + "(\xe2\x82) end \xf0\x9f";
    EXPECT_TRUE(t.decode(t.encode(bad, false, false)) == bad) << stem;
    const std::string run = "a" + std::string(200000, ' ') + "b\n" + std::string(50000, '\n') + "c";
    EXPECT_TRUE(t.decode(t.encode(run, false, false)) == run) << stem;
  }
}

// Not a parity check: a loose speed bound (100 KB of wikitext, BPE + regex) so an accidentally
// quadratic merge fails; the time is printed for the record.
TEST(TokenizerBpeSpeed, HundredKilobytesWellUnderASecond) {
  std::ifstream in(test::shared_path("data/wikitext-2-raw/wiki.test.raw"), std::ios::binary);
  ASSERT_TRUE(in);
  const std::string text =
      std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()).substr(0, 100 * 1024);
  for (const char* stem : {"tiny-random-qwen3-f16", "tiny-random-llama3-f16"}) {
    const Tokenizer& t = tokenizer_for(stem);
    const auto start = std::chrono::steady_clock::now();
    const auto ids = t.encode(text, false, false);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("[tokenizer speed] %s: %zu bytes -> %zu tokens in %.3f s\n", stem, text.size(), ids.size(), secs);
    EXPECT_TRUE(t.decode(ids) == text);
    EXPECT_LT(secs, 1.0);
  }
}

}  // namespace
}  // namespace kvevict
