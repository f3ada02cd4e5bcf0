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

constexpr uint64_t kAccuracyTag = 0xACC0ACC0ull, kDiffTag = 0xD1FFD1FFull, kPooledTag = 0x9001EDull;

// Per-problem mean correctness of one cell: problem index -> mean.
using ProblemMeans = std::map<int64_t, double>;

std::string fmt_bytes(int64_t b) {
  if (b >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1 << 30));
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1 << 20));
  return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024);
}

json ci_json(const BootstrapCi& c) { return {{"mean", c.mean_diff}, {"lo", c.lo}, {"hi", c.hi}, {"n", c.n}}; }

json equiv_json(const std::optional<Equivalence>& e) {
  if (!e) return nullptr;
  return {{"method", e->method},   {"margin", e->margin},   {"alpha", e->alpha}, {"n", e->n},
          {"mean", e->mean_diff},  {"ci_lo", e->ci_lo},     {"ci_hi", e->ci_hi}, {"p_lower", e->p_lower},
          {"p_upper", e->p_upper}, {"p", e->p},             {"equivalent", e->equivalent},
          {"power", e->power},     {"n10", e->n10},         {"n01", e->n01}};
}

/// "p 0.012 ✓ (power 0.83)": the TOST p-value, whether equivalence is shown, the power.
std::string equiv_cell(const std::optional<Equivalence>& e) {
  if (!e) return "–";
  return fmt::format("{:.3g}{} (power {:.2f})", e->p, e->equivalent ? " ≈" : "", e->power);
}

/// An equivalence test when the data allow one (Tango: any n; paired t: n >= 2).
std::optional<Equivalence> maybe_equivalence(const std::vector<double>& a, const std::vector<double>& b,
                                             double margin) {
  const auto binary = [](const std::vector<double>& v) {
    return std::all_of(v.begin(), v.end(), [](double x) { return x == 0 || x == 1; });
  };
  if (a.empty() || (a.size() < 2 && !(binary(a) && binary(b)))) return std::nullopt;
  return equivalence_test(a, b, margin);
}

}  // namespace

