// Next-token sampling: greedy, temperature, top-k and top-p (nucleus).
//
// Source: nucleus sampling, Holtzman et al. (arXiv 1904.09751) §3.1; the paper's protocol
// (docs/eviction-spec.md §4): temperature 0.6, top-p 0.95, no top-k.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "util/rng.h"

namespace kvevict {

/// Sampling settings. temperature 0 means greedy (argmax, lowest id on ties).
struct SamplerConfig {
  float temperature = 0.6f;
  float top_p = 0.95f;  ///< keep the smallest set of tokens whose probability reaches top_p (1 = off)
  int top_k = 0;        ///< keep the k most likely tokens first (0 = off)
  uint64_t seed = 0;
};

/// Checks ranges (temperature >= 0, 0 < top_p <= 1, top_k >= 0). Throws FieldError naming the field.
void validate_sampler(const SamplerConfig& cfg);

/// Index of the largest logit (lowest index on ties).
int32_t argmax(std::span<const float> logits);

/// Draws one token from logits[n_vocab] with the stream `rng` (seed it per (seed, sequence, step)
/// for reproducibility). Applies temperature, then top-k, then top-p over the sorted distribution.
int32_t sample_token(std::span<const float> logits, const SamplerConfig& cfg, Rng& rng);

}  // namespace kvevict
