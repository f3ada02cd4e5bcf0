#include "eval/divergence.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "model/forward.h"
#include "model/model.h"
#include "util/error.h"

namespace kvevict {
namespace {

/// log-softmax of one logits row, in double.
void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  out.resize(logits.size());
  double maxl = logits[0];
  for (float l : logits) maxl = std::max(maxl, static_cast<double>(l));
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - maxl);
  const double lse = maxl + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
}

/// KL(p || q) from log-probabilities.
double kl_divergence(const std::vector<double>& logp, const std::vector<double>& logq) {
  double kl = 0;
  for (size_t i = 0; i < logp.size(); ++i) kl += std::exp(logp[i]) * (logp[i] - logq[i]);
  return std::max(0.0, kl);  // rounding can leave -1e-17 where the rows are equal
}

size_t argmax(std::span<const float> row) {
  return static_cast<size_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

/// Zeroed running sums of one span over `cells` cells; span_finish turns them into means.
void span_init(DivergenceSpan& s, size_t cells) {
  s.kl.assign(cells, 0.0);
  s.nll.assign(cells, 0.0);
  s.top1.assign(cells, 0.0);
}

void span_finish(DivergenceSpan& s) {
  if (s.n == 0) return;
  const auto inv = 1.0 / static_cast<double>(s.n);
  s.full_nll *= inv;
  for (size_t c = 0; c < s.kl.size(); ++c) {
    s.kl[c] *= inv;
    s.nll[c] *= inv;
    s.top1[c] *= inv;
  }
}

}  // namespace

DivergenceText divergence_text(Engine& engine, std::span<const int32_t> tokens, int64_t prompt_len,
                               std::span<const DivergenceCell> cells, uint64_t sequence_id, int64_t answer_from) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (prompt_len < 1 || prompt_len >= n)
    throw Error(fmt::format("divergence: prompt of {} tokens must be in [1, {}) for a text of {} tokens", prompt_len,
                            n, n));
  if (answer_from != 0 && (answer_from < prompt_len || answer_from >= n))
    throw Error(fmt::format("divergence: answer start {} must be 0 (none) or in [prompt {}, text length {})",
                            answer_from, prompt_len, n));
  const int64_t steps = n - prompt_len;  // continuation tokens scored
  std::vector<std::unique_ptr<Sequence>> owned;
  owned.push_back(engine.new_sequence(sequence_id, make_policy("full"), EvictionConfig{}, prompt_len, steps));
  for (const DivergenceCell& c : cells) {
    if (!c.policy.evicts) throw Error(fmt::format("divergence: cell '{}' does not evict; `full` is the reference", c.label));
    try {
      owned.push_back(engine.new_sequence(sequence_id, c.policy, c.eviction, prompt_len, steps));
    } catch (const Error& e) {
      throw Error(fmt::format("divergence: cell '{}': {}", c.label, e.what()));
    }
  }
  const size_t n_seq = owned.size();
  const auto vocab = static_cast<size_t>(engine.model().config().n_vocab);
  std::vector<float> logits(n_seq * vocab), row;
  for (size_t s = 0; s < n_seq; ++s) {
    engine.prefill(*owned[s], tokens.first(static_cast<size_t>(prompt_len)), row);
    std::copy(row.begin(), row.end(), logits.begin() + static_cast<std::ptrdiff_t>(s * vocab));
  }
  std::vector<Sequence*> seqs;
  for (auto& s : owned) seqs.push_back(s.get());

  DivergenceText r;
  span_init(r.all, cells.size());
  span_init(r.answer, cells.size());
  std::vector<double> logp, logq;
  std::vector<int32_t> step_tokens(n_seq);
  for (int64_t i = prompt_len; i < n; ++i) {
    const auto target = static_cast<size_t>(tokens[static_cast<size_t>(i)]);
    const std::span<const float> full_row(logits.data(), vocab);
    log_softmax(full_row, logp);
    const size_t full_top = argmax(full_row);
    // The spans position i counts in: every scored position, and the answer's from answer_from on.
    DivergenceSpan* const spans[] = {&r.all, &r.answer};
    const size_t n_spans = answer_from != 0 && i >= answer_from ? 2 : 1;
    for (size_t k = 0; k < n_spans; ++k) {
      ++spans[k]->n;
      spans[k]->full_nll -= logp[target];
    }
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::span<const float> cell_row(logits.data() + (c + 1) * vocab, vocab);
      log_softmax(cell_row, logq);
      const double kl = kl_divergence(logp, logq), nll = -logq[target];
      const double top = argmax(cell_row) == full_top ? 1.0 : 0.0;
      for (size_t k = 0; k < n_spans; ++k) {
        spans[k]->kl[c] += kl;
        spans[k]->nll[c] += nll;
        spans[k]->top1[c] += top;
      }
    }
    if (i + 1 < n) {
      std::fill(step_tokens.begin(), step_tokens.end(), tokens[static_cast<size_t>(i)]);
      engine.decode_batch(seqs, step_tokens, logits);
    }
  }
  span_finish(r.all);
  span_finish(r.answer);
  for (size_t c = 0; c < cells.size(); ++c) r.stats.push_back(owned[c + 1]->stats);
  return r;
}

