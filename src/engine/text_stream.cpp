#include "engine/text_stream.h"

#include <algorithm>
#include <cstdint>

#include "util/utf8.h"

namespace kvevict {

TextStream::TextStream(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

size_t utf8_complete_prefix(const std::string& s) { return s.size() - utf8_incomplete_tail(s); }

std::string TextStream::push(const std::string& piece, bool match_stops) {
  if (stopped_) return {};
  pending_ += piece;
  // A stop string may start in text already held back, so search all of pending_ (emitted text
  // never contains a stop string's prefix that could still complete).
  size_t cut = std::string::npos;
  if (match_stops)
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

std::string TextStream::flush(bool keep_incomplete) {
  if (stopped_) return {};
  std::string out = keep_incomplete ? pending_ : pending_.substr(0, utf8_complete_prefix(pending_));
  pending_.clear();
  emitted_ += out;
  return out;
}

}  // namespace kvevict
