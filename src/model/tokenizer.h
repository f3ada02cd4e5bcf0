// Tokenizer built from GGUF metadata: SentencePiece (`tokenizer.ggml.model = "llama"`) or
// byte-level BPE (`"gpt2"`), with llama.cpp's special-token handling on top.
//
// Sources: GGUF spec keys `tokenizer.ggml.{model, pre, tokens, scores, token_type, merges,
// bos_token_id, eos_token_id, unknown_token_id, eot_token_id, eom_token_id, add_bos_token,
// add_eos_token, add_space_prefix}`; behaviour as llama.cpp's llama-vocab (tokenize with
// add_special / parse_special):
//  * special tokens are cut out of the text first, longest text first, as whole strings:
//    CONTROL and UNKNOWN tokens only with parse_special, USER_DEFINED tokens (`<think>`) always;
//    for models whose general.name contains a family's rstrip_special_names (model/arch.h:
//    "phi-3"/"phi3") whitespace after most special tokens is dropped (RSTRIP);
//  * each remaining fragment is encoded by the SPM merger (tokenizer/spm.h; a space is prefixed
//    to a fragment that starts the text or follows a special token) or the BPE merger
//    (tokenizer/bpe.h);
//  * add_special prepends BOS / appends EOS when the model's add_bos / add_eos say so
//    (defaults: SPM add_bos; BPE only for the llama-bpe pre-tokenizer; metadata keys win).
// Or built from a Hugging Face checkpoint's tokenizer.json (from_hf): then encoding follows the
// `tokenizers` library instead (tokenizer/hf.h), with the same parse_special meaning (special
// added tokens are matched only with it) and the same ids, types and decoding afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer/vocab.h"

namespace kvevict {

class GgufFile;

namespace tok {
class BpeModel;
class HfPipeline;
}  // namespace tok

/// Token type ids (GGUF `tokenizer.ggml.token_type`).
enum class TokenType : int32_t { NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6 };

/// Vocabulary + encode/decode. Immutable after construction; safe to share across threads.
class Tokenizer {
 public:
  /// Vocabulary algorithm.
  enum class Kind { SPM, BPE };

  /// Reads the vocabulary from `gguf`. Throws kvevict::Error naming the file, key and value when
  /// `tokenizer.ggml.model` is neither "llama" nor "gpt2", a BPE file's `tokenizer.ggml.pre` is
  /// missing or not one of bpe_pre_names() (llama.cpp would fall back to GPT-2's regex and give
  /// different ids), a required key is missing, a flag is not a bool, or array lengths differ.
  /// Required: model, tokens, scores (SPM), merges and pre (BPE). Optional (llama.cpp defaults):
  /// token_type (inferred), bos/eos/unknown ids (SPM 1/2/0, BPE 11/11/none; out-of-range ids
  /// are errors), eot/eom ids, add_bos_token, add_eos_token, add_space_prefix (SPM: true).
  static Tokenizer from_gguf(const GgufFile& gguf);

  /// Reads the tokenizer of a Hugging Face checkpoint directory: `dir`/tokenizer.json (the
  /// `tokenizers` format: vocabulary, merges, added tokens, normalizer, pre-tokenizer, decoder,
  /// post-processor; tokenizer/hf.h says what is implemented) and, when present,
  /// tokenizer_config.json (`bos_token`, `eos_token`, `add_bos_token`, `add_eos_token`),
  /// generation_config.json and config.json (`eos_token_id`: every id listed ends generation;
  /// `bos_token_id`). BOS/EOS are added as the post-processor's TemplateProcessing says, unless
  /// tokenizer_config.json sets add_bos_token / add_eos_token (transformers' Llama tokenizers
  /// rebuild the post-processor from those flags). Token types: special added tokens CONTROL,
  /// other added tokens USER_DEFINED, the unk token UNKNOWN, `<0xNN>` pieces BYTE when the model
  /// has byte_fallback. `n_vocab_rows` > 0 pads the vocabulary to that many ids with UNUSED
  /// `[PAD<id>]` entries (ids the embedding has but the tokenizer never produces, as
  /// convert_hf_to_gguf.py does). Throws kvevict::Error naming the file and field when a file is
  /// missing (tokenizer.json) or malformed, an id is duplicated or beyond n_vocab_rows, a special
  /// token named in tokenizer_config.json is not in the vocabulary, or the pipeline uses
  /// something not implemented.
  static Tokenizer from_hf(const std::string& dir, int64_t n_vocab_rows = 0);

  /// Builds a SentencePiece tokenizer directly (tests, synthetic models). `types` may be empty
  /// (all NORMAL, except `<0xNN>` pieces which become BYTE, BOS/EOS which become CONTROL and
  /// unk which becomes UNKNOWN). An id of -1 means "none". add_bos is true, add_eos false.
  /// Throws kvevict::Error when `scores`/`types` lengths differ from `pieces` or an id is
  /// outside [-1, n_vocab).
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::vector<int32_t> types, int32_t bos_id,
            int32_t eos_id, int32_t unk_id, bool add_space_prefix);

  /// Token ids for `text` (UTF-8), as llama.cpp's llama_tokenize(add_special, parse_special):
  /// add_special adds BOS first when add_bos() and EOS last when add_eos(); parse_special lets
  /// CONTROL tokens spelled in the text (`<|im_start|>`, `<s>`) become those tokens (use it for
  /// rendered chat templates). USER_DEFINED tokens are matched either way. An empty text yields
  /// no text tokens. Throws kvevict::Error when BOS/EOS is required but the vocabulary has none,
  /// or a byte cannot be encoded.
  std::vector<int32_t> encode(const std::string& text, bool add_special, bool parse_special) const;

