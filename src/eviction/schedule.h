// The eviction schedule every policy shares: when a round runs, what is pinned, how the keep-set
// is chosen from the selector's scores and how the cache is compacted.
//
// Source: docs/eviction-spec.md §2. A round, for each (layer, KV head): score the candidates (all
// slots but the newest r); give pinned positions +infinity; keep the top K_sel = B - r; sort the
// keep-set by slot (chronological compaction); gather keys, values and positions; append the
// newest r. Length becomes exactly B. Rounds run every s decode steps (the round interval, default
// s = r), so the cache peaks at B + s.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eviction/registry.h"
#include "kernels/rope.h"
#include "kvcache/kv_cache.h"
#include "util/field_error.h"

namespace kvevict {

class ThreadPool;

/// What to do when the prompt is longer than the prompt pin can hold (prompt_len > K_sel - 1).
/// Source: docs/eviction-spec.md §2.5.
enum class LongPromptMode {
  /// Default (the official HF engine): pin only the first K_sel - 1 prompt tokens; the rest of
  /// the prompt becomes ordinary candidates. The budget holds.
  PinHead,
  /// The paper's vLLM port: never evict a sequence whose prompt exceeds the budget B (full
  /// cache; the budget does not hold). A prompt in (K_sel - 1, B] is handled as in PinHead.
  Skip,
};

/// Parameters of the shared schedule for one sequence.
struct EvictionConfig {
  int64_t budget = 0;   ///< B: slots per (layer, KV head) after a round, prompt and buffer included
  int64_t recent = 64;  ///< r: newest slots that are never candidates
  /// s: decode steps between rounds (spec §2.3), the peak being B + s slots; 0 = r (kvevict's
  /// default, one round per recent buffer). R-KV's and TriAttention's code set it apart from
  /// the protected window (R-KV: a round every 128 tokens, `window_size` 8; TriAttention:
  /// `divide_length` 128).
  int64_t interval = 0;
  LongPromptMode long_prompt = LongPromptMode::PinHead;
  PositionMode positions = PositionMode::Logical;
  uint64_t seed = 0;  ///< base seed of every random choice
  int64_t k_sel() const { return budget - recent; }
  /// The round interval s in force: `interval`, or r when it is 0.
  int64_t round_interval() const { return interval > 0 ? interval : recent; }
};

/// Checks B > r >= 1, interval >= 0, sinks < K_sel, and the constraints the policy declares in its PolicyInfo
/// (min_sinks, min_k_sel). Nothing for a policy that does not evict. Throws FieldError naming the
/// field (Budget, Recent, RoundInterval or Sinks) and the values.
void validate_eviction(const EvictionConfig& cfg, const Policy& policy);

/// A policy with the schedule it runs under, checked by validate_eviction exactly once: only
/// CheckedPolicy::check makes one, so holding one proves the check ran, and
/// Engine::new_sequence(id, const CheckedPolicy&, ...) does not repeat it. Default: `full`.
class CheckedPolicy {
 public:
  CheckedPolicy();
  /// Runs validate_eviction(eviction, policy). Throws its FieldError.
  static CheckedPolicy check(Policy policy, const EvictionConfig& eviction);
  const Policy& policy() const { return policy_; }
  const EvictionConfig& eviction() const { return eviction_; }

 private:
  CheckedPolicy(Policy policy, const EvictionConfig& eviction) : policy_(std::move(policy)), eviction_(eviction) {}
  Policy policy_;
  EvictionConfig eviction_;
};

/// Human-readable warning when `prompt_len` exceeds the prompt pin (K_sel - 1), describing what
/// `cfg.long_prompt` will do; empty when there is nothing to warn about. `spell` names the
/// long-prompt setting the way the caller's front end does.
std::string long_prompt_warning(const EvictionConfig& cfg, const Policy& policy, int64_t prompt_len,
                                FieldSpeller spell = field_name);

/// True when a sequence with this prompt never evicts (policy `full`, or LongPromptMode::Skip
/// with a prompt-protecting policy and a prompt longer than B; docs/eviction-spec.md §2.5: the vLLM
/// port skips compression while the prompt exceeds the budget).
bool eviction_disabled(const EvictionConfig& cfg, const Policy& policy, int64_t prompt_len);

/// Slots per (layer, KV head) to allocate for a sequence: max(B, prompt_len) + s when it evicts
/// (the peak: a round runs as soon as length - B reaches a multiple of the round interval s), else
/// prompt_len + max_new_tokens.
int64_t required_capacity(const EvictionConfig& cfg, const Policy& policy, int64_t prompt_len, int64_t max_new_tokens);

/// True when a round is due after a decode step left `length` slots: length > B and
/// (length - B) is a multiple of the round interval s (cfg.round_interval(), r by default); in
/// steady state it fires at length = B + s (spec §2.3).
bool round_due(int64_t length, const EvictionConfig& cfg);

/// Number of leading positions pinned: max(sinks, protect ? min(prompt_len, K_sel - 1) : 0).
int64_t pinned_positions(const EvictionConfig& cfg, const Policy& policy, int64_t prompt_len);

/// Time spent in one round, milliseconds (wall clock).
struct RoundTiming {
  double score_ms = 0;
  double compact_ms = 0;
};

/// Keep-sets of one round: keep[layer * n_kv_heads + kv_head] = old slot indices kept,
/// ascending, size B (recent buffer included). Filled only when requested.
using KeepSets = std::vector<std::vector<int32_t>>;

/// Runs one eviction round on every (layer, KV head) of `kv` (all layers must have the same
/// length L >= B + 1). Candidates are slots [0, L - r). Calls state->on_compact for each head.
/// In PositionMode::Cache, re-rotates every moved key to its new slot index with `rope`.
/// Throws kvevict::Error if the selector returns a wrong-sized score vector.
RoundTiming run_round(SequenceKv& kv, const Policy& policy, SelectorState* state, const EvictionConfig& cfg,
                      int64_t prompt_len, int64_t n_seen, uint64_t sequence_id, int64_t round, const Rope& rope,
                      ThreadPool* pool, KeepSets* keep_out = nullptr);

/// Chooses the keep-set of one (layer, KV head) from scores[n_candidates]: candidates whose
/// position is < n_pinned score +infinity; NaN counts as -infinity; the top K_sel by
/// (score desc, slot asc) are taken and returned ascending, followed by the newest `recent`
/// slots [n_candidates, n_candidates + recent). Exposed for tests.
std::vector<int32_t> choose_keep_set(std::span<const float> scores, const int32_t* positions, int64_t n_pinned,
                                     int64_t k_sel, int64_t recent);

}  // namespace kvevict
