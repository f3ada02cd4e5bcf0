// SentencePiece-style merging (see spm.h). The symbol list and heap are kept in 32-bit fields so
// a long text stays compact.
#include "model/tokenizer/spm.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <string>

#include "util/error.h"

namespace kvevict::tok {

namespace {

// Bytes in the UTF-8 sequence that starts with `lead`, judged from its top four bits only, as
// llama.cpp does: continuation bytes (10xxxxxx) count as 1-byte symbols, and a lead byte claims
// its length even when the following bytes are not continuations. The caller clamps at the end
// of the text. Matching this exactly keeps invalid UTF-8 segmented the way the reference is.
size_t utf8_len(unsigned char lead) {
  static constexpr unsigned char kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

std::string byte_piece(unsigned b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
}

// One node of the doubly linked list of symbols. A symbol is always a contiguous span of the
// escaped text, so merging two neighbours only grows the left span; n == 0 marks a symbol that
// has been absorbed into its left neighbour.
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

}  // namespace

void spm_tokenize(std::string_view buf, const PieceIndex& index, const std::vector<float>& scores,
                  const int32_t (&byte_ids)[256], std::vector<int32_t>& out) {
  if (buf.empty()) return;
  if (buf.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw Error("Tokenizer: text of " + std::to_string(buf.size()) +
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
    const int32_t id = find_piece(index, buf.substr(l.start, size));
    if (id >= 0) queue.push(Bigram{scores[static_cast<size_t>(id)], left, right, size});
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
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& s = sym[static_cast<size_t>(i)];
    const std::string_view piece_text = buf.substr(s.start, s.n);
    const int32_t id = find_piece(index, piece_text);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // Only unmerged single characters can be missing: every merge produced a vocabulary piece.
    for (const char c : piece_text) {
      const int32_t byte_id = byte_ids[static_cast<unsigned char>(c)];
      if (byte_id < 0) {
        throw Error("Tokenizer: byte " + byte_piece(static_cast<unsigned char>(c)) +
                    " has no vocabulary piece and there is no unknown token");
      }
      out.push_back(byte_id);
    }
  }
}

}  // namespace kvevict::tok
