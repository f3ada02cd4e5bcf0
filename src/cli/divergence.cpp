// `kvevict divergence`: per-token KL divergence from `full` and perplexity of every policy at
// every budget over many texts (the first P tokens of each playing the prompt), and optionally
// the attention mass each query head puts on the first positions (does the model have sinks?).
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "cli/common.h"
#include "cli/grid.h"
#include "cli/progress.h"
#include "engine/engine.h"
#include "eval/divergence.h"
#include "eval/grader.h"
#include "eval/perplexity.h"
#include "eval/stats.h"
#include "model/model.h"
#include "util/error.h"

namespace kvevict::cli {
namespace {

struct DivergenceArgs {
  std::string model, policies, budgets, fractions, out;
  std::vector<std::string> files;
  int64_t length = 512, prompt = 32, texts = 25;
  int threads = 0;
  bool gutenberg = false, sink_mass = false;
  int64_t sink_k = 4, sink_min_position = 16;
  int bootstrap = 10000;
  PolicyArgs policy;
};

/// One text: its tokens, how many of them are the prompt, and where it came from.
struct Text {
  std::string source;
  int64_t index = 0;  ///< within its source
  std::vector<int32_t> tokens;
  int64_t prompt = 0;
  int64_t answer_from = 0;  ///< first token of the final answer (a task's), 0 = none
};

/// Where a task trace's final answer starts: its first token at or after the content of the last
/// \boxed{} (the answer the grader reads, extract_last_boxed in eval/grader.h), so the span is the
/// answer and its closing brace; 0 when the trace has none. The text before the answer is
/// tokenized on its own and matched against the trace's tokens, so a BPE merge across the boundary
/// starts the span at the first token that differs rather than past the answer.
int64_t answer_start(const Tokenizer& tok, const std::string& trace, const std::vector<int32_t>& trace_tokens,
                     int64_t prompt) {
  const std::optional<BoxedRange> box = last_boxed_range(trace);
  if (!box) return 0;
  const std::vector<int32_t> head = tok.encode(trace.substr(0, box->begin), false);
  size_t common = 0;
  while (common < head.size() && common < trace_tokens.size() && head[common] == trace_tokens[common]) ++common;
  return common < trace_tokens.size() ? prompt + static_cast<int64_t>(common) : 0;
}

/// Windows of `length` tokens from a text file, at most `count`, spread evenly over the file (a
/// book is sampled throughout, not only at its start). Each window starts with BOS when the
/// model adds one (as llama-perplexity's chunks do).
std::vector<Text> text_windows(const Model& model, const std::string& path, const DivergenceArgs& a) {
  std::string text = read_file(path, "-f");
  if (a.gutenberg) text = gutenberg_body(text);
  const std::vector<int32_t> all = model.tokenizer().encode(text, true);
  const auto n_windows = static_cast<int64_t>(all.size()) / a.length;
  if (n_windows == 0)
    throw Error(fmt::format("{}: {} tokens, fewer than one text of --length {}", path, all.size(), a.length));
  const int64_t take = std::min(n_windows, a.texts);
  std::vector<Text> out;
  for (int64_t i = 0; i < take; ++i) {
    const int64_t w = i * n_windows / take;  // evenly spaced window indices
    Text t;
    t.source = std::filesystem::path(path).filename().string();
    t.index = i;
    t.tokens.assign(all.begin() + w * a.length, all.begin() + (w + 1) * a.length);
    if (model.tokenizer().add_bos()) t.tokens[0] = model.tokenizer().bos_id();
    t.prompt = a.prompt;
    out.push_back(std::move(t));
  }
  if (take < a.texts)
    warn(fmt::format("{} holds {} texts of {} tokens, fewer than --texts {}", path, take, a.length, a.texts));
  return out;
}

/// kvevict task lines (`kvevict tasks gen`): the problem is the prompt, the trace the continuation.
std::vector<Text> task_texts(const Model& model, const std::string& path, const DivergenceArgs& a) {
  std::istringstream in(read_file(path, "-f"));
  std::vector<Text> out;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line) && static_cast<int64_t>(out.size()) < a.texts) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw Error(fmt::format("{}:{}: not a JSON object", path, lineno));
    }
    if (!j.is_object() || !j.contains("problem") || !j["problem"].is_string() || !j.contains("trace") ||
        !j["trace"].is_string())
      throw Error(fmt::format("{}:{}: a task line needs string fields \"problem\" and \"trace\" (kvevict tasks gen)",
                              path, lineno));
    Text t;
    t.source = std::filesystem::path(path).filename().string();
    t.index = static_cast<int64_t>(out.size());
    t.tokens = model.tokenizer().encode(j["problem"].get<std::string>(), true);
    t.prompt = static_cast<int64_t>(t.tokens.size());
    const std::string trace_text = j["trace"].get<std::string>();
    const std::vector<int32_t> trace = model.tokenizer().encode(trace_text, false);
    t.tokens.insert(t.tokens.end(), trace.begin(), trace.end());
    if (trace.empty()) throw Error(fmt::format("{}:{}: empty trace", path, lineno));
    t.answer_from = answer_start(model.tokenizer(), trace_text, trace, t.prompt);
    out.push_back(std::move(t));
  }
  if (out.empty()) throw Error(fmt::format("{}: no task lines", path));
  return out;
}

