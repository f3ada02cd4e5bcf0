// `src/bench`: the summary statistics every table reports, and what the throughput and
// round-cost benches count, on a synthetic `tiny` model (model/synth.h). Expected values: the
// medians/min/max are worked by hand below; round counts follow the schedule rule (spec §2.3:
// one round every r decode steps once a sequence holds B slots).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>

#include "bench/bench.h"
#include "model/synth.h"
#include "test_tmp.h"
#include "util/error.h"

namespace kvevict {
namespace {

std::string tiny_model() {
  static const std::string path = [] {
    // One file per test process: ctest runs tests as parallel processes, and rewriting a file
    // another process has mapped kills it with SIGBUS.
    const std::string p = test::tmp_path("bench_tiny_q8_0.gguf");
    write_synth_gguf(synth_shape("tiny"), parse_synth_type("q8_0"), 3, p);
    return p;
  }();
  return path;
}

TEST(Bench, SummaryIsMedianMinMax) {
  // Odd count: the middle value; even count: the mean of the two middle values.
  const Summary a = summarize({5.0, 1.0, 3.0});
  EXPECT_DOUBLE_EQ(a.median, 3.0);
  EXPECT_DOUBLE_EQ(a.min, 1.0);
  EXPECT_DOUBLE_EQ(a.max, 5.0);
  EXPECT_DOUBLE_EQ(a.spread_pct(), 50.0 * 4.0 / 3.0);
  const Summary b = summarize({4.0, 1.0, 2.0, 10.0});
  EXPECT_DOUBLE_EQ(b.median, 3.0);
  EXPECT_THROW(summarize({}), Error);
}

TEST(Bench, MedianIntervalIsTheSignTestOne) {
  // Binomial(10, 1/2): P(X <= 1) = 11/1024 <= 0.025 < P(X <= 2) = 56/1024, so k = 2: the 2nd and
  // 9th order statistics, coverage 1 - 22/1024. n = 6: P(X <= 0) = 1/64, k = 1 (min and max),
  // coverage 1 - 2/64. n = 5: P(X <= 0) = 1/32 > 0.025, no interval.
  const MedianCi a = median_ci({10, 3, 7, 1, 9, 2, 8, 4, 6, 5});
  EXPECT_TRUE(a.valid);
  EXPECT_DOUBLE_EQ(a.median, 5.5);
  EXPECT_DOUBLE_EQ(a.lo, 2.0);
  EXPECT_DOUBLE_EQ(a.hi, 9.0);
  EXPECT_NEAR(a.coverage, 1 - 22.0 / 1024, 1e-12);
  const MedianCi b = median_ci({6, 5, 4, 3, 2, 1});
  EXPECT_TRUE(b.valid);
  EXPECT_DOUBLE_EQ(b.lo, 1.0);
  EXPECT_DOUBLE_EQ(b.hi, 6.0);
  EXPECT_NEAR(b.coverage, 1 - 2.0 / 64, 1e-12);
  const MedianCi c = median_ci({5, 4, 3, 2, 1});
  EXPECT_FALSE(c.valid);
  EXPECT_DOUBLE_EQ(c.median, 3.0);
  // Level 0.9 at n = 10: P(X <= 2) = 56/1024 = 0.0547 > 0.05, so still k = 2.
  EXPECT_DOUBLE_EQ(median_ci({10, 3, 7, 1, 9, 2, 8, 4, 6, 5}, 0.9).lo, 2.0);
  EXPECT_THROW(median_ci({}), Error);
  EXPECT_THROW(median_ci({1.0}, 1.0), Error);
}

TEST(Bench, LoadAverageIsReadable) {
  // /proc/loadavg exists on Linux: three numbers, the first one also as a double.
  EXPECT_GE(load_average_1m(), 0.0);
  const std::string load = load_average();
  EXPECT_EQ(std::count(load.begin(), load.end(), ' '), 2) << load;
}

ThroughputBenchConfig tiny_throughput(int steps) {
  ThroughputBenchConfig c;
  c.common.model = tiny_model();
  c.common.threads = 1;
  c.common.reps = 1;
  c.common.recent = 16;
  c.batch = 3;
  c.budget = 48;
  c.start_length = 200;
  c.steps = steps;
  c.policies = {"random", "full"};
  c.iso_memory = false;
  return c;
}

TEST(Bench, ThroughputCountsTheRoundsInsideTheTimedSteps) {
  // r = 16: the 64 warm-up steps end on a round (64 = 4 r), so 32 timed steps hold exactly two
  // rounds per sequence (3 sequences: 6) and 8 timed steps none; `full` never has one.
  const nlohmann::json two = bench_throughput(tiny_throughput(32));
  ASSERT_EQ(two["iso_batch"].size(), 2u) << two.dump(2);
  EXPECT_EQ(two["iso_batch"][0]["policy"], "random");
  EXPECT_EQ(two["iso_batch"][0]["rounds_timed"], 6);
  EXPECT_EQ(two["iso_batch"][1]["rounds_timed"], 0);
  const nlohmann::json none = bench_throughput(tiny_throughput(8));
  EXPECT_EQ(none["iso_batch"][0]["rounds_timed"], 0);
  EXPECT_GT(none["iso_batch"][0]["tok_per_s"].get<double>(), 0.0);
}

TEST(Bench, ThroughputRoundsFollowTheRoundInterval) {
  // r = 16 with rounds every s = 8 / 32 steps (spec §2.3): the 64 warm-up steps end on a round in
  // both, so 32 timed steps hold 4 / 1 rounds per sequence (3 sequences: 12 / 3), not r's 2.
  ThroughputBenchConfig c = tiny_throughput(32);
  c.common.interval = 8;
  const nlohmann::json often = bench_throughput(c);
  EXPECT_EQ(often["iso_batch"][0]["rounds_timed"], 12) << often.dump(2);
  EXPECT_EQ(often["round_interval"], 8);
  EXPECT_EQ(often["recent"], 16);
  c.common.interval = 32;
  const nlohmann::json rare = bench_throughput(c);
  EXPECT_EQ(rare["iso_batch"][0]["rounds_timed"], 3) << rare.dump(2);
  // The interleaved table needs --steps a multiple of s (48 is one of r = 16, not of s = 32), and
  // says so before loading anything (a caller checks before waiting for a quiet machine).
  c.iso_batch = false;
  c.interleaved = true;
  c.steps = 48;
  c.common.model = "/nonexistent/model.gguf";
  try {
    check_throughput(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--steps (48) a multiple of the round interval (32, --round-interval)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(bench_throughput(c), Error);
  c.steps = 64;
  c.baseline = "tova";
  EXPECT_THROW(check_throughput(c), Error);
  c.baseline = "random";
  EXPECT_NO_THROW(check_throughput(c));
}

TEST(Bench, ProbsKernelPairForcesProbabilitiesEveryStepAndLayer) {
  // The forced batch must see one probability observation per (sequence, timed step, layer):
  // 3 sequences x 32 steps (4 blocks of 8) x the model's layers (from the JSON header, i.e. the
  // GGUF); the plain batch requests none. The schedule is the same, so both batches hold 2 rounds
  // per sequence in the timed steps (see the test above for why 32 steps at r = 16 hold two).
  ThroughputBenchConfig c = tiny_throughput(32);
  c.policies = {"random", "h2o"};
  c.probs_kernel = {"random", "h2o"};
  const nlohmann::json j = bench_throughput(c);
  ASSERT_EQ(j["probs_kernel"].size(), 2u) << j.dump(2);
  const int64_t n_layers = j["n_layers"].get<int64_t>();
  ASSERT_GT(n_layers, 0);
  const auto& random = j["probs_kernel"][0];
  EXPECT_EQ(random["policy"], "random");
  EXPECT_EQ(random["blocks"], 4);
  EXPECT_EQ(random["plain"]["forced_prob_observations"], 0);
  EXPECT_EQ(random["forced"]["forced_prob_observations"].get<int64_t>(), 3 * 32 * n_layers);
  EXPECT_EQ(random["plain"]["rounds_timed"], 6);
  EXPECT_EQ(random["forced"]["rounds_timed"], 6);
  EXPECT_EQ(random["diff_ms_per_step"]["samples"].size(), 4u);
  EXPECT_FALSE(random["diff_ci"]["valid"].get<bool>());  // 4 block pairs: too few for a 95% interval
  // A selector that itself reads probabilities (h2o) still gets them through the wrapper.
  EXPECT_EQ(j["probs_kernel"][1]["forced"]["forced_prob_observations"].get<int64_t>(), 3 * 32 * n_layers);
  // needs_*: what each selector declares (h2o reads probabilities; random reads nothing).
  ASSERT_EQ(j["iso_batch"].size(), 2u);
  EXPECT_FALSE(j["iso_batch"][0]["needs_probs"].get<bool>());
  EXPECT_FALSE(j["iso_batch"][0]["needs_queries"].get<bool>());
  EXPECT_TRUE(j["iso_batch"][1]["needs_probs"].get<bool>());
  // `full` has no selector to wrap: refused before anything runs.
  c.probs_kernel = {"full"};
  EXPECT_THROW(bench_throughput(c), Error);
}

TEST(Bench, InterleavedTableTimesEveryPolicyInEveryRepetition) {
  // 6 repetitions of 32 steps at r = 16: every policy has 6 samples, random (3 sequences) 2 rounds
  // per sequence per repetition (see the round-count test above) = 36, full none. The gain is the
  // per-repetition time ratio to the baseline minus 1, so the baseline's own is 0 in every one.
  ThroughputBenchConfig c = tiny_throughput(32);
  c.policies = {"full", "random", "h2o"};
  c.common.reps = 6;
  c.iso_batch = false;
  c.interleaved = true;
  const nlohmann::json j = bench_throughput(c);
  const auto& rows = j["interleaved"]["rows"];
  ASSERT_EQ(rows.size(), 3u) << j.dump(2);
  EXPECT_EQ(j["interleaved"]["baseline"], "random");
  const auto& base = rows[1];
  EXPECT_EQ(base["policy"], "random");
  EXPECT_EQ(base["rounds_timed"], 36);
  EXPECT_EQ(rows[0]["rounds_timed"], 0);
  EXPECT_EQ(rows[2]["rounds_timed"], 36);
  for (const auto& row : rows) {
    ASSERT_EQ(row["step_ms"]["samples"].size(), 6u);
    ASSERT_EQ(row["gain_samples"].size(), 6u);
    EXPECT_TRUE(row["gain"]["valid"].get<bool>());  // n = 6 is the smallest n with a 95% interval
    for (size_t i = 0; i < 6; ++i) {
      const double t = row["step_ms"]["samples"][i], tb = base["step_ms"]["samples"][i];
      EXPECT_NEAR(row["gain_samples"][i].get<double>(), t / tb - 1, 1e-12);
      EXPECT_NEAR(row["other_gain_samples"][i].get<double>(),
                  row["gain_samples"][i].get<double>() - row["round_gain_samples"][i].get<double>(), 1e-12);
    }
  }
  for (const auto& g : base["gain_samples"]) EXPECT_EQ(g.get<double>(), 0.0);
  for (const auto& g : base["round_gain_samples"]) EXPECT_EQ(g.get<double>(), 0.0);
  // Each repetition times every row once, in a seeded order that is not the same every time.
  const auto& orders = j["interleaved"]["orders"];
  ASSERT_EQ(orders.size(), 6u);
  std::set<std::vector<int>> distinct;
  for (const auto& o : orders) {
    std::vector<int> v = o.get<std::vector<int>>();
    distinct.insert(v);
    std::sort(v.begin(), v.end());
    EXPECT_EQ(v, (std::vector<int>{0, 1, 2}));
  }
  EXPECT_GT(distinct.size(), 1u);
  // full never runs a round: its rounds share is minus the baseline's rounds time over its step.
  EXPECT_LE(rows[0]["round_gain"]["median"].get<double>(), 0.0);
  // Refused before measuring: steps not a multiple of r, a baseline not run, a pool too small.
  c.steps = 24;
  EXPECT_THROW(bench_throughput(c), Error);
  c.steps = 32;
  c.baseline = "tova";
  EXPECT_THROW(bench_throughput(c), Error);
  c.baseline = "random";
  c.pool_bytes = 1024;
  EXPECT_THROW(bench_throughput(c), Error);
}

TEST(Bench, EvictRoundTimesEveryRequestedCell) {
  EvictBenchConfig c;
  c.common.model = tiny_model();
  c.common.threads = 1;
  c.common.reps = 2;
  c.common.recent = 16;
  c.budgets = {48, 96};
  c.policies = {"random", "snapkv"};
  c.warmup_steps = 8;
  const nlohmann::json j = bench_evict_round(c);
  ASSERT_EQ(j["rows"].size(), 4u) << j.dump(2);
  for (const auto& row : j["rows"]) {
    EXPECT_EQ(row["rounds_timed"], 2) << row.dump();
    EXPECT_GE(row["score_ms_per_layer"]["min"].get<double>(), 0.0);
  }
  // With a round interval apart from r the cells still time whole rounds (the first at B + s).
  c.common.interval = 24;
  const nlohmann::json s = bench_evict_round(c);
  ASSERT_EQ(s["rows"].size(), 4u) << s.dump(2);
  for (const auto& row : s["rows"]) EXPECT_EQ(row["rounds_timed"], 2) << row.dump();
  EXPECT_EQ(s["round_interval"], 24);
  c.common.interval = 0;
  // A policy that keeps every token has no round to time: a skipped row that says so, not silence.
  c.policies = {"full", "random"};
  c.budgets = {48};
  const nlohmann::json f = bench_evict_round(c);
  ASSERT_EQ(f["rows"].size(), 1u) << f.dump(2);
  ASSERT_EQ(f["skipped"].size(), 1u) << f.dump(2);
  EXPECT_EQ(f["skipped"][0]["policy"], "full");
  EXPECT_NE(f["skipped"][0]["reason"].get<std::string>().find("keeps every token"), std::string::npos);
  c.policies = {"random", "snapkv"};
  c.budgets = {48, 96};
  // A parameter for a policy that runs is used; one naming a policy that is not registered is refused.
  c.params = {"snapkv:window=8"};
  EXPECT_NO_THROW(bench_evict_round(c));
}

}  // namespace
}  // namespace kvevict