EvalSummary summarize(const EvalSettings& settings, const std::vector<RolloutRecord>& records, double margin) {
  if (!(margin > 0 && margin < 1)) throw Error(fmt::format("equivalence margin {} outside (0, 1)", margin));
  EvalSummary out;
  out.settings = settings;
  out.margin = margin;
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
    row.budget_fraction = row.cell.budget > 0 && row.mean_length > 0
        ? static_cast<double>(row.cell.budget) / row.mean_length
        : 0.0;
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
    row.equiv = maybe_equivalence(a, b, margin);
  }
  // Holm over every sign test of the report (its family of comparisons).
  std::vector<double> ps;
  for (const CellSummary& row : out.cells)
    if (row.sign) ps.push_back(row.sign->p);
  const std::vector<double> adjusted = holm_adjust(ps);
  size_t k = 0;
  for (CellSummary& row : out.cells)
    if (row.sign) row.sign_p_holm = adjusted[k++];
  // Per policy, pooled over budgets: the per-problem means of each budget's pair, then one mean
  // per problem (cluster_by_problem), so a problem seen at three budgets counts once.
  std::vector<std::string> policies;
  for (const CellSpec& c : settings.cells)
    if (c.policy != settings.reference && c.budget > 0 &&
        std::find(policies.begin(), policies.end(), c.policy) == policies.end())
      policies.push_back(c.policy);
  for (const std::string& policy : policies) {
    PooledComparison pc;
    pc.policy = policy;
    std::vector<PairedOutcome> rows;
    for (size_t i = 0; i < out.cells.size(); ++i) {
      const CellSummary& row = out.cells[i];
      if (row.cell.policy != policy || row.reference_label.empty()) continue;
      size_t ref = 0;
      while (ref < out.cells.size() && out.cells[ref].cell.label() != row.reference_label) ++ref;
      bool any = false;
      for (const auto& [idx, v] : means[i])
        if (const auto it = means[ref].find(idx); it != means[ref].end()) rows.push_back({idx, v, it->second}), any = true;
      if (any) pc.budgets.push_back(row.cell.budget);
    }
    if (pc.budgets.size() < 2) continue;
    std::sort(pc.budgets.begin(), pc.budgets.end());
    const auto [a, b] = cluster_by_problem(rows);
    pc.diff = paired_bootstrap_ci(a, b, settings.bootstrap_resamples,
                                  stream_id({settings.seed, fnv1a64(policy), kPooledTag}));
    pc.sign = paired_sign_test(a, b);
    pc.equiv = maybe_equivalence(a, b, margin);
    out.pooled.push_back(std::move(pc));
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
  md += fmt::format(
      "intervals: accuracy = Wilson score 95% CI over problems; Δ = paired, problem-clustered percentile "
      "bootstrap 95% CI; sign test exact, two-sided, Holm-adjusted over the table's {} comparisons; B/L = budget "
      "/ mean sequence length; TOST = equivalence within ±{:g} points at α = 0.05 (Tango's score test for one "
      "greedy rollout per problem, else paired t; ≈ = shown), with its power at a true difference of 0\n\n",
      std::count_if(s.cells.begin(), s.cells.end(), [](const CellSummary& c) { return c.sign.has_value(); }),
      100 * s.margin);
  int64_t fewest = -1;
  for (const CellSummary& c : s.cells)
    if (c.rollouts > 0 && (fewest < 0 || c.problems < fewest)) fewest = c.problems;
  if (fewest >= 0 && fewest < kSmallSampleProblems)
    md += fmt::format("**warning: only {} problem(s) in a cell (< {}): intervals are wide and approximate**\n\n",
                      fewest, kSmallSampleProblems);
  md += fmt::format(
      "| policy | budget | B/L | accuracy [95% Wilson CI] | Δ vs {} [95% bootstrap CI] | sign test p (+/−/=) | "
      "Holm p | TOST ±{:g} p (power) | gen tokens | rounds | peak KV slots | peak KV | decode tok/s | rollouts |\n",
      st.reference, 100 * s.margin);
  md += "|---|---:|---:|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|\n";
  for (const CellSummary& c : s.cells) {
    const std::string budget = c.cell.budget > 0 ? std::to_string(c.cell.budget) : "–";
    if (c.rollouts == 0) {
      md += fmt::format("| {} | {} | – | – | – | – | – | – | – | – | – | – | – | 0/{} |\n", c.cell.policy, budget,
                        c.expected_rollouts);
      continue;
    }
    const std::string fraction = c.budget_fraction > 0 ? fmt::format("{:.2f}", c.budget_fraction) : "–";
    const std::string holm = c.sign_p_holm ? fmt::format("{:.3g}", *c.sign_p_holm) : "–";
    const std::string acc =
        fmt::format("{:.3f} [{:.3f}, {:.3f}]", c.accuracy, c.accuracy_wilson.lo, c.accuracy_wilson.hi);
    const std::string diff = c.diff
        ? fmt::format("{:+.3f} [{:+.3f}, {:+.3f}]", c.diff->mean_diff, c.diff->lo, c.diff->hi)
        : std::string(c.cell.policy == st.reference ? "(reference)" : "–");
    const std::string sign = c.sign
        ? fmt::format("{:.3g} ({}/{}/{})", c.sign->p, c.sign->n_pos, c.sign->n_neg, c.sign->n_ties)
        : std::string("–");
    md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {:.1f} | {:.1f} | {} | {} | {:.0f} | {}/{} |\n",
                      c.cell.policy, budget, fraction, acc, diff, sign, holm, equiv_cell(c.equiv), c.mean_generated,
                      c.mean_rounds, c.peak_slots, fmt_bytes(c.peak_kv_bytes), c.decode_tok_s, c.rollouts,
                      c.expected_rollouts);
  }
  if (!s.pooled.empty()) {
    md += fmt::format(
        "\n**Pooled over budgets, each problem counted once** (per-problem mean over the budgets; vs {})\n\n",
        st.reference);
    md += fmt::format("| policy | budgets | problems | Δ [95% bootstrap CI] | sign test p (+/−/=) | TOST ±{:g} p (power) |\n",
                      100 * s.margin);
    md += "|---|---|---:|---|---|---|\n";
    for (const PooledComparison& p : s.pooled) {
      std::string budgets;
      for (int64_t b : p.budgets) budgets += fmt::format("{}{}", budgets.empty() ? "" : ",", b);
      md += fmt::format("| {} | {} | {} | {:+.3f} [{:+.3f}, {:+.3f}] | {:.3g} ({}/{}/{}) | {} |\n", p.policy, budgets,
                        p.diff.n, p.diff.mean_diff, p.diff.lo, p.diff.hi, p.sign.p, p.sign.n_pos, p.sign.n_neg,
                        p.sign.n_ties, equiv_cell(p.equiv));
    }
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
      "fact_lost_rollouts,fact_lost_correct,answer_too_long,budget_fraction,sign_p_holm,equiv_method,equiv_margin,"
      "equiv_p,equiv_equivalent,equiv_power,equiv_ci_lo,equiv_ci_hi\n";
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
    csv += fmt::format("{},{},{},{},{},{},{},{},wilson,paired-bootstrap,{},{},{},{},{},", c.mean_generated,
                       c.mean_length, c.mean_rounds, c.peak_slots, c.peak_kv_bytes, c.decode_tok_s, c.no_answer,
                       c.hit_cap, c.fact_kept_rollouts, c.fact_kept_correct, c.fact_lost_rollouts,
                       c.fact_lost_correct, c.answer_too_long);
    csv += fmt::format("{},{},", c.budget_fraction, c.sign_p_holm ? fmt::format("{}", *c.sign_p_holm) : "");
    if (c.equiv)
      csv += fmt::format("{},{},{},{},{},{},{}\n", c.equiv->method, c.equiv->margin, c.equiv->p,
                         c.equiv->equivalent ? 1 : 0, c.equiv->power, c.equiv->ci_lo, c.equiv->ci_hi);
    else
      csv += ",,,,,,\n";
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
           {"answer_too_long", c.answer_too_long},
           {"budget_fraction", c.budget_fraction},
           {"sign_p_holm", c.sign_p_holm ? json(*c.sign_p_holm) : json(nullptr)},
           {"equivalence", equiv_json(c.equiv)}};
    cells.push_back(std::move(j));
  }
  json pooled = json::array();
  for (const PooledComparison& p : s.pooled)
    pooled.push_back({{"policy", p.policy},
                      {"budgets", p.budgets},
                      {"diff", ci_json(p.diff)},
                      {"sign_test", {{"pos", p.sign.n_pos}, {"neg", p.sign.n_neg}, {"ties", p.sign.n_ties}, {"p", p.sign.p}}},
                      {"equivalence", equiv_json(p.equiv)}});
  return json{{"settings", s.settings.to_json()}, {"margin", s.margin}, {"cells", cells}, {"pooled", pooled}};
}

void write_summary_files(const std::string& dir, const EvalSummary& s) {
  const std::filesystem::path d(dir);
  write_file_atomic((d / "summary.md").string(), summary_markdown(s));
  write_file_atomic((d / "summary.csv").string(), summary_csv(s));
  write_file_atomic((d / "summary.json").string(), summary_json(s).dump(2) + "\n");
}

}  // namespace kvevict
