// Every selector within budget on a model: the selectors that read queries (snapkv, tova),
// probabilities (h2o) and calibrated pre-RoPE statistics (triattention) run on a model family or
// RoPE variant the way they run on llama (families and LongRoPE tests share it).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "eval/calibrate.h"
#include "eviction/query_stats.h"
#include "eviction/registry.h"
#include "util/thread_pool.h"

namespace kvevict::test {

/// Calibrates the pre-RoPE query statistics of `m` on `calib` (saved to `stats_path`, removed at
/// the end, for triattention), then for each of random, snapkv, tova, h2o, triattention and
/// streaming (seed 3): prefills tokens[0, P), decodes tokens[P, N), and asserts after every
/// decode step that layer 0 holds at most B + r slots (tokens), that at least 5 eviction rounds
/// ran and that the last logits are finite. Stops at the first failure (wrap in
/// ASSERT_NO_FATAL_FAILURE).
inline void expect_selectors_within_budget(const Model& m, const std::vector<int32_t>& tokens,
                                           std::span<const int32_t> calib, const std::string& stats_path, int64_t P,
                                           int64_t N, int64_t B, int64_t r) {
  ThreadPool pool(2);
  const QueryStats st = calibrate_query_stats(m, calib, 0, pool);
  save_query_stats(st, stats_path);
  for (const std::string name : {"random", "snapkv", "tova", "h2o", "triattention", "streaming"}) {
    const SelectorParams params =
        name == "triattention" ? SelectorParams::parse({"stats=" + stats_path}) : SelectorParams();
    Engine engine(m, 2);
    EvictionConfig cfg;
    cfg.budget = B;
    cfg.recent = r;
    cfg.seed = 3;
    auto seq = engine.new_sequence(0, make_policy(name, std::nullopt, std::nullopt, params), cfg, P, N - P);
    std::vector<float> logits;
    engine.prefill(*seq, std::span<const int32_t>(tokens).first(static_cast<size_t>(P)), logits);
    for (int64_t t = P; t < N; ++t) {
      engine.decode(*seq, tokens[static_cast<size_t>(t)], logits);
      ASSERT_LE(seq->kv.length(0), B + r) << name;
    }
    EXPECT_GE(seq->stats.rounds, 5) << name;
    for (float v : logits) ASSERT_TRUE(std::isfinite(v)) << name;
  }
  std::filesystem::remove(stats_path);
}

}  // namespace kvevict::test