namespace {

/// Sums, per (layer, query head), the probability each query token puts on positions [0, k).
class MassObserver final : public AttentionObserver {
 public:
  MassObserver(int n_layers, int n_heads, int k, int64_t min_position)
      : n_heads_(n_heads), k_(k), min_position_(min_position),
        sums_(static_cast<size_t>(n_layers) * static_cast<size_t>(n_heads), 0.0) {}

  void observe(const AttentionObservation& obs) override {
    if (obs.position < min_position_ || obs.probs == nullptr) return;
    // Full cache, no eviction: slot s holds position s, so the first k slots are the first k
    // positions.
    for (int h = 0; h < obs.n_heads; ++h) {
      const float* p = obs.probs + static_cast<int64_t>(h) * obs.n_slots;
      double m = 0;
      for (int s = 0; s < k_ && s < obs.n_slots; ++s) m += p[s];
      sums_[static_cast<size_t>(obs.layer) * static_cast<size_t>(n_heads_) + static_cast<size_t>(h)] += m;
    }
    if (obs.layer == 0) {
      ++queries_;
      uniform_ += static_cast<double>(k_) / static_cast<double>(obs.position + 1);
    }
  }
  const std::vector<double>& sums() const { return sums_; }
  int64_t queries() const { return queries_; }
  double uniform_sum() const { return uniform_; }

 private:
  int n_heads_, k_;
  int64_t min_position_;
  std::vector<double> sums_;
  int64_t queries_ = 0;
  double uniform_ = 0;
};

}  // namespace

AttentionMass attention_mass(const Model& model, std::span<const std::vector<int32_t>> texts, int first_k,
                             int64_t min_position, ThreadPool& pool) {
  if (first_k < 1) throw Error(fmt::format("attention mass: first_k {} must be >= 1", first_k));
  if (min_position < first_k)
    throw Error(fmt::format("attention mass: min_position {} must be >= first_k {}", min_position, first_k));
  const ModelConfig& c = model.config();
  const Rope rope(c.rope);
  MassObserver obs(c.n_layers, c.n_heads, first_k, min_position);
  ForwardBuffers buf;
  std::vector<float> logits;
  for (const std::vector<int32_t>& t : texts) {
    if (static_cast<int64_t>(t.size()) <= min_position) continue;
    SequenceKv kv(KvShape{c.n_layers, c.n_kv_heads, c.head_dim}, static_cast<int64_t>(t.size()));
    const ForwardSegment seg{&kv, t, 0, PositionMode::Logical, &obs, /*want_probs=*/true, /*is_prefill=*/true};
    model_forward(
        {.model = model, .rope = rope, .pool = pool, .buf = buf, .wanted = LogitsWanted::None, .allow_blas = true}, seg,
        logits);
  }
  if (obs.queries() == 0)
    throw Error(fmt::format("attention mass: no text is longer than min_position {} tokens", min_position));
  AttentionMass m;
  m.n_layers = c.n_layers;
  m.n_heads = c.n_heads;
  m.first_k = first_k;
  m.queries = obs.queries();
  m.uniform = obs.uniform_sum() / static_cast<double>(obs.queries());
  for (double s : obs.sums()) m.mass.push_back(s / static_cast<double>(obs.queries()));
  return m;
}

}  // namespace kvevict
