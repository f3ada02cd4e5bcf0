// Tokenizer facade: vocabulary loading, llama.cpp's special-token partition and type
// adjustments, dispatch to the SPM / BPE mergers, decoding. See tokenizer.h for the sources.
#include "model/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <utility>
#include <variant>

#include "format/gguf.h"
#include "model/arch.h"
#include "model/tokenizer/bpe.h"
#include "model/tokenizer/hf.h"
#include "model/tokenizer/spm.h"
#include "util/error.h"
#include "util/utf8.h"

namespace kvevict {

namespace {

// U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's visible stand-in for a space.
constexpr std::string_view kSpaceMark = "\xE2\x96\x81";

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte spelled by a byte piece "<0xNN>", or -1 when `s` is not of that form.
int parse_byte_piece(std::string_view s) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
  const int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// The piece text "<0xNN>" (upper-case hex, as SentencePiece writes it) for byte `b`.
std::string byte_piece(unsigned b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
}

// Replaces every U+2581 with a space.
std::string unescape_spaces(std::string_view s) { return tok::replace_all(s, kSpaceMark, " "); }

std::string type_name(const GgufValue& v) { return gguf_value_type_name(v.type); }

// A bool metadata value, or `fallback` when the key is absent. Throws naming file and key when
// the value is not a bool.
bool read_bool(const GgufFile& gguf, const std::string& key, bool fallback) {
  if (!gguf.has(key)) return fallback;
  const GgufValue& v = gguf.get(key);
  const bool* b = std::get_if<bool>(&v.scalar);
  if (v.type != GgufValueType::BOOL || b == nullptr) {
    throw Error(gguf.path() + ": " + key + " has type " + type_name(v) + ", expected bool");
  }
  return *b;
}

bool is_type(int32_t t, TokenType want) { return t == static_cast<int32_t>(want); }

// Texts llama.cpp treats as end-of-generation (llama-vocab: special_eog_ids by text).
constexpr std::string_view kEogTexts[] = {"<|eot_id|>", "<|im_end|>",    "<|end|>",         "<|return|>",
                                          "<|call|>",   "<end_of_turn>", "<|endoftext|>",   "<|eom_id|>",
                                          "<EOT>",      "_<EOT>",        "<|end_of_text|>", "<end_of_utterance>"};
// End-of-turn candidates used when `tokenizer.ggml.eot_token_id` is absent; llama.cpp takes one
// of them (hash-map order), every one but DeepSeek's is in kEogTexts already, so all count here.
constexpr std::string_view kEotTexts[] = {"<｜end▁of▁sentence｜>"};
// Fill-in-the-middle pad / repository / file-separator tokens: end-of-generation in llama.cpp.
constexpr std::string_view kFimEogTexts[] = {"<|fim_pad|>",   "<fim-pad>",  "<fim_pad>", "<PAD>",      "<|fim_repo|>",
                                             "<|repo_name|>", "<fim-repo>", "<REPO>",    "<reponame>", "<|file_sep|>"};
// Other fill-in-the-middle markers: llama.cpp forces them to CONTROL (so they are only parsed
// with parse_special).
constexpr std::string_view kFimOtherTexts[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>",  "<SUF>", "▁<SUF>", "<|code_suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>",   "<MID>", "▁<MID>", "<|code_middle|>"};

}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::vector<int32_t> types,
                     int32_t bos_id, int32_t eos_id, int32_t unk_id, bool add_space_prefix) {
  kind_ = Kind::SPM;
  pieces_ = std::move(pieces);
  scores_ = std::move(scores);
  types_ = std::move(types);
  bos_id_ = bos_id;
  eos_id_ = eos_id;
  unk_id_ = unk_id;
  add_space_prefix_ = add_space_prefix;
  const size_t n = pieces_.size();
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw Error("Tokenizer: " + std::to_string(n) + " pieces exceed the int32 token id range");
  }
  if (scores_.size() != n) {
    throw Error("Tokenizer: " + std::to_string(n) + " pieces but " + std::to_string(scores_.size()) + " scores");
  }
  const auto check_id = [&](const char* what, int32_t id) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      throw Error(std::string("Tokenizer: ") + what + " " + std::to_string(id) + " is outside [-1, " +
                  std::to_string(n) + ")");
    }
  };
  check_id("bos_id", bos_id_);
  check_id("eos_id", eos_id_);
  check_id("unk_id", unk_id_);

  if (types_.empty()) {
    // Synthetic vocabularies: infer the types the decoder needs (bytes, control, unknown).
    types_.assign(n, static_cast<int32_t>(TokenType::NORMAL));
    for (size_t i = 0; i < n; ++i) {
      if (parse_byte_piece(pieces_[i]) >= 0) types_[i] = static_cast<int32_t>(TokenType::BYTE);
    }
    if (unk_id_ >= 0) types_[static_cast<size_t>(unk_id_)] = static_cast<int32_t>(TokenType::UNKNOWN);
    if (bos_id_ >= 0) types_[static_cast<size_t>(bos_id_)] = static_cast<int32_t>(TokenType::CONTROL);
    if (eos_id_ >= 0) types_[static_cast<size_t>(eos_id_)] = static_cast<int32_t>(TokenType::CONTROL);
  } else if (types_.size() != n) {
    throw Error("Tokenizer: " + std::to_string(n) + " pieces but " + std::to_string(types_.size()) + " token types");
  }
  build_tables();
  find_eog(-1, -1);
  build_special_cache(false);
}

