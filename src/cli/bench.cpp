// `kvevict bench decode|evict-round|throughput`: speed measurements (bench/bench.h), printed as
// Markdown tables and written as JSON with --json.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <fstream>
#include <optional>
#include <thread>

#include "bench/bench.h"
#include "cli/common.h"
#include "cli/progress.h"
#include "eviction/registry.h"
#include "util/error.h"

namespace kvevict::cli {
namespace {

struct CommonArgs {
  std::string model, kv_type = "f32", json;
  int threads = 0, reps = 5;
  uint64_t seed = 0;
  int64_t recent = 64;
  bool recent_given = false;       ///< -r/--buffer was on the command line
  std::optional<int64_t> interval;  ///< --round-interval; unset = r
  double max_load = -1;       ///< wait until the 1-minute load is below this (negative: don't wait)
  int max_wait_s = 600;
};

void add_common(CLI::App* cmd, CommonArgs& a, bool model_required = true) {
  auto* model = cmd->add_option("-m,--model", a.model, model_help())->check(CLI::ExistingPath);
  if (model_required) model->required();
  add_threads_option(*cmd, a.threads);
  cmd->add_option("--kv-type", a.kv_type, "KV cache element type: f32 or f16")
      ->check(CLI::IsMember({"f32", "f16"}))
      ->capture_default_str();
  cmd->add_option("--reps", a.reps, "Repetitions per figure (median, min, max reported)")
      ->check(int_range(1, limits::kReps))
      ->capture_default_str();
  cmd->add_option("--seed", a.seed, "Seed of prompts and synthetic cache contents")
      ->check(seed_value())
      ->capture_default_str();
  cmd->add_option("--buffer,-r", a.recent, "Recent buffer r (llama-bench's -r, repetitions, is --reps here)")
      ->check(int_range(1, limits::kTokens))
      ->each([&a](const std::string&) { a.recent_given = true; })
      ->capture_default_str();
  cmd->add_option("--round-interval", a.interval,
                  "Round interval s: decode steps between eviction rounds, the cache peaking at B + s (default: r)")
      ->check(int_range(1, limits::kTokens));
  cmd->add_option("--json", a.json, "Write all results (with samples and load averages) to this JSON file");
  cmd->add_option("--max-load", a.max_load, "Wait until the 1-minute load average is below this before measuring");
  cmd->add_option("--max-wait", a.max_wait_s,
                  "Give up waiting for --max-load after this many seconds (then measure anyway, noted)")
      ->check(int_range(0, 86400))
      ->capture_default_str();
}

BenchCommon common(const CommonArgs& a) {
  BenchCommon c;
  c.model = a.model;
  c.threads = a.threads;
  c.kv_type = parse_kv_type(a.kv_type);
  c.reps = a.reps;
  c.seed = a.seed;
  c.recent = a.recent;
  c.interval = a.interval.value_or(0);
  if (a.threads < 0) throw Error(fmt::format("--threads {}: must be >= 0", a.threads));
  if (a.recent < 1) throw Error(fmt::format("--buffer {}: must be >= 1", a.recent));
  if (a.recent_given) warn_if_recent_looks_like_reps(a.recent, fmt::format("--reps (now {})", a.reps));
  return c;
}

// Waits for a quiet machine when asked; returns a note for the JSON.
std::string wait_for_load(const CommonArgs& a) {
  if (a.max_load < 0) return "not waited";
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    const double l = load_average_1m();
    if (l >= 0 && l < a.max_load) return fmt::format("1-min load {:.2f} < {:.2f}", l, a.max_load);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited > a.max_wait_s) {
      warn(fmt::format("load average still {} after {} s; measuring anyway", load_average(), a.max_wait_s));
      return fmt::format("gave up after {} s at load {}", a.max_wait_s, load_average());
    }
    std::this_thread::sleep_for(std::chrono::seconds(10));
  }
}

