// `kvevict keeplog summarize FILE...`: a table of averages over keep logs written by
// `kvevict generate --keep-log FILE`.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli/common.h"
#include "eval/keeplog.h"

namespace kvevict::cli {
namespace {

struct KeepLogArgs {
  std::vector<std::string> files;
  bool by_layer = false;
};

int run_summarize(const KeepLogArgs& a) {
  std::vector<KeepLogAverages> rows;
  for (const std::string& f : a.files) {
    auto r = summarize_keep_log(f, a.by_layer);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  fmt::print("{}", format_keep_log_table(rows));
  fmt::print(
      "prompt: per-KV-head prompt survival; prompt_U: prompt kept by >= 1 KV head; union: positions seen kept by "
      ">= 1 KV head; jaccard: mean pairwise Jaccard of the heads' selected slots; coverage: distinct selected "
      "positions / (KV heads x K_sel); bands: per-head survival by position band\n");
  return 0;
}

}  // namespace

void add_keeplog(CLI::App& root, std::vector<Command>& out) {
  auto a = std::make_shared<KeepLogArgs>();
  auto* kl = root.add_subcommand("keeplog", "Work with keep logs (kvevict generate --keep-log)");
  kl->require_subcommand(1);
  auto* sum = kl->add_subcommand("summarize", "Print the averages of one or more keep logs as a table");
  sum->add_option("files", a->files, "Keep-log files (JSON lines)")->required();
  sum->add_flag("--by-layer", a->by_layer, "Add one row per layer");
  out.push_back({kl, [a] { return run_summarize(*a); }});
}

}  // namespace kvevict::cli
