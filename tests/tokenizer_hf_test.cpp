// Tokenizers read from Hugging Face `tokenizer.json` files (Tokenizer::from_hf,
// model/tokenizer/hf.h), compared with the PyPI `tokenizers` package — the library that defines
// the format — on the same file, through tests/hf_reference.py: every string of the existing
// tokenizer tests (reference/stories260K.json, the 58 strings of reference/tiny-random-*.json)
// plus Unicode and whitespace edge cases, each under three settings (BOS/EOS added with special
// tokens parsed; not added; special tokens not parsed = tokenizers' encode_special_tokens).
// Files: TinyStories-656K's own tokenizer.json (SentencePiece-style BPE: Prepend/Replace
// normalizer, byte fallback, unk fusing), variants of it written here (Metaspace pre-tokenizer,
// NFC, lstrip/rstrip added tokens, fuse_unk off), and the tokenizer.json files that
// hf_reference.py builds from the tiny-random GGUF vocabularies (byte-level BPE with a Split
// regex and NFC for Qwen2/Qwen3, ignore_merges for Llama-3, SentencePiece merges for Phi-3).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hf_fixture.h"
#include "model/tokenizer.h"
#include "util/error.h"

namespace kvevict {
namespace {

using namespace test::hf;  // NOLINT: test helpers

const Tokenizer& tinystories_tokenizer() {
  static const Tokenizer t = Tokenizer::from_hf(tinystories_dir());
  return t;
}

// Expected: the tokenizers package on the checkpoint's own tokenizer.json.
TEST(TokenizerHf, TinyStoriesMatchesTokenizersPackage) {
  REQUIRE_TINYSTORIES();
  REQUIRE_PYTHON("tokenizers");
  const std::vector<std::string> strings = tokenizer_strings();
  ASSERT_GE(strings.size(), 90u);
  const TokCounts c = check_tokenizer_against_package(tinystories_tokenizer(), tinystories_dir(), strings);
  std::printf("[hf] tinystories-656k tokenizer: %d strings, %d checks against the tokenizers package\n", c.strings,
              c.checks);
  EXPECT_EQ(c.strings, static_cast<int>(strings.size()));
}

// Expected: tokenizer_config.json / tokenizer.json of TinyStories-656K (BOS <|start_story|> = 1
// added, EOS <|end_story|> = 2, no byte pieces in the vocabulary so unknown characters are unk).
TEST(TokenizerHf, TinyStoriesSpecialTokens) {
  REQUIRE_TINYSTORIES();
  const Tokenizer& t = tinystories_tokenizer();
  EXPECT_EQ(t.n_vocab(), 2048);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_TRUE(t.add_bos());
  EXPECT_FALSE(t.add_eos());
  EXPECT_EQ(t.type(0), TokenType::UNKNOWN);
  EXPECT_EQ(t.type(1), TokenType::CONTROL);
  EXPECT_EQ(t.type(2), TokenType::CONTROL);
  EXPECT_TRUE(t.is_eog(2));
  EXPECT_EQ(t.kind(), Tokenizer::Kind::SPM);
  // Pieces decode as SentencePiece ones: U+2581 -> space; control tokens print nothing.
  EXPECT_EQ(t.decode(t.encode("Once upon a time", true)), " Once upon a time");
  EXPECT_EQ(Tokenizer::from_hf(tinystories_dir(), 4096).n_vocab(), 4096);  // padded to the embedding
  EXPECT_THROW(Tokenizer::from_hf(tinystories_dir(), 1000), Error);
}

// Variants of TinyStories-656K's tokenizer.json, each compared with the package.
TEST(TokenizerHf, PipelineVariantsMatchTokenizersPackage) {
  REQUIRE_TINYSTORIES();
  REQUIRE_PYTHON("tokenizers");
  std::ifstream in(tinystories_dir() + "/tokenizer.json");
  const json base = json::parse(in);
  const json metaspace_decoder = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}, {"split", true}};
  struct Variant {
    std::string name;
    std::function<void(json&)> edit;
  };
  const std::vector<Variant> variants = {
      {"metaspace_first",
       [&](json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = {
             {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}};
         j["decoder"] = metaspace_decoder;
       }},
      {"metaspace_always_split",
       [&](json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = {
             {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}, {"split", true}};
         j["decoder"] = metaspace_decoder;
       }},
      {"strip_user_defined",
       [](json& j) {
         for (json& a : j["added_tokens"])
           if (a["content"] == "<|end_story|>")
             a.update({{"special", false}, {"normalized", false}, {"lstrip", true}, {"rstrip", true}});
       }},
      {"nfc",
       [](json& j) {
         json& steps = j["normalizer"]["normalizers"];
         steps.insert(steps.begin(), json::object({{"type", "NFC"}}));
       }},
      {"no_fuse_unk", [](json& j) { j["model"]["fuse_unk"] = false; }},
      {"ignore_merges", [](json& j) { j["model"]["ignore_merges"] = true; }},
  };
  const std::vector<std::string> strings = tokenizer_strings();
  for (const Variant& v : variants) {
    const fs::path dir = temp_root() / ("tok_" + v.name);
    fs::create_directories(dir);
    json j = base;
    v.edit(j);
    std::ofstream(dir / "tokenizer.json") << j.dump();
    const Tokenizer t = Tokenizer::from_hf(dir.string());
    const TokCounts c = check_tokenizer_against_package(t, dir.string(), strings);
    std::printf("[hf] tinystories tokenizer variant %s: %d strings, %d checks against the tokenizers package\n",
                v.name.c_str(), c.strings, c.checks);
    EXPECT_EQ(c.strings, static_cast<int>(strings.size())) << v.name;
  }
}