/// Warns when the 1-minute load average says other work shared the cores (`when`: "before"/"after").
void warn_if_loaded(const char* when) {
  const double l = load_average_1m();
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  if (l > 0.5 * cores)
    warn(
        fmt::format("1-minute load average {:.2f} on {} cores {} measuring: other work shares the machine, so times "
                    "and %-of-roofline figures are unreliable (wait with --max-load, or compare within one run)",
                    l, cores, when));
}

int finish(const CommonArgs& a, nlohmann::json j, const std::string& wait_note) {
  warn_if_loaded("after");
  j["load_wait"] = wait_note;
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    if (!f) throw Error(fmt::format("{}: cannot open for writing", a.json));
    f << j.dump(2) << "\n";
    if (!f) throw Error(fmt::format("{}: write failed", a.json));
    fmt::print("# wrote {}\n", a.json);
  }
  return 0;
}

std::vector<int64_t> parse_ints(const std::string& s, const std::string& option) {
  std::vector<int64_t> out;
  for (const std::string& p : split_list(s, option)) {
    try {
      size_t used = 0;
      const long long v = std::stoll(p, &used);
      if (used != p.size() || v <= 0 || v > limits::kTokens) throw std::invalid_argument(p);
      out.push_back(v);
    } catch (const std::exception&) {
      throw Error(fmt::format("{} {}: '{}' must be an integer in [1, {}]", option, s, p, limits::kTokens));
    }
  }
  return out;
}

}  // namespace

