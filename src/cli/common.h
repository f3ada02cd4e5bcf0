// Options shared by the CLI subcommands (model, policy, schedule, threads) and their parsing
// into engine types.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/policy_settings.h"
#include "eviction/registry.h"
#include "eviction/schedule.h"
#include "util/field_error.h"
#include "util/limits.h"

namespace kvevict::cli {

/// Help text of every -m/--model option: what Model::load opens.
inline constexpr const char* kModelHelp =
    "GGUF file, or Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json)";

/// The name a -m path shows as: a file's name without its extension ("stories260K"), a
/// directory's name as it is ("Qwen3-0.6B", not "Qwen3-0"); trailing slashes ignored.
/// `with_extension` keeps a file's extension ("stories260K.gguf").
std::string model_display_name(const std::string& path, bool with_extension = false);

/// Bytes of a -m path: the file's size, or the summed sizes of a checkpoint directory's files.
uint64_t model_path_bytes(const std::string& path);
/// Content digest of a model path (a GGUF file, or a directory's regular files in name order,
/// each prefixed by its name and size): FNV-1a 64 over every byte, as 16 hex digits. Reads the
/// whole model once (~1 s per GB); eval keys its output directory with it. Throws kvevict::Error
/// naming the file when it cannot be read.
std::string model_path_digest(const std::string& path);

/// Policy and schedule options as typed on the command line.
struct PolicyArgs {
  std::string policy;  ///< empty: `random` when --budget is given, else `full`
  int64_t budget = 0;  ///< 0 = not given
  int64_t recent = 64;
  bool recent_given = false;  ///< --buffer was on the command line (not the default)
  std::optional<int64_t> interval;  ///< --round-interval; unset = r
  std::optional<int> sinks;
  bool protect_prompt = false, no_protect_prompt = false;
  std::string long_prompt = "pin-head";
  std::string position_mode = "logical";
  uint64_t seed = 0;
  std::vector<std::string> params;
};

/// Adds --policy/--budget/--buffer/--round-interval/--sinks/--protect-prompt/--no-protect-prompt/--long-prompt/
/// --position-mode/-s,--seed/--param to `cmd`.
void add_policy_options(CLI::App& cmd, PolicyArgs& a, bool with_policy = true);

/// The settings the policy options describe (engine/policy_settings.h builds the policy from
/// them). Throws kvevict::Error for --protect-prompt with --no-protect-prompt.
PolicySettings policy_settings(const PolicyArgs& a);

// Upper bounds of the count and size options (checked while the command line is parsed, before
// any file is read): kvevict::limits in util/limits.h, shared with the server.

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

/// bench's -r is the recent buffer r, llama-bench's the repetition count (default 5): warns,
/// naming `repetitions` (what sets them here), when a given -r is at most 10, which looks like
/// one rather than a buffer.
void warn_if_recent_looks_like_reps(int64_t r, const std::string& repetitions);

/// Help text of -m/--model: "GGUF model (general.architecture llama, qwen2, qwen3, phi3)", from
/// the architecture table (model/arch.h).
std::string model_help();

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
