// SentencePiece-style (llama) tokenizer: vocabulary loading, greedy score-ordered merging, byte
// fallback and decoding. See tokenizer.h for the sources and the algorithm outline.
#include "model/tokenizer.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <utility>
#include <variant>

#include "format/gguf.h"
#include "util/error.h"

namespace kvevict {

namespace {

// U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's visible stand-in for a space.
constexpr std::string_view kSpaceMark = "\xE2\x96\x81";

// Bytes in the UTF-8 sequence that starts with `lead`, judged from its top four bits only, as
// llama.cpp does: continuation bytes (10xxxxxx) count as 1-byte symbols, and a lead byte claims
// its length even when the following bytes are not continuations. The caller clamps at the end
// of the text. Matching this exactly keeps invalid UTF-8 segmented the way the reference is.
size_t utf8_len(unsigned char lead) {
  static constexpr unsigned char kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

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
std::string unescape_spaces(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(kSpaceMark, pos);
    if (hit == std::string_view::npos) break;
    out.append(s, pos, hit - pos);
    out.push_back(' ');
    pos = hit + kSpaceMark.size();
  }
  out.append(s, pos);
  return out;
}

// One node of the doubly linked list of symbols. A symbol is always a contiguous span of the
// escaped text, so merging two neighbours only grows the left span; n == 0 marks a symbol that
// has been absorbed into its left neighbour.
// 32-bit fields keep the list and the heap compact (encode() rejects texts over 2 GiB).
struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t start;
  uint32_t n;
};

// A candidate merge of symbols left and right (neighbours when pushed) into a piece of `score`.
// `size` is the merged byte length at push time; a later mismatch shows the entry is stale.
struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  uint32_t size;
};

// Orders the max-heap: higher score first, and on equal scores the leftmost pair first.
struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

