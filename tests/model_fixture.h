// Loads stories260K once per test binary (skips the test when ../shared is absent).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "model/llama.h"
#include "test_paths.h"

namespace kvevict::test {

inline const LlamaModel* stories_model() {
  static std::unique_ptr<LlamaModel> m = [] {
    return std::filesystem::exists(stories260k()) ? LlamaModel::load(stories260k()) : nullptr;
  }();
  return m.get();
}

#define KVEVICT_REQUIRE_MODEL(var)                                     \
  const ::kvevict::LlamaModel* var = ::kvevict::test::stories_model(); \
  if (!var) KVEVICT_SKIP_UNLESS_CI("stories260K not found under " << ::kvevict::test::shared_dir())

}  // namespace kvevict::test
