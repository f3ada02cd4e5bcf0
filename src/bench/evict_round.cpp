// `bench evict-round` (bench.h): the cost of one eviction round per layer (scoring and
// compaction), per policy and budget.
#include <fmt/format.h>

#include <algorithm>

#include "bench/bench.h"
#include "bench/common.h"
#include "util/error.h"

namespace kvevict {

using namespace bench_detail;

nlohmann::json bench_evict_round(const EvictBenchConfig& cfg) {
  Loaded L = load(cfg.common);
  const Model& m = *L.model;
  Engine& engine = *L.engine;
  nlohmann::json out = header(cfg.common, m, engine);
  print_load("before");
  const int32_t V = m.config().n_vocab;
  const int n_layers = m.config().n_layers;
  const auto prompt = random_tokens(kPromptLen, V, cfg.common.seed);
  std::vector<float> logits;
  nlohmann::json rows = nlohmann::json::array(), skipped = nlohmann::json::array();
  fmt::print("\n## eviction round cost per layer (ms; median over {} rounds, min-max), {}\n", cfg.common.reps,
             schedule_label(cfg.common));
  fmt::print(
      "| policy | B | score ms/layer | compact ms/layer | total ms/layer | total (min-max) "
      "|\n|---|---|---|---|---|---|\n");
  for (const std::string& name : policy_list(cfg.policies, true)) {
    for (int64_t B : cfg.budgets) {
      try {
        const Policy pol = policy_with_params(name, cfg.params);
        if (!pol.evicts) throw Error(fmt::format("policy '{}' keeps every token: it runs no eviction round", pol.name));
        const EvictionConfig ec = eviction_config(cfg.common, B);
        auto seq = engine.new_sequence(2, pol, ec, kPromptLen, 1 << 30);
        engine.prefill(*seq, prompt, logits);
        // Synthetic slots up to B + s - warmup, then real decode steps up to the first round.
        const int64_t warm = std::min<int64_t>(cfg.warmup_steps, B + ec.round_interval() - kPromptLen - 1);
        fast_forward(*seq, B + ec.round_interval() - warm, cfg.common.seed);
        std::vector<double> score, compact, total;
        const auto cell_t0 = Clock::now();
        while (static_cast<int>(score.size()) < cfg.common.reps &&
               (score.empty() || seconds_since(cell_t0) < cfg.max_cell_seconds)) {
          const SequenceStats before = seq->stats;
          while (seq->stats.rounds == before.rounds) engine.decode(*seq, step_token(seq->n_seen, V), logits);
          score.push_back((seq->stats.score_ms - before.score_ms) / n_layers);
          compact.push_back((seq->stats.compact_ms - before.compact_ms) / n_layers);
          total.push_back(score.back() + compact.back());
        }
        const Summary ss = summarize(score), cs = summarize(compact), ts = summarize(total);
        rows.push_back({{"policy", pol.name},
                        {"budget", B},
                        {"rounds_timed", score.size()},
                        {"score_ms_per_layer", ss.to_json()},
                        {"compact_ms_per_layer", cs.to_json()},
                        {"total_ms_per_layer", ts.to_json()}});
        fmt::print("| {} | {} | {:.4f} | {:.4f} | {:.4f} | {:.4f}-{:.4f}{} |\n", pol.name, B, ss.median, cs.median,
                   ts.median, ts.min, ts.max,
                   static_cast<int>(score.size()) < cfg.common.reps
                       ? fmt::format(" ({} rounds: time cap)", score.size())
                       : "");
        if (cfg.common.on_cell) cfg.common.on_cell(fmt::format("{} B={}", pol.name, B));
        std::fflush(stdout);
      } catch (const Error& e) {
        skipped.push_back({{"policy", name}, {"budget", B}, {"reason", e.what()}});
        fmt::print("| {} | {} | skipped: {} | | | |\n", name, B, e.what());
      }
    }
  }
  out["rows"] = rows;
  out["skipped"] = skipped;
  out["recent"] = cfg.common.recent;
  out["round_interval"] = round_interval(cfg.common);
  out["load_after"] = load_average();
  print_load("after");
  return out;
}

}  // namespace kvevict
