// Byte-level BPE (see bpe.h).
#include "model/tokenizer/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

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
                   const std::string& where)
    : ignore_merges_(ignore_merges) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  const char* pattern = pre_regex(pre);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(where + ": pre-tokenizer regex does not compile at offset " + std::to_string(err_off) + ": " +
                reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: without JIT the interpreter runs
  code_ = std::shared_ptr<void>(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });

  for (unsigned b = 0; b < 256; ++b) byte_ids_[b] = find_piece(index, alphabet().text[b]);

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
    const std::string_view l = std::string_view(m).substr(0, sp), r = std::string_view(m).substr(sp + 1);
    const int32_t lid = find_piece(index, l), rid = find_piece(index, r);
    joined.assign(l);
    joined.append(r);
    const int32_t res = find_piece(index, joined);
    if (lid < 0 || rid < 0 || res < 0) continue;
    ranks_.try_emplace(pair_key(lid, rid), Merge{static_cast<int32_t>(i), res});  // first rank wins
  }
}

void BpeModel::tokenize(std::string_view text, const PieceIndex& index, std::vector<int32_t>& out) const {
  std::string mapped;
  for (const std::string_view word : pre_tokenize(text)) tokenize_word(word, index, mapped, out);
}

std::vector<std::string_view> BpeModel::pre_tokenize(std::string_view text) const {
  std::vector<std::string_view> words;
  auto* code = static_cast<pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(pcre2_match_data_create_from_pattern(code, nullptr),
                                                                    pcre2_match_data_free);
  if (!md) throw Error("Tokenizer: out of memory for regex match data");
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, 0, md.get(), nullptr);
    // A very long whitespace run can exhaust the JIT stack; the interpreter uses the heap.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_JIT, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      words.push_back(text.substr(pos));  // bytes no alternative covers (invalid UTF-8)
      break;
    }
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error("Tokenizer: pre-tokenizer regex failed at byte " + std::to_string(pos) + ": " +
                  reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    size_t s = ov[0], e = ov[1];
    if (s > pos) words.push_back(text.substr(pos, s - pos));
    if (e == s) e = s + 1;  // no alternative matches empty text; guard against a stall anyway
    if (s < text.size()) words.push_back(text.substr(s, std::min(e, text.size()) - s));
    pos = e;
  }
  return words;
}

void BpeModel::tokenize_word(std::string_view word, const PieceIndex& index, std::string& mapped,
                             std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    mapped.clear();
    for (const char c : word) mapped += alphabet().text[static_cast<unsigned char>(c)];
    if (const int32_t id = find_piece(index, mapped); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (word.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw Error("Tokenizer: pre-token of " + std::to_string(word.size()) + " bytes is too long (limit 2 GiB)");
  }
  // One symbol per byte: in the byte alphabet every byte is one character.
  std::vector<Symbol> sym(word.size());
  const auto n = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < n; ++i) {
    sym[static_cast<size_t>(i)] =
        Symbol{i - 1, i + 1 < n ? i + 1 : -1, byte_ids_[static_cast<unsigned char>(word[static_cast<size_t>(i)])]};
  }
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
    if (id < 0) {
      // Only an unmerged byte can be unknown (merges always produce vocabulary pieces).
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(word[static_cast<size_t>(i)]));
      throw Error(std::string("Tokenizer: byte ") + hex + " has no piece in this byte-level vocabulary");
    }
    out.push_back(id);
  }
}

}  // namespace kvevict::tok
