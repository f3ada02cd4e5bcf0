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

/// Merge table + compiled regex. Immutable after construction; safe to share across threads.
class BpeModel {
 public:
  /// `merges` are "left right" strings in rank order (GGUF `tokenizer.ggml.merges`); a merge
  /// whose left, right or merged text is not a piece of `index` can never fire and is dropped.
  /// Throws kvevict::Error (prefixed with `where`) when a merge has no separating space or the
  /// regex does not compile.
  BpeModel(const PieceIndex& index, const std::vector<std::string>& merges, BpePre pre, bool ignore_merges,
           const std::string& where);

  /// Appends the ids of `text` (one fragment without special tokens) to `out`. `index` must be
  /// the one given to the constructor. Throws kvevict::Error when the regex engine fails or a
  /// byte has no vocabulary piece.
  void tokenize(std::string_view text, const PieceIndex& index, std::vector<int32_t>& out) const;

  /// The pre-tokens of `text` (consecutive, covering it; bytes no regex alternative matches,
  /// i.e. invalid UTF-8, form their own pieces). Throws kvevict::Error when the regex engine fails.
  std::vector<std::string_view> pre_tokenize(std::string_view text) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  ///< token id of left+right
  };
  void tokenize_word(std::string_view word, const PieceIndex& index, std::string& mapped,
                     std::vector<int32_t>& out) const;

  std::shared_ptr<void> code_;                 ///< pcre2_code_8, freed with pcre2_code_free_8
  std::unordered_map<uint64_t, Merge> ranks_;  ///< (left id << 32 | right id) -> merge
  std::array<int32_t, 256> byte_ids_{};        ///< token of each single byte (-1: none)
  bool ignore_merges_;
};

}  // namespace kvevict::tok
