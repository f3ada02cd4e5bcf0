// `kvevict eval`: accuracy of policies x budgets on a task file, with the paper's statistics,
// resumable output, shards; and `kvevict merge`: one report from several shard directories.
#include <fmt/format.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <thread>

#include "cli/common.h"
#include "cli/grid.h"
#include "cli/progress.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "eval/plots.h"
#include "eval/prompt.h"
#include "eval/results.h"
#include "eval/runner.h"
#include "eval/summary.h"
#include "eval/task_file.h"
#include "model/chat_template.h"
#include "model/model.h"
#include "util/error.h"

namespace kvevict::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

/// Budgets of `eval` when neither --budget nor --budgets is given.
constexpr const char* kDefaultBudgets = "256";

struct EvalArgs {
  std::string model, tasks, format = "auto", bad_lines = "stop", policies = "full,random", budgets, reference = "full",
                            out = "kvevict-eval", shard = "0/1", tmpl = "auto";
  int64_t limit = 0;
  int rollouts = 2;
  float temp = 0.6f, top_p = 0.95f;
  int top_k = 0;
  int64_t max_length = 32768, max_new_tokens = 0;
  std::optional<bool> math_suffix;
  bool resume = true, no_plots = false;
  bool chat = false, no_think = false;  ///< --chat (= --template chat), --no-think
  std::string chat_template;            ///< --chat-template NAME
  int threads = 0, bootstrap = 10000;
  double margin = kDefaultMargin;  ///< --margin: TOST equivalence margin, accuracy units
  int64_t debug_delay_ms = 0;
  PolicyArgs policy;
};

/// The TOST margin must lie in (0, 1) (summary.h); checked before any work is done.
void check_margin(double margin) {
  if (!(margin > 0 && margin < 1))
    throw Error(fmt::format("--margin {}: must be an accuracy difference in (0, 1), e.g. 0.05 for 5 points", margin));
}

/// Parses "i/N" with 0 <= i < N. Throws kvevict::Error.
std::pair<int, int> parse_shard(const std::string& s) {
  int i = -1, n = 0;
  char tail = 0;
  if (std::sscanf(s.c_str(), "%d/%d%c", &i, &n, &tail) != 2 || n < 1 || i < 0 || i >= n || n > limits::kShards)
    throw Error(fmt::format("--shard {}: must be i/N with 0 <= i < N <= {} (e.g. 0/4)", s, limits::kShards));
  return {i, n};
}

json eviction_json(const PolicyArgs& a) {
  json j{{"recent", a.recent},
              {"sinks", a.sinks ? json(*a.sinks) : json(nullptr)},
              {"protect_prompt",
               a.protect_prompt          ? json(true)
                   : a.no_protect_prompt ? json(false)
                                         : json(nullptr)},
              {"long_prompt", a.long_prompt},
              {"positions", a.position_mode},
              {"params", a.params}};
  // Only when given, so a run's settings (and the resume check that compares them) read as they
  // did before the option existed.
  if (a.interval) j["round_interval"] = *a.interval;
  return j;
}

/// Writes summary files, prints the table, draws the plots.
void report(const std::string& dir, const EvalSettings& settings, const std::vector<RolloutRecord>& records,
            bool plots, double margin) {
  const EvalSummary s = summarize(settings, records, margin);
  write_summary_files(dir, s);
  fmt::print("{}", summary_markdown(s));
  std::fflush(stdout);
  if (!plots) return;
  const std::string why = run_plot_script({"eval", (fs::path(dir) / "summary.json").string(), dir});
  if (!why.empty()) warn("plots skipped: " + why);
}

