// Where tests find ../shared (the KVEVICT_SHARED environment variable, else the CMake default
// <source>/../shared), the source tree and the built kvevict binary. One place, so every test
// reads shared files the same way. The three configured paths live in one file CMake generates
// (test_paths_generated.cpp in the build folder), not in compile definitions: the test sources'
// compile commands are then the same in every clone, so ccache serves a fresh clone's build.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace kvevict::test {

/// The CMake default for shared_dir() (KVEVICT_SHARED_DIR), absolute. Generated.
const char* shared_default_dir();
/// The repository root (CMAKE_SOURCE_DIR), absolute. Generated.
const char* source_dir();
/// The built kvevict binary (the kvevict target's file), absolute. Generated; tests call
/// kvevict_binary().
const char* binary_path();

inline std::string shared_dir() {
  if (const char* env = std::getenv("KVEVICT_SHARED"); env && *env) return env;
  return shared_default_dir();
}
inline std::string shared_path(const std::string& rel) { return shared_dir() + "/" + rel; }
inline std::string stories260k() { return shared_path("models/stories260K/stories260K.gguf"); }
/// A file of the source tree, by its path from the repository root ("tests/x.py").
inline std::string source_path(const std::string& rel) { return std::string(source_dir()) + "/" + rel; }
/// The committed default reasoner (models/reasoner/MODEL_CARD.md): the small model that engine,
/// serving and eval tests load (in milliseconds).
inline std::string reasoner_model() { return source_path("models/reasoner/reasoner.gguf"); }
inline std::string kvevict_binary() { return binary_path(); }

/// True under CI (environment CI=true or CI=1, as GitHub Actions and most runners set it).
inline bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci && (std::string(ci) == "true" || std::string(ci) == "1");
}

}  // namespace kvevict::test

/// For a test whose shared model or data is missing: skip it locally, but fail it under CI, where
/// a skipped test would let the suite pass having checked nothing. `msg` may be a `<<` chain.
#define KVEVICT_SKIP_UNLESS_CI(msg)                                                                       \
  do {                                                                                                    \
    if (::kvevict::test::in_ci()) {                                                                       \
      GTEST_FAIL() << msg << " (CI is set: the shared models and data are required; set KVEVICT_SHARED)"; \
    } else {                                                                                              \
      GTEST_SKIP() << msg;                                                                                \
    }                                                                                                     \
  } while (0)