// Expected: one-line errors naming file and field for what the pipeline does not implement.
TEST(TokenizerHf, RefusesWhatIsNotImplemented) {
  REQUIRE_TINYSTORIES();
  std::ifstream in(tinystories_dir() + "/tokenizer.json");
  const json base = json::parse(in);
  struct Case {
    std::string name;
    std::function<void(json&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"wordpiece", [](json& j) { j["model"]["type"] = "WordPiece"; },
       "model.type 'WordPiece' (supported: BPE) is not implemented"},
      {"lowercase",
       [](json& j) {
         j["normalizer"]["normalizers"].push_back({{"type", "Lowercase"}});
       },
       "normalizer 'Lowercase' (supported: NFC, Prepend, Replace, Sequence) is not implemented"},
      {"regex_replace",
       [](json& j) {
         j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
       },
       "normalizer Replace with a Regex pattern is not implemented"},
      {"digits",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
       },
       "pre_tokenizer 'Digits' (supported: Split, ByteLevel, Metaspace, Sequence) is not implemented"},
      {"split_removed",
       [](json& j) {
         j["pre_tokenizer"] = {
             {"type", "Split"}, {"pattern", {{"Regex", " "}}}, {"behavior", "Removed"}, {"invert", false}};
       },
       "pre_tokenizer Split behavior 'Removed' (supported: Isolated) is not implemented"},
      {"bad_regex",
       [](json& j) {
         j["pre_tokenizer"] = {
             {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}, {"invert", false}};
       },
       "pre-tokenizer regex does not compile"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; },
       "model.dropout 0.1 (BPE dropout is random) is not implemented"},
      {"single_word", [](json& j) { j["added_tokens"][1]["single_word"] = true; },
       "added_tokens[1] ('<|start_story|>') single_word = true is not implemented"},
      {"bad_merge", [](json& j) { j["model"]["merges"].push_back("nothere alsonot"); },
       "merge #1967 ('nothere', 'alsonot') uses or makes a piece that is not in the vocabulary"},
      {"dup_id", [](json& j) { j["model"]["vocab"]["dup"] = 5; }, "id 5 is given to both"},
      {"decoder",
       [](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder 'WordPiece'"},
      {"post",
       [](json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       "post_processor 'BertProcessing' is not implemented"},
      {"no_vocab", [](json& j) { j["model"].erase("vocab"); }, "model.vocab is missing or not an object"},
  };
  for (const Case& c : cases) {
    const fs::path dir = temp_root() / ("tokbad_" + c.name);
    fs::create_directories(dir);
    json j = base;
    c.edit(j);
    std::ofstream(dir / "tokenizer.json") << j.dump();
    std::string err;
    try {
      (void)Tokenizer::from_hf(dir.string());
    } catch (const Error& e) {
      err = e.what();
    }
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find((dir / "tokenizer.json").string()), std::string::npos) << c.name << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.name << ": " << err;
  }
  // tokenizer_config.json naming a token the vocabulary lacks.
  const fs::path dir = temp_root() / "tokbad_config";
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << base.dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<s>"})";
  try {
    (void)Tokenizer::from_hf(dir.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: bos_token '<s>' is not in the vocabulary"),
              std::string::npos)
        << e.what();
  }
}

class TokenizerHfFamily : public ::testing::TestWithParam<Family> {};

// Expected: the tokenizers package on the converted tokenizer.json, all strings, three settings;
// agreement with llama.cpp's ids (reference JSON) is printed, not asserted: a tokenizer.json
// rebuilt from a GGUF vocabulary need not reproduce every llama.cpp choice.
TEST_P(TokenizerHfFamily, MatchesTokenizersPackage) {
  const Family& f = GetParam();
  const std::string gguf = test::shared_path("models/tiny-random/" + f.stem + ".gguf");
  if (!fs::exists(gguf)) KVEVICT_SKIP_UNLESS_CI(gguf << " not found");
  REQUIRE_PYTHON("numpy, safetensors, tokenizers");
  const std::string dir = converted_dir(f.stem);
  const Tokenizer t = Tokenizer::from_hf(dir);
  const TokCounts c = check_tokenizer_against_package(t, dir, tokenizer_strings());
  std::ifstream in(test::shared_path("reference/tiny-random-" + f.family + ".json"));
  const json ref = json::parse(in);
  int same = 0, n = 0;
  for (const json& e : ref.at("tokenize")) {
    ++n;
    same += t.encode(e.at("text").get<std::string>(), false, false) == e.at("ids").get<std::vector<int32_t>>();
  }
  std::printf("[hf] %s tokenizer.json: %d strings, %d checks against tokenizers; llama.cpp ids equal on %d/%d\n",
              f.stem.c_str(), c.strings, c.checks, same, n);
  EXPECT_GT(c.strings, 90);
}

INSTANTIATE_TEST_SUITE_P(TinyRandom, TokenizerHfFamily,
                         ::testing::Values(Family{"qwen2", "tiny-random-qwen2-f16"},
                                           Family{"qwen3", "tiny-random-qwen3-f16"},
                                           Family{"llama3", "tiny-random-llama3-f16"},
                                           Family{"phi3", "tiny-random-phi3-f16"}),
                         [](const auto& info) { return info.param.family; });

}  // namespace
}  // namespace kvevict
