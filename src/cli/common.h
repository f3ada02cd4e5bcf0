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
  std::string policy;      ///< empty: `random` when --budget is given, else `full`
  int64_t budget = 0;      ///< 0 = not given
  int64_t recent = 64;
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

/// CLI11 check for an integer option: the value must be >= lo. The error reads
/// "--name: must be an integer >= lo (got X)" (CLI11 prefixes the option name).
CLI::Validator at_least(long long lo);

/// CLI11 check for a seed (uint64): digits only, so "-1" is an error instead of wrapping to 2^64-1.
CLI::Validator seed_value();

/// Builds the policy named `name` with the shared overrides. Throws kvevict::Error.
/// With `params` given, selector parameters are read from (and marked used in) that object and
/// not checked here: the caller checks once for a whole grid.
Policy build_policy(const PolicyArgs& a, const std::string& name, const SelectorParams* params = nullptr);

/// Builds the schedule config. For evicting policies --budget is required (Error otherwise).
EvictionConfig build_eviction(const PolicyArgs& a, const Policy& p);

/// Reads a whole file. Throws kvevict::Error naming the path if it cannot be read.
std::string read_file(const std::string& path);

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
/// `serve` (OpenAI-compatible HTTP server) and `bench serve` — cli/serve.cpp, cli/bench_serve.cpp.
void add_serve(CLI::App& root, std::vector<Command>& out);


}  // namespace kvevict::cli
