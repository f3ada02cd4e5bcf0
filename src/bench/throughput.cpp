// `bench throughput` (bench.h): batched decode throughput at equal batch and at equal KV memory,
// and the attention-probability kernel's cost measured in pairs.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/common.h"
#include "util/error.h"
#include "util/rng.h"

namespace kvevict {

using namespace bench_detail;

namespace {

// Wraps a selector so that the forward pass computes attention probabilities for it (needs()
// adds `attention`) while selection is the inner selector's, unchanged: the probabilities are
// counted and dropped, the inner state sees exactly what it asked for.
class ProbsForcingState final : public SelectorState {
 public:
  ProbsForcingState(std::unique_ptr<SelectorState> inner, SelectorNeeds inner_needs)
      : inner_(std::move(inner)), needs_(inner_needs) {}
  void observe(const AttentionObservation& obs) override {
    if (obs.probs) ++prob_observations;
    if (!inner_ || !needs_.any()) return;
    AttentionObservation o = obs;
    if (!needs_.attention) o.probs = nullptr;
    inner_->observe(o);
  }
  void on_compact(int layer, int kv_head, std::span<const int32_t> keep) override {
    if (inner_) inner_->on_compact(layer, kv_head, keep);
  }
  SelectorState* inner() { return inner_.get(); }
  int64_t prob_observations = 0;  ///< (token, layer) observations that carried probabilities

 private:
  std::unique_ptr<SelectorState> inner_;
  SelectorNeeds needs_;
};

class ProbsForcingSelector final : public Selector {
 public:
  explicit ProbsForcingSelector(std::shared_ptr<const Selector> inner) : inner_(std::move(inner)) {}
  SelectorNeeds needs() const override {
    SelectorNeeds n = inner_->needs();
    n.attention = true;
    return n;
  }
  std::unique_ptr<SelectorState> make_state(const KvShape& shape) const override {
    return std::make_unique<ProbsForcingState>(inner_->make_state(shape), inner_->needs());
  }
  void score(const RoundInput& in, SelectorState* state, std::span<float> scores) const override {
    inner_->score(in, state ? static_cast<ProbsForcingState*>(state)->inner() : nullptr, scores);
  }

 private:
  std::shared_ptr<const Selector> inner_;
};

int64_t prob_observations(const Sequence& s) {
  const auto* st = dynamic_cast<const ProbsForcingState*>(s.state.get());
  return st ? st->prob_observations : 0;
}

constexpr int kWarmSteps = 64;  ///< untimed batched steps after the fast-forward

/// Decode steps a benchmarked sequence takes at most: warm-up, timed steps, and a margin of 2.
int64_t max_new_tokens(const ThroughputBenchConfig& cfg) {
  return cfg.start_length + kWarmSteps + int64_t{cfg.common.reps} * cfg.steps + 2;
}

struct ThroughputRun {
  double tok_per_s = 0;
  double round_ms_per_step = 0;          ///< eviction rounds (score + compact), all sequences, per timed step
  int64_t rounds_timed = 0;              ///< eviction rounds inside the timed steps, all sequences
  double observe_ms_per_step = 0;        ///< selectors' per-token observation work, per timed step
  int64_t forced_prob_observations = 0;  ///< probability observations a forcing wrapper saw (timed steps)
  Summary step_ms;
  int64_t kv_bytes_per_seq = 0;
};

// `batch` sequences of one policy, prefilled with kPromptLen random tokens, fast-forwarded to
// start_length and advanced by 64 untimed batched steps; then timed in blocks of steps.
class BatchRun {
 public:
  BatchRun(Engine& engine, const Policy& pol, const ThroughputBenchConfig& cfg, int batch)
      : engine_(engine), V_(engine.model().config().n_vocab), toks_(static_cast<size_t>(batch)) {
    const EvictionConfig ec = eviction_config(cfg.common, cfg.budget);
    const int64_t max_new = max_new_tokens(cfg);
    for (int i = 0; i < batch; ++i) {
      auto s = engine.new_sequence(static_cast<uint64_t>(i), pol, ec, kPromptLen, max_new);
      engine.prefill(*s, random_tokens(kPromptLen, V_, cfg.common.seed + static_cast<uint64_t>(i)), logits_);
      fast_forward(*s, cfg.start_length, cfg.common.seed + static_cast<uint64_t>(i));
      ptrs_.push_back(s.get());
      seqs_.push_back(std::move(s));
    }
    for (int w = 0; w < kWarmSteps; ++w) step();
    round0_ = selector_ms(true);
    observe0_ = selector_ms(false);
    rounds0_ = rounds();
    probs0_ = probs();
  }
  /// Runs n batched steps; returns ms per step.
  double time_steps(int n) {
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) step();
    return seconds_since(t0) * 1e3 / n;
  }
  /// Eviction rounds' time (score + compact), all sequences, since the batch was made (ms).
  double rounds_ms() const { return selector_ms(true); }
  /// Selector and schedule counters since the end of the warm-up.
  void finish(ThroughputRun& out, double timed_steps) const {
    out.rounds_timed = rounds() - rounds0_;
    out.forced_prob_observations = probs() - probs0_;
    out.round_ms_per_step = (selector_ms(true) - round0_) / timed_steps;
    out.observe_ms_per_step = (selector_ms(false) - observe0_) / timed_steps;
    out.kv_bytes_per_seq = seqs_[0]->kv.allocated_bytes();
  }

