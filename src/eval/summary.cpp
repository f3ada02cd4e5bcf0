#include "eval/summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "eval/grader.h"
#include "eval/task_file.h"
#include "util/error.h"
#include "util/rng.h"

namespace kvevict {
namespace {

using json = nlohmann::json;

constexpr uint64_t kAccuracyTag = 0xACC0ACC0ull, kDiffTag = 0xD1FFD1FFull;

// Per-problem mean correctness of one cell: problem index -> mean.
using ProblemMeans = std::map<int64_t, double>;

std::string fmt_bytes(int64_t b) {
  if (b >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1 << 30));
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1 << 20));
  return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024);
}

json ci_json(const BootstrapCi& c) { return {{"mean", c.mean_diff}, {"lo", c.lo}, {"hi", c.hi}, {"n", c.n}}; }

}  // namespace

EvalSummary summarize(const EvalSettings& settings, const std::vector<RolloutRecord>& records) {
  EvalSummary out;
  out.settings = settings;
  std::map<std::string, size_t> index;  // cell label -> row
  for (const CellSpec& c : settings.cells) {
    index[c.label()] = out.cells.size();
    CellSummary row;
    row.cell = c;
    row.expected_rollouts = settings.problems_in_shard() * settings.rollouts;
    out.cells.push_back(row);
  }
  // Accumulate per cell.
  struct Acc {
    std::map<int64_t, std::pair<double, int64_t>> per_problem;  // index -> (correct sum, count)
    double gen = 0, len = 0, rounds = 0, decode_ms = 0;
  };
  std::vector<Acc> acc(out.cells.size());
  for (const RolloutRecord& r : records) {
    const auto it = index.find(r.cell().label());
    if (it == index.end())
      throw Error(fmt::format("rollout of problem '{}' belongs to {}, which is not in this run's grid", r.problem_id,
                              r.cell().label()));
    CellSummary& row = out.cells[it->second];
    Acc& a = acc[it->second];
    auto& p = a.per_problem[r.problem_index];
    p.first += r.correct ? 1.0 : 0.0;
    p.second += 1;
    row.rollouts += 1;
    a.gen += static_cast<double>(r.generated_tokens);
    a.len += static_cast<double>(r.prompt_tokens + r.generated_tokens);
    a.rounds += static_cast<double>(r.rounds);
    a.decode_ms += r.decode_ms + r.score_ms + r.compact_ms;
    row.peak_slots = std::max(row.peak_slots, r.peak_slots);
    row.peak_kv_bytes = std::max(row.peak_kv_bytes, r.peak_kv_bytes);
    // By the recorded grade: a box too long to compare is an answer, not a missing one.
    row.no_answer += r.grade == grade_outcome_name(GradeOutcome::NoAnswer) ? 1 : 0;
    row.answer_too_long += r.grade == grade_outcome_name(GradeOutcome::AnswerTooLong) ? 1 : 0;
    row.hit_cap += r.finish == "eos" ? 0 : 1;
    if (r.fact_kept) {
      (*r.fact_kept ? row.fact_kept_rollouts : row.fact_lost_rollouts) += 1;
      (*r.fact_kept ? row.fact_kept_correct : row.fact_lost_correct) += r.correct ? 1 : 0;
    }
  }
  std::vector<ProblemMeans> means(out.cells.size());
  for (size_t i = 0; i < out.cells.size(); ++i) {
    CellSummary& row = out.cells[i];
    const Acc& a = acc[i];
    row.problems = static_cast<int64_t>(a.per_problem.size());
    if (row.rollouts == 0) continue;
    std::vector<double> m;
    for (const auto& [idx, p] : a.per_problem) {
      means[i][idx] = p.first / static_cast<double>(p.second);
      m.push_back(means[i][idx]);
    }
    double sum = 0;
    for (double v : m) sum += v;
    row.accuracy = sum / static_cast<double>(m.size());
    const std::vector<double> zeros(m.size(), 0.0);
    row.accuracy_ci = paired_bootstrap_ci(m, zeros, settings.bootstrap_resamples,
                                          stream_id({settings.seed, fnv1a64(row.cell.label()), kAccuracyTag}));
    row.accuracy_wilson = wilson_interval(std::clamp(row.accuracy, 0.0, 1.0), row.problems);
    const auto n = static_cast<double>(row.rollouts);
    row.mean_generated = a.gen / n;
    row.mean_length = a.len / n;
    row.mean_rounds = a.rounds / n;
    row.decode_tok_s = a.decode_ms > 0 ? a.gen / (a.decode_ms / 1000.0) : 0.0;
  }
  // Paired comparisons with the reference cell.
  for (size_t i = 0; i < out.cells.size(); ++i) {
    CellSummary& row = out.cells[i];
    if (row.cell.policy == settings.reference) continue;
    std::optional<size_t> ref;
    for (size_t j = 0; j < out.cells.size(); ++j) {
      const CellSpec& c = out.cells[j].cell;
      if (c.policy == settings.reference && (c.budget == 0 || c.budget == row.cell.budget)) ref = j;
    }
    if (!ref) continue;
    row.reference_label = out.cells[*ref].cell.label();
    std::vector<double> a, b;
    for (const auto& [idx, v] : means[i])
      if (const auto it = means[*ref].find(idx); it != means[*ref].end()) a.push_back(v), b.push_back(it->second);
    if (a.empty()) continue;
    row.diff = paired_bootstrap_ci(
        a, b, settings.bootstrap_resamples,
        stream_id({settings.seed, fnv1a64(row.cell.label()), fnv1a64(row.reference_label), kDiffTag}));
    row.sign = paired_sign_test(a, b);
  }
  return out;
}

