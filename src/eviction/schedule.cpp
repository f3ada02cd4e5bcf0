#include "eviction/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
}  // namespace

void validate_eviction(const EvictionConfig& cfg, const Policy& policy) {
  if (!policy.evicts) return;
  if (cfg.recent < 1)
    throw FieldError(Field::Recent, "", fmt::format(" {}: the recent buffer r must be >= 1", cfg.recent));
  if (cfg.interval < 0)
    throw FieldError(Field::RoundInterval, "",
                     fmt::format(" {}: must be >= 1 (0 = the recent buffer r)", cfg.interval));
  if (cfg.budget <= cfg.recent)
    throw FieldError(Field::Budget, "",
                     fmt::format(" {} must be greater than the recent buffer r = {} (K_sel = B - r must be >= 1)",
                                 cfg.budget, cfg.recent));
  if (policy.sinks >= cfg.k_sel())
    throw FieldError(Field::Sinks, "",
                     fmt::format(" {} must be smaller than K_sel = B - r = {}", policy.sinks, cfg.k_sel()));
  // What the policy itself needs (registry.h): running below it would silently run something
  // other than what was named.
  if (policy.info == nullptr) return;
  const PolicyInfo& info = *policy.info;
  if (policy.sinks < info.min_sinks)
    throw FieldError(Field::Sinks, fmt::format("policy '{}' with ", info.name),
                     fmt::format(" {} {}", policy.sinks, info.min_sinks_reason));
  if (cfg.k_sel() < info.min_k_sel)
    throw FieldError(
        Field::Budget,
        fmt::format("policy '{}' {}, more than K_sel = B - r = {} slots (", info.name, info.min_k_sel_reason,
                    cfg.k_sel()),
        fmt::format(" {}, r = {}): it needs B >= {}", cfg.budget, cfg.recent, cfg.recent + info.min_k_sel));
}

CheckedPolicy::CheckedPolicy() : policy_(make_policy("full")) {}

CheckedPolicy CheckedPolicy::check(Policy policy, const EvictionConfig& eviction) {
  validate_eviction(eviction, policy);
  return CheckedPolicy(std::move(policy), eviction);
}

std::string long_prompt_warning(const EvictionConfig& cfg, const Policy& policy, int64_t prompt_len,
                                FieldSpeller spell) {
  if (!policy.evicts || !policy.protect_prompt || prompt_len <= cfg.k_sel() - 1) return "";
  const std::string_view mode = spell(Field::LongPrompt);
  if (eviction_disabled(cfg, policy, prompt_len))
    return fmt::format(
        "prompt of {} tokens is longer than the budget B = {}: eviction is skipped for this "
        "sequence and the cache grows without bound ({} pin-head enforces the "
        "budget instead)",
        prompt_len, cfg.budget, mode);
  return fmt::format(
      "prompt of {} tokens is longer than the prompt pin K_sel - 1 = {}: only its "
      "first {} tokens are pinned, the rest can be evicted{}",
      prompt_len, cfg.k_sel() - 1, cfg.k_sel() - 1,
      cfg.long_prompt == LongPromptMode::Skip
          ? fmt::format(" ({} skip skips eviction only for prompts longer than B = {})", mode, cfg.budget)
          : fmt::format(" ({} skip keeps the full cache instead when the prompt exceeds B)", mode));
}

bool eviction_disabled(const EvictionConfig& cfg, const Policy& policy, int64_t prompt_len) {
  if (!policy.evicts) return true;
  // Spec §2.5 (vLLM port): skip only while the prompt exceeds B; a prompt in (K_sel - 1, B]
  // still fits the budget, so it evicts with its head pinned as in PinHead.
  return cfg.long_prompt == LongPromptMode::Skip && policy.protect_prompt && prompt_len > cfg.budget;
}

int64_t required_capacity(const EvictionConfig& cfg, const Policy& policy, int64_t prompt_len, int64_t max_new_tokens) {
  if (eviction_disabled(cfg, policy, prompt_len)) return std::max<int64_t>(1, prompt_len + max_new_tokens);
  return std::max(cfg.budget, prompt_len) + cfg.round_interval();
}

bool round_due(int64_t length, const EvictionConfig& cfg) {
  return length > cfg.budget && (length - cfg.budget) % cfg.round_interval() == 0;
}

int64_t pinned_positions(const EvictionConfig& cfg, const Policy& policy, int64_t prompt_len) {
  const int64_t prompt_pin = policy.protect_prompt ? std::min(prompt_len, cfg.k_sel() - 1) : 0;
  return std::max<int64_t>(policy.sinks, prompt_pin);
}