int run_eval(const EvalArgs& a) {
  // 1. Validate every option before loading anything.
  SamplerConfig sampler{a.temp, a.top_p, a.top_k, a.policy.seed};
  validate_sampler(sampler);
  if (a.rollouts < 1 || a.rollouts > limits::kRollouts)
    throw Error(fmt::format("--rollouts {}: must be in [1, {}]", a.rollouts, limits::kRollouts));
  if (a.max_length < 2) throw Error(fmt::format("--max-length {}: must be >= 2", a.max_length));
  if (a.max_new_tokens < 0) throw Error(fmt::format("--max-new-tokens {}: must be >= 0", a.max_new_tokens));
  if (a.limit < 0) throw Error(fmt::format("--limit {}: must be >= 0", a.limit));
  if (a.bootstrap < 100) throw Error(fmt::format("--bootstrap {}: use at least 100 resamples", a.bootstrap));
  check_margin(a.margin);
  const auto [shard_index, shard_count] = parse_shard(a.shard);
  const std::vector<std::string> names = split_list(a.policies, "--policies");
  // Neither --budget nor --budgets: the default grid, so `--policies full,random` runs as is.
  const std::string budgets = a.budgets.empty() && a.policy.budget == 0 ? std::string(kDefaultBudgets) : a.budgets;
  std::vector<EvalCell> cells;
  std::vector<Policy> grid_policies;
  for (GridEntry& g : policy_grid(a.policy, names, budget_grid(budgets, a.policy.budget))) {
    grid_policies.push_back(g.policy());
    EvalCell c;
    c.spec = {g.name, g.eviction().budget};
    c.kv = g.kv;
    cells.push_back(std::move(c));
  }
  if (const std::string w = unused_schedule_warning(a.policy, grid_policies); !w.empty()) warn(w);
  if (std::find(names.begin(), names.end(), a.reference) == names.end())
    throw Error(fmt::format("--reference '{}' is not among --policies ({})", a.reference, a.policies));
  const TemplateChoice tmpl = parse_template_choice(a.chat ? "chat" : a.tmpl);
  if (!a.chat_template.empty()) (void)ChatTemplate::by_name(a.chat_template);  // bad name: fail early

  // 2. Tasks (bad lines stop or are skipped), then the model and the prompt template.
  TaskReadOptions ro;
  ro.format = parse_task_format(a.format);
  if (a.bad_lines != "stop" && a.bad_lines != "skip")
    throw Error(fmt::format("--bad-lines '{}': expected stop or skip", a.bad_lines));
  ro.on_bad_line = a.bad_lines == "skip" ? BadLinePolicy::Skip : BadLinePolicy::Stop;
  ro.limit = a.limit;
  ro.warn = warn;
  ro.max_bytes = limits::kFileBytes;
  ro.option = "-f";
  const EvalTaskFile tf = read_tasks(a.tasks, ro);
  const auto model = Model::load(a.model);
  PromptOptions po;
  po.choice = tmpl;
  po.math_suffix = a.math_suffix.value_or(tf.format != TaskFormat::Kvevict);
  const PromptBuilder prompts(*model, po, warn, ChatPromptOptions{a.chat_template, !a.no_think});

  EvalSettings st;
  st.model_file = model_display_name(a.model, true);
  st.model_bytes = model_path_bytes(a.model);
  st.model_digest = model_path_digest(a.model);
  st.tasks_file = fs::path(a.tasks).filename().string();
  st.tasks_format = task_format_name(tf.format);
  st.n_tasks = static_cast<int64_t>(tf.tasks.size());
  st.tasks_digest = tasks_digest(tf.tasks);
  for (const EvalCell& c : cells) st.cells.push_back(c.spec);
  st.reference = a.reference;
  st.rollouts = a.rollouts;
  st.temperature = a.temp;
  st.top_p = a.top_p;
  st.top_k = a.top_k;
  st.max_length = a.max_length;
  st.max_new_tokens = a.max_new_tokens;
  st.seed = a.policy.seed;
  st.eviction = eviction_json(a.policy);
  st.prompt_template = prompts.template_name();
  st.math_suffix = po.math_suffix;
  st.bootstrap_resamples = a.bootstrap;
  st.shard_index = shard_index;
  st.shard_count = shard_count;

  // 3. This shard's problems and their prompts (a prompt the tokenizer refuses stops here).
  RolloutOptions opts;
  opts.rollouts = a.rollouts;
  opts.sampler = sampler;
  opts.max_length = a.max_length;
  opts.max_new_tokens = a.max_new_tokens;
  std::vector<EvalTask> tasks;
  std::vector<std::vector<int32_t>> prompt_ids;
  int64_t over_cap = 0, longest = 0;
  for (const EvalTask& t : tf.tasks) {
    if (!st.in_shard(t.index)) continue;
    prompt_ids.push_back(prompts.tokens(t.problem));
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompt_ids.back().size()));
    over_cap += generation_cap(opts, static_cast<int64_t>(prompt_ids.back().size())) <= 0;
    tasks.push_back(t);
  }
  if (over_cap > 0)
    warn(fmt::format("{} of {} prompts leave no room under --max-length {}: they are recorded as not answered",
                     over_cap, tasks.size(), a.max_length));
  for (const EvalCell& c : cells)
    if (auto w = long_prompt_warning(c.kv.eviction(), c.kv.policy(), longest, flag_name); !w.empty())
      warn(fmt::format("{} (longest prompt): {}", c.spec.label(), w));
  // 4. Another model's TriAttention statistics (or any selector that does not fit this model's KV
  // shape) are refused here, before the output directory exists.
  Engine engine(*model, a.threads);
  for (const EvalCell& c : cells)
    if (c.kv.policy().selector) (void)c.kv.policy().selector->make_state(engine.kv_shape());

  // 5. The output directory: refuses another configuration; lists what is already done.
  ResultsDir dir = ResultsDir::open(a.out, st, a.resume, warn);
  std::set<std::string> done;
  int64_t done_correct = 0;
  for (const RolloutRecord& r : dir.existing()) done.insert(r.key()), done_correct += r.correct;

  const int64_t total = static_cast<int64_t>(tasks.size()) * static_cast<int64_t>(cells.size()) * a.rollouts;
  fmt::print(stderr, "eval: {} problems{} x {} cells x {} rollouts = {} rollouts; {} already in {}, {} to run\n",
             tasks.size(), shard_count > 1 ? fmt::format(" (shard {}/{})", shard_index, shard_count) : std::string(),
             cells.size(), a.rollouts, total, done.size(), a.out, total - static_cast<int64_t>(done.size()));

  // 6. Run what is missing; every rollout is on disk before the next one starts.
  std::vector<RolloutRecord> records = dir.existing();
  Progress bar("eval", total, "rollouts", static_cast<int64_t>(done.size()));
  int64_t seen = static_cast<int64_t>(done.size()), correct = done_correct;
  run_grid(
      engine, tasks, prompt_ids, cells, opts, [&](const std::string& key) { return done.count(key) != 0; },
      [&](RolloutRecord&& rec) {
        dir.append(rec);
        ++seen, correct += rec.correct ? 1 : 0;
        bar.add(1, fmt::format("acc {:.3f}", static_cast<double>(correct) / static_cast<double>(seen)));
        rec.text = std::string();  // on disk; the summary does not need it
        records.push_back(std::move(rec));
        if (a.debug_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.debug_delay_ms));
      });
  bar.finish();

  // 7. Report.
  report(a.out, st, records, !a.no_plots, a.margin);
  return 0;
}

