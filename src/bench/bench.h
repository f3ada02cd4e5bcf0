// `kvevict bench` measurements: decode speed vs the memory-bandwidth roofline, eviction-round
// cost per selector, and batched throughput at equal batch and at equal KV memory.
//
// Source: docs/eviction-spec.md §4 (the paper's round costs and serving numbers
// these tables are analogues of); STREAM (McCalpin, "Memory Bandwidth and Machine Balance",
// 1995) for the copy kernel and its byte-counting convention (read + write bytes).
//
// Every figure is the median over repetitions, reported with min and max; the bandwidth that
// defines the roofline is the best repetition (STREAM's convention: the best of N trials). Long contexts are
// reached by *fast-forwarding* a sequence: its cache is filled with synthetic keys/values
// (uniform in ±1) at the positions it would hold after L tokens (full: all L; bounded: the
// prompt and B - prompt positions spread over the rest), and n_seen is set to L; then real
// decode steps are timed (including every eviction round they trigger). Cost per step depends on
// the live slots, the positions and the policy's work, not on how the values were produced.
#pragma once

#include <functional>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/kv_cache.h"

namespace kvevict {

class ThreadPool;

/// Median / min / max of repeated measurements (same unit as the samples).
struct Summary {
  double median = 0, min = 0, max = 0;
  std::vector<double> samples;
  /// Half the min-max range relative to the median, percent.
  double spread_pct() const { return median != 0 ? 50.0 * (max - min) / median : 0.0; }
  nlohmann::json to_json() const;
};

/// Summarises samples (Error when empty).
Summary summarize(std::vector<double> samples);

/// A distribution-free confidence interval for the median of n samples: [x_(k), x_(n+1-k)] of
/// the sorted samples with k the largest rank whose binomial(n, 1/2) tail P(X <= k-1) is at most
/// (1 - level) / 2 (the sign-test interval; e.g. Hollander & Wolfe, Nonparametric Statistical
/// Methods, §3.6). `coverage` is its exact coverage, 1 - 2 P(X <= k-1) >= level. With too few
/// samples for any such k (n < 6 at level 0.95) `valid` is false and lo/hi are the min and max.
struct MedianCi {
  double median = 0, lo = 0, hi = 0, coverage = 0;
  bool valid = false;
  nlohmann::json to_json() const;
};

/// The median's interval at `level` (0 < level < 1). Throws kvevict::Error when samples is empty
/// or level is out of range.
MedianCi median_ci(std::vector<double> samples, double level = 0.95);

/// The 1-, 5- and 15-minute load averages from /proc/loadavg ("?" fields when unreadable).
std::string load_average();
/// 1-minute load average, or -1 when unreadable.
double load_average_1m();

/// STREAM-style copy bandwidth: `reps` copies of an array of `bytes` bytes into another, the
/// range split over the pool's threads; GB/s (1e9 bytes/s) counting bytes read + written.
Summary copy_bandwidth_gbps(ThreadPool& pool, int64_t bytes, int reps);

/// Read-only bandwidth (what a decode step mostly does): `reps` sums over an array of `bytes`
/// bytes split over the pool's threads (AVX2 loads, 4 accumulators); GB/s of bytes read.
Summary read_bandwidth_gbps(ThreadPool& pool, int64_t bytes, int reps);

/// Options shared by the bench modes.
struct BenchCommon {
  std::string model;  ///< GGUF path
  int threads = 0;    ///< 0 = all cores
  KvType kv_type = KvType::F32;
  int reps = 5;  ///< repetitions per figure
  uint64_t seed = 0;
  int64_t recent = 64;   ///< r
  int64_t interval = 0;  ///< s, decode steps between rounds (0 = r; EvictionConfig::interval, spec §2.3)
  /// Called after each measured cell (a sweep length, a (policy, B) pair, a policy of a table)
  /// with a short label; the CLI drives its progress display from it. May be empty.
  std::function<void(const std::string& label)> on_cell;
};

/// `bench decode`. With `shape` set, models of that shape (model/synth.h) are synthesised in
/// each of `types` and measured one after another against one roofline (the best copy
/// bandwidth measured before and after them), instead of common.model.
struct DecodeBenchConfig {
  BenchCommon common;
  std::string shape;                             ///< synth shape name; empty: use common.model
  std::vector<std::string> types = {"q8_0"};     ///< synth weight types / mixes (SynthTypes)
  std::string synth_dir = "out/bench-models";    ///< synthesised files, reused when present (same shape, type, seed)
  std::vector<int64_t> prefill_lengths = {128};  ///< prompt tokens of the prefill table (empty: no table)
  bool sweep = true;                             ///< run the length sweep (only with a single model)
  int steps = 32;                                ///< decode steps timed per repetition
  std::vector<int64_t> lengths = {1024, 2048, 4096, 8192, 16384, 32768};  ///< generated tokens
  int64_t max_length = 32768;                                             ///< lengths above this are skipped
  int64_t budget = 1024;                                                  ///< B of the bounded runs
  std::string policy = "random";                                          ///< policy of the bounded runs
};

/// `bench evict-round`.
struct EvictBenchConfig {
  BenchCommon common;
  std::vector<int64_t> budgets = {256, 1024, 4096};
  std::vector<std::string> policies;  ///< empty: every evicting policy of the registry
  std::vector<std::string> params;    ///< "policy:key=value" (that policy) or "key=value"
  int warmup_steps = 64;              ///< real decode steps before the first timed round
  double max_cell_seconds = 60;       ///< stop repeating a (policy, B) cell after this (>= 1 round; noted)
};

/// `bench throughput`.
struct ThroughputBenchConfig {
  BenchCommon common;
  int batch = 16;  ///< iso-batch size
  int64_t budget = 1024;
  int64_t start_length = 4096;            ///< tokens already generated when timing starts
  int steps = 128;                        ///< timed decode steps per repetition (2 rounds at r = 64)
  int64_t pool_bytes = int64_t{2} << 30;  ///< iso-memory KV pool
  int max_batch = 64;                     ///< iso-memory runs at most this batch (noted when capped)
  std::vector<std::string> policies;      ///< empty: every policy of the registry
  std::vector<std::string> params;
  bool iso_batch = true, iso_memory = true;  ///< which tables to run
  /// Policies whose probability kernel is measured in pairs (table "probability kernel"): two
  /// batches of the policy, one with the attention kernel forced to compute and hand out
  /// probabilities (then ignored), timed in alternating blocks of steps. Selection and rounds are
  /// the same, only the two-pass kernel (attend_probs) replaces the online-softmax one, so the
  /// difference is what a policy that reads attention probabilities (H2O) pays in the kernel
  /// alone. Each must be an evicting policy (Error before measuring: `full` has no selector).
  std::vector<std::string> probs_kernel;
  /// Table "interleaved": every policy's batch is built first, then each repetition times
  /// `steps` steps of every policy in turn, in a fresh order drawn from `seed` per repetition, so a
  /// slow spell of a shared machine, or what one policy leaves in the caches, falls on every policy
  /// in turn instead of on one policy's block of repetitions. Each repetition also gives `baseline`'s throughput gain over every
  /// other policy measured side by side (t_policy / t_baseline - 1), with the share of it the
  /// eviction rounds account for; medians with a sign-test interval (median_ci). Needs steps a
  /// multiple of the round interval s (r by default; every repetition then holds the same number of rounds) and all batches' KV
  /// within pool_bytes at once (Error otherwise, before anything runs).
  bool interleaved = false;
  std::string baseline = "random";
};

/// Each runner prints its table to stdout as it goes and returns everything as JSON (config,
/// machine load before and after, copy bandwidth, rows). Throws kvevict::Error on bad input.
nlohmann::json bench_decode(const DecodeBenchConfig& cfg);
nlohmann::json bench_evict_round(const EvictBenchConfig& cfg);
nlohmann::json bench_throughput(const ThroughputBenchConfig& cfg);

/// The decode steps between rounds of c's schedule: c.interval, or r when unset (EvictionConfig's
/// round_interval, spec §2.3).
int64_t round_interval(const BenchCommon& c);

/// The checks of bench_throughput's arguments that need no model (positive sizes, --probs-kernel
/// policies with a selector; for the interleaved table, --steps a multiple of the round interval and
/// the baseline among the policies), so a caller can refuse bad input before waiting for a quiet
/// machine. Throws kvevict::Error naming the option.
void check_throughput(const ThroughputBenchConfig& cfg);

}  // namespace kvevict
