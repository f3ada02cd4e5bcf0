// Byte-level BPE (GGUF `tokenizer.ggml.model = "gpt2"`) for one text fragment: pre-tokenizer
// regex, GPT-2 byte<->unicode map, merges by rank.
//
// Sources: GPT-2's byte-level BPE (Radford et al. 2019, the `bytes_to_unicode` table of its
// encoder), llama.cpp's BPE tokenizer (merge the adjacent pair of lowest rank first, leftmost on
// ties; `ignore_merges`: a pre-token that is itself a vocabulary piece is emitted whole) and the
// pre-tokenizer regexes llama.cpp selects by `tokenizer.ggml.pre` (see pre_regex()). The regexes
// run on PCRE2 in UTF + Unicode-property mode.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer/regex_split.h"
#include "model/tokenizer/vocab.h"

namespace kvevict::tok {

/// Pre-tokenizer families implemented (llama.cpp's LLAMA_VOCAB_PRE_TYPE_{QWEN2, LLAMA3, DBRX,
/// GPT4O}). Dbrx is the cl100k (GPT-4) regex, the same text as Llama3's, without ignore_merges.
enum class BpePre { Qwen2, Llama3, Dbrx, Gpt4o };

/// The family llama.cpp uses for a `tokenizer.ggml.pre` value ("qwen2", "deepseek-r1-qwen";
/// "llama-bpe", "llama3", "llama-v3"; "dbrx" — Phi-4 / Phi-4-reasoning GGUFs, cl100k vocabulary;
/// "gpt-4o", "llama4" — Phi-4-mini, o200k vocabulary), or nullopt.
std::optional<BpePre> bpe_pre_from_name(std::string_view name);

/// The `tokenizer.ggml.pre` values bpe_pre_from_name() accepts, comma-separated (for errors).
std::string bpe_pre_names();

/// The pre-tokenizer regex (PCRE2 syntax) of a family, as the upstream tokenizer.json states it.
const char* pre_regex(BpePre pre);

/// Raw bytes of a piece written in GPT-2's byte-level alphabet. A code point outside the
/// alphabet is kept as its UTF-8 text (such pieces do not occur in byte-level vocabularies).
std::string unicode_to_bytes(std::string_view piece);

/// How a BpeModel turns a pre-token into initial symbols (Hugging Face tokenizers' BPE model
/// options; the GGUF constructor uses the byte-level defaults).
struct BpeOptions {
  /// true: byte-level BPE, one symbol per byte in GPT-2's alphabet. false: one symbol per UTF-8
  /// character (SentencePiece-style vocabularies written as BPE, e.g. Llama-2 / Phi-3
  /// tokenizer.json), with the fallbacks below for characters that are not pieces.
  bool byte_level = true;
  /// Character-level: a character that is not a piece becomes the tokens `<0xNN>` of its bytes,
  /// when all of them exist (tokenizers' `byte_fallback`).
  bool byte_fallback = false;
  int32_t unk_id = -1;    ///< character-level: token for a character left unknown (-1: error)
  bool fuse_unk = false;  ///< consecutive unknown characters give one unk token
  /// A pre-token that is itself a vocabulary piece is emitted whole, before any merging.
  bool ignore_merges = false;
  /// Duplicate merges: the last rank wins (tokenizers builds its merge map that way) instead of
  /// the first (llama.cpp).
  bool last_duplicate_wins = false;
  /// A merge whose parts or result are not pieces is an error (tokenizers refuses such a file)
  /// instead of being dropped (llama.cpp: it can never fire).
  bool strict_merges = false;
};

/// Merge table (+ compiled regex for the GGUF pre-tokenizers). Immutable after construction;
/// safe to share across threads.
class BpeModel {
 public:
  /// `merges` are "left right" strings in rank order (GGUF `tokenizer.ggml.merges`); a merge
  /// whose left, right or merged text is not a piece of `index` can never fire and is dropped.
  /// Byte-level, with the regex of `pre`. Throws kvevict::Error (prefixed with `where`) when a
  /// merge has no separating space or the regex does not compile.
  BpeModel(const PieceIndex& index, const std::vector<std::string>& merges, BpePre pre, bool ignore_merges,
           const std::string& where);

  /// Merges as (left, right) pairs in rank order, no regex: the caller pre-tokenizes and calls
  /// tokenize_word (tokenizer.json's BPE model). Throws kvevict::Error (prefixed with `where`)
  /// for a merge the options make strict, naming its index.
  BpeModel(const PieceIndex& index, const std::vector<std::pair<std::string, std::string>>& merges,
           const BpeOptions& options, const std::string& where);

  /// Appends the ids of `text` (one fragment without special tokens) to `out`: pre-tokenized
  /// with the regex, then each pre-token merged. `index` must be the one given to the
  /// constructor. Throws kvevict::Error when the regex engine fails or a byte has no vocabulary
  /// piece, or when the model has no regex.
  void tokenize(std::string_view text, const PieceIndex& index, std::vector<int32_t>& out) const;

  /// The pre-tokens of `text` (consecutive, covering it; bytes no regex alternative matches,
  /// i.e. invalid UTF-8, form their own pieces). Throws kvevict::Error when the regex engine
  /// fails or the model has no regex.
  std::vector<std::string_view> pre_tokenize(std::string_view text) const;

  /// Appends the ids of one pre-token to `out` (merges lowest rank first, leftmost on ties).
  /// Throws kvevict::Error when a byte (byte-level) or character (no unk) has no piece.
  void tokenize_word(std::string_view word, const PieceIndex& index, std::vector<int32_t>& out) const;

  /// Number of usable merges.
  size_t n_merges() const { return ranks_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  ///< token id of left+right
  };
  bool add_merge(const PieceIndex& index, std::string_view l, std::string_view r, size_t rank, std::string& joined);
  void initial_symbols(std::string_view word, const PieceIndex& index, std::vector<int32_t>& ids) const;

  std::optional<RegexSplitter> regex_;
  std::unordered_map<uint64_t, Merge> ranks_;  ///< (left id << 32 | right id) -> merge
  std::array<int32_t, 256> byte_ids_{};        ///< byte-level: token of each byte's character (-1: none)
  std::array<int32_t, 256> fallback_ids_{};    ///< character-level: token `<0xNN>` of each byte (-1: none)
  BpeOptions opt_;
};

}  // namespace kvevict::tok
