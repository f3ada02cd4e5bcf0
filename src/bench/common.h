// Helpers shared by the `kvevict bench` measurements (bench/*.cpp): timing, synthetic tokens,
// fast-forwarding a sequence to a long context, loading the model, the JSON header every table
// carries, and the policy list of a run. Internal to src/bench/ (bench.h is the interface).
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "engine/engine.h"
#include "eviction/registry.h"
#include "model/model.h"

namespace kvevict::bench_detail {

using Clock = std::chrono::steady_clock;
/// Seconds from t0 to now.
double seconds_since(Clock::time_point t0);

/// Prompt of every benchmarked sequence (tokens).
constexpr int64_t kPromptLen = 16;

/// Bytes of weights one decode step streams: every matrix once, the output matrix once, one
/// embedding row (the embedding matrix is read whole only when it doubles as the output).
int64_t weight_bytes_per_step(const Model& m);

/// Bytes of keys+values one decode step reads at `slots` live slots per (layer, KV head).
int64_t kv_bytes_per_step(const KvShape& s, int64_t slots);

/// n seeded token ids in [0, n_vocab).
std::vector<int32_t> random_tokens(int64_t n, int32_t n_vocab, uint64_t seed);

/// The token fed at decode step i (a fixed function of i, so runs are comparable).
int32_t step_token(int64_t i, int32_t n_vocab);

/// Fast-forwards a prefilled sequence (prompt of kPromptLen tokens) to L tokens seen: fills slots
/// [kPromptLen, n_slots) with synthetic rows at increasing positions ending at L - 1 (n_slots = L
/// for a sequence that never evicts, else min(L, B)), sets n_seen = L. Throws kvevict::Error
/// when n_slots exceeds the cache's capacity.
void fast_forward(Sequence& seq, int64_t L, uint64_t seed);

/// The eviction settings of a benchmarked sequence: budget B, c's recent buffer r, round interval
/// s and seed (spec §2.3).
EvictionConfig eviction_config(const BenchCommon& c, int64_t budget);

/// "r = 64", or "r = 8, s = 128" with a round interval apart from r: a table's schedule label.
std::string schedule_label(const BenchCommon& c);

/// A model and an engine over it.
struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
};

/// Loads c.model with c.threads and c.kv_type. Throws kvevict::Error when c.reps < 1 or the
/// model does not load.
Loaded load(const BenchCommon& c);

/// The JSON every table starts with: model shape, weight type, threads, KV type, reps, load.
nlohmann::json header(const BenchCommon& c, const Model& m, Engine& e);

/// Policy `name` with its share of `params` ([POLICY:]NAME=VALUE, eviction/registry.h); a
/// parameter it does not take is an error only when it names the policy.
Policy policy_with_params(const std::string& name, const std::vector<std::string>& params);

/// `given`, or every policy of the registry (only the evicting ones with evicting_only).
std::vector<std::string> policy_list(const std::vector<std::string>& given, bool evicting_only);

/// Prints "# load average WHEN: a b c".
void print_load(const char* when);

}  // namespace kvevict::bench_detail
