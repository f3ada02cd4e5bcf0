// The encoding pipeline of a Hugging Face `tokenizer.json` (the `tokenizers` library's format):
// added tokens, normalizer, pre-tokenizer, BPE model. Tokenizer::from_hf (model/tokenizer.h)
// builds the vocabulary and one HfPipeline; Tokenizer::encode runs it.
//
// Source: huggingface/tokenizers (tokenizers/src): AddedVocabulary::extract_and_normalize —
// added tokens with `normalized: false` are cut from the raw text first, the rest is normalized,
// then tokens with `normalized: true` are cut from the normalized text, their patterns being
// their normalized contents (so with a Prepend("▁") normalizer "<|x|>" is matched as "▁<|x|>");
// matching is leftmost-longest over all tokens at once (aho-corasick MatchKind::LeftmostLongest),
// `lstrip`/`rstrip` widen a match over adjacent whitespace (char::is_whitespace), and with
// split_special_tokens (here: parse_special = false) `special` tokens are matched and skipped,
// their text staying ordinary text. Normalizers: NFC (via utf8proc), Prepend (non-empty pieces),
// Replace (string patterns), Sequence. Pre-tokenizers: Split (regex, behaviour Isolated, not
// inverted), ByteLevel (add_prefix_space, use_regex with GPT-2's pattern), Metaspace
// (replacement, prepend_scheme always/first/never — "first" only for the piece that starts the
// original text — and split, MergedWithNext), Sequence. Model: BPE (tokenizer/bpe.h) with
// byte_fallback, unk_token, fuse_unk, ignore_merges. Anything else — another normalizer,
// pre-tokenizer, model type, Split behaviour, single_word tokens, BPE dropout or
// continuing-subword prefixes — is refused at load, naming the field and value.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer/bpe.h"
#include "model/tokenizer/regex_split.h"
#include "model/tokenizer/vocab.h"

namespace kvevict::tok {

/// One entry of tokenizer.json `added_tokens`.
struct HfAddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;     ///< not matched when parse_special is false
  bool normalized = false;  ///< matched in the normalized text (pattern = normalized content)
  bool lstrip = false, rstrip = false;
};

/// Unicode NFC of `s` (utf8proc, Unicode 15 tables as Debian ships them). Invalid UTF-8 bytes are
/// kept as they are and the valid runs between them normalized. ASCII-only text is returned as is.
std::string nfc(std::string_view s);

/// The pipeline. Immutable after construction; safe to share across threads.
class HfPipeline {
 public:
  /// Parses `tj` (the whole tokenizer.json) against `index` (every piece and added token -> id,
  /// built by the caller). `where` (the file path) prefixes every error. Throws kvevict::Error
  /// naming the field and value for anything not implemented (see the file comment), a merge
  /// that uses or makes a piece outside the vocabulary, or a field of the wrong JSON type.
  HfPipeline(const nlohmann::json& tj, const PieceIndex& index, const std::string& where);

  /// Appends the ids of `text` (no BOS/EOS; the post-processor is the caller's) to `out`.
  void encode(std::string_view text, bool parse_special, const PieceIndex& index, std::vector<int32_t>& out) const;

  /// Whether the model is byte-level (ByteLevel pre-tokenizer and decoder) rather than
  /// character-level with SentencePiece's U+2581 spaces.
  bool byte_level() const { return byte_level_; }
  const std::vector<HfAddedToken>& added_tokens() const { return added_; }

 private:
  struct NormStep {
    enum Kind { Nfc, Prepend, Replace } kind;
    std::string a, b;
  };
  struct PreStep {
    enum Kind { Split, ByteLevel, Metaspace } kind = Split;
    std::shared_ptr<const RegexSplitter> regex;  // Split, ByteLevel with use_regex
    bool add_prefix_space = false;               // ByteLevel
    std::string replacement;                     // Metaspace
    enum Prepend { Always, First, Never } prepend = Always;
    bool split = false;  // Metaspace
  };
  struct Piece {
    std::string text;
    int32_t token = -1;     ///< an added token's id, or -1 for text still to encode
    bool at_start = false;  ///< begins at offset 0 of the original text
  };
  void parse_normalizer(const nlohmann::json& n, const std::string& where);
  void parse_pre_tokenizer(const nlohmann::json& p, const std::string& where);
  std::string normalize(std::string_view s) const;
  void split_added(std::vector<Piece>& pieces, bool normalized_pass, bool parse_special) const;
  void pre_tokenize(const Piece& p, std::vector<std::string>& words) const;

  std::vector<HfAddedToken> added_;
  std::vector<std::string> patterns_;  ///< per added token: its text as matched (normalized if `normalized`)
  std::vector<NormStep> norm_;
  std::vector<PreStep> pre_;
  std::optional<BpeModel> bpe_;
  bool byte_level_ = false;
};

}  // namespace kvevict::tok