 private:
  void step() {
    for (size_t i = 0; i < ptrs_.size(); ++i) toks_[i] = step_token(ptrs_[i]->n_seen + static_cast<int64_t>(i), V_);
    engine_.decode_batch(ptrs_, toks_, logits_);
  }
  double selector_ms(bool rounds) const {
    double t = 0;
    for (const Sequence* s : ptrs_) t += rounds ? s->stats.score_ms + s->stats.compact_ms : s->stats.observe_ms;
    return t;
  }
  int64_t rounds() const {
    int64_t n = 0;
    for (const Sequence* s : ptrs_) n += s->stats.rounds;
    return n;
  }
  int64_t probs() const {
    int64_t n = 0;
    for (const Sequence* s : ptrs_) n += prob_observations(*s);
    return n;
  }
  Engine& engine_;
  int32_t V_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
  std::vector<Sequence*> ptrs_;
  std::vector<int32_t> toks_;
  std::vector<float> logits_;
  double round0_ = 0, observe0_ = 0;
  int64_t rounds0_ = 0, probs0_ = 0;
};

// Runs `batch` sequences of `pol` (BatchRun), then reps x steps timed batched steps.
// tok/s = batch * steps / time.
ThroughputRun run_batch(Engine& engine, const Policy& pol, const ThroughputBenchConfig& cfg, int batch) {
  BatchRun run(engine, pol, cfg, batch);
  std::vector<double> ms;
  for (int r = 0; r < cfg.common.reps; ++r) ms.push_back(run.time_steps(cfg.steps));
  ThroughputRun out;
  run.finish(out, static_cast<double>(cfg.common.reps) * cfg.steps);
  out.step_ms = summarize(ms);
  out.tok_per_s = batch * 1e3 / out.step_ms.median;
  return out;
}

/// The probability kernel's cost measured in pairs: two batches of the same policy, one with the
/// kernel forced to produce probabilities, timed in alternating blocks of kPairBlock steps
/// (A B, then B A, ...), so slow drifts of a shared machine's load hit both alike.
struct PairedRun {
  ThroughputRun plain, forced;  ///< step_ms: per-block ms per step
  Summary diff_ms;              ///< forced - plain, per pair of blocks, ms per step
};
constexpr int kPairBlock = 8;

PairedRun run_paired(Engine& engine, const Policy& plain, const Policy& forced, const ThroughputBenchConfig& cfg) {
  BatchRun a(engine, plain, cfg, cfg.batch), b(engine, forced, cfg, cfg.batch);
  const int blocks = std::max(1, cfg.common.reps * cfg.steps / kPairBlock);
  std::vector<double> ma, mb, diff;
  for (int i = 0; i < blocks; ++i) {
    double ta, tb;
    if (i % 2 == 0) {
      ta = a.time_steps(kPairBlock);
      tb = b.time_steps(kPairBlock);
    } else {
      tb = b.time_steps(kPairBlock);
      ta = a.time_steps(kPairBlock);
    }
    ma.push_back(ta);
    mb.push_back(tb);
    diff.push_back(tb - ta);
  }
  PairedRun out;
  const double timed = static_cast<double>(blocks) * kPairBlock;
  a.finish(out.plain, timed);
  b.finish(out.forced, timed);
  out.plain.step_ms = summarize(ma);
  out.forced.step_ms = summarize(mb);
  out.plain.tok_per_s = cfg.batch * 1e3 / out.plain.step_ms.median;
  out.forced.tok_per_s = cfg.batch * 1e3 / out.forced.step_ms.median;
  out.diff_ms = summarize(diff);
  return out;
}

/// The interleaved table (ThroughputBenchConfig::interleaved): per policy, ms per step and rounds
/// ms per step in every repetition, and the baseline's gain over it in the same repetition.
struct InterleavedRow {
  std::string name;
  std::vector<double> step_ms, round_ms;
  /// Per rep: t / t_base - 1; its part from eviction rounds, (rounds - rounds_base) / t_base; and
  /// the rest (gain - rounds part: the forward pass, observation, memory traffic).
  std::vector<double> gain, round_gain, other_gain;
  ThroughputRun counters;
};

std::vector<InterleavedRow> run_interleaved(Engine& engine, const std::vector<Policy>& pols,
                                            const ThroughputBenchConfig& cfg, size_t base,
                                            std::vector<std::vector<int64_t>>& orders) {
  std::vector<std::unique_ptr<BatchRun>> runs;
  for (const Policy& p : pols) runs.push_back(std::make_unique<BatchRun>(engine, p, cfg, cfg.batch));
  const size_t P = pols.size();
  std::vector<InterleavedRow> rows(P);
  for (size_t i = 0; i < P; ++i) rows[i].name = pols[i].name;
  for (int rep = 0; rep < cfg.common.reps; ++rep) {
    // A fresh seeded order each repetition: no policy always follows the same one, so what a
    // predecessor leaves in the caches falls on every policy.
    Rng rng(stream_id({cfg.common.seed, 0x17e41ea5ull, static_cast<uint64_t>(rep)}));
    orders.push_back(random_permutation(rng, static_cast<int64_t>(P)));
    for (const int64_t idx : orders.back()) {
      const size_t i = static_cast<size_t>(idx);
      const double r0 = runs[i]->rounds_ms();
      rows[i].step_ms.push_back(runs[i]->time_steps(cfg.steps));
      rows[i].round_ms.push_back((runs[i]->rounds_ms() - r0) / cfg.steps);
    }
    const double tb = rows[base].step_ms.back(), rb = rows[base].round_ms.back();
    for (InterleavedRow& row : rows) {
      row.gain.push_back(row.step_ms.back() / tb - 1);
      row.round_gain.push_back((row.round_ms.back() - rb) / tb);
      row.other_gain.push_back(row.gain.back() - row.round_gain.back());
    }
  }
  const double timed = static_cast<double>(cfg.common.reps) * cfg.steps;
  for (size_t i = 0; i < P; ++i) runs[i]->finish(rows[i].counters, timed);
  return rows;
}

nlohmann::json interleaved_table(Engine& engine, const ThroughputBenchConfig& cfg) {
  std::vector<Policy> pols;
  size_t base = 0;  // check_throughput made sure the baseline is among the policies
  for (const std::string& name : policy_list(cfg.policies, false)) {
    pols.push_back(policy_with_params(name, cfg.params));
    if (pols.back().name == cfg.baseline) base = pols.size() - 1;
  }
  // Every batch lives at once: refuse before allocating what the pool does not hold.
  const int64_t slot_bytes = engine.kv_shape().bytes_per_token();
  int64_t need = 0;
  for (const Policy& p : pols) {
    const EvictionConfig ec = eviction_config(cfg.common, cfg.budget);
    const int64_t max_new = max_new_tokens(cfg);
    need += cfg.batch * required_capacity(ec, p, kPromptLen, max_new) * slot_bytes;
  }
  if (need > cfg.pool_bytes)
    throw Error(fmt::format(
        "bench throughput: the interleaved table holds every policy's batch at once: {:.0f} MiB of KV, over "
        "--pool-mib {:.0f} (fewer policies, a smaller --batch or a larger --pool-mib)",
        static_cast<double>(need) / (1 << 20), static_cast<double>(cfg.pool_bytes) / (1 << 20)));
  fmt::print(
      "\n## interleaved: batch {}, B = {}, {}, from {} generated tokens; {} repetitions of {} steps, every "
      "policy in each, in a seeded random order; gain = t / t_{} - 1 per repetition, median [sign-test interval]\n"
      "| policy | tok/s | step ms (min-max) | rounds ms/step | {}'s gain | of which rounds | rest |\n"
      "|---|---|---|---|---|---|---|\n",
      cfg.batch, cfg.budget, schedule_label(cfg.common), cfg.start_length, cfg.common.reps, cfg.steps, cfg.baseline,
      cfg.baseline);
  std::vector<std::vector<int64_t>> orders;
  const std::vector<InterleavedRow> rows = run_interleaved(engine, pols, cfg, base, orders);
  nlohmann::json out = {{"baseline", cfg.baseline},
                        {"batch", cfg.batch},
                        {"steps", cfg.steps},
                        {"reps", cfg.common.reps},
                        {"kv_bytes_all_batches", need},
                        {"orders", orders},  // per repetition, the rows' indices in the order timed
                        {"rows", nlohmann::json::array()}};
  for (const InterleavedRow& row : rows) {
    const Summary step = summarize(row.step_ms), rounds = summarize(row.round_ms);
    const MedianCi g = median_ci(row.gain), rg = median_ci(row.round_gain), og = median_ci(row.other_gain);
    out["rows"].push_back({{"policy", row.name},
                           {"tok_per_s", cfg.batch * 1e3 / step.median},
                           {"step_ms", step.to_json()},
                           {"round_ms_per_step", rounds.to_json()},
                           {"rounds_timed", row.counters.rounds_timed},
                           {"observe_ms_per_step", row.counters.observe_ms_per_step},
                           {"kv_bytes_per_seq", row.counters.kv_bytes_per_seq},
                           {"gain", g.to_json()},
                           {"gain_samples", row.gain},
                           {"round_gain", rg.to_json()},
                           {"round_gain_samples", row.round_gain},
                           {"other_gain", og.to_json()},
                           {"other_gain_samples", row.other_gain}});
    const auto pct = [](const MedianCi& c) {
      return c.valid ? fmt::format("{:+.1f}% [{:+.1f}, {:+.1f}]", 100 * c.median, 100 * c.lo, 100 * c.hi)
                     : fmt::format("{:+.1f}% (too few reps for an interval)", 100 * c.median);
    };
    fmt::print("| {} | {:.2f} | {:.2f} ({:.2f}-{:.2f}) | {:.2f} | {} | {} | {} |\n", row.name,
               cfg.batch * 1e3 / step.median, step.median, step.min, step.max, rounds.median, pct(g), pct(rg), pct(og));
  }
  std::fflush(stdout);
  if (cfg.common.on_cell) cfg.common.on_cell("interleaved");
  return out;
}

}  // namespace

