#include "util/utf8.h"

#include <algorithm>
#include <cstdint>

namespace kvevict {

namespace {
// Length of the sequence a lead byte starts (1 for ASCII), 0 for a byte that cannot lead.
size_t lead_length(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 0;
}
}  // namespace

bool utf8_valid(std::string_view s) {
  static constexpr uint32_t kMinCp[] = {0, 0, 0x80, 0x800, 0x10000};
  static constexpr uint32_t kLeadMask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = lead_length(c);
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = c & kLeadMask[len];
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < kMinCp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

size_t utf8_incomplete_tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t need = std::max<size_t>(lead_length(c), 1);
    return need > back ? back : 0;
  }
  return 0;  // no lead byte within 3 bytes: malformed anyway, nothing to wait for
}

}  // namespace kvevict