std::string type_name(const GgufValue& v) { return gguf_value_type_name(v.type); }

}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> pieces, std::vector<float> scores,
                     std::vector<int32_t> types, int32_t bos_id, int32_t eos_id, int32_t unk_id,
                     bool add_space_prefix)
    : pieces_(std::move(pieces)),
      scores_(std::move(scores)),
      types_(std::move(types)),
      bos_id_(bos_id),
      eos_id_(eos_id),
      unk_id_(unk_id),
      add_space_prefix_(add_space_prefix) {
  const size_t n = pieces_.size();
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw Error("Tokenizer: " + std::to_string(n) + " pieces exceed the int32 token id range");
  }
  if (scores_.size() != n) {
    throw Error("Tokenizer: " + std::to_string(n) + " pieces but " +
                std::to_string(scores_.size()) + " scores");
  }
  const auto check_id = [&](const char* what, int32_t id) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      throw Error(std::string("Tokenizer: ") + what + " " + std::to_string(id) +
                  " is outside [-1, " + std::to_string(n) + ")");
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
    throw Error("Tokenizer: " + std::to_string(n) + " pieces but " +
                std::to_string(types_.size()) + " token types");
  }

  // A duplicated piece text maps to its last id, as llama.cpp's token_to_id map does.
  index_.reserve(n);
  for (size_t i = 0; i < n; ++i) index_.insert_or_assign(pieces_[i], static_cast<int32_t>(i));

  // Byte fallback, in llama.cpp's order: the "<0xNN>" piece, then a piece that is the raw byte
  // itself, then unk (-1 when there is none; encode() reports that if it is ever needed).
  for (unsigned b = 0; b < 256; ++b) {
    int32_t id = find_piece(byte_piece(b));
    if (id < 0) id = find_piece(std::string(1, static_cast<char>(b)));
    byte_ids_[b] = id >= 0 ? id : unk_id_;
  }

  // Output text per token, following llama.cpp's token_to_piece(special=false).
  decoded_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    switch (static_cast<TokenType>(types_[i])) {
      case TokenType::NORMAL:
        decoded_[i] = unescape_spaces(pieces_[i]);
        break;
      case TokenType::BYTE: {
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

Tokenizer Tokenizer::from_gguf(const GgufFile& gguf) {
  const std::string& path = gguf.path();

  const std::string model = gguf.get_string("tokenizer.ggml.model");
  if (model != "llama") {
    throw Error(path + ": tokenizer.ggml.model is '" + model +
                "'; only 'llama' (SentencePiece) vocabularies are supported");
  }

  std::vector<std::string> tokens = gguf.get_string_array("tokenizer.ggml.tokens");
  if (tokens.empty()) throw Error(path + ": tokenizer.ggml.tokens is empty");
  const size_t n = tokens.size();
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw Error(path + ": tokenizer.ggml.tokens has " + std::to_string(n) +
                " entries, more than int32 token ids can address");
  }

  // Scores are required: without them SentencePiece merging has no order.
  std::vector<float> scores = gguf.get_float_array("tokenizer.ggml.scores");
  if (scores.size() != n) {
    throw Error(path + ": tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  }

  // Token types are optional (as in llama.cpp); the constructor infers them when absent.
  std::vector<int32_t> types;
  if (gguf.has("tokenizer.ggml.token_type")) {
    const std::vector<int64_t> raw = gguf.get_int_array("tokenizer.ggml.token_type");
    if (raw.size() != n) {
      throw Error(path + ": tokenizer.ggml.token_type has " + std::to_string(raw.size()) +
                  " entries but tokenizer.ggml.tokens has " + std::to_string(n));
    }
    types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (raw[i] < std::numeric_limits<int32_t>::min() || raw[i] > std::numeric_limits<int32_t>::max()) {
        throw Error(path + ": tokenizer.ggml.token_type[" + std::to_string(i) + "] = " +
                    std::to_string(raw[i]) + " is not a valid token type");
      }
      types.push_back(static_cast<int32_t>(raw[i]));
    }
  }

  // Special ids default to llama.cpp's SentencePiece defaults when the keys are absent.
  const auto read_id = [&](const std::string& key, uint64_t fallback) {
    const uint64_t id = gguf.get_uint_or(key, fallback);
    if (id >= n) {
      throw Error(path + ": " + key + " = " + std::to_string(id) +
                  " is out of range for a vocabulary of " + std::to_string(n) + " tokens");
    }
    return static_cast<int32_t>(id);
  };
  const int32_t bos = read_id("tokenizer.ggml.bos_token_id", 1);
  const int32_t eos = read_id("tokenizer.ggml.eos_token_id", 2);
  const int32_t unk = read_id("tokenizer.ggml.unknown_token_id", 0);

  bool add_space_prefix = true;  // llama.cpp's default for SentencePiece when the key is absent
  if (gguf.has("tokenizer.ggml.add_space_prefix")) {
    const GgufValue& v = gguf.get("tokenizer.ggml.add_space_prefix");
    const bool* b = std::get_if<bool>(&v.scalar);
    if (v.type != GgufValueType::BOOL || b == nullptr) {
      throw Error(path + ": tokenizer.ggml.add_space_prefix has type " + type_name(v) +
                  ", expected bool");
    }
    add_space_prefix = *b;
  }

  return Tokenizer(std::move(tokens), std::move(scores), std::move(types), bos, eos, unk,
                   add_space_prefix);
}

int32_t Tokenizer::find_piece(std::string_view text) const {
  const auto it = index_.find(text);
  return it == index_.end() ? -1 : it->second;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_bos) const {
  std::vector<int32_t> out;
  if (add_bos) {
    if (bos_id_ < 0) throw Error("Tokenizer: BOS requested but the vocabulary has no BOS token");
    out.push_back(bos_id_);
  }
  // llama.cpp makes no text fragment from an empty string, so not even the prefix space appears.
  if (text.empty()) return out;

  // Escape: optional leading space, then every ' ' -> U+2581.
  std::string buf;
  buf.reserve(text.size() + (text.size() >> 2) + kSpaceMark.size());
  if (add_space_prefix_) buf.append(kSpaceMark);
  for (const char c : text) {
    if (c == ' ') {
      buf.append(kSpaceMark);
    } else {
      buf.push_back(c);
    }
  }

  if (buf.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw Error("Tokenizer: text of " + std::to_string(text.size()) +
                " bytes is too long to encode at once (limit 2 GiB after escaping)");
  }

  // One symbol per UTF-8 character.
  std::vector<Symbol> sym;
  sym.reserve(buf.size());
  for (size_t off = 0; off < buf.size();) {
    const size_t len = std::min(utf8_len(static_cast<unsigned char>(buf[off])), buf.size() - off);
    const auto idx = static_cast<int32_t>(sym.size());
    sym.push_back(Symbol{idx - 1, off + len == buf.size() ? -1 : idx + 1, static_cast<uint32_t>(off),
                         static_cast<uint32_t>(len)});
    off += len;
  }

  std::vector<Bigram> storage;
  storage.reserve(sym.size());
  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue(BigramLess{}, std::move(storage));
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = sym[static_cast<size_t>(left)];
    const Symbol& r = sym[static_cast<size_t>(right)];
    const uint32_t size = l.n + r.n;  // r starts where l ends: symbols are contiguous spans
    const int32_t id = find_piece(std::string_view(buf).substr(l.start, size));
    if (id >= 0) queue.push(Bigram{scores_[static_cast<size_t>(id)], left, right, size});
  };
  for (size_t i = 1; i < sym.size(); ++i) try_add(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[static_cast<size_t>(b.left)];
    Symbol& r = sym[static_cast<size_t>(b.right)];
    // Stale: one side was absorbed (n == 0) or has grown since this pair was pushed.
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  // Symbol 0 is never absorbed (only right-hand symbols are), so the list starts there.
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& s = sym[static_cast<size_t>(i)];
    const std::string_view piece_text = std::string_view(buf).substr(s.start, s.n);
    const int32_t id = find_piece(piece_text);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // Only unmerged single characters can be missing: every merge produced a vocabulary piece.
    for (const char c : piece_text) {
      const int32_t byte_id = byte_ids_[static_cast<unsigned char>(c)];
      if (byte_id < 0) {
        throw Error("Tokenizer: byte " + byte_piece(static_cast<unsigned char>(c)) +
                    " has no vocabulary piece and there is no unknown token");
      }
      out.push_back(byte_id);
    }
  }
  return out;
}

std::string Tokenizer::piece(int32_t id) const {
  if (id < 0 || id >= n_vocab()) {
    throw Error("Tokenizer: token id " + std::to_string(id) + " is outside [0, " +
                std::to_string(n_vocab()) + ")");
  }
  return decoded_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id < 0 || id >= n_vocab()) {
      throw Error("Tokenizer: token id " + std::to_string(id) + " is outside [0, " +
                  std::to_string(n_vocab()) + ")");
    }
    out += decoded_[static_cast<size_t>(id)];
  }
  return out;
}

}  // namespace kvevict
