// `kvevict tasks gen`: writes generated tasks as JSON lines (tasks/generator.h).
// `kvevict tasks eval`: greedy full-cache accuracy of a model on generated tasks — a small check
// for the shipped model's card, not the evaluation harness (that is `kvevict eval`).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "cli/common.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "eval/grader.h"
#include "eval/solve.h"
#include "model/model.h"
#include "tasks/generator.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict::cli {
namespace {

struct SizeArgs {
  std::string steps, facts, depth, restate;
  int64_t length = 0;  ///< trace tokens; 0 = not given
};

/// What resolve_size returns: the ranges generate_tasks takes.
struct SizeRanges {
  IntRange steps, facts, depth;
  std::vector<int64_t> restate;
};

struct GenArgs {
  std::string family = "chain";
  int64_t n = 10;
  uint64_t seed = 0;
  uint64_t first = 0;
  SizeArgs size;
  std::string out;
};

struct EvalArgs {
  std::string model, input;
  std::string families = "chain,running,once,recall,revisit";
  int64_t n = 100;
  uint64_t seed = 1000;
  SizeArgs size;
  int jobs = 0;
  bool show_failures = false;
};

void add_size_options(CLI::App& cmd, SizeArgs& s) {
  cmd.add_option("--steps", s.steps, "Steps N: a number or a range LO-HI drawn per task (default from --length)");
  cmd.add_option("--length", s.length, "Target trace length in tokens; N is chosen to come closest")
      ->check(int_range(1, limits::kTokens));
  cmd.add_option("--facts", s.facts, "Facts (fact lines, 2-26; one cycle's length except in recall/revisit): a number or LO-HI (default 20)");
  cmd.add_option("--depth", s.depth,
                 "recall/revisit: depth K, the phase-A lines that compute the value (3-20): a number or LO-HI "
                 "(default 6)");
  cmd.add_option("--restate", s.restate,
                 "recall/revisit: R, the copies (recall) or reads (revisit) of the value over 160 lines: 1, 2, 4 or "
                 "8, or a comma-separated list drawn per task (default 1)");
}

/// Resolves the size options for one family into ranges. Errors name the options.
SizeRanges resolve_size(const SizeArgs& s, TaskFamily f) {
  if (!s.steps.empty() && s.length > 0) throw Error("give either --steps or --length, not both");
  if (!is_trace_family(f) && (!s.depth.empty() || !s.restate.empty()))
    throw Error(fmt::format("--depth and --restate apply to recall and revisit only, not {}", task_family_name(f)));
  SizeRanges r;
  r.depth = s.depth.empty() ? IntRange{0, 0} : parse_int_range(s.depth, "--depth");
  r.restate = s.restate.empty() ? std::vector<int64_t>{1} : parse_restate_list(s.restate, "--restate");
  if (!s.steps.empty()) {
    r.steps = parse_int_range(s.steps, "--steps");
  } else if (s.length != 0) {
    if (r.depth.lo != r.depth.hi || r.restate.size() != 1)
      throw Error("--length needs one --depth and one --restate (it picks one N); give --steps for ranges");
    const int64_t n = steps_for_trace_length(f, s.length, TaskSize{0, 0, r.depth.lo, r.restate[0]});
    r.steps = {n, n};
  } else {
    throw Error("give --steps N (or LO-HI) or --length TOKENS");
  }
  r.facts = s.facts.empty() ? IntRange{kDefaultFacts, kDefaultFacts} : parse_int_range(s.facts, "--facts");
  return r;
}

int run_gen(const GenArgs& a) {
  const TaskFamily f = parse_task_family(a.family);
  const SizeRanges r = resolve_size(a.size, f);
  const auto tasks = generate_tasks(f, r.steps, r.facts, a.seed, a.n, a.first, r.depth, r.restate);
  std::ofstream file;
  if (!a.out.empty()) {
    file.open(a.out);
    if (!file) throw Error(fmt::format("-o {}: cannot open for writing", a.out));
  }
  std::ostream& os = a.out.empty() ? std::cout : file;
  for (const Task& t : tasks) os << task_to_json(t) << '\n';
  os.flush();
  if (!os) throw Error(fmt::format("writing tasks to {} failed", a.out.empty() ? "stdout" : a.out));
  return 0;
}

int run_eval(const EvalArgs& a) {
  const int jobs = a.jobs > 0 ? a.jobs : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<Task> tasks;  // read before the model: a bad file fails fast
  if (!a.input.empty()) {
    std::istringstream in(read_file(a.input, "-f"));
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) tasks.push_back(task_from_json(line));
  } else {
    for (const std::string& name : split_list(a.families, "--family")) {
      const TaskFamily f = parse_task_family(name);
      SizeArgs size = a.size;
      if (!is_trace_family(f)) size.depth.clear(), size.restate.clear();  // apply to recall/revisit only
      const SizeRanges r = resolve_size(size, f);
      auto part = generate_tasks(f, r.steps, r.facts, a.seed, a.n, 0, r.depth, r.restate);
      tasks.insert(tasks.end(), part.begin(), part.end());
    }
  }
  const auto model = Model::load(a.model);
  std::vector<std::string> outputs(tasks.size());
  std::atomic<size_t> next{0};
  // One Engine per worker, tasks taken in turn. The pool rethrows a worker's error here (an
  // exception escaping a bare std::thread would abort without a message); the first error also
  // ends the others' turns.
  ThreadPool workers(jobs);
  workers.parallel_for(jobs, [&](int64_t, int64_t) {
    try {
      Engine engine(*model, 1);
      for (size_t i = next++; i < tasks.size(); i = next++) {
        const Task& t = tasks[i];
        outputs[i] = greedy_solve(engine, *model, t.problem, default_max_new(t), i);
      }
    } catch (...) {
      next = tasks.size();
      throw;
    }
  });