void Tokenizer::build_tables() {
  const size_t n = pieces_.size();
  // A duplicated piece text maps to its last id, as llama.cpp's token_to_id map does.
  index_.reserve(n);
  for (size_t i = 0; i < n; ++i) index_.insert_or_assign(pieces_[i], static_cast<int32_t>(i));

  // SPM byte fallback, in llama.cpp's order: the "<0xNN>" piece, then a piece that is the raw
  // byte itself, then unk (-1 when there is none; encoding reports that if it is ever needed).
  for (unsigned b = 0; b < 256; ++b) {
    int32_t id = token_id(byte_piece(b));
    if (id < 0) id = token_id(std::string(1, static_cast<char>(b)));
    byte_ids_[b] = id >= 0 ? id : unk_id_;
  }
}

void Tokenizer::find_eog(int32_t eot_id, int32_t eom_id) {
  std::vector<int32_t> eog;
  const auto mark = [&](std::string_view text, bool is_eog) {
    const int32_t id = token_id(text);
    if (id < 0) return;
    // llama.cpp overrides the type of these "control-looking" tokens to CONTROL.
    types_[static_cast<size_t>(id)] = static_cast<int32_t>(TokenType::CONTROL);
    if (is_eog) eog.push_back(id);
  };
  for (const std::string_view t : kEogTexts) mark(t, true);
  if (eot_id < 0) {
    for (const std::string_view t : kEotTexts) mark(t, true);
  }
  for (const std::string_view t : kFimEogTexts) mark(t, true);
  for (const std::string_view t : kFimOtherTexts) mark(t, false);
  for (const int32_t id : {eos_id_, eot_id, eom_id}) {
    if (id >= 0) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  eog_ = std::move(eog);

  // Output text per token (needs the final types), following llama.cpp's token_to_piece(special=false).
  const size_t n = pieces_.size();
  decoded_.assign(n, std::string());
  for (size_t i = 0; i < n; ++i) {
    switch (static_cast<TokenType>(types_[i])) {
      case TokenType::NORMAL:
        decoded_[i] = kind_ == Kind::BPE ? tok::unicode_to_bytes(pieces_[i]) : unescape_spaces(pieces_[i]);
        break;
      case TokenType::BYTE: {
        if (kind_ == Kind::BPE) break;  // llama.cpp prints nothing for BYTE tokens of a BPE vocabulary
        const int b = parse_byte_piece(pieces_[i]);
        // A BYTE-typed token that is not spelled <0xNN> is malformed; show its text rather than
        // guessing a byte.
        decoded_[i] = b >= 0 ? std::string(1, static_cast<char>(b)) : unescape_spaces(pieces_[i]);
        break;
      }
      case TokenType::USER_DEFINED:
        decoded_[i] = pieces_[i];  // verbatim: llama.cpp does not unescape user-defined tokens
        break;
      default:
        break;  // CONTROL, UNKNOWN, UNUSED and undefined types print nothing
    }
  }
}

void Tokenizer::build_special_cache(bool rstrip_specials) {
  specials_.clear();
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const int32_t t = types_[i];
    if (pieces_[i].empty()) continue;  // an empty text would match everywhere
    if (is_type(t, TokenType::CONTROL) || is_type(t, TokenType::USER_DEFINED) || is_type(t, TokenType::UNKNOWN)) {
      specials_.push_back(static_cast<int32_t>(i));
    }
  }
  // Longest first, so "<|im_start|>" is cut before a shorter special it contains; ties by id
  // (llama.cpp's order among equal lengths is unspecified).
  std::stable_sort(specials_.begin(), specials_.end(), [&](int32_t a, int32_t b) {
    return pieces_[static_cast<size_t>(a)].size() > pieces_[static_cast<size_t>(b)].size();
  });
  rstrip_.assign(pieces_.size(), 0);
  if (rstrip_specials) {
    // llama.cpp's per-model attributes for Phi-3: whitespace after special tokens is dropped,
    // except after <unk>, <s> and <|endoftext|>; </s> strips too.
    for (const int32_t id : specials_) rstrip_[static_cast<size_t>(id)] = 1;
    if (const int32_t id = token_id("</s>"); id >= 0) rstrip_[static_cast<size_t>(id)] = 1;
    for (const char* t : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (const int32_t id = token_id(t); id >= 0) rstrip_[static_cast<size_t>(id)] = 0;
    }
  }
}