struct MergeArgs {
  std::vector<std::string> dirs;
  std::string out;
  bool no_plots = false;
  double margin = kDefaultMargin;
};

int run_merge(const MergeArgs& a) {
  check_margin(a.margin);
  // Every directory must hold the same run apart from its shard; shards must not repeat.
  std::vector<EvalSettings> settings;
  for (const std::string& d : a.dirs) settings.push_back(read_settings(d));
  for (size_t i = 1; i < settings.size(); ++i)
    if (settings[i].model_digest.empty() != settings[0].model_digest.empty())
      throw Error(fmt::format("{} and {}: one was written by a kvevict that did not record the model's digest, so "
                              "they cannot be shown to hold the same model; refusing to merge them",
                              a.dirs[0], a.dirs[i]));
  const auto without_shard = [](const EvalSettings& s) {
    json j = s.to_json();
    j.erase("shard");
    return j;
  };
  const json base = without_shard(settings[0]);
  std::set<int> shards;
  for (size_t i = 0; i < settings.size(); ++i) {
    if (const std::string d = json_difference(base, without_shard(settings[i])); !d.empty())
      throw Error(fmt::format("{} and {} hold different runs ({}); refusing to merge them", a.dirs[0], a.dirs[i], d));
    if (settings[i].shard_count != settings[0].shard_count)
      throw Error(fmt::format("{} is shard {}/{} but {} is shard {}/{}", a.dirs[i], settings[i].shard_index,
                              settings[i].shard_count, a.dirs[0], settings[0].shard_index, settings[0].shard_count));
    if (!shards.insert(settings[i].shard_index).second)
      throw Error(
          fmt::format("shard {}/{} given twice ({})", settings[i].shard_index, settings[i].shard_count, a.dirs[i]));
  }
  for (int s = 0; s < settings[0].shard_count; ++s)
    if (!shards.count(s))
      warn(fmt::format("shard {}/{} is missing: its problems count as not run", s, settings[0].shard_count));

  std::vector<RolloutRecord> records;
  std::set<std::string> keys;
  for (size_t i = 0; i < a.dirs.size(); ++i) {
    const std::string path = (fs::path(a.dirs[i]) / ResultsDir::kRollouts).string();
    if (!fs::exists(path)) {
      warn(fmt::format("{} holds no rollouts yet", a.dirs[i]));
      continue;
    }
    auto recs = read_rollouts(path, /*keep_text=*/true, warn).records;
    const int64_t expected =
        settings[i].problems_in_shard() * static_cast<int64_t>(settings[i].cells.size()) * settings[i].rollouts;
    if (static_cast<int64_t>(recs.size()) < expected)
      warn(fmt::format("{} holds {} of its {} rollouts (resume that shard to finish it)", a.dirs[i], recs.size(),
                       expected));
    for (RolloutRecord& r : recs) {
      if (!settings[i].in_shard(r.problem_index))
        throw Error(fmt::format("{}: problem {} does not belong to shard {}/{}", path, r.problem_index,
                                settings[i].shard_index, settings[i].shard_count));
      if (!keys.insert(r.key()).second)
        throw Error(fmt::format("{}: rollout {} of problem '{}' under {} is also in another shard", path, r.rollout,
                                r.problem_id, r.cell().label()));
      records.push_back(std::move(r));
    }
  }
  EvalSettings merged = settings[0];
  merged.shard_index = 0;
  merged.shard_count = 1;
  // A stable order: problem, then the grid's cell order, then rollout.
  std::map<std::string, size_t> cell_order;
  for (size_t i = 0; i < merged.cells.size(); ++i) cell_order[merged.cells[i].label()] = i;
  std::sort(records.begin(), records.end(), [&](const RolloutRecord& x, const RolloutRecord& y) {
    const auto kx = std::make_tuple(x.problem_index, cell_order[x.cell().label()], x.rollout);
    const auto ky = std::make_tuple(y.problem_index, cell_order[y.cell().label()], y.rollout);
    return kx < ky;
  });

  // The merged directory is a complete unsharded output directory (it can be resumed).
  std::error_code ec;
  fs::create_directories(a.out, ec);
  if (ec) throw Error(fmt::format("{}: cannot create the output directory: {}", a.out, ec.message()));
  const std::string config_path = (fs::path(a.out) / ResultsDir::kConfig).string();
  const DirLock lock = DirLock::acquire(a.out);
  check_settings_match(a.out, merged);
  for (const std::string& d : a.dirs)
    if (fs::equivalent(d, a.out, ec)) throw Error(fmt::format("--out {} is one of the merged directories", a.out));
  std::string lines;
  for (const RolloutRecord& r : records) lines += r.to_json().dump() + "\n";
  write_file_atomic((fs::path(a.out) / ResultsDir::kRollouts).string(), lines);
  write_file_atomic(config_path, merged.to_json().dump(2) + "\n");
  fmt::print(stderr, "merge: {} rollouts from {} directories into {}\n", records.size(), a.dirs.size(), a.out);
  report(a.out, merged, records, !a.no_plots, a.margin);
  return 0;
}

}  // namespace