void check_throughput(const ThroughputBenchConfig& cfg) {
  if (cfg.batch < 1 || cfg.steps < 1 || cfg.max_batch < 1 || cfg.pool_bytes <= 0)
    throw Error("bench throughput: --batch, --steps, --max-batch and --pool-mib must be positive");
  for (const std::string& name : cfg.probs_kernel)
    if (!policy_with_params(name, cfg.params).selector)
      throw Error(
          fmt::format("bench throughput: --probs-kernel policy '{}' has no selector to force "
                      "attention probabilities for (give an evicting policy)",
                      name));
  if (!cfg.interleaved) return;
  const int64_t s = round_interval(cfg.common);
  if (cfg.steps % s != 0)
    throw Error(fmt::format(
        "bench throughput: the interleaved table needs --steps ({}) a multiple of the round interval ({}, {}), so "
        "that every repetition holds the same number of eviction rounds",
        cfg.steps, s, cfg.common.interval > 0 ? "--round-interval" : "-r"));
  bool found = false;
  for (const std::string& name : policy_list(cfg.policies, false))
    found = found || policy_with_params(name, cfg.params).name == cfg.baseline;
  if (!found) throw Error(fmt::format("bench throughput: --baseline '{}' is not among --policies", cfg.baseline));
}

nlohmann::json bench_throughput(const ThroughputBenchConfig& cfg) {
  check_throughput(cfg);
  Loaded L = load(cfg.common);
  Engine& engine = *L.engine;
  nlohmann::json out = header(cfg.common, *L.model, engine);
  print_load("before");
  const KvShape shape = engine.kv_shape();
  const int64_t slot_bytes = shape.bytes_per_token();
  out["bytes_per_slot"] = slot_bytes;
  out["budget"] = cfg.budget;
  out["recent"] = cfg.common.recent;
  out["round_interval"] = round_interval(cfg.common);
  out["start_length"] = cfg.start_length;
  out["pool_bytes"] = cfg.pool_bytes;
  nlohmann::json iso_batch = nlohmann::json::array(), iso_mem = nlohmann::json::array(),
                 skipped = nlohmann::json::array();

  if (cfg.interleaved) out["interleaved"] = interleaved_table(engine, cfg);
  if (cfg.iso_batch) {
    fmt::print("\n## iso-batch: batch {}, B = {}, {}, timed from {} generated tokens ({} steps x {} reps)\n",
               cfg.batch, cfg.budget, schedule_label(cfg.common), cfg.start_length, cfg.steps, cfg.common.reps);
    fmt::print(
        "| policy | tok/s | step ms (min-max) | of which rounds ms | of which observing ms | KV MiB/seq "
        "|\n|---|---|---|---|---|---|\n");
  }
  for (const std::string& name : cfg.iso_batch ? policy_list(cfg.policies, false) : std::vector<std::string>{}) {
    try {
      const Policy pol = policy_with_params(name, cfg.params);
      const SelectorNeeds pol_needs = pol.selector ? pol.selector->needs() : SelectorNeeds{};
      const ThroughputRun r = run_batch(engine, pol, cfg, cfg.batch);
      iso_batch.push_back({{"policy", pol.name},
                           // What the selector asks of the forward pass (model/observer.h).
                           {"needs_probs", pol_needs.attention},
                           {"needs_queries", pol_needs.queries},
                           {"batch", cfg.batch},
                           {"tok_per_s", r.tok_per_s},
                           {"round_ms_per_step", r.round_ms_per_step},
                           {"observe_ms_per_step", r.observe_ms_per_step},
                           {"step_ms", r.step_ms.to_json()},
                           {"kv_bytes_per_seq", r.kv_bytes_per_seq},
                           {"rounds_timed", r.rounds_timed}});
      if (pol.evicts && r.rounds_timed == 0)
        fmt::print(stderr,
                   "kvevict: warning: bench throughput: no eviction round fell inside the {} timed steps of '{}' "
                   "(a round comes every {} steps per sequence): its rounds cost is not measured\n",
                   int64_t{cfg.common.reps} * cfg.steps, pol.name, round_interval(cfg.common));
      fmt::print("| {} | {:.2f} | {:.2f} ({:.2f}-{:.2f}) | {:.2f} | {:.2f} | {:.1f} |\n", pol.name, r.tok_per_s,
                 r.step_ms.median, r.step_ms.min, r.step_ms.max, r.round_ms_per_step, r.observe_ms_per_step,
                 static_cast<double>(r.kv_bytes_per_seq) / (1 << 20));
      std::fflush(stdout);
      if (cfg.common.on_cell) cfg.common.on_cell("iso-batch " + pol.name);
    } catch (const Error& e) {
      skipped.push_back({{"policy", name}, {"table", "iso-batch"}, {"reason", e.what()}});
      fmt::print("| {} | skipped: {} | | | | |\n", name, e.what());
    }
  }

  nlohmann::json probs_kernel = nlohmann::json::array();
  if (!cfg.probs_kernel.empty())
    fmt::print(
        "\n## probability kernel, paired: batch {}, B = {}, {}, from {} generated tokens; the same policy with "
        "and without the attention kernel forced to produce probabilities, timed in alternating blocks of {} steps\n"
        "| policy | plain step ms (min-max) | forced step ms (min-max) | forced - plain ms/step, median of pairs "
        "(min-max) | % of plain |\n|---|---|---|---|---|\n",
        cfg.batch, cfg.budget, schedule_label(cfg.common), cfg.start_length, kPairBlock);
  for (const std::string& name : cfg.probs_kernel) {
    const Policy plain = policy_with_params(name, cfg.params);
    Policy forced = plain;
    forced.selector = std::make_shared<ProbsForcingSelector>(plain.selector);
    const PairedRun r = run_paired(engine, plain, forced, cfg);
    const auto side = [](const ThroughputRun& t) {
      return nlohmann::json{{"tok_per_s", t.tok_per_s},
                            {"step_ms", t.step_ms.to_json()},
                            {"round_ms_per_step", t.round_ms_per_step},
                            {"observe_ms_per_step", t.observe_ms_per_step},
                            {"rounds_timed", t.rounds_timed},
                            {"forced_prob_observations", t.forced_prob_observations}};
    };
    probs_kernel.push_back({{"policy", plain.name},
                            {"batch", cfg.batch},
                            {"block_steps", kPairBlock},
                            {"blocks", r.diff_ms.samples.size()},
                            {"plain", side(r.plain)},
                            {"forced", side(r.forced)},
                            {"diff_ms_per_step", r.diff_ms.to_json()},
                            {"diff_ci", median_ci(r.diff_ms.samples).to_json()}});
    fmt::print("| {} | {:.2f} ({:.2f}-{:.2f}) | {:.2f} ({:.2f}-{:.2f}) | {:.2f} ({:.2f}-{:.2f}) | {:.1f}% |\n",
               plain.name, r.plain.step_ms.median, r.plain.step_ms.min, r.plain.step_ms.max, r.forced.step_ms.median,
               r.forced.step_ms.min, r.forced.step_ms.max, r.diff_ms.median, r.diff_ms.min, r.diff_ms.max,
               100.0 * r.diff_ms.median / r.plain.step_ms.median);
    std::fflush(stdout);
    if (cfg.common.on_cell) cfg.common.on_cell("probs kernel " + plain.name);
  }
  out["probs_kernel"] = probs_kernel;

  if (cfg.iso_memory) {
    fmt::print("\n## iso-memory: KV pool {:.0f} MiB, bytes per slot across layers and heads {}\n",
               static_cast<double>(cfg.pool_bytes) / (1 << 20), slot_bytes);
    fmt::print(
        "| policy | slots/seq | max batch = pool / (slots x bytes) | run batch | allocated = predicted | tok/s | "
        "rounds ms/step |\n|---|---|---|---|---|---|---|\n");
  }
  for (const std::string& name : cfg.iso_memory ? policy_list(cfg.policies, false) : std::vector<std::string>{}) {
    try {
      const Policy pol = policy_with_params(name, cfg.params);
      const EvictionConfig ec = eviction_config(cfg.common, cfg.budget);
      const int64_t max_new = max_new_tokens(cfg);
      // Slots each sequence holds at its peak: B + s when it evicts, else all it will see.
      const int64_t slots = required_capacity(ec, pol, kPromptLen, max_new);
      const int64_t max_batch = cfg.pool_bytes / (slots * slot_bytes);
      if (max_batch < 1) throw Error("the pool does not hold one sequence");
      const int run = static_cast<int>(std::min<int64_t>(max_batch, cfg.max_batch));
      const ThroughputRun r = run_batch(engine, pol, cfg, run);
      const bool exact = r.kv_bytes_per_seq == slots * slot_bytes;
      iso_mem.push_back({{"policy", pol.name},
                         {"slots_per_seq", slots},
                         {"max_batch", max_batch},
                         {"run_batch", run},
                         {"capped", run < max_batch},
                         {"allocated_bytes_per_seq", r.kv_bytes_per_seq},
                         {"predicted_bytes_per_seq", slots * slot_bytes},
                         {"tok_per_s", r.tok_per_s},
                         {"round_ms_per_step", r.round_ms_per_step},
                         {"observe_ms_per_step", r.observe_ms_per_step},
                         {"step_ms", r.step_ms.to_json()}});
      fmt::print("| {} | {} | {} | {}{} | {} | {:.2f} | {:.2f} |\n", pol.name, slots, max_batch, run,
                 run < max_batch ? " (capped)" : "", exact ? "yes" : "NO", r.tok_per_s, r.round_ms_per_step);
      std::fflush(stdout);
      if (cfg.common.on_cell) cfg.common.on_cell("iso-memory " + pol.name);
    } catch (const Error& e) {
      skipped.push_back({{"policy", name}, {"table", "iso-memory"}, {"reason", e.what()}});
      fmt::print("| {} | skipped: {} | | | | | |\n", name, e.what());
    }
  }
  out["iso_batch"] = iso_batch;
  out["iso_memory"] = iso_mem;
  out["skipped"] = skipped;
  out["load_after"] = load_average();
  print_load("after");
  return out;
}

}  // namespace kvevict
