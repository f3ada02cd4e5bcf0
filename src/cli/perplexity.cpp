// `kvevict perplexity`: token-by-token perplexity under policies x budgets (with a PNG of
// perplexity and smoothed per-position NLL vs position, the StreamingLLM figure), and
// llama.cpp's chunked mode.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "cli/common.h"
#include "cli/grid.h"
#include "cli/progress.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "eval/perplexity.h"
#include "eval/plots.h"
#include "model/model.h"
#include "util/error.h"

namespace kvevict::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct PerplexityArgs {
  std::string model, file, csv, policies, budgets, plot;
  int64_t tokens = 0;
  int64_t ctx = 0, chunks = 0;
  int threads = 0;
  bool gutenberg = false;
  int64_t report_every = 512;
  int64_t smooth = 0;
  PolicyArgs policy;
};

/// policies x budgets (a policy that does not evict runs once), validated up front. Without
/// --policies the default policy follows the first budget, as it would with --budget.
std::vector<GridEntry> build_runs(const PerplexityArgs& a) {
  const std::vector<int64_t> budgets = budget_grid(a.budgets, a.policy.budget);
  PolicyArgs pick = a.policy;
  if (!budgets.empty()) pick.budget = budgets[0];
  const std::vector<std::string> names = a.policies.empty()
      ? std::vector<std::string>{policy_name(policy_settings(pick))}
      : split_list(a.policies, "--policies");
  std::vector<GridEntry> runs = policy_grid(a.policy, names, budgets);
  std::vector<Policy> policies;
  for (const GridEntry& g : runs) policies.push_back(g.policy());
  if (const std::string w = unused_schedule_warning(a.policy, policies); !w.empty()) warn(w);
  return runs;
}

std::string budget_text(const GridEntry& r) {
  return r.policy().evicts ? std::to_string(r.eviction().budget) : std::string("-");
}

int run_perplexity(const PerplexityArgs& a) {
  const std::vector<GridEntry> runs = build_runs(a);
  if (!a.plot.empty() && a.ctx > 0) throw Error("--plot draws the token-by-token mode; it cannot be used with -c");
  if (!a.csv.empty() && a.ctx > 0)
    throw Error("--csv writes the token-by-token mode's per-token NLL; it cannot be used with -c");
  if (a.smooth < 0) throw Error(fmt::format("--smooth {}: must be >= 0", a.smooth));
  std::string text = read_file(a.file, "-f");  // before the model: a bad file fails fast
  // Chunked mode runs n_ctx-token sequences, as llama-perplexity -c does, so LongRoPE picks its
  // factor set by that size (model/model.h); token-by-token mode runs up to context_length.
  LoadOptions lo;
  lo.context_size = a.ctx;
  const auto model = Model::load(a.model, lo);
  if (a.gutenberg) {
    const size_t before = text.size();
    text = gutenberg_body(text);
    if (text.size() == before)
      warn(fmt::format("{}: no Project Gutenberg START/END markers found; --gutenberg-body scores the whole file",
                       a.file));
  }
  std::vector<int32_t> tokens = model->tokenizer().encode(text, true);
  if (a.tokens > 0 && static_cast<int64_t>(tokens.size()) > a.tokens) tokens.resize(static_cast<size_t>(a.tokens));
  if (a.tokens > 0 && static_cast<int64_t>(tokens.size()) < a.tokens)
    warn(fmt::format("{} holds only {} tokens, fewer than --tokens {}", a.file, tokens.size(), a.tokens));
  // llama-perplexity's habit (no -c) on a long file would decode every token one at a time.
  // Past the context only on request: --tokens, or -c for the chunked protocol.
  if (a.ctx == 0 && a.tokens == 0 && static_cast<int64_t>(tokens.size()) > model->config().context_length)
    throw Error(fmt::format(
        "{}: {} tokens exceed the model's context of {} ({}context_length): pass -c N for llama-perplexity's chunked "
        "mode (e.g. -c {}), or --tokens N to score the first N tokens one at a time",
        a.file, tokens.size(), model->config().context_length, model->config().arch + ".",
        std::min<int64_t>(model->config().context_length, 512)));
  Engine engine(*model, a.threads);
  // Per-token NLL goes to --csv, and to <plot>.nll.csv for the figure.
  std::string nll_path = a.csv;
  if (nll_path.empty() && !a.plot.empty())
    nll_path = std::filesystem::path(a.plot).replace_extension(".nll.csv").string();
  if (!a.plot.empty()) {
    std::error_code ec;
    const auto parent = std::filesystem::path(a.plot).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  }
  std::ofstream csv;
  if (!nll_path.empty()) {
    csv.open(nll_path);
    if (!csv) throw Error(fmt::format("{}: cannot open for writing", nll_path));
    csv << "policy,budget,position,token,nll\n";
  }
  if (a.ctx > 0) {
    if (a.ctx > model->config().context_length)
      warn(fmt::format("-c {} exceeds the model's trained context of {} tokens: positions beyond it are extrapolated",
                       a.ctx, model->config().context_length));
    for (const GridEntry& run : runs) {
      fmt::print(stderr, "perplexity: {} tokens, {} chunks of {}, policy {}{}\n", tokens.size(),
                 a.chunks > 0 ? std::min<int64_t>(a.chunks, static_cast<int64_t>(tokens.size()) / a.ctx)
                              : static_cast<int64_t>(tokens.size()) / a.ctx,
                 a.ctx, run.policy().name, run.policy().evicts ? fmt::format(" at B = {}", run.eviction().budget) : "");
      const auto r =
          perplexity_chunked(engine, run.policy(), run.eviction(), tokens, a.ctx, a.chunks, [](int64_t i, double ppl) {
            fmt::print("[{}]{:.4f},", i, ppl);
            std::fflush(stdout);
          });
      fmt::print("\nFinal estimate: PPL = {:.4f} +/- {:.5f}\n", r.ppl, r.ppl_stderr);
    }
    return 0;
  }
  if (tokens.size() > static_cast<size_t>(model->config().context_length))
    for (const GridEntry& run : runs)
      if (!run.policy().evicts)
        warn(fmt::format("{} tokens exceed the model's stated context of {}: '{}' will run past it", tokens.size(),
                         model->config().context_length, run.policy().name));
  fmt::print("{:<22} {:>7} {:>8} {:>12} {:>8} {:>10} {:>9}\n", "policy", "budget", "tokens", "perplexity", "rounds",
             "peak slots", "tok/s");
  std::fflush(stdout);
  // Progress counts scored tokens over the whole grid; it is told every kStep tokens.
  const int64_t kStep = a.report_every > 0 ? std::gcd(int64_t{64}, a.report_every) : 64;
  const auto per_run = static_cast<int64_t>(tokens.size()) - 1;
  Progress progress("perplexity", per_run * static_cast<int64_t>(runs.size()), "tokens");
  for (const GridEntry& run : runs) {
    const Policy& p = run.policy();
    const auto t0 = Clock::now();
    int64_t counted = 0;
    const auto r = perplexity_decode(engine, p, run.eviction(), tokens, kStep, [&](int64_t i, double ppl) {
      progress.add(i - counted, p.name + (p.evicts ? fmt::format(" B={}", run.eviction().budget) : std::string()));
      counted = i;
      if (a.report_every > 0 && i % a.report_every == 0)
        progress.message(fmt::format("  {} [{}] running PPL {:.4f}", p.name, i, ppl));
    });
    progress.add(per_run - counted);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    progress.clear();
    fmt::print("{:<22} {:>7} {:>8} {:>12.4f} {:>8} {:>10} {:>9.1f}\n", p.name, budget_text(run), r.nll.size(), r.ppl,
               r.stats.rounds, r.stats.peak_slots, static_cast<double>(r.nll.size()) / secs);
    std::fflush(stdout);
    if (csv) {
      const std::string budget = p.evicts ? std::to_string(run.eviction().budget) : std::string();
      for (size_t i = 0; i < r.nll.size(); ++i)
        csv << p.name << ',' << budget << ',' << i + 1 << ',' << tokens[i + 1] << ',' << fmt::format("{:.6f}", r.nll[i])
            << '\n';
    }
  }
  if (csv && !csv.flush()) throw Error(fmt::format("{}: write failed", nll_path));
  if (!a.plot.empty()) {
    csv.close();
    const std::string title = fmt::format("{} on {} ({} tokens)", model_display_name(a.model, true),
                                          std::filesystem::path(a.file).filename().string(), tokens.size());
    const std::string why =
        run_plot_script({"perplexity", nll_path, a.plot, "--title", title, "--smooth", std::to_string(a.smooth),
                         "--context", std::to_string(model->config().context_length)});
    if (!why.empty()) warn("plot skipped: " + why);
  }
  return 0;
}

}  // namespace