void add_bench(CLI::App& root, std::vector<Command>& out) {
  auto* bench = root.add_subcommand("bench", "Speed benchmarks: decode (roofline), evict-round, throughput");
  bench->require_subcommand(1);

  // decode
  auto da = std::make_shared<CommonArgs>();
  auto dc = std::make_shared<DecodeBenchConfig>();
  auto dl = std::make_shared<std::string>("1024,2048,4096,8192,16384,32768");
  auto* dec = bench->add_subcommand(
      "decode", "Decode tok/s vs the copy-bandwidth roofline; step time vs generated length, full vs bounded");
  add_common(dec, *da, false);
  auto dtypes = std::make_shared<std::string>("q8_0");
  auto no_sweep = std::make_shared<bool>(false);
  bool& dc_no_sweep = *no_sweep;
  auto dprefill = std::make_shared<std::string>("128");
  auto* dshape = dec->add_option(
      "--shape", dc->shape,
      "Instead of --model: synthesise this shape (tools synth-gguf) in each --type and compare them in one run");
  dec->add_option("--type", *dtypes,
                  "With --shape: weight types / mixes, comma-separated (e.g. q4_0,q4_k_m,q5_k_m,q6_k,q8_0)")
      ->capture_default_str();
  dec->add_option("--synth-dir", dc->synth_dir,
                  "With --shape: where the synthesised models are written (reused when present)")
      ->capture_default_str();
  dec->add_option("--prefill", *dprefill, "Prompt lengths of the prefill table, comma-separated ('none': no table)")
      ->capture_default_str();
  dec->add_flag("--no-sweep", dc_no_sweep, "Skip the step-time-vs-length sweep (always skipped with --shape)");
  dec->add_option("--steps", dc->steps, "Decode steps per repetition (bounded runs: 2 r)")
      ->check(int_range(1, limits::kTokens))
      ->capture_default_str();
  dec->add_option("--lengths", *dl, "Generated lengths of the sweep (comma-separated)")->capture_default_str();
  dec->add_option("--max-length", dc->max_length, "Skip sweep lengths above this")
      ->check(int_range(1, limits::kTokens))
      ->capture_default_str();
  dec->add_option("--budget,-B", dc->budget, "Budget B of the bounded runs")
      ->check(int_range(1, limits::kTokens))
      ->capture_default_str();
  dec->add_option("--policy", dc->policy, "Policy of the bounded runs")->capture_default_str();

  // evict-round
  auto ea = std::make_shared<CommonArgs>();
  auto ec = std::make_shared<EvictBenchConfig>();
  auto eb = std::make_shared<std::string>("256,1024,4096");
  auto ep = std::make_shared<std::string>();
  auto* ev =
      bench->add_subcommand("evict-round", "Per-layer eviction round cost (scoring, compaction) per policy and budget");
  add_common(ev, *ea);
  ev->add_option("--budgets", *eb, "Budgets B (comma-separated)")->capture_default_str();
  ev->add_option("--policies", *ep, "Policies (comma-separated; default: every evicting policy)");
  ev->add_option("--param", ec->params,
                 "Selector parameter [POLICY:]NAME=VALUE (repeatable; with POLICY: only that policy)");
  ev->add_option("--warmup", ec->warmup_steps, "Real decode steps before the first timed round")
      ->check(int_range(0, limits::kTokens))
      ->capture_default_str();
  ev->add_option("--max-cell-seconds", ec->max_cell_seconds,
                 "Stop repeating a (policy, B) cell after this many seconds")
      ->capture_default_str();

  // throughput
  auto ta = std::make_shared<CommonArgs>();
  auto tc = std::make_shared<ThroughputBenchConfig>();
  auto tp = std::make_shared<std::string>();
  auto pool_mib = std::make_shared<int64_t>(2048);
  auto* tp_cmd = bench->add_subcommand("throughput", "Batched decode tok/s: iso-batch and iso-memory, per policy");
  add_common(tp_cmd, *ta);
  ta->reps = 3;
  tp_cmd->add_option("--batch", tc->batch, "Iso-batch size")
      ->check(int_range(1, limits::kBatch))
      ->capture_default_str();
  tp_cmd->add_option("--budget,-B", tc->budget, "Budget B")
      ->check(int_range(1, limits::kTokens))
      ->capture_default_str();
  tp_cmd->add_option("--start-length", tc->start_length, "Generated tokens before timing starts")
      ->check(int_range(0, limits::kTokens))
      ->capture_default_str();
  tp_cmd->add_option("--steps", tc->steps, "Timed batched steps per repetition (r or more, so rounds fall inside)")
      ->check(int_range(1, limits::kTokens))
      ->capture_default_str();
  tp_cmd->add_option("--pool-mib", *pool_mib, "Iso-memory KV pool (MiB)")
      ->check(int_range(1, 1 << 20))
      ->capture_default_str();
  tp_cmd->add_option("--max-batch", tc->max_batch, "Largest batch actually run in iso-memory")
      ->check(int_range(1, limits::kBatch))
      ->capture_default_str();
  tp_cmd->add_option("--policies", *tp, "Policies (comma-separated; default: all)");
  tp_cmd->add_option("--param", tc->params,
                     "Selector parameter [POLICY:]NAME=VALUE (repeatable; with POLICY: only that policy)");
  auto probs_kernel = std::make_shared<std::string>();
  tp_cmd->add_option("--probs-kernel", *probs_kernel,
                     "Also measure these policies (comma-separated) with and without the attention kernel forced "
                     "to compute probabilities (ignored), in alternating blocks of 8 steps: the probability "
                     "kernel's cost for the same selection");
  auto tables = std::make_shared<std::string>("iso-batch,iso-memory");
  tp_cmd
      ->add_option("--tables", *tables,
                   "Tables to run: iso-batch, iso-memory, interleaved (every policy in each repetition, in a "
                   "seeded random order, with the --baseline policy's gain over each; comma-separated)")
      ->capture_default_str();
  tp_cmd->add_option("--baseline", tc->baseline, "Interleaved table: the policy whose gain over the others is given")
      ->capture_default_str();

  out.push_back({bench, [=] {
                   if (dec->parsed()) {
                     if (da->model.empty() == dc->shape.empty())
                       throw Error("bench decode: give either --model or --shape (with --type)");
                     if (dshape->count() == 0 && dec->count("--type") > 0)
                       throw Error("bench decode: --type needs --shape (a --model file has its own types)");
                     dc->common = common(*da);
                     dc->lengths = parse_ints(*dl, "--lengths");
                     dc->types = split_list(*dtypes, "--type");
                     dc->prefill_lengths =
                         *dprefill == "none" ? std::vector<int64_t>{} : parse_ints(*dprefill, "--prefill");
                     dc->sweep = !*no_sweep;
                     auto progress = std::make_shared<Progress>(
                         "bench decode", 2 * static_cast<int64_t>(dc->lengths.size()), "cells", 0, false);
                     dc->common.on_cell = [progress](const std::string& label) { progress->add(1, label); };
                     const std::string note = wait_for_load(*da);
                     warn_if_loaded("before");
                     return finish(*da, bench_decode(*dc), note);
                   }
                   if (ev->parsed()) {
                     ec->common = common(*ea);
                     ec->budgets = parse_ints(*eb, "--budgets");
                     if (!ep->empty()) ec->policies = split_list(*ep, "--policies");
                     const int64_t n_pol = ec->policies.empty() ? static_cast<int64_t>(all_policies().size()) - 1
                                                                : static_cast<int64_t>(ec->policies.size());
                     auto progress = std::make_shared<Progress>(
                         "bench evict-round", n_pol * static_cast<int64_t>(ec->budgets.size()), "cells", 0, false);
                     ec->common.on_cell = [progress](const std::string& label) { progress->add(1, label); };
                     const std::string note = wait_for_load(*ea);
                     warn_if_loaded("before");
                     return finish(*ea, bench_evict_round(*ec), note);
                   }
                   if (tp_cmd->parsed()) {
                     tc->common = common(*ta);
                     tc->pool_bytes = *pool_mib * (int64_t{1} << 20);
                     if (!tp->empty()) tc->policies = split_list(*tp, "--policies");
                     if (!probs_kernel->empty()) tc->probs_kernel = split_list(*probs_kernel, "--probs-kernel");
                     tc->iso_batch = tc->iso_memory = tc->interleaved = false;
                     for (const std::string& t : split_list(*tables, "--tables")) {
                       if (t == "iso-batch")
                         tc->iso_batch = true;
                       else if (t == "iso-memory")
                         tc->iso_memory = true;
                       else if (t == "interleaved")
                         tc->interleaved = true;
                       else
                         throw Error(
                             fmt::format("--tables: unknown table '{}' (iso-batch, iso-memory, interleaved)", t));
                     }
                     if (!tc->interleaved && tp_cmd->count("--baseline") > 0)
                       throw Error("--baseline is the interleaved table's: add interleaved to --tables");
                     const int64_t n_pol = tc->policies.empty() ? static_cast<int64_t>(all_policies().size())
                                                                : static_cast<int64_t>(tc->policies.size());
                     auto progress = std::make_shared<Progress>(
                         "bench throughput",
                         n_pol * (tc->iso_batch + tc->iso_memory) + tc->interleaved +
                             static_cast<int64_t>(tc->probs_kernel.size()),
                         "cells", 0, false);
                     tc->common.on_cell = [progress](const std::string& label) { progress->add(1, label); };
                     check_throughput(*tc);  // bad arguments fail now, not after waiting for a quiet machine
                     const std::string note = wait_for_load(*ta);
                     warn_if_loaded("before");
                     const int64_t s = round_interval(tc->common);
                     if (int64_t{tc->steps} * ta->reps < s)
                       warn(fmt::format("--steps {} x --reps {} < the round interval {}: the timed steps may hold no "
                                        "eviction round",
                                        tc->steps, ta->reps, s));
                     return finish(*ta, bench_throughput(*tc), note);
                   }
                   return 2;
                 }});
}

}  // namespace kvevict::cli