void add_eval(CLI::App& root, std::vector<Command>& out) {
  auto e = std::make_shared<EvalArgs>();
  auto* cmd = root.add_subcommand(
      "eval", "Accuracy of policies x budgets on a task file (resumable; paired CIs and sign tests)");
  cmd->add_option("-m,--model", e->model, model_help())->required()->check(CLI::ExistingPath);
  cmd->add_option("-f,--file", e->tasks, "Task file, JSON lines (MATH-500, GSM8K or kvevict format)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--format", e->format, "Task format: auto, math500, gsm8k, kvevict")
      ->check(CLI::IsMember({"auto", "math500", "gsm8k", "kvevict"}))
      ->capture_default_str();
  cmd->add_option("--limit", e->limit, "Use only the first N problems (0 = all)")
      ->check(int_range(0, limits::kProblems))
      ->capture_default_str();
  cmd->add_option("--bad-lines", e->bad_lines, "A malformed task line: stop (error) or skip (warn with FILE:LINE)")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str();
  cmd->add_option("--policies", e->policies, "Comma-separated policies (" + policy_names() + "; any may take +prompt)")
      ->capture_default_str();
  cmd->add_option("--budgets", e->budgets,
                  fmt::format("Comma-separated budgets B for the evicting policies (each 1..{}; default {} unless "
                              "--budget is given)",
                              limits::kTokens, kDefaultBudgets));
  cmd->add_option("--reference", e->reference,
                  "Policy every other one is compared with (same budget unless it is full)")
      ->capture_default_str();
  cmd->add_option("--margin", e->margin,
                  "Equivalence margin of the report's TOST (Tango's test), in accuracy units, in (0, 1): 0.05 = 5 points. "
                  "Only the summary depends on it, so a finished run can be re-summarized with another")
      ->capture_default_str();
  cmd->add_option("--rollouts", e->rollouts, "Rollouts per problem, decoded as parallel sequences")
      ->check(int_range(1, limits::kRollouts))
      ->capture_default_str();
  cmd->add_option("--temp", e->temp, "Temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-p", e->top_p, "Nucleus sampling threshold (1 = off)")->capture_default_str();
  cmd->add_option("--top-k", e->top_k, "Top-k (0 = off, the paper's setting)")
      ->check(int_range(0, limits::kTokens))
      ->capture_default_str();
  cmd->add_option("--max-length", e->max_length, "Cap on prompt + generated tokens (the paper counts the prompt)")
      ->check(int_range(2, limits::kTokens))
      ->capture_default_str();
  cmd->add_option("-n,--n-predict", e->max_new_tokens, "Also cap generated tokens (0 = only --max-length)")
      ->check(int_range(0, limits::kTokens))
      ->capture_default_str();
  cmd->add_option("--template", e->tmpl, "Prompt template: auto (the GGUF's chat template if supported), plain, chat")
      ->capture_default_str();
  cmd->add_flag("--chat", e->chat,
                "Same as --template chat: the model's chat template, one user turn, no system prompt");
  cmd->add_flag("--no-think", e->no_think,
                "Chat templates of Qwen3 / DeepSeek-R1: thinking off (enable_thinking=false)");
  cmd->add_option("--chat-template", e->chat_template,
                  "Chat template to use instead of the GGUF's (" + ChatTemplate::names() + ")");
  // A flag function, not a flag bound to the optional: CLI11 then leaves the optional empty
  // when neither form is given, so the per-format default below applies.
  cmd->add_flag_function(
      "--math-suffix", [e](std::int64_t) { e->math_suffix = true; },
      "Append the paper's \"Please reason step by step, and put your final answer within \\boxed{}.\" "
      "(default: on for MATH-500/GSM8K, off for kvevict tasks)");
  cmd->add_flag_function(
      "--no-math-suffix", [e](std::int64_t) { e->math_suffix = false; }, "Do not append it");
  cmd->add_option("-o,--output", e->out, "Output directory (rollouts.jsonl, summary.md/csv/json, PNGs)")
      ->capture_default_str();
  cmd->add_flag_function(
      "--resume", [e](std::int64_t) { e->resume = true; },
      "Continue a run in --output without recomputing finished rollouts (the default)");
  cmd->add_flag_function(
      "--no-resume", [e](std::int64_t) { e->resume = false; },
      "Refuse an --output directory that already holds results");
  cmd->add_option("--shard", e->shard, "Run only problems with index mod N == i (i/N); combine with `kvevict merge`")
      ->capture_default_str();
  cmd->add_option("--bootstrap", e->bootstrap, "Bootstrap resamples for the CIs")
      ->check(int_range(100, limits::kBootstrap))
      ->capture_default_str();
  cmd->add_flag("--no-plots", e->no_plots, "Do not draw the PNG plots");
  add_threads_option(*cmd, e->threads);
  cmd->add_option("--debug-delay-ms", e->debug_delay_ms, "Sleep after each rollout (tests of kill-and-resume)")
      ->group("");
  add_policy_options(*cmd, e->policy, /*with_policy=*/false);
  out.push_back({cmd, [e] { return run_eval(*e); }});
}

void add_merge(CLI::App& root, std::vector<Command>& out) {
  auto m = std::make_shared<MergeArgs>();
  auto* cmd = root.add_subcommand("merge", "Combine `kvevict eval --shard i/N` directories into one report");
  cmd->add_option("dirs", m->dirs, "Shard output directories")->required();
  cmd->add_option("-o,--output", m->out, "Directory for the merged rollouts and report")->required();
  cmd->add_flag("--no-plots", m->no_plots, "Do not draw the PNG plots");
  cmd->add_option("--margin", m->margin, "Equivalence margin of the report's TOST, in accuracy units, in (0, 1)")
      ->capture_default_str();
  out.push_back({cmd, [m] { return run_merge(*m); }});
}

}  // namespace kvevict::cli
