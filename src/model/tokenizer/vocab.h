// Vocabulary lookup shared by the SentencePiece and byte-level BPE encoders: piece text -> id.
// Also the one string helper they share (replace_all).
//
// Source: GGUF `tokenizer.ggml.tokens` (one piece text per id). As in llama.cpp's token_to_id
// map, a duplicated piece text maps to its last id.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace kvevict::tok {

/// Hash usable with both std::string and std::string_view keys, so encoders can look up
/// candidate pieces as views into their working buffers without allocating a string per probe.
struct PieceHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

/// Piece text -> token id.
using PieceIndex = std::unordered_map<std::string, int32_t, PieceHash, std::equal_to<>>;

/// `s` with every occurrence of `from` (non-empty) replaced by `to` (the pieces' space marks:
/// U+2581 <-> ' ').
inline std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s, pos);
  return out;
}

/// Id of the piece spelled `text` in `index`, or -1 when there is none.
inline int32_t find_piece(const PieceIndex& index, std::string_view text) {
  const auto it = index.find(text);
  return it == index.end() ? -1 : it->second;
}

}  // namespace kvevict::tok
