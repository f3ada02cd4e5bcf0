// Synthetic retrieval probes (`kvevict probe`): does a fact stated in the reasoning trace survive
// eviction until a question asks for it?
//
// Source: docs/eviction-spec.md §4 (the paper's §5): a passcode stated once and needed many rounds
// later (Table 3), and a fact planted in only k of a model's KV heads (1 head 3%, 2 heads 60%,
// 3 heads 83%, 8 heads 99% retrieval on Qwen3-4B). The texts, the layout and the filler are
// kvevict's own.
//
// Layout of one trial (token ids; every segment is tokenized on its own, as if preceded by a
// space, and the segments are concatenated):
//   prompt   = BOS + instruction                                   (prefilled; pinned by policies that pin)
//   trace    = lead filler + fact + filler ... + question          (decoded one token at a time, eviction active)
//   answer   = the code, teacher-forced: log p of each token, and whether each is the argmax
// `distance` = filler tokens between the end of the fact and the question. A restated fact is
// stated `restatements` times, at distances d, d(n-1)/n, ..., d/n before the question.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace kvevict {

/// Which probe.
enum class ProbeKind {
  Planted,   ///< fact once; kept only in chosen (layer, KV head) sites, evicted in all others
  Restated,  ///< fact stated several times, under the policy as it is
  Passcode,  ///< fact stated once, under the policy as it is
};

/// Parses "planted", "restated" or "passcode". Throws kvevict::Error.
ProbeKind parse_probe_kind(const std::string& name);
/// Lower-case name as accepted by parse_probe_kind.
const char* probe_kind_name(ProbeKind k);

/// A selector that forces the fate of chosen slots and leaves the rest to an inner selector:
/// in (layer, KV head) sites whose keep mask is set, candidates at `positions` score +infinity
/// (always kept); in every other site they score -infinity, so they are the first to go (a round
/// drops n_candidates - K_sel candidates: with a fact of at most that many tokens, the first
/// round that sees it as candidates evicts all of it). Other candidates keep the inner
/// selector's scores. The engine is unchanged: this is an ordinary Selector.
class ForcedSitesSelector final : public Selector {
 public:
  /// positions: logical positions to force, any order. keep: [n_layers * n_kv_heads], site
  /// (layer, head) at layer * n_kv_heads + head. Throws kvevict::Error when inner is null.
  ForcedSitesSelector(std::shared_ptr<const Selector> inner, std::vector<int32_t> positions, std::vector<uint8_t> keep);
  SelectorNeeds needs() const override { return inner_->needs(); }
  std::unique_ptr<SelectorState> make_state(const KvShape& shape) const override { return inner_->make_state(shape); }
  /// Inner scores, then the overrides. Throws kvevict::Error when the keep mask does not match
  /// the cache's n_layers * n_kv_heads.
  void score(const RoundInput& in, SelectorState* state, std::span<float> scores) const override;

 private:
  std::shared_ptr<const Selector> inner_;
  std::vector<int32_t> positions_;  // sorted
  std::vector<uint8_t> keep_;
};

/// `base` with its selector wrapped in a ForcedSitesSelector (name base.name + "+sites", same
/// protection and sinks). Throws kvevict::Error when base does not evict.
Policy force_sites(const Policy& base, std::vector<int32_t> positions, std::vector<uint8_t> keep);

/// Keep mask with `k` KV heads per layer, drawn uniformly without replacement per layer from
/// Rng(stream_id({seed, layer, tag})). [n_layers * n_kv_heads]. Throws when k > n_kv_heads or k < 0.
std::vector<uint8_t> random_head_mask(const KvShape& shape, int k, uint64_t seed);

/// Keep mask from explicit sites "L:H" (layer, KV head). Throws kvevict::Error for an
/// out-of-range or malformed site.
std::vector<uint8_t> site_mask(const KvShape& shape, const std::vector<std::pair<int, int>>& sites);

/// Parses "0:1,2:3" into (layer, KV head) pairs. Throws kvevict::Error naming the bad entry.
std::vector<std::pair<int, int>> parse_sites(const std::string& s);

/// One trial's tokens.
struct ProbeLayout {
  std::vector<int32_t> prompt;          ///< [P], BOS first when the model has one
  std::vector<int32_t> trace;           ///< [T], ends with the question
  std::vector<int32_t> answer;          ///< [A] forced answer tokens
  std::vector<int32_t> fact_positions;  ///< logical positions of every token of every fact statement
  std::string code;                     ///< the answer text
};

/// Options shared by every trial.
struct ProbeTextOptions {
  int digits = 4;               ///< length of the code (digits, first one non-zero)
  int64_t lead = 32;            ///< filler tokens between the prompt and the first fact statement
  int restatements = 4;         ///< statements of a Restated fact
  std::vector<int32_t> filler;  ///< filler token source (cycled from a seeded offset); empty = built-in sentences
};

/// Builds trial `trial` of `kind` at `distance` (>= 1) with the tokenizer of `model`. The code
/// and the filler offset come from Rng(stream_id({seed, trial, tag})), so every configuration
/// sees the same trials. Throws kvevict::Error on distance < 1 or digits outside [1, 18].
ProbeLayout build_probe_layout(const Tokenizer& tok, ProbeKind kind, int64_t distance, const ProbeTextOptions& opts,
                               uint64_t seed, int trial);

/// Result of one trial.
struct ProbeTrial {
  double answer_logprob = 0;  ///< sum over answer tokens of log p(token | everything before), nats
  int answer_tokens = 0;
  bool exact = false;  ///< every answer token was the argmax (= greedy decoding retrieves the code)
  int64_t rounds = 0;  ///< eviction rounds run
  /// Fact tokens still cached when the question was read, summed over (layer, KV head) sites,
  /// divided by (fact tokens x sites): 1 = kept everywhere, 0 = gone.
  double fact_kept = 0;
};

/// Runs one trial: prefill the prompt, decode the trace with `policy` active, then teacher-force
/// the answer. Throws kvevict::Error from the engine.
ProbeTrial run_probe_trial(Engine& engine, const Policy& policy, const EvictionConfig& cfg, const ProbeLayout& layout,
                           uint64_t sequence_id);

}  // namespace kvevict