Tokenizer Tokenizer::from_gguf(const GgufFile& gguf) {
  const std::string& path = gguf.path();
  Tokenizer t;

  const std::string model = gguf.get_string("tokenizer.ggml.model");
  if (model == "llama") {
    t.kind_ = Kind::SPM;
  } else if (model == "gpt2") {
    t.kind_ = Kind::BPE;
  } else {
    throw Error(path + ": tokenizer.ggml.model is '" + model +
                "'; supported: 'llama' (SentencePiece) and 'gpt2' (byte-level BPE)");
  }

  t.pieces_ = gguf.get_string_array("tokenizer.ggml.tokens");
  if (t.pieces_.empty()) throw Error(path + ": tokenizer.ggml.tokens is empty");
  const size_t n = t.pieces_.size();
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw Error(path + ": tokenizer.ggml.tokens has " + std::to_string(n) +
                " entries, more than int32 token ids can address");
  }

  if (t.kind_ == Kind::SPM || gguf.has("tokenizer.ggml.scores")) {
    // Required for SPM: without them SentencePiece merging has no order. BPE ignores them.
    t.scores_ = gguf.get_float_array("tokenizer.ggml.scores");
    if (t.scores_.size() != n) {
      throw Error(path + ": tokenizer.ggml.scores has " + std::to_string(t.scores_.size()) +
                  " entries but tokenizer.ggml.tokens has " + std::to_string(n));
    }
  }

  // Token types are optional (as in llama.cpp): all NORMAL when absent.
  t.types_.assign(n, static_cast<int32_t>(TokenType::NORMAL));
  if (gguf.has("tokenizer.ggml.token_type")) {
    const std::vector<int64_t> raw = gguf.get_int_array("tokenizer.ggml.token_type");
    if (raw.size() != n) {
      throw Error(path + ": tokenizer.ggml.token_type has " + std::to_string(raw.size()) +
                  " entries but tokenizer.ggml.tokens has " + std::to_string(n));
    }
    for (size_t i = 0; i < n; ++i) {
      if (raw[i] < std::numeric_limits<int32_t>::min() || raw[i] > std::numeric_limits<int32_t>::max()) {
        throw Error(path + ": tokenizer.ggml.token_type[" + std::to_string(i) + "] = " + std::to_string(raw[i]) +
                    " is not a valid token type");
      }
      t.types_[i] = static_cast<int32_t>(raw[i]);
    }
  } else if (t.kind_ == Kind::SPM) {
    for (size_t i = 0; i < n; ++i) {
      if (parse_byte_piece(t.pieces_[i]) >= 0) t.types_[i] = static_cast<int32_t>(TokenType::BYTE);
    }
  }

  // Special ids default to llama.cpp's per-model defaults when the keys are absent (-1: none).
  const auto read_id = [&](const std::string& key, int64_t fallback) -> int32_t {
    if (!gguf.has(key)) return static_cast<int32_t>(fallback < static_cast<int64_t>(n) ? fallback : -1);
    const uint64_t id = gguf.get_uint(key);
    if (id >= n) {
      throw Error(path + ": " + key + " = " + std::to_string(id) + " is out of range for a vocabulary of " +
                  std::to_string(n) + " tokens");
    }
    return static_cast<int32_t>(id);
  };
  const bool spm = t.kind_ == Kind::SPM;
  t.bos_id_ = read_id("tokenizer.ggml.bos_token_id", spm ? 1 : 11);
  t.eos_id_ = read_id("tokenizer.ggml.eos_token_id", spm ? 2 : 11);
  t.unk_id_ = read_id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  if (spm && !gguf.has("tokenizer.ggml.token_type")) {
    // Without types, mark what the decoder needs (as the synthetic constructor does).
    if (t.unk_id_ >= 0) t.types_[static_cast<size_t>(t.unk_id_)] = static_cast<int32_t>(TokenType::UNKNOWN);
    if (t.bos_id_ >= 0) t.types_[static_cast<size_t>(t.bos_id_)] = static_cast<int32_t>(TokenType::CONTROL);
    if (t.eos_id_ >= 0) t.types_[static_cast<size_t>(t.eos_id_)] = static_cast<int32_t>(TokenType::CONTROL);
  }
  const int32_t eot = read_id("tokenizer.ggml.eot_token_id", -1);
  const int32_t eom = read_id("tokenizer.ggml.eom_token_id", -1);

  std::vector<std::string> merges;
  tok::BpePre pre = tok::BpePre::Qwen2;
  bool default_add_bos = true;
  if (!spm) {
    if (!gguf.has("tokenizer.ggml.pre")) {
      throw Error(path +
                  ": tokenizer.ggml.pre is missing; a byte-level BPE vocabulary needs its pre-tokenizer (supported: " +
                  tok::bpe_pre_names() + ")");
    }
    t.pre_ = gguf.get_string("tokenizer.ggml.pre");
    const auto p = tok::bpe_pre_from_name(t.pre_);
    if (!p) {
      throw Error(path + ": tokenizer.ggml.pre = '" + t.pre_ +
                  "' is not supported (supported: " + tok::bpe_pre_names() + ")");
    }
    pre = *p;
    merges = gguf.get_string_array("tokenizer.ggml.merges");
    // llama.cpp adds BOS by default only for the Llama-3 pre-tokenizer among these.
    default_add_bos = pre == tok::BpePre::Llama3;
  }
  t.add_bos_ = read_bool(gguf, "tokenizer.ggml.add_bos_token", default_add_bos);
  t.add_eos_ = read_bool(gguf, "tokenizer.ggml.add_eos_token", false);
  t.add_space_prefix_ = read_bool(gguf, "tokenizer.ggml.add_space_prefix", spm);
  if (t.add_bos_ && t.bos_id_ < 0)
    throw Error(path + ": tokenizer.ggml.add_bos_token is true but there is no BOS token");
  if (t.add_eos_ && t.eos_id_ < 0)
    throw Error(path + ": tokenizer.ggml.add_eos_token is true but there is no EOS token");

  t.build_tables();
  if (!spm) {
    t.bpe_ = std::make_shared<const tok::BpeModel>(t.index_, merges, pre, pre == tok::BpePre::Llama3, path);
  }
  t.find_eog(eot, eom);

  std::string name = gguf.has("general.name") ? gguf.get_string("general.name") : std::string();
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  bool rstrip = false;  // llama.cpp keys this on the model's name, whatever its architecture
  for (const ArchInfo& a : architectures())
    for (const std::string& fragment : a.rstrip_special_names) rstrip |= name.find(fragment) != std::string::npos;
  t.build_special_cache(rstrip);
  return t;
}

