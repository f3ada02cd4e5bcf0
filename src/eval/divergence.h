// How far an evicting policy moves a model's next-token distributions away from the full cache,
// on real text: per-token KL divergence from `full` and perplexity, teacher-forced, with the
// first P tokens of each text playing the prompt; and how much attention each query head puts on
// the first positions of a text (whether the model has attention sinks at all).
//
// Source: KL(full || evicted) per decode step as the KV-compression literature reports it (e.g.
// the "KL divergence from the full cache" curves of SnapKV arXiv 2404.14469 §5 and kvpress's
// evaluation); attention mass on the first tokens as StreamingLLM (arXiv 2309.17453) §3.1 /
// Figure 2 measures it. docs/eviction-spec.md §2 for the schedule the policies run under.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace kvevict {

/// One (policy, schedule) cell compared with `full` on a text.
struct DivergenceCell {
  std::string label;  ///< e.g. "random@102"
  Policy policy;
  EvictionConfig eviction;
};

/// Means over one span of scored positions, for `full` and every cell.
struct DivergenceSpan {
  int64_t n = 0;                ///< positions in the span
  double full_nll = 0;          ///< mean -log p_full(token), nats per token
  std::vector<double> kl;       ///< [cells] mean KL(p_full || p_cell), nats per token
  std::vector<double> nll;      ///< [cells] mean -log p_cell(token), nats per token
  std::vector<double> top1;     ///< [cells] fraction of positions whose argmax equals full's
};

/// Result of one text for every cell. Positions scored: the continuation tokens
/// tokens[P], ..., tokens[N-1] (N - P of them), each predicted from everything before it.
/// `answer` pools the positions [A, N) of a text given an answer start A (a task's final
/// answer: where a policy that lost what the trace computed shows it, while the whole
/// continuation's mean is dominated by steps the prompt answers); answer.n = 0 without one.
struct DivergenceText {
  DivergenceSpan all;                ///< every scored position (all.n = N - P)
  std::vector<SequenceStats> stats;  ///< [cells] rounds, peak slots, timings
  DivergenceSpan answer;             ///< positions [answer_from, N); n = 0 without an answer start
};

/// Teacher-forces `tokens` [N] through `full` and through every cell in lockstep: all sequences
/// prefill tokens[0, P) (P = prompt_len; eviction never runs in prefill, spec §2.2, and a policy
/// that pins the prompt pins these P tokens) and then decode tokens[P, N-1) one step at a time
/// in one batch (Engine::decode_batch, so `full` and the cells see bit-identical kernels and
/// a cell's KL is exactly 0 until its first eviction round). KL and NLL are computed in double
/// from log-softmax of the logits. sequence_id seeds every random draw of the cells (same id,
/// same keep-sets, whatever else runs). `answer_from` = A (0 = none) also pools positions
/// [A, N) into `answer`. Throws kvevict::Error when P < 1 or P >= N, A is not 0 and not in [P, N),
/// a cell does not evict, or a cell's schedule is invalid (names the cell).
DivergenceText divergence_text(Engine& engine, std::span<const int32_t> tokens, int64_t prompt_len,
                               std::span<const DivergenceCell> cells, uint64_t sequence_id,
                               int64_t answer_from = 0);

/// Mean attention mass each query head puts on the first `first_k` positions of a text, under
/// the full cache: for every query token at position t >= min_position, the sum of its softmax
/// probabilities over positions [0, first_k), averaged over those tokens.
struct AttentionMass {
  int n_layers = 0, n_heads = 0;
  int first_k = 0;
  int64_t queries = 0;         ///< query tokens averaged per head
  std::vector<double> mass;    ///< [n_layers * n_heads]: mean mass on positions [0, first_k)
  /// What uniform attention over the causal prefix would give: mean over the same query tokens of
  /// first_k / (t + 1). A head far above it concentrates on the first tokens (a sink).
  double uniform = 0;
};

/// Runs each text (one prefill each, full cache, attention probabilities requested) and averages
/// the mass on its first `first_k` positions over query tokens at positions >= min_position, per
/// (layer, query head), pooled over texts. Throws kvevict::Error when first_k < 1, min_position
/// < first_k, or no text reaches min_position + 1 tokens.
AttentionMass attention_mass(const Model& model, std::span<const std::vector<int32_t>> texts, int first_k,
                             int64_t min_position, ThreadPool& pool);

}  // namespace kvevict
