// `kvevict calibrate`: TriAttention's query statistics from a corpus, written as JSON for
// `--policy triattention --param stats=FILE`.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli/common.h"
#include "cli/progress.h"
#include "eval/calibrate.h"
#include "eval/perplexity.h"
#include "model/model.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict::cli {
namespace {

struct CalibrateArgs {
  std::string model, file, out;
  int64_t tokens = 50000;
  int64_t ctx = 0;
  int threads = 0;
  bool gutenberg = false;
};

int run_calibrate(const CalibrateArgs& a) {
  if (a.tokens < 2) throw Error(fmt::format("--tokens {}: must be >= 2", a.tokens));
  if (a.ctx < 0 || a.ctx == 1) throw Error(fmt::format("-c {}: must be 0 (the model's context) or >= 2", a.ctx));
  std::string text = read_file(a.file, "-f");  // before the model: a bad file fails fast
  const auto model = Model::load(a.model);
  if (a.gutenberg) text = gutenberg_body(text);
  std::vector<int32_t> tokens = model->tokenizer().encode(text, true);
  if (static_cast<int64_t>(tokens.size()) > a.tokens)
    tokens.resize(static_cast<size_t>(a.tokens));
  else if (static_cast<int64_t>(tokens.size()) < a.tokens)
    warn(fmt::format("{} holds only {} tokens, fewer than --tokens {}", a.file, tokens.size(), a.tokens));
  ThreadPool pool(a.threads);
  QueryStats stats;
  {
    Progress progress("calibrate", static_cast<int64_t>(tokens.size()), "tokens");
    int64_t last = 0;
    stats = calibrate_query_stats(*model, tokens, a.ctx, pool, [&](int64_t done, int64_t) {
      progress.add(done - last);
      last = done;
    });
  }
  stats.model = a.model;
  stats.source = a.file;
  save_query_stats(stats, a.out);
  const int64_t ctx = a.ctx > 0 ? a.ctx : model->config().context_length;
  fmt::print(
      "[kvevict] calibrate: {} tokens of {} in {} chunk(s) of <= {} | {} layers x {} query heads x {} bands -> {}\n",
      tokens.size(), a.file, (static_cast<int64_t>(tokens.size()) + ctx - 1) / ctx, ctx, stats.n_layers, stats.n_heads,
      stats.n_bands(), a.out);
  return 0;
}

}  // namespace

void add_calibrate(CLI::App& root, std::vector<Command>& out) {
  auto c = std::make_shared<CalibrateArgs>();
  auto* cmd = root.add_subcommand("calibrate",
                                  "Write TriAttention's query statistics (pre-RoPE query means per band) for a model");
  cmd->add_option("-m,--model", c->model, model_help())->required()->check(CLI::ExistingPath);
  cmd->add_option("-f,--file", c->file, "Calibration text (not the evaluation set)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", c->out, "Statistics file to write (JSON)")->required();
  cmd->add_option("--tokens", c->tokens, "Use the first N tokens (BOS included)")
      ->check(int_range(2, limits::kCorpusTokens))
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", c->ctx, "Tokens per prefill chunk (0 = the model's context length)")
      ->check(int_range(0, limits::kTokens))
      ->capture_default_str();
  cmd->add_flag("--gutenberg-body", c->gutenberg, "Use only the text between Project Gutenberg's START/END markers");
  add_threads_option(*cmd, c->threads);
  out.push_back({cmd, [c] { return run_calibrate(*c); }});
}

}  // namespace kvevict::cli