std::string summary_markdown(const EvalSummary& s) {
  const EvalSettings& st = s.settings;
  std::string md;
  md += fmt::format("model `{}` · tasks `{}` ({}, {} problems{}) · {} rollout(s) per problem\n\n", st.model_file,
                    st.tasks_file, st.tasks_format, st.n_tasks,
                    st.shard_count > 1 ? fmt::format(", shard {}/{}", st.shard_index, st.shard_count) : std::string(),
                    st.rollouts);
  md += fmt::format(
      "temperature {:g} · top-p {:g} · top-k {} · max length {} (prompt included){} · seed {} · "
      "template {}{} · bootstrap {} resamples\n\n",
      st.temperature, st.top_p, st.top_k, st.max_length,
      st.max_new_tokens > 0 ? fmt::format(" · max new tokens {}", st.max_new_tokens) : std::string(), st.seed,
      st.prompt_template, st.math_suffix ? " + math suffix" : "", st.bootstrap_resamples);
  md +=
      "intervals: accuracy = Wilson score 95% CI over problems; Δ = paired, problem-clustered percentile "
      "bootstrap 95% CI; sign test exact, two-sided\n\n";
  int64_t fewest = -1;
  for (const CellSummary& c : s.cells)
    if (c.rollouts > 0 && (fewest < 0 || c.problems < fewest)) fewest = c.problems;
  if (fewest >= 0 && fewest < kSmallSampleProblems)
    md += fmt::format("**warning: only {} problem(s) in a cell (< {}): intervals are wide and approximate**\n\n",
                      fewest, kSmallSampleProblems);
  md += fmt::format(
      "| policy | budget | accuracy [95% Wilson CI] | Δ vs {} [95% bootstrap CI] | sign test p (+/−/=) | gen tokens | "
      "rounds | peak KV slots | peak KV | decode tok/s | rollouts |\n",
      st.reference);
  md += "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|\n";
  for (const CellSummary& c : s.cells) {
    const std::string budget = c.cell.budget > 0 ? std::to_string(c.cell.budget) : "–";
    if (c.rollouts == 0) {
      md += fmt::format("| {} | {} | – | – | – | – | – | – | – | – | 0/{} |\n", c.cell.policy, budget,
                        c.expected_rollouts);
      continue;
    }
    const std::string acc =
        fmt::format("{:.3f} [{:.3f}, {:.3f}]", c.accuracy, c.accuracy_wilson.lo, c.accuracy_wilson.hi);
    const std::string diff = c.diff
        ? fmt::format("{:+.3f} [{:+.3f}, {:+.3f}]", c.diff->mean_diff, c.diff->lo, c.diff->hi)
        : std::string(c.cell.policy == st.reference ? "(reference)" : "–");
    const std::string sign = c.sign
        ? fmt::format("{:.3g} ({}/{}/{})", c.sign->p, c.sign->n_pos, c.sign->n_neg, c.sign->n_ties)
        : std::string("–");
    md += fmt::format("| {} | {} | {} | {} | {} | {:.1f} | {:.1f} | {} | {} | {:.0f} | {}/{} |\n", c.cell.policy,
                      budget, acc, diff, sign, c.mean_generated, c.mean_rounds, c.peak_slots,
                      fmt_bytes(c.peak_kv_bytes), c.decode_tok_s, c.rollouts, c.expected_rollouts);
  }
  bool any_fact = false;
  for (const CellSummary& c : s.cells) any_fact = any_fact || c.fact_kept_rollouts + c.fact_lost_rollouts > 0;
  if (!any_fact) return md;
  // Did a policy win by keeping the fact? Accuracy split by whether any (layer, KV head) still
  // held the once-stated fact's slot at the end of the rollout.
  md += "\n**Fact stated once: was its slot still cached at the end (any layer, any KV head)?**\n\n";
  md += "| policy | budget | fact kept: rollouts | accuracy if kept | fact lost: rollouts | accuracy if lost |\n";
  md += "|---|---:|---:|---|---:|---|\n";
  const auto ratio = [](int64_t right, int64_t n) {
    return n > 0 ? fmt::format("{:.3f} ({}/{})", static_cast<double>(right) / static_cast<double>(n), right, n)
                 : std::string("–");
  };
  for (const CellSummary& c : s.cells) {
    if (c.fact_kept_rollouts + c.fact_lost_rollouts == 0) continue;
    md += fmt::format("| {} | {} | {} | {} | {} | {} |\n", c.cell.policy,
                      c.cell.budget > 0 ? std::to_string(c.cell.budget) : "–", c.fact_kept_rollouts,
                      ratio(c.fact_kept_correct, c.fact_kept_rollouts), c.fact_lost_rollouts,
                      ratio(c.fact_lost_correct, c.fact_lost_rollouts));
  }
  return md;
}

