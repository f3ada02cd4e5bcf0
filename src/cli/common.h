// Options shared by the CLI subcommands (model, policy, schedule, threads) and their parsing
// into engine types.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "eviction/registry.h"
#include "eviction/schedule.h"

namespace kvevict::cli {

/// Policy and schedule options as typed on the command line.
struct PolicyArgs {
  std::string policy;  ///< empty: `random` when --budget is given, else `full`
  int64_t budget = 0;  ///< 0 = not given
  int64_t recent = 64;
  bool recent_given = false;  ///< --buffer was on the command line (not the default)
  std::optional<int> sinks;
  bool protect_prompt = false, no_protect_prompt = false;
  std::string long_prompt = "pin-head";
  std::string position_mode = "logical";
  uint64_t seed = 0;
  std::vector<std::string> params;
};

/// Adds --policy/--budget/--buffer/--sinks/--protect-prompt/--no-protect-prompt/--long-prompt/
/// --position-mode/--seed/--param to `cmd`.
void add_policy_options(CLI::App& cmd, PolicyArgs& a, bool with_policy = true);

/// The policy to run when --policy was not given: `random` with a budget, `full` without.
std::string default_policy(const PolicyArgs& a);

/// Upper bounds of the count and size options, checked while the command line is parsed, before
/// any file is read. They are far above any sensible run and far below what would exhaust memory
/// or never finish: a value past one is a typo (e.g. `--rollouts 100000000`), not a workload.
/// docs/cli.md ("Errors") lists them; the flag table in CONTRIBUTING.md names the options.
namespace limits {
inline constexpr long long kTokens =
    1 << 20;  ///< -n, -c, --max-length, --budget(s), --buffer, --sinks, lengths (tokens)
inline constexpr long long kCorpusTokens = 100'000'000;  ///< --tokens of perplexity/calibrate
inline constexpr long long kRollouts = 1024;             ///< eval --rollouts (decoded as parallel sequences)
inline constexpr long long kBootstrap = 1'000'000;       ///< eval --bootstrap resamples
inline constexpr long long kProblems = 10'000'000;       ///< --limit, tasks --count, --chunks
inline constexpr long long kShards = 100'000;            ///< eval --shard i/N: N
inline constexpr long long kTrials = 100'000;            ///< probe --trials, --restate
inline constexpr long long kReps = 1000;                 ///< bench --reps
inline constexpr long long kBatch = 4096;                ///< bench --batch, --max-batch (sequences)
inline constexpr int kThreadsPerCore = 4;                ///< -t <= 4 x cores unless --force-threads
inline constexpr long long kThreadsForced = 4096;        ///< -t with --force-threads
/// Bytes of a file read whole into memory (text of perplexity/calibrate -f, eval/tasks eval -f,
/// probe --filler): 1 GiB, about 250M tokens, above limits::kCorpusTokens.
inline constexpr long long kFileBytes = 1LL << 30;
}  // namespace limits

/// CLI11 check for an integer option: the value must be >= lo. The error reads
/// "--name X: must be >= lo" ("must be an integer >= lo" when X is not one; CLI11 writes
/// "--name: must be ... (got X)" and main.cpp rewrites it).
CLI::Validator at_least(long long lo);

/// CLI11 check for an integer option in [lo, hi]. The error reads "--name X: must be in [lo, hi]".
CLI::Validator int_range(long long lo, long long hi);

/// The thread cap without --force-threads: limits::kThreadsPerCore x the cores the OS reports.
int max_threads();

/// Adds `-t,--threads N` (0 = all cores; at most max_threads() unless `--force-threads` is also
/// given, then at most limits::kThreadsForced) to `cmd`. `help` describes what the threads do.
/// The cap is checked once the subcommand is parsed (CLI::ValidationError, one line).
void add_threads_option(CLI::App& cmd, int& threads, const std::string& help = "Threads, 0 = all cores");

/// Rewrites old spellings of options to the current ones (hidden aliases: `eval --tasks` ->
/// `--file`, `--out` -> `--output`, `--max-new-tokens` -> `--n-predict`, `calibrate --ctx` ->
/// `--ctx-size`, `tasks --n` -> `--count`, `-i/--input` -> `-f/--file`, `-j/--jobs` ->
/// `-t/--threads`). Only arguments after the subcommand name are rewritten; `--old=value` too.
std::vector<std::string> apply_aliases(const std::vector<std::string>& args);

/// "did you mean" for the arguments CLI11 could not place: for each unknown `-x`/`--xyz` in
/// `extras`, the closest option name of `cmd` (and its parents). Returns "" when nothing is close.
std::string suggest_options(const CLI::App& cmd, const std::vector<std::string>& extras);

/// CLI11 check for a seed (uint64): digits only, so "-1" is an error instead of wrapping to 2^64-1.
CLI::Validator seed_value();

/// Builds the policy named `name` with the shared overrides and its share of the `--param`
/// items (params_for_policy). Throws kvevict::Error. With check_params, an item this policy does
/// not take is an error; a grid passes false and calls check_param_items once for all its policies.
Policy build_policy(const PolicyArgs& a, const std::string& name, bool check_params = true);

/// Builds the schedule config. For evicting policies --budget is required (Error otherwise).
EvictionConfig build_eviction(const PolicyArgs& a, const Policy& p);

/// When no policy of a run evicts (`full`, `full+prompt`) but --budget, --buffer or --sinks was
/// given, the warning line saying they are unused (a policy that keeps every token has no budget,
/// recent buffer or sinks); "" otherwise.
std::string unused_schedule_warning(const PolicyArgs& a, const std::vector<Policy>& policies);

/// Reads a whole file given as `option` (e.g. "-f"), at most limits::kFileBytes bytes; pipes and
/// devices are read up to the limit (read_file_limited). Throws kvevict::Error naming the option,
/// the path and, when the file is too large, the limit.
std::string read_file(const std::string& path, const std::string& option);

/// Splits "a,b,c" into parts (empty parts rejected with an Error naming `option`).
std::vector<std::string> split_list(const std::string& s, const std::string& option);

/// Prints "kvevict: warning: <msg>" to stderr.
void warn(const std::string& msg);

/// A subcommand: its CLI11 app and what runs once it was parsed (returns the exit code).
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

/// Each subcommand file defines one adder; main.cpp lists them (one line per subcommand).
void add_generate(CLI::App& root, std::vector<Command>& out);
void add_perplexity(CLI::App& root, std::vector<Command>& out);
void add_policies(CLI::App& root, std::vector<Command>& out);
void add_tasks(CLI::App& root, std::vector<Command>& out);
/// `tools` (synth-gguf) — cli/tools.cpp.
void add_tools(CLI::App& root, std::vector<Command>& out);
/// `bench` (decode, evict-round, throughput) — cli/bench.cpp.
void add_bench(CLI::App& root, std::vector<Command>& out);
void add_calibrate(CLI::App& root, std::vector<Command>& out);
void add_keeplog(CLI::App& root, std::vector<Command>& out);
void add_eval(CLI::App& root, std::vector<Command>& out);
void add_merge(CLI::App& root, std::vector<Command>& out);
void add_probe(CLI::App& root, std::vector<Command>& out);
/// `divergence` (KL from full and perplexity over many texts, sink attention mass) — cli/divergence.cpp.
void add_divergence(CLI::App& root, std::vector<Command>& out);
/// `serve` (OpenAI-compatible HTTP server) and `bench serve` — cli/serve.cpp, cli/bench_serve.cpp.
void add_serve(CLI::App& root, std::vector<Command>& out);

}  // namespace kvevict::cli