  fmt::print("{:<8} {:>6} {:>6} {:>8} {:>12} {:>12}\n", "family", "n", "right", "accuracy", "steps", "trace_tok");
  for (TaskFamily f : all_task_families()) {
    int64_t n = 0, right = 0, smin = kMaxSteps + 1, smax = 0, tmin = 1 << 30, tmax = 0;
    for (size_t i = 0; i < tasks.size(); ++i) {
      const Task& t = tasks[i];
      if (t.family != f) continue;
      ++n;
      const auto got = extract_last_boxed(outputs[i]);
      const bool ok = got && *got == t.answer;
      right += ok;
      smin = std::min(smin, t.size.steps);
      smax = std::max(smax, t.size.steps);
      const int64_t tl = trace_length(f, t.size);
      tmin = std::min(tmin, tl);
      tmax = std::max(tmax, tl);
      if (!ok && a.show_failures)
        fmt::print(stderr, "FAIL {} gold {} got {}\n{}{}\n", t.id, t.answer, got ? *got : "(none)", t.problem,
                   outputs[i]);
    }
    if (n == 0) continue;
    fmt::print("{:<8} {:>6} {:>6} {:>8.4f} {:>12} {:>12}\n", task_family_name(f), n, right,
               static_cast<double>(right) / static_cast<double>(n), fmt::format("{}-{}", smin, smax),
               fmt::format("{}-{}", tmin, tmax));
  }
  return 0;
}

}  // namespace

void add_tasks(CLI::App& root, std::vector<Command>& out) {
  auto* tasks = root.add_subcommand("tasks", "Generate the synthetic reasoning tasks, or check a model on them");
  tasks->require_subcommand(1);

  auto g = std::make_shared<GenArgs>();
  auto* gen = tasks->add_subcommand("gen", "Write generated tasks as JSON lines (deterministic by seed)");
  gen->add_option("--family", g->family, "chain | running | once | recall | revisit")->capture_default_str();
  gen->add_option("--count", g->n, "Number of tasks")->check(int_range(1, limits::kProblems))->capture_default_str();
  gen->add_option("--seed", g->seed, "Seed")->check(seed_value())->capture_default_str();
  gen->add_option("--first", g->first, "Index of the first task (tasks are numbered per seed)")->capture_default_str();
  add_size_options(*gen, g->size);
  gen->add_option("-o,--output", g->out, "Output file (default stdout)");

  auto e = std::make_shared<EvalArgs>();
  auto* ev = tasks->add_subcommand("eval", "Greedy full-cache accuracy of a model on generated tasks");
  ev->add_option("-m,--model", e->model, model_help())->required()->check(CLI::ExistingPath);
  ev->add_option("-f,--file", e->input, "Task file (JSON lines) instead of generating")->check(CLI::ExistingFile);
  ev->add_option("--family", e->families, "Families, comma-separated")->capture_default_str();
  ev->add_option("--count", e->n, "Tasks per family")->check(int_range(1, limits::kProblems))->capture_default_str();
  ev->add_option("--seed", e->seed, "Seed (training uses seeds < 1000)")->check(seed_value())->capture_default_str();
  add_size_options(*ev, e->size);
  add_threads_option(*ev, e->jobs, "Tasks decoded in parallel, one thread each (0 = all cores)");
  ev->add_flag("--show-failures", e->show_failures, "Print each wrong task and the model's output to stderr");
  // One entry for `tasks` (main.cpp matches top-level names); it runs whichever subcommand parsed.
  out.push_back({tasks, [gen, g, e] { return gen->parsed() ? run_gen(*g) : run_eval(*e); }});
}

}  // namespace kvevict::cli