std::vector<int32_t> choose_keep_set(std::span<const float> scores, const int32_t* positions, int64_t n_pinned,
                                     int64_t k_sel, int64_t recent) {
  const auto n_cand = static_cast<int64_t>(scores.size());
  std::vector<int32_t> keep;
  keep.reserve(static_cast<size_t>(std::min(n_cand, k_sel) + recent));
  if (n_cand <= k_sel) {
    keep.resize(static_cast<size_t>(n_cand));
    std::iota(keep.begin(), keep.end(), 0);
  } else {
    std::vector<float> eff(scores.begin(), scores.end());
    for (int64_t i = 0; i < n_cand; ++i) {
      if (positions[i] < n_pinned)
        eff[static_cast<size_t>(i)] = std::numeric_limits<float>::infinity();
      else if (std::isnan(eff[static_cast<size_t>(i)]))
        eff[static_cast<size_t>(i)] = -std::numeric_limits<float>::infinity();
    }
    std::vector<int32_t> idx(static_cast<size_t>(n_cand));
    std::iota(idx.begin(), idx.end(), 0);
    // Strict total order (score desc, slot asc) makes the chosen set independent of the
    // nth_element implementation.
    const auto better = [&](int32_t a, int32_t b) {
      const float sa = eff[static_cast<size_t>(a)], sb = eff[static_cast<size_t>(b)];
      return sa > sb || (sa == sb && a < b);
    };
    std::nth_element(idx.begin(), idx.begin() + k_sel, idx.end(), better);
    keep.assign(idx.begin(), idx.begin() + k_sel);
    std::sort(keep.begin(), keep.end());
  }
  for (int64_t i = 0; i < recent; ++i) keep.push_back(static_cast<int32_t>(n_cand + i));
  return keep;
}

RoundTiming run_round(SequenceKv& kv, const Policy& policy, SelectorState* state, const EvictionConfig& cfg,
                      int64_t prompt_len, int64_t n_seen, uint64_t sequence_id, int64_t round, const Rope& rope,
                      ThreadPool* pool, KeepSets* keep_out) {
  const KvShape& shape = kv.shape();
  const int64_t length = kv.length(0);
  for (int l = 1; l < shape.n_layers; ++l)
    if (kv.length(l) != length)
      throw Error(fmt::format("eviction round: layer {} holds {} slots but layer 0 holds {}", l, kv.length(l), length));
  const int64_t n_cand = length - cfg.recent;
  const int64_t n_heads_total = int64_t{shape.n_layers} * shape.n_kv_heads;
  RoundTiming timing;

  const int64_t n_pinned = pinned_positions(cfg, policy, prompt_len);
  auto t0 = Clock::now();
  std::vector<float> scores(static_cast<size_t>(n_heads_total * n_cand));
  const RoundInput in{kv,   n_cand,     prompt_len, n_seen,   cfg.seed, sequence_id,  round,
                      pool, cfg.budget, cfg.recent, n_pinned, &rope,    cfg.positions};
  policy.selector->score(in, state, scores);
  timing.score_ms = ms_since(t0);

  t0 = Clock::now();
  KeepSets keeps(static_cast<size_t>(n_heads_total));
  const auto compact = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int layer = static_cast<int>(i / shape.n_kv_heads), head = static_cast<int>(i % shape.n_kv_heads);
      auto& keep = keeps[static_cast<size_t>(i)];
      keep = choose_keep_set(
          std::span<const float>(scores).subspan(static_cast<size_t>(i * n_cand), static_cast<size_t>(n_cand)),
          kv.positions(layer, head), n_pinned, cfg.k_sel(), cfg.recent);
      kv.compact(layer, head, keep);
      if (cfg.positions == PositionMode::Cache) {
        // Keys were rotated to their old slot index; rotate each moved key by (new - old).
        float* k = kv.keys(layer, head);
        for (size_t j = 0; j < keep.size(); ++j)
          if (static_cast<int64_t>(j) != keep[j])
            rope.rotate(k + static_cast<int64_t>(j) * shape.head_dim, static_cast<int64_t>(j) - keep[j]);
      }
    }
  };
  // Work estimate: keys and values of every slot moved once.
  if (pool)
    pool->parallel_for(n_heads_total, compact, n_heads_total * length * shape.head_dim * 2);
  else
    compact(0, n_heads_total);
  const auto new_len = static_cast<int64_t>(keeps[0].size());
  for (int l = 0; l < shape.n_layers; ++l) kv.set_length(l, new_len);
  if (state)
    for (int64_t i = 0; i < n_heads_total; ++i)
      state->on_compact(static_cast<int>(i / shape.n_kv_heads), static_cast<int>(i % shape.n_kv_heads),
                        keeps[static_cast<size_t>(i)]);
  timing.compact_ms = ms_since(t0);
  if (keep_out) *keep_out = std::move(keeps);
  return timing;
}

}  // namespace kvevict