/// The budgets to run: --budgets, or --budget-fractions of --length (rounded), or --budget.
std::vector<int64_t> run_budgets(const DivergenceArgs& a) {
  if (!a.fractions.empty()) {
    if (!a.budgets.empty() || a.policy.budget > 0)
      throw Error("--budget-fractions cannot be combined with --budget or --budgets");
    std::vector<int64_t> out;
    for (const std::string& f : split_list(a.fractions, "--budget-fractions")) {
      double v = 0;
      size_t used = 0;
      try {
        v = std::stod(f, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != f.size() || !(v > 0) || v > 1)
        throw Error(fmt::format("--budget-fractions: '{}' must be a number in (0, 1]", f));
      out.push_back(std::max<int64_t>(1, std::llround(v * static_cast<double>(a.length))));
    }
    return out;
  }
  return budget_grid(a.budgets, a.policy.budget);
}

struct CellSummary {
  double kl = 0, kl_lo = 0, kl_hi = 0;
  double ppl = 0, dnll = 0, dnll_lo = 0, dnll_hi = 0;
  double top1 = 0, rounds = 0;
};

using SpanOf = DivergenceSpan DivergenceText::*;

/// The texts of `idx` whose span `span` holds positions (every text for `all`).
std::vector<size_t> with_span(const std::vector<DivergenceText>& res, const std::vector<size_t>& idx, SpanOf span) {
  std::vector<size_t> out;
  for (size_t i : idx)
    if ((res[i].*span).n > 0) out.push_back(i);
  return out;
}

/// Pools the texts `idx` of one cell over one span of positions: KL and ΔNLL (cell - full) as
/// means over texts with percentile bootstrap 95% intervals over texts; perplexity token-weighted.
/// `idx` must be non-empty and every text's span non-empty (with_span).
CellSummary summarize(const std::vector<DivergenceText>& res, const std::vector<size_t>& idx, SpanOf span,
                      size_t cell, int resamples, uint64_t seed) {
  std::vector<double> kl, dnll, zeros(idx.size(), 0.0);
  double nll_sum = 0, tokens = 0;
  CellSummary s;
  for (size_t i : idx) {
    const DivergenceSpan& r = res[i].*span;
    kl.push_back(r.kl[cell]);
    dnll.push_back(r.nll[cell] - r.full_nll);
    nll_sum += r.nll[cell] * static_cast<double>(r.n);
    tokens += static_cast<double>(r.n);
    s.top1 += r.top1[cell] / static_cast<double>(idx.size());
    s.rounds += static_cast<double>(res[i].stats[cell].rounds) / static_cast<double>(idx.size());
  }
  const BootstrapCi ckl = paired_bootstrap_ci(kl, zeros, resamples, seed);
  const BootstrapCi cd = paired_bootstrap_ci(dnll, zeros, resamples, seed + 1);
  s.kl = ckl.mean_diff;
  s.kl_lo = ckl.lo;
  s.kl_hi = ckl.hi;
  s.dnll = cd.mean_diff;
  s.dnll_lo = cd.lo;
  s.dnll_hi = cd.hi;
  s.ppl = std::exp(nll_sum / tokens);
  return s;
}

double full_ppl(const std::vector<DivergenceText>& res, const std::vector<size_t>& idx, SpanOf span) {
  double nll = 0, tokens = 0;
  for (size_t i : idx) {
    nll += (res[i].*span).full_nll * static_cast<double>((res[i].*span).n);
    tokens += static_cast<double>((res[i].*span).n);
  }
  return std::exp(nll / tokens);
}

void print_sink_mass(const AttentionMass& m, std::ofstream* csv) {
  fmt::print("\nattention mass on the first {} positions (full cache, query tokens at positions >= min; {} query "
             "tokens; uniform attention would give {:.4f}):\n",
             m.first_k, m.queries, m.uniform);
  fmt::print("{:>6} {:>8} {:>8} {:>8}   per head\n", "layer", "min", "median", "max");
  for (int l = 0; l < m.n_layers; ++l) {
    std::vector<double> row(m.mass.begin() + l * m.n_heads, m.mass.begin() + (l + 1) * m.n_heads);
    std::vector<double> sorted = row;
    std::sort(sorted.begin(), sorted.end());
    std::string heads;
    for (double v : row) heads += fmt::format(" {:.3f}", v);
    fmt::print("{:>6} {:>8.4f} {:>8.4f} {:>8.4f}  {}\n", l, sorted.front(), quantile_sorted(sorted, 0.5), sorted.back(),
               heads);
    if (csv)
      for (int h = 0; h < m.n_heads; ++h)
        *csv << l << ',' << h << ',' << fmt::format("{:.6f}", row[static_cast<size_t>(h)]) << ','
             << fmt::format("{:.6f}", m.uniform) << '\n';
  }
}

int run_divergence(const DivergenceArgs& a) {
  if (a.prompt < 1 || a.prompt >= a.length)
    throw Error(fmt::format("--prompt-tokens {}: must be in [1, --length {})", a.prompt, a.length));
  const std::vector<int64_t> budgets = run_budgets(a);
  const std::vector<std::string> names =
      a.policies.empty() ? std::vector<std::string>{policy_name(policy_settings(a.policy))}
                         : split_list(a.policies, "--policies");
  std::vector<GridEntry> grid = policy_grid(a.policy, names, budgets);
  std::erase_if(grid, [](const GridEntry& g) { return !g.policy().evicts; });  // `full` is the reference
  if (grid.empty()) throw Error("--policies: no evicting policy to compare with `full`");
  const auto model = Model::load(a.model);
  std::vector<Text> texts;
  for (const std::string& f : a.files) {
    std::vector<Text> t = f.ends_with(".jsonl") ? task_texts(*model, f, a) : text_windows(*model, f, a);
    texts.insert(texts.end(), std::make_move_iterator(t.begin()), std::make_move_iterator(t.end()));
  }
  std::vector<DivergenceCell> cells;
  for (const GridEntry& g : grid)
    cells.push_back({fmt::format("{}@{}", g.name, g.eviction().budget), g.policy(), g.eviction()});
  Engine engine(*model, a.threads);
  std::vector<DivergenceText> res;
  {
    int64_t total = 0;
    for (const Text& t : texts) total += static_cast<int64_t>(t.tokens.size()) - t.prompt;
    Progress progress("divergence", total, "tokens");
    for (size_t i = 0; i < texts.size(); ++i) {
      res.push_back(divergence_text(engine, texts[i].tokens, texts[i].prompt, cells, i, texts[i].answer_from));
      progress.add(res.back().all.n, texts[i].source);
    }
  }
  std::map<std::string, std::vector<size_t>> by_source;
  std::vector<size_t> all;
  for (size_t i = 0; i < texts.size(); ++i) {
    by_source[texts[i].source].push_back(i);
    all.push_back(i);
  }
  std::vector<std::pair<std::string, std::vector<size_t>>> groups(by_source.begin(), by_source.end());
  if (groups.size() > 1) groups.emplace_back("all", all);

  std::ofstream csv, sink_csv;
  nlohmann::json summary = nlohmann::json::array();
  if (!a.out.empty()) {
    std::filesystem::create_directories(a.out);
    csv.open(a.out + "/divergence.csv");
    if (!csv) throw Error(fmt::format("{}/divergence.csv: cannot open for writing", a.out));
    // answer_*: the same means over the final answer's tokens (task files; empty without one).
    csv << "source,text,tokens,prompt,policy,budget,kl,nll,full_nll,top1,rounds,answer_tokens,answer_kl,answer_nll,"
           "answer_full_nll,answer_top1\n";
    for (size_t i = 0; i < texts.size(); ++i)
      for (size_t c = 0; c < cells.size(); ++c) {
        const DivergenceSpan &all_span = res[i].all, &ans = res[i].answer;
        csv << texts[i].source << ',' << texts[i].index << ',' << texts[i].tokens.size() << ',' << texts[i].prompt
            << ',' << grid[c].name << ',' << grid[c].eviction().budget << ',' << fmt::format("{:.6g}", all_span.kl[c])
            << ',' << fmt::format("{:.6f}", all_span.nll[c]) << ',' << fmt::format("{:.6f}", all_span.full_nll) << ','
            << fmt::format("{:.4f}", all_span.top1[c]) << ',' << res[i].stats[c].rounds << ',' << ans.n;
        if (ans.n > 0)
          csv << ',' << fmt::format("{:.6g}", ans.kl[c]) << ',' << fmt::format("{:.6f}", ans.nll[c]) << ','
              << fmt::format("{:.6f}", ans.full_nll) << ',' << fmt::format("{:.4f}", ans.top1[c]);
        else
          csv << ",,,,";
        csv << '\n';
      }
  }
  constexpr SpanOf kAll = &DivergenceText::all, kAnswer = &DivergenceText::answer;
  for (const auto& [source, idx] : groups) {
    double prompt = 0;
    for (size_t i : idx) prompt += static_cast<double>(texts[i].prompt) / static_cast<double>(idx.size());
    const double full_all = full_ppl(res, idx, kAll);
    fmt::print("\n{}: {} texts, prompt {:.0f} tokens (mean); full perplexity {:.4f}; KL in nats/token, intervals "
               "percentile bootstrap 95% over texts\n",
               source, idx.size(), prompt, full_all);
    const std::vector<size_t> ans_idx = with_span(res, idx, kAnswer);
    const double full_answer = ans_idx.empty() ? 0.0 : full_ppl(res, ans_idx, kAnswer);
    std::vector<CellSummary> ans(cells.size());
    for (size_t c = 0; c < cells.size() && !ans_idx.empty(); ++c)
      ans[c] = summarize(res, ans_idx, kAnswer, c, a.bootstrap, a.policy.seed);
    fmt::print("{:<22} {:>6} {:>6} {:>28} {:>11} {:>30} {:>7} {:>7}\n", "policy", "B", "B/len", "KL from full [95% CI]",
               "perplexity", "ΔNLL vs full [95% CI]", "top-1", "rounds");
    for (size_t c = 0; c < cells.size(); ++c) {
      const CellSummary s = summarize(res, idx, kAll, c, a.bootstrap, a.policy.seed);
      double len = 0;
      for (size_t i : idx) len += static_cast<double>(texts[i].tokens.size()) / static_cast<double>(idx.size());
      const double frac = static_cast<double>(grid[c].eviction().budget) / len;
      fmt::print("{:<22} {:>6} {:>6.2f} {:>28} {:>11.4f} {:>30} {:>7.3f} {:>7.1f}\n", grid[c].name,
                 grid[c].eviction().budget, frac, fmt::format("{:.4f} [{:.4f}, {:.4f}]", s.kl, s.kl_lo, s.kl_hi), s.ppl,
                 fmt::format("{:+.4f} [{:+.4f}, {:+.4f}]", s.dnll, s.dnll_lo, s.dnll_hi), s.top1, s.rounds);
      nlohmann::json answer = nullptr;
      if (!ans_idx.empty())
        answer = {{"texts", ans_idx.size()},
                  {"kl", ans[c].kl},
                  {"kl_ci", {ans[c].kl_lo, ans[c].kl_hi}},
                  {"perplexity", ans[c].ppl},
                  {"full_perplexity", full_answer},
                  {"dnll", ans[c].dnll},
                  {"dnll_ci", {ans[c].dnll_lo, ans[c].dnll_hi}},
                  {"top1", ans[c].top1}};
      summary.push_back({{"source", source},
                         {"texts", idx.size()},
                         {"policy", grid[c].name},
                         {"budget", grid[c].eviction().budget},
                         {"budget_fraction", frac},
                         {"kl", s.kl},
                         {"kl_ci", {s.kl_lo, s.kl_hi}},
                         {"perplexity", s.ppl},
                         {"full_perplexity", full_all},
                         {"dnll", s.dnll},
                         {"dnll_ci", {s.dnll_lo, s.dnll_hi}},
                         {"top1", s.top1},
                         {"rounds", s.rounds},
                         {"answer", answer}});
    }
    if (ans_idx.empty()) continue;
    double ans_tokens = 0;
    for (size_t i : ans_idx) ans_tokens += static_cast<double>(res[i].answer.n) / static_cast<double>(ans_idx.size());
    fmt::print("\n{}, final answer tokens only (inside the last \\boxed{{}}, {:.1f} tokens a text, {} texts): what the "
               "answer read from the cache; full perplexity {:.4f}\n",
               source, ans_tokens, ans_idx.size(), full_answer);
    fmt::print("{:<22} {:>6} {:>28} {:>11} {:>30} {:>7}\n", "policy", "B", "KL from full [95% CI]", "perplexity",
               "ΔNLL vs full [95% CI]", "top-1");
    for (size_t c = 0; c < cells.size(); ++c)
      fmt::print("{:<22} {:>6} {:>28} {:>11.4f} {:>30} {:>7.3f}\n", grid[c].name, grid[c].eviction().budget,
                 fmt::format("{:.4f} [{:.4f}, {:.4f}]", ans[c].kl, ans[c].kl_lo, ans[c].kl_hi), ans[c].ppl,
                 fmt::format("{:+.4f} [{:+.4f}, {:+.4f}]", ans[c].dnll, ans[c].dnll_lo, ans[c].dnll_hi), ans[c].top1);
  }
  if (a.sink_mass) {
    std::vector<std::vector<int32_t>> toks;
    for (const Text& t : texts) toks.push_back(t.tokens);
    const AttentionMass m = attention_mass(*model, toks, static_cast<int>(a.sink_k), a.sink_min_position, engine.pool());
    if (!a.out.empty()) {
      sink_csv.open(a.out + "/sink_mass.csv");
      if (!sink_csv) throw Error(fmt::format("{}/sink_mass.csv: cannot open for writing", a.out));
      sink_csv << "layer,head,mass_first_" << m.first_k << ",uniform\n";
    }
    print_sink_mass(m, sink_csv.is_open() ? &sink_csv : nullptr);
  }
  if (!a.out.empty()) {
    std::ofstream js(a.out + "/summary.json");
    js << summary.dump(1) << '\n';
    if (!js || !csv.flush()) throw Error(fmt::format("{}: write failed", a.out));
  }
  return 0;
}

}  // namespace

