#include "engine/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "util/error.h"
#include "util/field_error.h"

namespace kvevict {

void validate_sampler(const SamplerConfig& cfg) {
  if (!(cfg.temperature >= 0.0f) || !std::isfinite(cfg.temperature))
    throw FieldError(Field::Temperature, "", fmt::format(" {}: must be a finite number >= 0", cfg.temperature));
  if (!(cfg.top_p > 0.0f && cfg.top_p <= 1.0f))
    throw FieldError(Field::TopP, "", fmt::format(" {}: must be in (0, 1]", cfg.top_p));
  if (cfg.top_k < 0) throw FieldError(Field::TopK, "", fmt::format(" {}: must be >= 0", cfg.top_k));
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t sample_token(std::span<const float> logits, const SamplerConfig& cfg, Rng& rng) {
  if (cfg.temperature == 0.0f) return argmax(logits);
  const auto n = static_cast<int32_t>(logits.size());
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  // Stable order: probability desc, then id asc, so the draw is reproducible.
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
        (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  });
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
  const double r = rng.uniform() * sum;
  double cum = 0;
  for (int32_t i = 0; i < keep; ++i) {
    cum += p[static_cast<size_t>(i)];
    if (r < cum) return idx[static_cast<size_t>(i)];
  }
  return idx[static_cast<size_t>(keep - 1)];
}

}  // namespace kvevict
