// Byte-level BPE (see bpe.h).
#include "model/tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <queue>

#include "util/error.h"

namespace kvevict::tok {

namespace {

// The contraction alternatives are case-insensitive, digits are split one by one (Qwen2) or in
// groups of up to three (Llama-3), letters may carry one leading non-letter/non-digit, and
// trailing whitespace before a non-space is left for the next pre-token ("\s+(?!\S)").
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// o200k-style (GPT-4o, Phi-4): case-aware words (an upper-case run ends where a lower-case run
// follows) with the contraction as an optional suffix; a punctuation run also absorbs '/'.
constexpr const char* kGpt4oRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// UTF-8 encoding of code point `cp` (< 0x800 here: the byte alphabet ends at U+0143).
std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// GPT-2's table: printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
// themselves; the other 68 bytes take code points 256, 257, ... in byte order, so every byte
// has a visible, non-space character.
struct ByteAlphabet {
  std::array<std::string, 256> text;
  std::array<int16_t, 324> byte_of;  // code point -> byte, -1 outside the alphabet
  ByteAlphabet() {
    byte_of.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? b : next++;
      text[b] = utf8(cp);
      byte_of[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

struct Symbol {
  int32_t prev;
  int32_t next;
  int32_t id;  ///< token id of this symbol's text; -1 unknown, -2 absorbed into its left neighbour
};

// A candidate merge of neighbours (left, right) with their ids at push time; a later id
// mismatch marks it stale (ids only change by growing, so an old id never comes back).
struct Bigram {
  int32_t rank;
  int32_t left;
  int32_t right;
  int32_t left_id;
  int32_t right_id;
  int32_t result;
};

// Min-heap order: lowest rank first, leftmost on ties (as llama.cpp's llm_bigram_bpe).
struct BigramGreater {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

uint64_t pair_key(int32_t l, int32_t r) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
}

}  // namespace

std::optional<BpePre> bpe_pre_from_name(std::string_view name) {
  if (name == "qwen2" || name == "deepseek-r1-qwen") return BpePre::Qwen2;
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3") return BpePre::Llama3;
  if (name == "dbrx") return BpePre::Dbrx;
  if (name == "gpt-4o" || name == "llama4") return BpePre::Gpt4o;
  return std::nullopt;
}

std::string bpe_pre_names() { return "qwen2, deepseek-r1-qwen, llama-bpe, llama3, llama-v3, dbrx, gpt-4o, llama4"; }

const char* pre_regex(BpePre pre) {
  switch (pre) {
    case BpePre::Qwen2:
      return kQwen2Regex;
    case BpePre::Llama3:
    case BpePre::Dbrx:
      return kLlama3Regex;
    case BpePre::Gpt4o:
      return kGpt4oRegex;
  }
  return kQwen2Regex;
}

std::string unicode_to_bytes(std::string_view piece) {
  const ByteAlphabet& a = alphabet();
  std::string out;
  out.reserve(piece.size());
  for (size_t i = 0; i < piece.size();) {
    const auto c = static_cast<unsigned char>(piece[i]);
    uint32_t cp = c;
    size_t len = 1;
    if (c >= 0xC0 && c < 0xE0 && i + 1 < piece.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(piece[i + 1]) & 0x3Fu);
      len = 2;
    }
    if (cp < a.byte_of.size() && a.byte_of[cp] >= 0 && (len == 2 || c < 0x80)) {
      out.push_back(static_cast<char>(a.byte_of[cp]));
    } else {
      // Outside the byte alphabet: keep the text (multi-byte sequences are copied whole).
      size_t n = len;
      if (c >= 0xE0) n = c >= 0xF0 ? 4 : 3;
      n = std::min(n, piece.size() - i);
      out.append(piece.substr(i, n));
      len = n;
    }
    i += len;
  }
  return out;
}

BpeModel::BpeModel(const PieceIndex& index, const std::vector<std::string>& merges, BpePre pre, bool ignore_merges,
                   const std::string& where) {
  opt_.ignore_merges = ignore_merges;
  regex_.emplace(pre_regex(pre), where);
  for (unsigned b = 0; b < 256; ++b) byte_ids_[b] = find_piece(index, alphabet().text[b]);
  fallback_ids_.fill(-1);
  ranks_.reserve(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    // Split at the first space after the first character, as llama.cpp does (a left part can
    // never be empty).
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos) {
      throw Error(where + ": tokenizer.ggml.merges[" + std::to_string(i) + "] = '" + m +
                  "' has no space separating its two parts");
    }
    if (i > static_cast<size_t>(std::numeric_limits<int32_t>::max())) break;
    add_merge(index, std::string_view(m).substr(0, sp), std::string_view(m).substr(sp + 1), i, joined);
  }
}

BpeModel::BpeModel(const PieceIndex& index, const std::vector<std::pair<std::string, std::string>>& merges,
                   const BpeOptions& options, const std::string& where)
    : opt_(options) {
  for (unsigned b = 0; b < 256; ++b) {
    byte_ids_[b] = opt_.byte_level ? find_piece(index, alphabet().text[b]) : -1;
    static constexpr char kHex[] = "0123456789ABCDEF";
    const std::string piece{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    fallback_ids_[b] = !opt_.byte_level && opt_.byte_fallback ? find_piece(index, piece) : -1;
  }
  if (merges.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw Error(where + ": " + std::to_string(merges.size()) + " merges exceed the int32 rank range");
  ranks_.reserve(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    if (!add_merge(index, merges[i].first, merges[i].second, i, joined) && opt_.strict_merges)
      throw Error(where + ": merge #" + std::to_string(i) + " ('" + merges[i].first + "', '" + merges[i].second +
                  "') uses or makes a piece that is not in the vocabulary");
  }
}

bool BpeModel::add_merge(const PieceIndex& index, std::string_view l, std::string_view r, size_t rank,
                         std::string& joined) {
  const int32_t lid = find_piece(index, l), rid = find_piece(index, r);
  joined.assign(l);
  joined.append(r);
  const int32_t res = find_piece(index, joined);
  if (lid < 0 || rid < 0 || res < 0) return false;
  const Merge m{static_cast<int32_t>(rank), res};
  if (opt_.last_duplicate_wins) {
    ranks_.insert_or_assign(pair_key(lid, rid), m);
  } else {
    ranks_.try_emplace(pair_key(lid, rid), m);  // first rank wins
  }
  return true;
}

void BpeModel::tokenize(std::string_view text, const PieceIndex& index, std::vector<int32_t>& out) const {
  for (const std::string_view word : pre_tokenize(text)) tokenize_word(word, index, out);
}

std::vector<std::string_view> BpeModel::pre_tokenize(std::string_view text) const {
  if (!regex_) throw Error("Tokenizer: this BPE model has no pre-tokenizer regex");
  return regex_->split(text);
}

namespace {
// Bytes of the UTF-8 character starting at s[i] (1 for a stray continuation byte or a sequence
// cut short; tokenizers only ever sees valid UTF-8, so the fallback only keeps invalid input
// encodable).
size_t char_len(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return n;
}

[[noreturn]] void no_piece_for_byte(unsigned char b) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", b);
  throw Error(std::string("Tokenizer: byte ") + hex + " has no piece in this vocabulary");
}
}  // namespace

// The symbols a pre-token starts as: one per byte (byte-level; -1 where a byte has no piece,
// reported after merging as before), or one per character with tokenizers' fallbacks
// (BPE::merge_word: the character's piece, else its `<0xNN>` byte tokens when all exist, else
// unk, consecutive unks fused when fuse_unk).
void BpeModel::initial_symbols(std::string_view word, const PieceIndex& index, std::vector<int32_t>& ids) const {
  ids.clear();
  if (opt_.byte_level) {
    for (const char c : word) ids.push_back(byte_ids_[static_cast<unsigned char>(c)]);
    return;
  }
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    const size_t n = char_len(word, i);
    const std::string_view ch = word.substr(i, n);
    i += n;
    if (const int32_t id = find_piece(index, ch); id >= 0) {
      ids.push_back(id);
      last_unk = false;
      continue;
    }
    bool all = opt_.byte_fallback;
    for (size_t k = 0; all && k < ch.size(); ++k) all = fallback_ids_[static_cast<unsigned char>(ch[k])] >= 0;
    if (all) {
      for (const char c : ch) ids.push_back(fallback_ids_[static_cast<unsigned char>(c)]);
      last_unk = false;
      continue;
    }
    if (opt_.unk_id < 0) no_piece_for_byte(static_cast<unsigned char>(ch[0]));
    if (!(opt_.fuse_unk && last_unk)) ids.push_back(opt_.unk_id);
    last_unk = true;
  }
}

void BpeModel::tokenize_word(std::string_view word, const PieceIndex& index, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (opt_.ignore_merges) {
    std::string mapped;
    if (opt_.byte_level) {
      for (const char c : word) mapped += alphabet().text[static_cast<unsigned char>(c)];
    } else {
      mapped.assign(word);
    }
    if (const int32_t id = find_piece(index, mapped); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (word.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw Error("Tokenizer: pre-token of " + std::to_string(word.size()) + " bytes is too long (limit 2 GiB)");
  }
  std::vector<int32_t> ids;
  initial_symbols(word, index, ids);
  const auto n = static_cast<int32_t>(ids.size());
  std::vector<Symbol> sym(ids.size());
  for (int32_t i = 0; i < n; ++i)
    sym[static_cast<size_t>(i)] = Symbol{i - 1, i + 1 < n ? i + 1 : -1, ids[static_cast<size_t>(i)]};
  std::priority_queue<Bigram, std::vector<Bigram>, BigramGreater> queue;
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t lid = sym[static_cast<size_t>(left)].id, rid = sym[static_cast<size_t>(right)].id;
    if (lid < 0 || rid < 0) return;
    const auto it = ranks_.find(pair_key(lid, rid));
    if (it != ranks_.end()) queue.push(Bigram{it->second.rank, left, right, lid, rid, it->second.result});
  };
  for (int32_t i = 1; i < n; ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[static_cast<size_t>(b.left)];
    Symbol& r = sym[static_cast<size_t>(b.right)];
    if (l.id != b.left_id || r.id != b.right_id || l.next != b.right) continue;  // stale
    l.id = b.result;
    r.id = -2;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const int32_t id = sym[static_cast<size_t>(i)].id;
    // Only an unmerged byte can be unknown (merges always produce vocabulary pieces).
    if (id < 0) no_piece_for_byte(static_cast<unsigned char>(word[static_cast<size_t>(i)]));
    out.push_back(id);
  }
}

}  // namespace kvevict::tok
