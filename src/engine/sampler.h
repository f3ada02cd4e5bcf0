// Next-token sampling: logit bias and repetition / presence / frequency penalties on the model's
// logits, then greedy or temperature with top-k, top-p (nucleus) and min-p cuts; and the
// log-probabilities reported for a chosen token.
//
// Sources: nucleus sampling, Holtzman et al. (arXiv 1904.09751) §3.1; the paper's protocol
// (docs/eviction-spec.md §4): temperature 0.6, top-p 0.95, no top-k. The other fields follow
// vLLM's sampler (vllm/model_executor/layers/sampler.py and layers/utils.py `apply_penalties`,
// SamplingParams docs) so a server request means what it means there:
//   logit_bias (OpenAI API): logit[t] += bias[t], before everything else;
//   repetition_penalty (CTRL, Keskar et al. arXiv 1909.05858 §4.1, as vLLM and llama.cpp apply
//     it): for every token seen in the prompt or the output, logit /= p when logit > 0, else
//     logit *= p;
//   frequency / presence penalty (OpenAI API "parameter details"): for every token generated
//     c > 0 times, logit -= c * frequency_penalty + presence_penalty (output tokens only);
//   temperature, then top-k, then top-p over the tokens top-k kept (renormalised), then min-p
//     (vLLM `_apply_min_p`; Nguyen et al. arXiv 2407.01082 §3): drop tokens whose probability is
//     below min_p times the largest one.
// llama.cpp differs only in the penalty window (its last 64 tokens, prompt included).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "util/rng.h"

namespace kvevict {

/// Sampling settings. temperature 0 means greedy (argmax of the adjusted logits, lowest id on
/// ties). Every field past `seed` is off by default, so its default changes nothing.
struct SamplerConfig {
  float temperature = 0.6f;
  float top_p = 0.95f;  ///< keep the smallest set of tokens whose probability reaches top_p (1 = off)
  int top_k = 0;        ///< keep the k most likely tokens first (0 = off)
  uint64_t seed = 0;
  float min_p = 0.0f;                        ///< drop tokens with probability < min_p x the largest (0 = off), [0, 1]
  float repetition_penalty = 1.0f;           ///< on tokens of the prompt and output (1 = off), > 0
  float presence_penalty = 0.0f;             ///< subtracted once per generated token id (0 = off), [-2, 2]
  float frequency_penalty = 0.0f;            ///< subtracted per occurrence in the output (0 = off), [-2, 2]
  std::map<int32_t, float> logit_bias = {};  ///< token id -> added to its logit, [-100, 100] (OpenAI's range)

  /// True when logit_bias or a penalty changes the logits before sampling.
  bool adjusts_logits() const {
    return !logit_bias.empty() || repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  /// True when the penalties need the counts of the tokens seen (TokenCounts).
  bool needs_counts() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

/// Checks ranges (temperature >= 0, 0 < top_p <= 1, top_k >= 0, the ranges above; with
/// n_vocab > 0 also every logit_bias token id in [0, n_vocab)). Throws FieldError naming the field.
void validate_sampler(const SamplerConfig& cfg, int32_t n_vocab = 0);

/// Index of the largest logit (lowest index on ties).
int32_t argmax(std::span<const float> logits);

/// Token ids ordered by (logit desc, id asc) — the order sample_token draws in. With
/// 0 < top_k < n_vocab / 16 only the first top_k ids are returned (a partial sort), else all
/// n_vocab (a stable radix sort on the logits' order keys; -0.0 ties with +0.0). Logits must not
/// be NaN.
std::vector<int32_t> order_by_probability(std::span<const float> logits, int32_t top_k = 0);

/// Draws one token from logits[n_vocab] with the stream `rng` (seed it per (seed, sequence, step)
/// for reproducibility): greedy when temperature is 0, else temperature, top-k, top-p and min-p
/// over the distribution sorted by (probability desc, id asc). logit_bias and the penalties are
/// not applied here (adjust_logits does that; it needs the sequence's history).
int32_t sample_token(std::span<const float> logits, const SamplerConfig& cfg, Rng& rng);

/// How often each token id occurred in a sequence: in the prompt (repetition penalty) and in the
/// generated tokens (all three penalties). Memory O(n_vocab).
class TokenCounts {
 public:
  TokenCounts() = default;
  /// Counts of a sequence with prompt `prompt` and nothing generated yet. Throws kvevict::Error
  /// for an id outside [0, n_vocab).
  TokenCounts(int32_t n_vocab, std::span<const int32_t> prompt);
  /// One generated token.
  void add_output(int32_t token);
  bool in_prompt(int32_t token) const { return prompt_[static_cast<size_t>(token)] != 0; }
  int32_t in_output(int32_t token) const { return output_[static_cast<size_t>(token)]; }
  /// Token ids seen so far (prompt or output), each once, in order of first sight.
  const std::vector<int32_t>& seen() const { return seen_; }

 private:
  std::vector<uint8_t> prompt_;
  std::vector<int32_t> output_;
  std::vector<int32_t> seen_;
};

/// Applies cfg.logit_bias, then the repetition, frequency and presence penalties (header
/// formulas) to logits[n_vocab] in place. `counts` may be null when !cfg.needs_counts().
void adjust_logits(std::span<float> logits, const SamplerConfig& cfg, const TokenCounts* counts);

/// Log-probabilities of one step, from the model's raw logits (before bias, penalties and
/// temperature; vLLM's default "raw_logprobs", OpenAI's logprobs): the chosen token's and the
/// `top_n` most likely alternatives' (descending, lowest id first on ties).
struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0;                           ///< natural log, <= 0
  std::vector<std::pair<int32_t, float>> top;  ///< (token id, logprob), top_n entries
};

/// log_softmax(logits)[token] computed in double (max-subtracted), and the top_n alternatives.
/// Throws kvevict::Error for a token outside the logits or top_n < 0.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top_n);

}  // namespace kvevict
