#include "eviction/selector.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "util/error.h"
#include "util/field_error.h"
#include "util/thread_pool.h"

namespace kvevict {

void PerHeadSelector::score(const RoundInput& in, SelectorState* state, std::span<float> scores) const {
  const KvShape& s = in.kv.shape();
  const int64_t n_heads_total = int64_t{s.n_layers} * s.n_kv_heads;
  const auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int layer = static_cast<int>(i / s.n_kv_heads), head = static_cast<int>(i % s.n_kv_heads);
      score_head(in, state, layer, head,
                 scores.subspan(static_cast<size_t>(i * in.n_candidates), static_cast<size_t>(in.n_candidates)));
    }
  };
  // Work estimate: one pass over every candidate's key (most per-head scorers do about that).
  if (in.pool)
    in.pool->parallel_for(n_heads_total, run, n_heads_total * in.n_candidates * s.head_dim);
  else
    run(0, n_heads_total);
}

SelectorParams SelectorParams::parse(const std::vector<std::string>& items) {
  SelectorParams p;
  for (const std::string& it : items) {
    const auto eq = it.find('=');
    if (eq == std::string::npos || eq == 0)
      throw FieldError(Field::Param, "", fmt::format(" '{}': expected name=value", it));
    const std::string key = it.substr(0, eq);
    if (p.values_.count(key)) throw FieldError(Field::Param, "", fmt::format(" '{}' given twice", key));
    p.values_[key] = it.substr(eq + 1);
    p.used_[key] = false;
  }
  return p;
}

SelectorParams SelectorParams::recording(std::vector<ParamSpec>* out) {
  SelectorParams p;
  p.record_ = out;
  return p;
}

void SelectorParams::record(ParamSpec spec) const {
  if (!record_) return;
  for (const ParamSpec& s : *record_)
    if (s.name == spec.name) return;
  record_->push_back(std::move(spec));
}

double SelectorParams::get(const std::string& key, double fallback, double lo, double hi) const {
  record({key, "number", fmt::format("{}", fallback), lo, hi, {}});
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  used_[key] = true;
  const char* s = it->second.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  if (end == s || *end != '\0' || errno != 0)
    throw FieldError(Field::Param, "", fmt::format(" {}={}: not a number", key, it->second));
  if (v < lo || v > hi)
    throw FieldError(Field::Param, "",
                     fmt::format(" {}={}: outside the allowed range [{}, {}]", key, it->second, lo, hi));
  return v;
}

int64_t SelectorParams::get_int(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const {
  record({key, "integer", fmt::format("{}", fallback), static_cast<double>(lo), static_cast<double>(hi), {}});
  if (!values_.count(key)) return fallback;
  const double v = get(key, 0.0, static_cast<double>(lo), static_cast<double>(hi));
  if (v != std::floor(v))
    throw FieldError(Field::Param, "", fmt::format(" {}={}: must be an integer", key, values_.at(key)));
  return static_cast<int64_t>(v);
}

std::string SelectorParams::get_string(const std::string& key, const std::string& fallback,
                                       const std::vector<std::string>& allowed) const {
  record({key, "text", fallback, 0, 0, allowed});
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  used_[key] = true;
  if (allowed.empty() || std::find(allowed.begin(), allowed.end(), it->second) != allowed.end()) return it->second;
  std::string list;
  for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
  throw FieldError(Field::Param, "", fmt::format(" {}={}: must be one of {}", key, it->second, list));
}

std::vector<std::string> SelectorParams::unused() const {
  std::vector<std::string> out;
  for (const auto& [k, used] : used_)
    if (!used) out.push_back(k);
  return out;
}

void SelectorParams::check_all_used(const std::string& policy) const {
  std::string unused;
  for (const auto& [k, used] : used_)
    if (!used) unused += (unused.empty() ? "" : ", ") + k;
  if (!unused.empty())
    throw FieldError::plain(Field::Param, fmt::format("policy '{}' has no parameter(s): {}", policy, unused));
}

}  // namespace kvevict
