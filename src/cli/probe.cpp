// `kvevict probe`: the paper's synthetic retrieval probes (docs/eviction-spec.md §4) on any model:
// a fact planted in chosen (layer, KV head) sites only, a restated fact, a passcode stated once.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "cli/common.h"
#include "cli/grid.h"
#include "cli/progress.h"
#include "engine/engine.h"
#include "eval/perplexity.h"
#include "eval/probe.h"
#include "model/model.h"
#include "util/error.h"
#include "util/rng.h"

namespace kvevict::cli {
namespace {

constexpr uint64_t kMaskTag = 0x4D41534Bull, kSeqTag = 0x53455120ull;

struct ProbeArgs {
  std::string model, kinds = "planted,restated,passcode", policies = "full,random", budgets, distances = "256,1024",
                     keep_heads, sites, planted_base = "random-unprotected", filler, csv;
  bool gutenberg = false;
  int trials = 10, restate = 4, digits = 4, threads = 0;
  int64_t lead = 32;
  PolicyArgs policy;
};

/// One configuration of the grid.
struct Config {
  ProbeKind kind;
  GridEntry run;  // for Planted: the base policy (wrapped per trial)
  int64_t distance = 0;
  int keep_heads = -1;      // Planted: k heads per layer (-1: explicit sites)
  std::string sites_label;  // Planted: "k=2/4" or "sites 0:1,1:0"
};

struct Aggregate {
  int n = 0;
  double lp = 0, lp2 = 0, per_token = 0, exact = 0, kept = 0, rounds = 0;
};

int run_probe(const ProbeArgs& a) {
  // Validate what needs no model, then load it and validate the rest before any trial runs.
  if (a.trials < 1) throw Error(fmt::format("--trials {}: must be >= 1", a.trials));
  std::vector<ProbeKind> kinds;
  for (const std::string& k : split_list(a.kinds, "--kinds")) kinds.push_back(parse_probe_kind(k));
  const std::vector<int64_t> distances = parse_int_list(a.distances, "--distances", 1);
  for (const int64_t d : distances)
    if (d > limits::kTokens) throw Error(fmt::format("--distances {}: {} must be <= {}", a.distances, d, limits::kTokens));
  const std::vector<int64_t> budgets = budget_grid(a.budgets, a.policy.budget);
  const auto model = Model::load(a.model);
  Engine engine(*model, a.threads);
  const KvShape shape = engine.kv_shape();
  std::vector<int64_t> keep_heads;
  if (!a.keep_heads.empty())
    keep_heads = parse_int_list(a.keep_heads, "--keep-heads", 0);
  else if (a.sites.empty())
    for (int k = 0; k <= shape.n_kv_heads; ++k) keep_heads.push_back(k);
  for (const int64_t k : keep_heads)
    if (k > shape.n_kv_heads)
      throw Error(fmt::format("--keep-heads {}: the model has {} KV heads per layer", k, shape.n_kv_heads));
  std::vector<std::pair<int, int>> sites;
  if (!a.sites.empty()) {
    sites = parse_sites(a.sites);
    (void)site_mask(shape, sites);  // range check now
  }

  const bool any_planted = std::find(kinds.begin(), kinds.end(), ProbeKind::Planted) != kinds.end();
  const bool any_other = std::any_of(kinds.begin(), kinds.end(), [](ProbeKind k) { return k != ProbeKind::Planted; });
  std::vector<GridEntry> planted, others;
  if (any_planted) {
    planted = policy_grid(a.policy, {a.planted_base}, budgets);
    if (!planted[0].policy().evicts) throw Error(fmt::format("--planted-base '{}' does not evict", a.planted_base));
  }
  if (any_other) others = policy_grid(a.policy, split_list(a.policies, "--policies"), budgets);
  std::vector<Config> grid;
  for (const ProbeKind kind : kinds)
    for (const int64_t d : distances) {
      if (kind != ProbeKind::Planted) {
        for (const GridEntry& g : others) grid.push_back({kind, g, d, -1, "-"});
        continue;
      }
      for (const GridEntry& g : planted) {
        for (const int64_t k : keep_heads)
          grid.push_back({kind, g, d, static_cast<int>(k), fmt::format("k={}/{}", k, shape.n_kv_heads)});
        if (!sites.empty()) grid.push_back({kind, g, d, -1, "sites " + a.sites});
      }
    }

  ProbeTextOptions text;
  text.digits = a.digits;
  text.lead = a.lead;
  text.restatements = a.restate;
  if (!a.filler.empty()) {
    std::string body = read_file(a.filler, "--filler");
    if (a.gutenberg) body = gutenberg_body(body);
    text.filler = model->tokenizer().encode(body, false);
    if (text.filler.empty()) throw Error(fmt::format("{}: no filler tokens", a.filler));
  }
  // Check every layout once (a distance too short for the restatements is an input error).
  for (const ProbeKind kind : kinds)
    for (const int64_t d : distances) (void)build_probe_layout(model->tokenizer(), kind, d, text, a.policy.seed, 0);

  std::ofstream csv;
  if (!a.csv.empty()) {
    csv.open(a.csv);
    if (!csv) throw Error(fmt::format("{}: cannot open for writing", a.csv));
    csv << "kind,policy,budget,distance,rounds_back,sites,trials,answer_logprob,answer_logprob_se,per_token_logprob,"
           "retrieval,fact_kept,mean_rounds\n";
  }
  fmt::print("{:<9} {:<26} {:>6} {:>8} {:>7} {:<12} {:>6} {:>20} {:>9} {:>9} {:>9}\n", "probe", "policy", "budget",
             "distance", "r back", "sites", "trials", "log p(answer) ± se", "per tok", "retrieval", "fact kept");
  for (const Config& c : grid)
    if (c.run.policy().selector) (void)c.run.policy().selector->make_state(shape);  // another model's statistics
  Progress progress("probe", static_cast<int64_t>(grid.size()) * a.trials, "trials");
  for (const Config& c : grid) {
    Aggregate g;
    for (int t = 0; t < a.trials; ++t, progress.add(1, std::string(probe_kind_name(c.kind)) + " " + c.run.name)) {
      const ProbeLayout layout = build_probe_layout(model->tokenizer(), c.kind, c.distance, text, a.policy.seed, t);
      Policy p = c.run.policy();
      if (c.kind == ProbeKind::Planted) {
        const std::vector<uint8_t> mask = c.keep_heads >= 0
            ? random_head_mask(shape, c.keep_heads, stream_id({a.policy.seed, static_cast<uint64_t>(t), kMaskTag}))
            : site_mask(shape, sites);
        p = force_sites(c.run.policy(), layout.fact_positions, mask);
      }
      const ProbeTrial r =
          run_probe_trial(engine, p, c.run.eviction(), layout, stream_id({static_cast<uint64_t>(t), kSeqTag}));
      g.n += 1;
      g.lp += r.answer_logprob;
      g.lp2 += r.answer_logprob * r.answer_logprob;
      g.per_token += r.answer_logprob / std::max(1, r.answer_tokens);
      g.exact += r.exact ? 1 : 0;
      g.kept += r.fact_kept;
      g.rounds += static_cast<double>(r.rounds);
    }
    const double n = g.n, mean = g.lp / n;
    const double var = n > 1 ? std::max(0.0, (g.lp2 - n * mean * mean) / (n - 1)) : 0.0;
    const double se = std::sqrt(var / n);
    const int64_t b = c.run.eviction().budget;
    const double rounds_back =
        b > 0 ? static_cast<double>(c.distance) / static_cast<double>(c.run.eviction().round_interval()) : 0.0;
    const std::string budget = b > 0 ? std::to_string(b) : "-";
    const std::string policy = c.kind == ProbeKind::Planted ? c.run.name + "+sites" : c.run.name;
    progress.clear();
    fmt::print("{:<9} {:<26} {:>6} {:>8} {:>7} {:<12} {:>6} {:>20} {:>9.3f} {:>9.3f} {:>9.3f}\n",
               probe_kind_name(c.kind), policy, budget, c.distance, b > 0 ? fmt::format("{:.1f}", rounds_back) : "-",
               c.sites_label, g.n, fmt::format("{:.3f} ± {:.3f}", mean, se), g.per_token / n, g.exact / n, g.kept / n);
    std::fflush(stdout);
    if (csv)
      csv << fmt::format("{},{},{},{},{},\"{}\",{},{},{},{},{},{},{}\n", probe_kind_name(c.kind), policy,
                         b > 0 ? std::to_string(b) : "", c.distance, rounds_back, c.sites_label, g.n, mean, se,
                         g.per_token / n, g.exact / n, g.kept / n, g.rounds / n);
  }
  if (csv && !csv.flush()) throw Error(fmt::format("{}: write failed", a.csv));
  return 0;
}

}  // namespace

void add_probe(CLI::App& root, std::vector<Command>& out) {
  auto p = std::make_shared<ProbeArgs>();
  auto* cmd = root.add_subcommand(
      "probe", "Synthetic retrieval probes: planted fact in chosen KV heads, restated fact, passcode");
  cmd->add_option("-m,--model", p->model, model_help())->required()->check(CLI::ExistingPath);
  cmd->add_option("--kinds", p->kinds, "Probes: planted, restated, passcode")->capture_default_str();
  cmd->add_option("--policies", p->policies, "Policies for the restated and passcode probes")->capture_default_str();
  cmd->add_option("--budgets", p->budgets, "Comma-separated budgets B");
  cmd->add_option("--distances", p->distances, "Tokens between the (first) statement of the fact and the question")
      ->capture_default_str();
  cmd->add_option(
      "--keep-heads", p->keep_heads,
      "Planted: keep the fact in k random KV heads of every layer, for each k listed (default 0..n_kv_heads)");
  cmd->add_option("--sites", p->sites, "Planted: keep the fact exactly in these LAYER:KV_HEAD sites (e.g. 0:1,3:0)");
  cmd->add_option("--planted-base", p->planted_base, "Planted: policy that evicts everything else")
      ->capture_default_str();
  cmd->add_option("--trials", p->trials, "Trials per configuration (each a different code and filler)")
      ->check(int_range(1, limits::kTrials))
      ->capture_default_str();
  cmd->add_option("--restate", p->restate, "Restated: statements of the fact")
      ->check(int_range(1, limits::kTrials))
      ->capture_default_str();
  cmd->add_option("--digits", p->digits, "Digits of the secret number")->check(int_range(1, 18))->capture_default_str();
  cmd->add_option("--lead", p->lead, "Filler tokens between the prompt and the first statement")
      ->check(int_range(0, limits::kTokens))
      ->capture_default_str();
  cmd->add_option("--filler", p->filler, "Text file to draw filler from (default: built-in simple sentences)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--gutenberg-body", p->gutenberg,
                "Filler: only the text between Project Gutenberg's START/END markers");
  cmd->add_option("--csv", p->csv, "Write one CSV row per configuration");
  add_threads_option(*cmd, p->threads);
  add_policy_options(*cmd, p->policy, /*with_policy=*/false);
  out.push_back({cmd, [p] { return run_probe(*p); }});
}

}  // namespace kvevict::cli
