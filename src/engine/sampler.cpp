#include "engine/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "util/error.h"
#include "util/field_error.h"

namespace kvevict {

void validate_sampler(const SamplerConfig& cfg, int32_t n_vocab) {
  if (!(cfg.temperature >= 0.0f) || !std::isfinite(cfg.temperature))
    throw FieldError(Field::Temperature, "", fmt::format(" {}: must be a finite number >= 0", cfg.temperature));
  if (!(cfg.top_p > 0.0f && cfg.top_p <= 1.0f))
    throw FieldError(Field::TopP, "", fmt::format(" {}: must be in (0, 1]", cfg.top_p));
  if (cfg.top_k < 0) throw FieldError(Field::TopK, "", fmt::format(" {}: must be >= 0", cfg.top_k));
  if (!(cfg.min_p >= 0.0f && cfg.min_p <= 1.0f))
    throw FieldError(Field::MinP, "", fmt::format(" {}: must be in [0, 1]", cfg.min_p));
  if (!(cfg.repetition_penalty > 0.0f) || !std::isfinite(cfg.repetition_penalty))
    throw FieldError(Field::RepetitionPenalty, "",
                     fmt::format(" {}: must be a finite number > 0", cfg.repetition_penalty));
  if (!(cfg.presence_penalty >= -2.0f && cfg.presence_penalty <= 2.0f))
    throw FieldError(Field::PresencePenalty, "", fmt::format(" {}: must be in [-2, 2]", cfg.presence_penalty));
  if (!(cfg.frequency_penalty >= -2.0f && cfg.frequency_penalty <= 2.0f))
    throw FieldError(Field::FrequencyPenalty, "", fmt::format(" {}: must be in [-2, 2]", cfg.frequency_penalty));
  for (const auto& [token, bias] : cfg.logit_bias) {
    if (token < 0 || (n_vocab > 0 && token >= n_vocab))
      throw FieldError(Field::LogitBias, "",
                       n_vocab > 0 ? fmt::format(" token id {}: must be in [0, {})", token, n_vocab)
                                   : fmt::format(" token id {}: must be >= 0", token));
    if (!(bias >= -100.0f && bias <= 100.0f))
      throw FieldError(Field::LogitBias, "", fmt::format(" {} for token {}: must be in [-100, 100]", bias, token));
  }
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

namespace {

// Order key of a logit: unsigned, increasing as the logit decreases (so an ascending sort gives
// probability desc). -0.0 is folded into +0.0 because the two compare equal.
uint32_t descending_key(float l) {
  uint32_t b;
  const float f = l == 0.0f ? 0.0f : l;
  std::memcpy(&b, &f, sizeof b);
  const uint32_t ascending = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ~ascending;
}

}  // namespace

std::vector<int32_t> order_by_probability(std::span<const float> logits, int32_t top_k) {
  const auto n = static_cast<int32_t>(logits.size());
  std::vector<int32_t> idx(static_cast<size_t>(n));
  if (top_k > 0 && top_k < n / 16) {
    std::iota(idx.begin(), idx.end(), 0);
    // Only the first top_k places are read: select them, then order them (same order as a full
    // sort's prefix: the comparison is a strict total order).
    std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(), [&](int32_t a, int32_t b) {
      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
          (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
    });
    idx.resize(static_cast<size_t>(top_k));
    return idx;
  }
  // LSD radix sort of (key, id) on the 32-bit key, 4 passes of 8 bits: stable, so ids that tie
  // stay ascending. ~10x faster than a comparison sort of a 50k-150k vocabulary, and the same
  // permutation.
  std::vector<uint64_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    a[static_cast<size_t>(i)] = (uint64_t{descending_key(logits[static_cast<size_t>(i)])} << 32) | static_cast<uint32_t>(i);
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 32 + 8 * pass;
    size_t count[257] = {0};
    for (const uint64_t v : a) ++count[((v >> shift) & 0xFF) + 1];
    if (count[((a[0] >> shift) & 0xFF) + 1] == a.size()) continue;  // every key has this digit
    for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (const uint64_t v : a) b[count[(v >> shift) & 0xFF]++] = v;
    a.swap(b);
  }
  for (int32_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = static_cast<int32_t>(a[static_cast<size_t>(i)] & 0xFFFFFFFFu);
  return idx;
}

int32_t sample_token(std::span<const float> logits, const SamplerConfig& cfg, Rng& rng) {
  if (cfg.temperature == 0.0f) return argmax(logits);
  const auto n = static_cast<int32_t>(logits.size());
  // Stable order: probability desc, then id asc, so the draw is reproducible.
  const std::vector<int32_t> idx = order_by_probability(logits, cfg.top_k);
  int32_t keep = n;
  if (cfg.top_k > 0) keep = std::min(keep, cfg.top_k);
  const double maxl = logits[static_cast<size_t>(idx[0])];
  std::vector<double> p(static_cast<size_t>(keep));
  double sum = 0;
  for (int32_t i = 0; i < keep; ++i) {
    p[static_cast<size_t>(i)] =
        std::exp((logits[static_cast<size_t>(idx[static_cast<size_t>(i)])] - maxl) / cfg.temperature);
    sum += p[static_cast<size_t>(i)];
  }
  if (cfg.top_p < 1.0f) {
    double cum = 0;
    int32_t cut = keep;
    for (int32_t i = 0; i < keep; ++i) {
      cum += p[static_cast<size_t>(i)] / sum;
      if (cum >= cfg.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  if (cfg.min_p > 0.0f) {
    // p[i] = exp((l_i - l_max) / T) is the probability relative to the largest (p[0] = 1), which
    // renormalising after top-k / top-p does not change.
    int32_t cut = 1;
    while (cut < keep && p[static_cast<size_t>(cut)] >= static_cast<double>(cfg.min_p)) ++cut;
    keep = cut;
    sum = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  const double r = rng.uniform() * sum;
  double cum = 0;
  for (int32_t i = 0; i < keep; ++i) {
    cum += p[static_cast<size_t>(i)];
    if (r < cum) return idx[static_cast<size_t>(i)];
  }
  return idx[static_cast<size_t>(keep - 1)];
}

TokenCounts::TokenCounts(int32_t n_vocab, std::span<const int32_t> prompt)
    : prompt_(static_cast<size_t>(n_vocab), 0), output_(static_cast<size_t>(n_vocab), 0) {
  for (const int32_t t : prompt) {
    if (t < 0 || t >= n_vocab) throw Error(fmt::format("token id {} is outside [0, {})", t, n_vocab));
    if (!prompt_[static_cast<size_t>(t)]) seen_.push_back(t);
    prompt_[static_cast<size_t>(t)] = 1;
  }
}

void TokenCounts::add_output(int32_t token) {
  if (token < 0 || static_cast<size_t>(token) >= output_.size())
    throw Error(fmt::format("token id {} is outside [0, {})", token, output_.size()));
  if (!prompt_[static_cast<size_t>(token)] && output_[static_cast<size_t>(token)] == 0) seen_.push_back(token);
  output_[static_cast<size_t>(token)] += 1;
}

void adjust_logits(std::span<float> logits, const SamplerConfig& cfg, const TokenCounts* counts) {
  for (const auto& [token, bias] : cfg.logit_bias)
    if (token >= 0 && static_cast<size_t>(token) < logits.size()) logits[static_cast<size_t>(token)] += bias;
  if (!cfg.needs_counts()) return;
  if (counts == nullptr) throw Error("adjust_logits: penalties need the sequence's token counts");
  // Only tokens seen so far are touched (vLLM: masks of prompt and output tokens).
  for (const int32_t t : counts->seen()) {
    float& l = logits[static_cast<size_t>(t)];
    if (cfg.repetition_penalty != 1.0f) l = l > 0.0f ? l / cfg.repetition_penalty : l * cfg.repetition_penalty;
    if (const int32_t c = counts->in_output(t); c > 0)
      l -= static_cast<float>(c) * cfg.frequency_penalty + cfg.presence_penalty;
  }
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top_n) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size())
    throw Error(fmt::format("token_logprobs: token {} is outside [0, {})", token, logits.size()));
  if (top_n < 0) throw Error(fmt::format("token_logprobs: top_n {} must be >= 0", top_n));
  const double maxl = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (const float l : logits) z += std::exp(static_cast<double>(l) - maxl);
  const double log_z = maxl + std::log(z);
  TokenLogprobs out;
  out.token = token;
  out.logprob = static_cast<float>(static_cast<double>(logits[static_cast<size_t>(token)]) - log_z);
  const auto n = std::min<size_t>(static_cast<size_t>(top_n), logits.size());
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(n), idx.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
        (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  });
  for (size_t i = 0; i < n; ++i)
    out.top.emplace_back(idx[i], static_cast<float>(static_cast<double>(logits[static_cast<size_t>(idx[i])]) - log_z));
  return out;
}

}  // namespace kvevict