int32_t Tokenizer::token_id(std::string_view text) const { return tok::find_piece(index_, text); }

bool Tokenizer::is_eog(int32_t id) const { return std::binary_search(eog_.begin(), eog_.end(), id); }

void Tokenizer::encode_fragment(std::string_view text, bool after_special, std::vector<int32_t>& out) const {
  if (kind_ == Kind::BPE) {
    bpe_->tokenize(text, index_, out);
    return;
  }
  // SPM: optional leading space (at the start and after a special token), then ' ' -> U+2581.
  std::string buf;
  buf.reserve(text.size() + (text.size() >> 2) + kSpaceMark.size());
  if (add_space_prefix_ && after_special) buf.append(kSpaceMark);
  for (const char c : text) {
    if (c == ' ') {
      buf.append(kSpaceMark);
    } else {
      buf.push_back(c);
    }
  }
  tok::spm_tokenize(buf, index_, scores_, byte_ids_, out);
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && add_bos_) {
    if (bos_id_ < 0) throw Error("Tokenizer: BOS requested but the vocabulary has no BOS token");
    out.push_back(bos_id_);
  }
  if (hf_) {
    hf_->encode(text, parse_special, index_, out);
  } else {
    encode_llama(text, parse_special, out);
  }
  if (add_special && add_eos_) {
    if (eos_id_ < 0) throw Error("Tokenizer: EOS requested but the vocabulary has no EOS token");
    out.push_back(eos_id_);
  }
  return out;
}

