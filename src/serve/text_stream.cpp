#include "serve/text_stream.h"

#include <algorithm>
#include <cstdint>

namespace kvevict::serve {

TextStream::TextStream(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

size_t utf8_complete_prefix(const std::string& s) {
  // Walk back over at most 3 continuation bytes to the last lead byte; cut it if its sequence
  // is longer than what follows it.
  const size_t n = s.size();
  size_t i = n;
  int back = 0;
  while (i > 0 && back < 4) {
    const auto c = static_cast<unsigned char>(s[i - 1]);
    if ((c & 0xC0) != 0x80) {
      size_t need = 1;
      if ((c & 0xE0) == 0xC0)
        need = 2;
      else if ((c & 0xF0) == 0xE0)
        need = 3;
      else if ((c & 0xF8) == 0xF0)
        need = 4;
      return (n - (i - 1) < need) ? i - 1 : n;
    }
    --i;
    ++back;
  }
  return n;
}

bool utf8_valid(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else
      return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

std::string TextStream::push(const std::string& piece) {
  if (stopped_) return {};
  pending_ += piece;
  // A stop string may start in text already held back, so search all of pending_ (emitted text
  // never contains a stop string's prefix that could still complete).
  size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, cut);
    pending_.clear();
    emitted_ += out;
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  size_t ready = pending_.size() - hold;
  ready = utf8_complete_prefix(pending_.substr(0, ready));
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  emitted_ += out;
  return out;
}

std::string TextStream::flush() {
  if (stopped_) return {};
  std::string out = pending_.substr(0, utf8_complete_prefix(pending_));
  pending_.clear();
  emitted_ += out;
  return out;
}

}  // namespace kvevict::serve
