// kvevict command-line interface: generate, perplexity, policies.
// Every user error (bad option, missing file, B <= r, unknown policy) prints one line and exits 2.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "cli/common.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "eval/perplexity.h"
#include "model/llama.h"
#include "util/error.h"

namespace kvevict::cli {
namespace {

using Clock = std::chrono::steady_clock;

void warn(const std::string& msg) { fmt::print(stderr, "kvevict: warning: {}\n", msg); }

struct GenerateArgs {
  std::string model, prompt;
  int64_t n = 256;
  float temp = 0.6f, top_p = 0.95f;
  int top_k = 0;
  int threads = 0;
  bool ignore_eos = false;
  PolicyArgs policy;
};

int run_generate(const GenerateArgs& a) {
  const auto model = LlamaModel::load(a.model);
  const Policy policy = build_policy(a.policy, a.policy.policy);
  const EvictionConfig cfg = build_eviction(a.policy, policy);
  SamplerConfig sc{a.temp, a.top_p, a.top_k, a.policy.seed};
  validate_sampler(sc);
  if (a.n < 1) throw Error(fmt::format("-n {}: must be >= 1", a.n));
  const Tokenizer& tok = model->tokenizer();
  const std::vector<int32_t> prompt = tok.encode(a.prompt, true);
  if (auto w = long_prompt_warning(cfg, policy, static_cast<int64_t>(prompt.size())); !w.empty()) warn(w);
  if (!policy.evicts && static_cast<int64_t>(prompt.size()) + a.n > model->config().context_length)
    warn(fmt::format("{} tokens exceed the model's stated context of {}", prompt.size() + static_cast<size_t>(a.n),
                     model->config().context_length));

  Engine engine(*model, a.threads);
  auto seq = engine.new_sequence(0, policy, cfg, static_cast<int64_t>(prompt.size()), a.n);
  std::vector<float> logits;
  engine.prefill(*seq, prompt, logits);
  fmt::print("{}", a.prompt);
  std::fflush(stdout);
  int64_t generated = 0;
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < a.n; ++i) {
    Rng rng(stream_id({a.policy.seed, seq->id, static_cast<uint64_t>(i), 0x5A4D504CULL}));
    const int32_t next = sample_token(logits, sc, rng);
    if (next == tok.eos_id() && !a.ignore_eos) break;
    ++generated;
    fmt::print("{}", tok.piece(next));
    std::fflush(stdout);
    if (i + 1 < a.n) engine.decode(*seq, next, logits);
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const SequenceStats& s = seq->stats;
  fmt::print("\n");
  fmt::print(
      "[kvevict] policy {} | prompt {} tok | generated {} tok | {:.1f} tok/s | eviction rounds {} | "
      "peak slots/KV head {} (B+r = {}) | KV bytes {} | score {:.3f} ms/round | compact {:.3f} ms/round\n",
      policy.name, prompt.size(), generated, secs > 0 ? static_cast<double>(generated) / secs : 0.0, s.rounds,
      s.peak_slots, policy.evicts ? fmt::format("{}", cfg.budget + cfg.recent) : std::string("n/a"),
      seq->kv.allocated_bytes(), s.rounds ? s.score_ms / static_cast<double>(s.rounds) : 0.0,
      s.rounds ? s.compact_ms / static_cast<double>(s.rounds) : 0.0);
  return 0;
}

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
      a.policies.empty() ? std::vector<std::string>{a.policy.policy} : split_list(a.policies, "--policies");
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

int run_policies() {
  fmt::print("{:<20} {:>7} {:>6}  {}\n", "policy", "prompt", "sinks", "what it keeps");
  for (const PolicyInfo* p : all_policies())
    fmt::print("{:<20} {:>7} {:>6}  {}\n", p->name, p->evicts ? (p->protect_prompt ? "pinned" : "-") : "all",
               p->sinks, p->summary);
  return 0;
}

}  // namespace
}  // namespace kvevict::cli

int main(int argc, char** argv) {
  using namespace kvevict;
  using namespace kvevict::cli;
  CLI::App app{"kvevict: LLM inference with a per-KV-head token budget and pluggable eviction"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");

  GenerateArgs g;
  auto* gen = app.add_subcommand("generate", "Generate text with eviction active and print a summary line");
  gen->add_option("-m,--model", g.model, "GGUF model (llama architecture)")->required();
  gen->add_option("-p,--prompt", g.prompt, "Prompt text")->required();
  gen->add_option("-n,--n-predict", g.n, "Tokens to generate")->capture_default_str();
  gen->add_option("--temp", g.temp, "Temperature (0 = greedy)")->capture_default_str();
  gen->add_option("--top-p", g.top_p, "Nucleus sampling threshold (1 = off)")->capture_default_str();
  gen->add_option("--top-k", g.top_k, "Top-k (0 = off)")->capture_default_str();
  gen->add_option("-t,--threads", g.threads, "Threads (0 = all cores)")->capture_default_str();
  gen->add_flag("--ignore-eos", g.ignore_eos, "Keep generating after the end-of-sequence token");
  add_policy_options(*gen, g.policy);

  PerplexityArgs pp;
  auto* ppl = app.add_subcommand("perplexity", "Perplexity of a text with the policy active");
  ppl->add_option("-m,--model", pp.model, "GGUF model (llama architecture)")->required();
  ppl->add_option("-f,--file", pp.file, "Text file")->required();
  ppl->add_option("--tokens", pp.tokens, "Use only the first N tokens (BOS included; 0 = all)");
  ppl->add_option("--policies", pp.policies, "Comma-separated policies to run in turn (overrides --policy)");
  ppl->add_option("--csv", pp.csv, "Write policy,position,token,nll per scored token");
  ppl->add_option("-c,--ctx-size", pp.ctx, "Chunked mode (llama-perplexity): chunk size in tokens");
  ppl->add_option("--chunks", pp.chunks, "Chunked mode: at most this many chunks (0 = all)");
  ppl->add_option("--report-every", pp.report_every, "Print running perplexity every N tokens to stderr")->capture_default_str();
  ppl->add_flag("--gutenberg-body", pp.gutenberg, "Score only the text between Project Gutenberg's START/END markers");
  ppl->add_option("-t,--threads", pp.threads, "Threads (0 = all cores)")->capture_default_str();
  add_policy_options(*ppl, pp.policy);

  auto* pol = app.add_subcommand("policies", "List the eviction policies");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "kvevict: error: {}\n", e.what());
    return 2;
  }
  try {
    if (gen->parsed()) return run_generate(g);
    if (ppl->parsed()) return run_perplexity(pp);
    if (pol->parsed()) return run_policies();
  } catch (const kvevict::Error& e) {
    fmt::print(stderr, "kvevict: error: {}\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "kvevict: error: out of memory\n");
    return 2;
  }
  return 0;
}