// llama.cpp's tokenize for GGUF vocabularies: special tokens cut out longest first, then each
// fragment through the SPM or BPE merger.
void Tokenizer::encode_llama(const std::string& text, bool parse_special, std::vector<int32_t>& out) const {
  // Fragments of the text: a special token (id >= 0) or a raw span [off, off + len).
  struct Fragment {
    int32_t id;
    size_t off, len;
  };
  std::vector<Fragment> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  const std::string_view all(text);
  std::vector<Fragment> next;
  for (const int32_t sid : specials_) {
    const int32_t type = types_[static_cast<size_t>(sid)];
    if (!parse_special && (is_type(type, TokenType::CONTROL) || is_type(type, TokenType::UNKNOWN))) continue;
    const std::string& st = pieces_[static_cast<size_t>(sid)];
    const bool rstrip = rstrip_[static_cast<size_t>(sid)] != 0;
    bool changed = false;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      size_t off = f.off, len = f.len;
      while (len > 0) {
        const size_t hit = all.substr(0, off + len).find(st, off);
        if (hit == std::string_view::npos) break;
        changed = true;
        if (hit > off) next.push_back({-1, off, hit - off});
        next.push_back({sid, 0, 0});
        const size_t end = off + len;
        off = hit + st.size();
        if (rstrip) {
          while (off < end && std::isspace(static_cast<unsigned char>(text[off]))) ++off;
        }
        len = end - off;
      }
      if (len > 0) next.push_back({-1, off, len});
    }
    if (changed) frags.swap(next);
  }

  bool after_special = true;  // SPM prefixes a space to the first fragment too
  for (const Fragment& f : frags) {
    if (f.id >= 0) {
      out.push_back(f.id);
      after_special = true;
    } else {
      encode_fragment(all.substr(f.off, f.len), after_special, out);
      after_special = false;
    }
  }
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_bos) const {
  return encode(text, add_bos, false);
}

std::string Tokenizer::piece(int32_t id, bool special) const {
  if (id < 0 || id >= n_vocab()) {
    throw Error("Tokenizer: token id " + std::to_string(id) + " is outside [0, " + std::to_string(n_vocab()) + ")");
  }
  const int32_t t = types_[static_cast<size_t>(id)];
  if (special && (is_type(t, TokenType::CONTROL) || is_type(t, TokenType::UNKNOWN))) {
    return pieces_[static_cast<size_t>(id)];
  }
  return decoded_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  std::string out;
  for (const int32_t id : ids) {
    if (special) {
      out += piece(id, true);
      continue;
    }
    if (id < 0 || id >= n_vocab()) {
      throw Error("Tokenizer: token id " + std::to_string(id) + " is outside [0, " + std::to_string(n_vocab()) + ")");
    }
    out += decoded_[static_cast<size_t>(id)];
  }
  return out;
}

std::string TokenTextStream::push(int32_t id) {
  pending_ += tok_->piece(id, special_);
  const size_t hold = utf8_incomplete_tail(pending_);
  std::string ready = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

std::string TokenTextStream::finish() { return std::exchange(pending_, std::string()); }

}  // namespace kvevict