void add_perplexity(CLI::App& root, std::vector<Command>& out) {
  auto pp = std::make_shared<PerplexityArgs>();
  auto* ppl = root.add_subcommand("perplexity", "Perplexity of a text with the policy active");
  ppl->add_option("-m,--model", pp->model, model_help())->required()->check(CLI::ExistingPath);
  ppl->add_option("-f,--file", pp->file, "Text file")->required()->check(CLI::ExistingFile);
  ppl->add_option("--tokens", pp->tokens, "Use only the first N tokens (BOS included; 0 = all)")
      ->check(int_range(0, limits::kCorpusTokens))
      ->capture_default_str();
  ppl->add_option("--policies", pp->policies, "Comma-separated policies to run in turn (overrides --policy)");
  ppl->add_option("--budgets", pp->budgets,
                  "Comma-separated budgets: every evicting policy runs at each (instead of --budget)");
  ppl->add_option("--csv", pp->csv, "Write policy,budget,position,token,nll per scored token");
  ppl->add_option("--plot", pp->plot,
                  "Draw perplexity and smoothed per-position NLL vs position per policy into this PNG "
                  "(the per-token NLL also goes to <plot>.nll.csv unless --csv is given)");
  ppl->add_option("--smooth", pp->smooth, "Moving-average window of the NLL curve in tokens (0 = tokens/50)")
      ->check(int_range(0, limits::kTokens))
      ->capture_default_str();
  ppl->add_option("-c,--ctx-size", pp->ctx,
                  "Chunked mode (llama-perplexity): chunk size in tokens (0 = token-by-token mode)")
      ->check(int_range(0, limits::kTokens))
      ->capture_default_str();
  ppl->add_option("--chunks", pp->chunks, "Chunked mode: at most this many chunks (0 = all)")
      ->check(int_range(0, limits::kProblems))
      ->capture_default_str();
  ppl->add_option("--report-every", pp->report_every, "Print running perplexity every N tokens to stderr (0 = never)")
      ->check(int_range(0, limits::kCorpusTokens))
      ->capture_default_str();
  ppl->add_flag("--gutenberg-body", pp->gutenberg, "Score only the text between Project Gutenberg's START/END markers");
  add_threads_option(*ppl, pp->threads);
  add_policy_options(*ppl, pp->policy);
  out.push_back({ppl, [pp] { return run_perplexity(*pp); }});
}

}  // namespace kvevict::cli