void add_divergence(CLI::App& root, std::vector<Command>& out) {
  auto d = std::make_shared<DivergenceArgs>();
  auto* cmd = root.add_subcommand(
      "divergence", "KL divergence from `full` and perplexity of each policy over many texts (and sink attention mass)");
  cmd->add_option("-m,--model", d->model, model_help())->required()->check(CLI::ExistingPath);
  cmd->add_option("-f,--file", d->files,
                  "Text file (cut into --texts windows of --length tokens) or task file *.jsonl from `kvevict tasks "
                  "gen` (problem = prompt, trace = continuation); repeat for several")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--texts", d->texts, "Texts per file (windows spread over a text file; first lines of a task file)")
      ->check(int_range(1, limits::kProblems))
      ->capture_default_str();
  cmd->add_option("--length", d->length, "Tokens per text window (BOS included)")
      ->check(int_range(2, limits::kTokens))
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", d->prompt, "Leading tokens of a window that play the prompt (pinned by +prompt)")
      ->check(int_range(1, limits::kTokens))
      ->capture_default_str();
  cmd->add_option("--policies", d->policies, "Comma-separated policies (`full` is always the reference)");
  cmd->add_option("--budgets", d->budgets, "Comma-separated budgets (tokens)");
  cmd->add_option("--budget-fractions", d->fractions, "Comma-separated budgets as fractions of --length, e.g. 0.1,0.2,0.4");
  cmd->add_flag("--gutenberg-body", d->gutenberg, "Use only the text between Project Gutenberg's START/END markers");
  cmd->add_flag("--sink-mass", d->sink_mass, "Also print each query head's attention mass on the first positions");
  cmd->add_option("--sink-positions", d->sink_k, "First positions counted as sinks")
      ->check(int_range(1, 64))
      ->capture_default_str();
  cmd->add_option("--sink-min-position", d->sink_min_position, "Average over query tokens at positions >= this")
      ->check(int_range(1, limits::kTokens))
      ->capture_default_str();
  cmd->add_option("--bootstrap", d->bootstrap, "Bootstrap resamples of the intervals")
      ->check(int_range(1, limits::kBootstrap))
      ->capture_default_str();
  cmd->add_option("-o,--output", d->out, "Directory for divergence.csv (per text and cell), summary.json, sink_mass.csv");
  add_threads_option(*cmd, d->threads);
  add_policy_options(*cmd, d->policy);
  out.push_back({cmd, [d] { return run_divergence(*d); }});
}

}  // namespace kvevict::cli
