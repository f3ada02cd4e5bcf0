// SentencePiece-style (llama) tokenizer built from GGUF metadata.
//
// Source: GGUF spec keys `tokenizer.ggml.model` ("llama"), `tokenizer.ggml.tokens`,
// `tokenizer.ggml.scores`, `tokenizer.ggml.token_type`, `tokenizer.ggml.bos_token_id`,
// `tokenizer.ggml.eos_token_id`, `tokenizer.ggml.unknown_token_id`, `tokenizer.ggml.add_space_prefix`;
// algorithm as llama.cpp's SPM tokenizer: a space is prepended (add_space_prefix, default true),
// spaces become U+2581, the text is split into UTF-8 characters, and adjacent symbols are merged
// greedily by the vocabulary score of the merged piece (highest score first, leftmost on ties);
// a final symbol missing from the vocabulary is emitted as byte tokens `<0xNN>`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvevict {

class GgufFile;

/// Token type ids (GGUF `tokenizer.ggml.token_type`).
enum class TokenType : int32_t { NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6 };

/// Vocabulary + encode/decode. Immutable after construction; safe to share across threads.
class Tokenizer {
 public:
  /// Reads the vocabulary from `gguf`. Throws kvevict::Error naming the file and key when
  /// `tokenizer.ggml.model` is not "llama", a required key is missing, or array lengths differ.
  /// Required: model, tokens, scores. Optional (llama.cpp defaults): token_type (inferred),
  /// bos/eos/unknown_token_id (1/2/0; out-of-range ids are errors), add_space_prefix (true).
  static Tokenizer from_gguf(const GgufFile& gguf);

  /// Builds a tokenizer directly (tests, synthetic models). `types` may be empty (all NORMAL,
  /// except `<0xNN>` pieces which become BYTE, BOS/EOS which become CONTROL and unk which becomes
  /// UNKNOWN). An id of -1 means "none". Throws kvevict::Error when `scores`/`types` lengths
  /// differ from `pieces` or an id is outside [-1, n_vocab).
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::vector<int32_t> types,
            int32_t bos_id, int32_t eos_id, int32_t unk_id, bool add_space_prefix);

  /// Token ids for `text` (UTF-8). With add_bos, BOS comes first. Special tokens are not parsed
  /// (text like "<s>" is tokenized as plain characters), matching llama.cpp parse_special=false.
  /// An empty text yields no tokens (just BOS with add_bos): the space prefix is not added.
  std::vector<int32_t> encode(const std::string& text, bool add_bos) const;

  /// Text of one token as it appears in output: U+2581 -> space, `<0xNN>` -> that byte,
  /// control tokens (BOS/EOS), unknown and unused tokens -> empty, user-defined tokens verbatim
  /// (as llama.cpp's token_to_piece with special=false). Throws kvevict::Error for an id outside
  /// [0, n_vocab).
  std::string piece(int32_t id) const;

  /// Concatenation of piece() over ids.
  std::string decode(const std::vector<int32_t>& ids) const;

  /// Number of tokens in the vocabulary.
  int32_t n_vocab() const { return static_cast<int32_t>(pieces_.size()); }
  /// Beginning-of-sequence token id (-1: none).
  int32_t bos_id() const { return bos_id_; }
  /// End-of-sequence token id (-1: none).
  int32_t eos_id() const { return eos_id_; }
  /// Raw vocabulary entry (with U+2581 and `<0xNN>` as stored).
  const std::string& raw_piece(int32_t id) const { return pieces_.at(static_cast<size_t>(id)); }

 private:
  /// Hash usable with both std::string and std::string_view keys, so encode() can look up
  /// candidate merges as views into its working buffer without allocating a string per probe.
  struct PieceHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  /// Id of the vocabulary piece spelled `text`, or -1.
  int32_t find_piece(std::string_view text) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t, PieceHash, std::equal_to<>> index_;
  std::vector<std::string> decoded_;  ///< piece(id) precomputed, so decode() only appends
  int32_t byte_ids_[256];  ///< token for a raw byte in the byte fallback (`<0xNN>`, else unk/-1)
  int32_t bos_id_, eos_id_, unk_id_;
  bool add_space_prefix_;
};

}  // namespace kvevict
