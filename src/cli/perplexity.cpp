// `kvevict perplexity`: token-by-token perplexity under a policy, and llama.cpp's chunked mode.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "cli/common.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "eval/perplexity.h"
#include "model/llama.h"
#include "util/error.h"

namespace kvevict::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct PerplexityArgs {
  std::string model, file, csv, policies;
  int64_t tokens = 0;
  int64_t ctx = 0, chunks = 0;
  int threads = 0;
  bool gutenberg = false;
  int64_t report_every = 512;
  PolicyArgs policy;
};

int run_perplexity(const PerplexityArgs& a) {
  const auto model = LlamaModel::load(a.model);
  std::string text = read_file(a.file);
  if (a.gutenberg) text = gutenberg_body(text);
  std::vector<int32_t> tokens = model->tokenizer().encode(text, true);
  if (a.tokens > 0 && static_cast<int64_t>(tokens.size()) > a.tokens) tokens.resize(static_cast<size_t>(a.tokens));
  if (a.tokens > 0 && static_cast<int64_t>(tokens.size()) < a.tokens)
    warn(fmt::format("{} holds only {} tokens, fewer than --tokens {}", a.file, tokens.size(), a.tokens));
  const std::vector<std::string> names =
      a.policies.empty() ? std::vector<std::string>{default_policy(a.policy)} : split_list(a.policies, "--policies");
  std::vector<std::pair<Policy, EvictionConfig>> runs;
  for (const std::string& n : names) {  // validate everything before the first long run
    Policy p = build_policy(a.policy, n);
    runs.emplace_back(p, build_eviction(a.policy, p));
  }
  Engine engine(*model, a.threads);
  std::ofstream csv;
  if (!a.csv.empty()) {
    csv.open(a.csv);
    if (!csv) throw Error(fmt::format("{}: cannot open for writing", a.csv));
    csv << "policy,position,token,nll\n";
  }
  if (a.ctx > 0) {
    for (auto& [p, cfg] : runs) {
      fmt::print(stderr, "perplexity: {} tokens, {} chunks of {}, policy {}\n", tokens.size(),
                 a.chunks > 0 ? std::min<int64_t>(a.chunks, static_cast<int64_t>(tokens.size()) / a.ctx)
                              : static_cast<int64_t>(tokens.size()) / a.ctx, a.ctx, p.name);
      const auto r = perplexity_chunked(engine, p, cfg, tokens, a.ctx, a.chunks,
                                        [](int64_t i, double ppl) { fmt::print("[{}]{:.4f},", i, ppl); std::fflush(stdout); });
      fmt::print("\nFinal estimate: PPL = {:.4f} +/- {:.5f}\n", r.ppl, r.ppl_stderr);
    }
    return 0;
  }
  if (tokens.size() > static_cast<size_t>(model->config().context_length))
    for (auto& [p, cfg] : runs)
      if (!p.evicts || cfg.positions == PositionMode::Logical)
        if (!p.evicts) warn(fmt::format("{} tokens exceed the model's stated context of {}: '{}' will run past it",
                                        tokens.size(), model->config().context_length, p.name));
  fmt::print("{:<22} {:>7} {:>8} {:>12} {:>8} {:>10} {:>9}\n", "policy", "budget", "tokens", "perplexity",
             "rounds", "peak slots", "tok/s");
  for (auto& [p, cfg] : runs) {
    const auto t0 = Clock::now();
    const auto r = perplexity_decode(engine, p, cfg, tokens, a.report_every, [&](int64_t i, double ppl) {
      fmt::print(stderr, "  {} [{}] running PPL {:.4f}\n", p.name, i, ppl);
    });
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    fmt::print("{:<22} {:>7} {:>8} {:>12.4f} {:>8} {:>10} {:>9.1f}\n", p.name,
               p.evicts ? std::to_string(cfg.budget) : std::string("-"), r.nll.size(), r.ppl, r.stats.rounds,
               r.stats.peak_slots, static_cast<double>(r.nll.size()) / secs);
    std::fflush(stdout);
    if (csv)
      for (size_t i = 0; i < r.nll.size(); ++i)
        csv << p.name << ',' << i + 1 << ',' << tokens[i + 1] << ',' << fmt::format("{:.6f}", r.nll[i]) << '\n';
  }
  if (csv && !csv.flush()) throw Error(fmt::format("{}: write failed", a.csv));
  return 0;
}


}  // namespace

void add_perplexity(CLI::App& root, std::vector<Command>& out) {
  auto pp = std::make_shared<PerplexityArgs>();
  auto* ppl = root.add_subcommand("perplexity", "Perplexity of a text with the policy active");
  ppl->add_option("-m,--model", pp->model, "GGUF model (llama architecture)")->required();
  ppl->add_option("-f,--file", pp->file, "Text file")->required();
  ppl->add_option("--tokens", pp->tokens, "Use only the first N tokens (BOS included; 0 = all)");
  ppl->add_option("--policies", pp->policies, "Comma-separated policies to run in turn (overrides --policy)");
  ppl->add_option("--csv", pp->csv, "Write policy,position,token,nll per scored token");
  ppl->add_option("-c,--ctx-size", pp->ctx, "Chunked mode (llama-perplexity): chunk size in tokens");
  ppl->add_option("--chunks", pp->chunks, "Chunked mode: at most this many chunks (0 = all)");
  ppl->add_option("--report-every", pp->report_every, "Print running perplexity every N tokens to stderr")->capture_default_str();
  ppl->add_flag("--gutenberg-body", pp->gutenberg, "Score only the text between Project Gutenberg's START/END markers");
  ppl->add_option("-t,--threads", pp->threads, "Threads (0 = all cores)")->capture_default_str();
  add_policy_options(*ppl, pp->policy);
  out.push_back({ppl, [pp] { return run_perplexity(*pp); }});
}

}  // namespace kvevict::cli
