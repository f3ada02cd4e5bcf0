// Where tests find ../shared: the KVEVICT_SHARED environment variable, else the CMake default
// (<source>/../shared). One place, so every test reads shared files the same way.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace kvevict::test {

inline std::string shared_dir() {
  if (const char* env = std::getenv("KVEVICT_SHARED"); env && *env) return env;
  return KVEVICT_SHARED_DEFAULT;
}
inline std::string shared_path(const std::string& rel) { return shared_dir() + "/" + rel; }
inline std::string stories260k() { return shared_path("models/stories260K/stories260K.gguf"); }
inline std::string kvevict_binary() { return KVEVICT_BINARY; }

}  // namespace kvevict::test