  /// encode(text, add_bos, false): the model's BOS (and EOS, when its metadata asks for one)
  /// with add_bos; a model whose `tokenizer.ggml.add_bos_token` is false gets no BOS.
  std::vector<int32_t> encode(const std::string& text, bool add_bos) const;

  /// Text of one token as it appears in output (llama.cpp's token_to_piece with special=false):
  /// SPM U+2581 -> space and `<0xNN>` -> that byte; BPE pieces mapped back from GPT-2's byte
  /// alphabet; control, unknown and unused tokens -> empty; user-defined tokens verbatim. With
  /// `special`, control and unknown tokens are rendered as their text too. Throws kvevict::Error
  /// for an id outside [0, n_vocab).
  std::string piece(int32_t id, bool special = false) const;

  /// Concatenation of piece(id, special) over ids (bytes, possibly split UTF-8 at the ends).
  std::string decode(const std::vector<int32_t>& ids, bool special = false) const;

  /// Id of the token whose raw text is exactly `text` (e.g. "<|im_end|>", "</think>"), or -1.
  int32_t token_id(std::string_view text) const;

  /// Whether generation should stop at `id`: EOS, the end-of-turn / end-of-message tokens
  /// (`tokenizer.ggml.eot_token_id` / `eom_token_id` or found by text) and every token llama.cpp
  /// treats as end-of-generation by its text (`<|eot_id|>`, `<|im_end|>`, `<|end|>`,
  /// `<|endoftext|>`, `<|eom_id|>`, `<|end_of_text|>`, `<end_of_turn>`, `<｜end▁of▁sentence｜>`,
  /// fill-in-the-middle pad/repo/file-separator tokens, ...). False for ids out of range.
  bool is_eog(int32_t id) const;
  /// All end-of-generation ids, ascending.
  const std::vector<int32_t>& eog_ids() const { return eog_; }

  /// Number of tokens in the vocabulary.
  int32_t n_vocab() const { return static_cast<int32_t>(pieces_.size()); }
  /// Beginning-of-sequence token id (-1: none).
  int32_t bos_id() const { return bos_id_; }
  /// End-of-sequence token id (-1: none).
  int32_t eos_id() const { return eos_id_; }
  /// Whether encode(..., add_special=true, ...) prepends BOS (`tokenizer.ggml.add_bos_token`).
  bool add_bos() const { return add_bos_; }
  /// Whether encode(..., add_special=true, ...) appends EOS (`tokenizer.ggml.add_eos_token`).
  bool add_eos() const { return add_eos_; }
  /// SPM (SentencePiece-style pieces: U+2581 spaces, `<0xNN>` bytes; also tokenizer.json
  /// character-level BPE) or BPE (byte-level).
  Kind kind() const { return kind_; }
  /// `tokenizer.ggml.pre` of a BPE vocabulary ("" for SPM and for tokenizer.json vocabularies).
  const std::string& pre() const { return pre_; }
  /// Raw vocabulary entry (with U+2581, `<0xNN>` or GPT-2 byte characters as stored).
  const std::string& raw_piece(int32_t id) const { return pieces_.at(static_cast<size_t>(id)); }
  /// Token type of `id` after llama.cpp's adjustments (end-of-generation texts become CONTROL).
  TokenType type(int32_t id) const { return static_cast<TokenType>(types_.at(static_cast<size_t>(id))); }

 private:
  Tokenizer() = default;
  void build_tables();
  void find_eog(int32_t eot_id, int32_t eom_id);
  void build_special_cache(bool rstrip_specials);
  void encode_fragment(std::string_view text, bool after_special, std::vector<int32_t>& out) const;
  void encode_llama(const std::string& text, bool parse_special, std::vector<int32_t>& out) const;

  Kind kind_ = Kind::SPM;
  std::string pre_;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  tok::PieceIndex index_;
  std::vector<std::string> decoded_;  ///< piece(id, false) precomputed, so decode() only appends
  int32_t byte_ids_[256] = {};        ///< SPM: token for a raw byte in the byte fallback (`<0xNN>`, else unk/-1)
  std::shared_ptr<const tok::BpeModel> bpe_;
  std::shared_ptr<const tok::HfPipeline> hf_;  ///< tokenizer.json pipeline (from_hf), else null
  std::vector<int32_t> specials_;              ///< CONTROL/USER_DEFINED/UNKNOWN ids, longest text first
  std::vector<uint8_t> rstrip_;                ///< per id: drop whitespace after this special token
  std::vector<int32_t> eog_;
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1;
  bool add_space_prefix_ = false, add_bos_ = true, add_eos_ = false;
};

/// Streaming detokenizer: push() returns the text of each new token, holding back a trailing
/// incomplete UTF-8 sequence (a character split across byte tokens) until the token that
/// completes it arrives, so printed output never contains a broken character mid-stream.
/// Source: UTF-8 (RFC 3629) lead-byte lengths.
class TokenTextStream {
 public:
  /// `special`: render control tokens as their text (see Tokenizer::piece).
  explicit TokenTextStream(const Tokenizer& tok, bool special = false) : tok_(&tok), special_(special) {}
  /// Complete text available after token `id`. Throws kvevict::Error for an id out of range.
  std::string push(int32_t id);
  /// Whatever is still held back (an incomplete sequence at the end of generation), verbatim.
  std::string finish();

 private:
  const Tokenizer* tok_;
  bool special_;
  std::string pending_;
};

}  // namespace kvevict
