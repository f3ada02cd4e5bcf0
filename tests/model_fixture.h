// Loads stories260K once per test binary (skips the test when ../shared is absent).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "eviction/registry.h"
#include "model/model.h"
#include "test_paths.h"

namespace kvevict::test {

inline const Model* stories_model() {
  static std::unique_ptr<Model> m = [] {
    return std::filesystem::exists(stories260k()) ? Model::load(stories260k()) : nullptr;
  }();
  return m.get();
}

/// `n_total` token ids: a fixed story prompt (with BOS) plus the model's own greedy continuation
/// computed with `full`, so every policy under test decodes the same, natural tokens.
inline std::vector<int32_t> greedy_story_tokens(const Model& m, int n_total) {
  auto ids = m.tokenizer().encode("Once upon a time, Lily and Ben found a small red box", true);
  Engine engine(m, 1);
  auto seq = engine.new_sequence(0, make_policy("full"), {}, static_cast<int64_t>(ids.size()), n_total);
  std::vector<float> logits;
  engine.prefill(*seq, ids, logits);
  while (static_cast<int>(ids.size()) < n_total) {
    ids.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    engine.decode(*seq, ids.back(), logits);
  }
  return ids;
}

#define KVEVICT_REQUIRE_MODEL(var)                                     \
  const ::kvevict::Model* var = ::kvevict::test::stories_model(); \
  if (!var) KVEVICT_SKIP_UNLESS_CI("stories260K not found under " << ::kvevict::test::shared_dir())

}  // namespace kvevict::test
