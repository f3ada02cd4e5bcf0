// Helpers shared by the libFuzzer harnesses: a per-process scratch file (the readers under test
// take paths) and a UTF-8 check.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace kvevict::fuzz {

/// Writes `size` bytes to a scratch file of this process (under $TMPDIR or /tmp) and returns
/// its path; the file is rewritten on every call. Aborts when the file cannot be written.
inline const std::string& write_scratch(const uint8_t* data, size_t size, const char* suffix) {
  static std::string path;
  if (path.empty()) {
    const char* dir = std::getenv("TMPDIR");
    path = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/kvevict-fuzz-" + std::to_string(getpid()) +
        suffix;
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) std::abort();
  return path;
}

/// True when s is well-formed UTF-8 (RFC 3629).
inline bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3Fu);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

/// The shared models/data folder: $KVEVICT_SHARED, else the configured default.
inline std::string shared_dir() {
  const char* env = std::getenv("KVEVICT_SHARED");
  return env != nullptr && *env != '\0' ? env : KVEVICT_SHARED_DEFAULT;
}

}  // namespace kvevict::fuzz
