// The report of an eval run: one row per (policy, budget) cell with accuracy, the paired
// comparison against the reference policy, generated length, peak cache and decode speed;
// rendered as Markdown (what the CLI prints), CSV and JSON (what the plot script reads).
//
// Source: the paper's protocol (docs/eviction-spec.md §4): per-problem mean accuracy over rollouts;
// for each policy vs the reference, a paired problem-clustered percentile bootstrap 95% CI of
// the difference and an exact two-sided sign test (eval/stats.h). Added so that "A ~ B" can be
// claimed only when shown: an equivalence test (TOST, margin kDefaultMargin unless given) with
// its power, Holm-adjusted sign-test p-values over the report's comparisons, each budget as a
// fraction of the mean sequence length, and per policy a comparison pooled over its budgets
// with each problem counted once (clustered by problem).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "eval/results.h"
#include "eval/stats.h"

namespace kvevict {

/// Default equivalence margin of a report: 5 accuracy points.
inline constexpr double kDefaultMargin = 0.05;

/// One row of the report.
struct CellSummary {
  CellSpec cell;
  int64_t problems = 0;           ///< problems with at least one finished rollout
  int64_t rollouts = 0;           ///< finished rollouts
  int64_t expected_rollouts = 0;  ///< problems of the run x rollouts per problem
  double accuracy = 0;            ///< mean over problems of the per-problem mean
  ProportionCi accuracy_wilson;   ///< Wilson score 95% CI of the accuracy over `problems` (the reported one)
  BootstrapCi accuracy_ci;        ///< problem-clustered bootstrap CI of the accuracy (vs 0); zero width at 0 or 1
  /// Against the reference cell (reference policy, same budget; `full` has one cell): absent for
  /// the reference itself and when no problem has results in both cells.
  std::optional<BootstrapCi> diff;
  std::optional<SignTest> sign;
  /// Equivalence with the reference within +-margin (eval/stats.h equivalence_test: Tango's TOST
  /// for one greedy rollout per problem, the paired t TOST for means over rollouts); absent when
  /// `diff` is (or fewer than 2 paired problems for the t test).
  std::optional<Equivalence> equiv;
  /// Holm-adjusted sign-test p over every cell of the report that has a sign test.
  std::optional<double> sign_p_holm;
  std::string reference_label;  ///< label of the cell compared with
  /// budget / mean_length: the budget as a fraction of the mean sequence (prompt + generated)
  /// length; 0 for a policy that does not evict.
  double budget_fraction = 0;
  double mean_generated = 0;    ///< generated tokens per rollout
  double mean_length = 0;       ///< prompt + generated tokens per rollout
  double mean_rounds = 0;       ///< eviction rounds per rollout
  int64_t peak_slots = 0;       ///< max over rollouts of live slots per (layer, KV head)
  int64_t peak_kv_bytes = 0;    ///< max over rollouts of peak_slots x bytes per slot (all layers and heads)
  double decode_tok_s = 0;      ///< generated tokens / time in decode steps and rounds (per sequence)
  int64_t no_answer = 0;        ///< rollouts graded no_answer: no \boxed{} (GSM8K: no #### line either)
  int64_t answer_too_long = 0;  ///< rollouts graded answer_too_long: a boxed answer over kMaxAnswerBytes
  int64_t hit_cap = 0;          ///< rollouts stopped by the length cap (or with no room)
  /// Keep-log check of a fact stated once (RolloutRecord::fact_kept; `once` tasks only): rollouts
  /// that ended with the fact's slot still held by some (layer, KV head), and how many of them
  /// were right; the same for rollouts that had lost it. All zero for other tasks.
  int64_t fact_kept_rollouts = 0, fact_kept_correct = 0, fact_lost_rollouts = 0, fact_lost_correct = 0;
};

/// One policy against the reference pooled over every budget both ran: per problem, the mean
/// over budgets (and rollouts) of each side, so each problem is one paired observation.
struct PooledComparison {
  std::string policy;
  std::vector<int64_t> budgets;  ///< the budgets pooled, ascending
  BootstrapCi diff;              ///< problem-clustered bootstrap 95% CI of mean(policy - reference)
  SignTest sign;                 ///< over problems (ties = equal per-problem means)
  std::optional<Equivalence> equiv;
};

/// The whole report.
struct EvalSummary {
  EvalSettings settings;
  double margin = kDefaultMargin;  ///< equivalence margin used by every test of the report
  std::vector<CellSummary> cells;  ///< in settings.cells order
  /// Policies that evict, compared with the reference over >= 2 budgets, in settings order.
  std::vector<PooledComparison> pooled;
};

/// Builds the report from `records` (any order; records of cells not in settings.cells are an
/// error). Bootstrap streams are seeded from settings.seed and the cell labels, so the same
/// records give the same report however they were produced (one run, resumed, or merged shards).
/// `margin`: equivalence margin in accuracy units (0 < margin < 1). Throws kvevict::Error for a
/// record of an unknown cell or an invalid margin.
EvalSummary summarize(const EvalSettings& settings, const std::vector<RolloutRecord>& records,
                      double margin = kDefaultMargin);

/// Markdown: a few header lines (model, tasks, sampling) and the table; when rollouts carry the
/// fact-slot check, a second table splits each cell's accuracy by whether the fact was kept.
std::string summary_markdown(const EvalSummary& s);
/// CSV with one header line and one row per cell (numbers unrounded).
std::string summary_csv(const EvalSummary& s);
/// {"settings": ..., "cells": [...]} with every CellSummary field.
nlohmann::json summary_json(const EvalSummary& s);

/// Writes summary.md, summary.csv and summary.json into `dir` (atomically). Throws kvevict::Error.
void write_summary_files(const std::string& dir, const EvalSummary& s);

}  // namespace kvevict