std::string summary_csv(const EvalSummary& s) {
  std::string csv =
      "policy,budget,problems,rollouts,expected_rollouts,accuracy,accuracy_lo,accuracy_hi,reference,diff,diff_lo,"
      "diff_hi,sign_pos,sign_neg,sign_ties,sign_p,mean_generated,mean_length,mean_rounds,peak_slots,peak_kv_bytes,"
      "decode_tok_s,no_answer,hit_cap,accuracy_ci_method,diff_ci_method,fact_kept_rollouts,fact_kept_correct,"
      "fact_lost_rollouts,fact_lost_correct,answer_too_long\n";
  for (const CellSummary& c : s.cells) {
    csv += fmt::format("{},{},{},{},{},{},{},{},{},", c.cell.policy,
                       c.cell.budget > 0 ? std::to_string(c.cell.budget) : "", c.problems, c.rollouts,
                       c.expected_rollouts, c.accuracy, c.accuracy_wilson.lo, c.accuracy_wilson.hi, c.reference_label);
    if (c.diff)
      csv += fmt::format("{},{},{},", c.diff->mean_diff, c.diff->lo, c.diff->hi);
    else
      csv += ",,,";
    if (c.sign)
      csv += fmt::format("{},{},{},{},", c.sign->n_pos, c.sign->n_neg, c.sign->n_ties, c.sign->p);
    else
      csv += ",,,,";
    // New columns go at the end, so readers that index columns keep working.
    csv += fmt::format("{},{},{},{},{},{},{},{},wilson,paired-bootstrap,{},{},{},{},{}\n", c.mean_generated,
                       c.mean_length, c.mean_rounds, c.peak_slots, c.peak_kv_bytes, c.decode_tok_s, c.no_answer,
                       c.hit_cap, c.fact_kept_rollouts, c.fact_kept_correct, c.fact_lost_rollouts,
                       c.fact_lost_correct, c.answer_too_long);
  }
  return csv;
}

json summary_json(const EvalSummary& s) {
  json cells = json::array();
  for (const CellSummary& c : s.cells) {
    json j{{"policy", c.cell.policy},
           {"budget", c.cell.budget > 0 ? json(c.cell.budget) : json(nullptr)},
           {"label", c.cell.label()},
           {"problems", c.problems},
           {"rollouts", c.rollouts},
           {"expected_rollouts", c.expected_rollouts},
           {"accuracy", c.accuracy},
           {"accuracy_ci",
            {{"method", "wilson"},
             {"level", 0.95},
             {"lo", c.accuracy_wilson.lo},
             {"hi", c.accuracy_wilson.hi},
             {"n", c.accuracy_wilson.n}}},
           {"accuracy_bootstrap_ci", ci_json(c.accuracy_ci)},
           {"small_sample", c.rollouts > 0 && c.problems < kSmallSampleProblems},
           {"reference", c.reference_label.empty() ? json(nullptr) : json(c.reference_label)},
           {"diff", c.diff ? ci_json(*c.diff) : json(nullptr)},
           {"diff_ci_method", "paired-bootstrap"},
           {"sign_test",
            c.sign ? json{{"pos", c.sign->n_pos}, {"neg", c.sign->n_neg}, {"ties", c.sign->n_ties}, {"p", c.sign->p}}
                   : json(nullptr)},
           {"mean_generated", c.mean_generated},
           {"mean_length", c.mean_length},
           {"mean_rounds", c.mean_rounds},
           {"peak_slots", c.peak_slots},
           {"peak_kv_bytes", c.peak_kv_bytes},
           {"decode_tok_s", c.decode_tok_s},
           {"no_answer", c.no_answer},
           {"hit_cap", c.hit_cap},
           {"fact_kept_rollouts", c.fact_kept_rollouts},
           {"fact_kept_correct", c.fact_kept_correct},
           {"fact_lost_rollouts", c.fact_lost_rollouts},
           {"fact_lost_correct", c.fact_lost_correct},
           {"answer_too_long", c.answer_too_long}};
    cells.push_back(std::move(j));
  }
  return json{{"settings", s.settings.to_json()}, {"cells", cells}};
}

void write_summary_files(const std::string& dir, const EvalSummary& s) {
  const std::filesystem::path d(dir);
  write_file_atomic((d / "summary.md").string(), summary_markdown(s));
  write_file_atomic((d / "summary.csv").string(), summary_csv(s));
  write_file_atomic((d / "summary.json").string(), summary_json(s).dump(2) + "\n");
}

}  // namespace kvevict
