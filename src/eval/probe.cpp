#include "eval/probe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/sampler.h"
#include "eval/perplexity.h"
#include "util/error.h"
#include "util/rng.h"

namespace kvevict {
namespace {

constexpr uint64_t kTrialTag = 0x50524F42ull, kHeadTag = 0x48454144ull;

// Simple sentences in the register of small story models (kvevict's own text).
constexpr const char* kFiller[] = {
    "The cat sat by the window and watched the rain.",
    "A boy found a red ball under the old tree.",
    "They walked to the river and threw small stones.",
    "Mom baked bread, and the kitchen smelled warm.",
    "The bird sang a song on the garden fence.",
    "A girl drew a big sun with a yellow crayon.",
    "The dog ran after the wind and barked at the leaves.",
    "Grandpa told a story about a boat on the sea.",
};
constexpr const char* kInstruction = "Remember the secret number you will be told.";
constexpr const char* kFact = "The secret number is {}.";
constexpr const char* kQuestion = "What is the secret number? The secret number is";

// Appends n filler tokens drawn with `rng`.
void append_filler(std::vector<int32_t>& out, int64_t n, const Tokenizer& tok, const ProbeTextOptions& opts, Rng& rng,
                   int64_t& cursor) {
  if (n <= 0) return;
  if (!opts.filler.empty()) {
    const auto size = static_cast<int64_t>(opts.filler.size());
    for (int64_t i = 0; i < n; ++i) out.push_back(opts.filler[static_cast<size_t>((cursor++) % size)]);
    return;
  }
  int64_t added = 0;
  while (added < n) {
    const auto k = static_cast<size_t>(rng.uniform() * static_cast<double>(std::size(kFiller)));
    for (int32_t t : tok.encode(kFiller[std::min(k, std::size(kFiller) - 1)], false)) {
      if (added == n) break;
      out.push_back(t);
      ++added;
    }
  }
}

}  // namespace

ProbeKind parse_probe_kind(const std::string& name) {
  if (name == "planted") return ProbeKind::Planted;
  if (name == "restated") return ProbeKind::Restated;
  if (name == "passcode") return ProbeKind::Passcode;
  throw Error(fmt::format("--kinds: unknown probe '{}' (known: planted, restated, passcode)", name));
}

const char* probe_kind_name(ProbeKind k) {
  switch (k) {
    case ProbeKind::Planted:
      return "planted";
    case ProbeKind::Restated:
      return "restated";
    case ProbeKind::Passcode:
      return "passcode";
  }
  return "?";
}

ForcedSitesSelector::ForcedSitesSelector(std::shared_ptr<const Selector> inner, std::vector<int32_t> positions,
                                         std::vector<uint8_t> keep)
    : inner_(std::move(inner)), positions_(std::move(positions)), keep_(std::move(keep)) {
  if (!inner_) throw Error("forced sites: no inner selector");
  std::sort(positions_.begin(), positions_.end());
}

void ForcedSitesSelector::score(const RoundInput& in, SelectorState* state, std::span<float> scores) const {
  const KvShape& s = in.kv.shape();
  if (keep_.size() != static_cast<size_t>(s.n_layers) * static_cast<size_t>(s.n_kv_heads))
    throw Error(fmt::format("forced sites: keep mask has {} entries for {} layers x {} KV heads", keep_.size(),
                            s.n_layers, s.n_kv_heads));
  inner_->score(in, state, scores);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int l = 0; l < s.n_layers; ++l)
    for (int h = 0; h < s.n_kv_heads; ++h) {
      const size_t site = static_cast<size_t>(l) * static_cast<size_t>(s.n_kv_heads) + static_cast<size_t>(h);
      const int32_t* pos = in.kv.positions(l, h);
      float* out = scores.data() + site * static_cast<size_t>(in.n_candidates);
      for (int64_t i = 0; i < in.n_candidates; ++i)
        if (std::binary_search(positions_.begin(), positions_.end(), pos[i])) out[i] = keep_[site] ? kInf : -kInf;
    }
}

Policy force_sites(const Policy& base, std::vector<int32_t> positions, std::vector<uint8_t> keep) {
  if (!base.evicts || !base.selector) throw Error(fmt::format("forced sites: policy '{}' does not evict", base.name));
  Policy p = base;
  p.name = base.name + "+sites";
  p.selector = std::make_shared<ForcedSitesSelector>(base.selector, std::move(positions), std::move(keep));
  return p;
}

std::vector<uint8_t> random_head_mask(const KvShape& shape, int k, uint64_t seed) {
  if (k < 0 || k > shape.n_kv_heads)
    throw Error(fmt::format("--keep-heads {}: must be in [0, {}] (KV heads per layer)", k, shape.n_kv_heads));
  std::vector<uint8_t> mask(static_cast<size_t>(shape.n_layers) * static_cast<size_t>(shape.n_kv_heads), 0);
  for (int l = 0; l < shape.n_layers; ++l) {
    Rng rng(stream_id({seed, static_cast<uint64_t>(l), kHeadTag}));
    std::vector<int> heads(static_cast<size_t>(shape.n_kv_heads));
    std::iota(heads.begin(), heads.end(), 0);
    // Partial Fisher-Yates: the first k entries are a uniform k-subset.
    for (int i = 0; i < k; ++i) {
      const int j = i + std::min(shape.n_kv_heads - i - 1, static_cast<int>(rng.uniform() * (shape.n_kv_heads - i)));
      std::swap(heads[static_cast<size_t>(i)], heads[static_cast<size_t>(j)]);
      mask[static_cast<size_t>(l * shape.n_kv_heads + heads[static_cast<size_t>(i)])] = 1;
    }
  }
  return mask;
}

std::vector<std::pair<int, int>> parse_sites(const std::string& s) {
  std::vector<std::pair<int, int>> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int l = -1, h = -1;
    char tail = 0;
    if (std::sscanf(part.c_str(), "%d:%d%c", &l, &h, &tail) != 2 || l < 0 || h < 0)
      throw Error(fmt::format("--sites '{}': '{}' is not LAYER:KV_HEAD", s, part));
    out.emplace_back(l, h);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::vector<uint8_t> site_mask(const KvShape& shape, const std::vector<std::pair<int, int>>& sites) {
  std::vector<uint8_t> mask(static_cast<size_t>(shape.n_layers) * static_cast<size_t>(shape.n_kv_heads), 0);
  for (const auto& [l, h] : sites) {
    if (l < 0 || l >= shape.n_layers || h < 0 || h >= shape.n_kv_heads)
      throw Error(fmt::format("--sites: {}:{} is outside the model's {} layers x {} KV heads", l, h, shape.n_layers,
                              shape.n_kv_heads));
    mask[static_cast<size_t>(l * shape.n_kv_heads + h)] = 1;
  }
  return mask;
}

ProbeLayout build_probe_layout(const Tokenizer& tok, ProbeKind kind, int64_t distance, const ProbeTextOptions& opts,
                               uint64_t seed, int trial) {
  if (distance < 1) throw Error(fmt::format("--distances: {} must be >= 1", distance));
  if (opts.digits < 1 || opts.digits > 18) throw Error(fmt::format("--digits {}: must be in [1, 18]", opts.digits));
  Rng rng(stream_id({seed, static_cast<uint64_t>(trial), kTrialTag}));
  ProbeLayout L;
  L.code += static_cast<char>('1' + std::min(8, static_cast<int>(rng.uniform() * 9)));
  for (int i = 1; i < opts.digits; ++i)
    L.code += static_cast<char>('0' + std::min(9, static_cast<int>(rng.uniform() * 10)));
  int64_t cursor =
      opts.filler.empty() ? 0 : static_cast<int64_t>(rng.uniform() * static_cast<double>(opts.filler.size()));

  L.prompt = tok.encode(kInstruction, tok.bos_id() >= 0);
  const auto P = static_cast<int32_t>(L.prompt.size());
  const std::vector<int32_t> fact = tok.encode(fmt::format(kFact, L.code), false);
  const auto F = static_cast<int64_t>(fact.size());
  const int n = kind == ProbeKind::Restated ? opts.restatements : 1;
  if (n < 1) throw Error(fmt::format("--restate {}: must be >= 1", n));
  // Distances (tokens between a statement's end and the question) d, d(n-1)/n, ..., d/n.
  std::vector<int64_t> dist(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) dist[static_cast<size_t>(k)] = distance * (n - k) / n;
  for (int k = 0; k + 1 < n; ++k)
    if (dist[static_cast<size_t>(k)] - dist[static_cast<size_t>(k + 1)] < F)
      throw Error(fmt::format("--distances {} is too short for {} statements of a {}-token fact", distance, n, F));
  append_filler(L.trace, opts.lead, tok, opts, rng, cursor);
  for (int k = 0; k < n; ++k) {
    for (int64_t i = 0; i < F; ++i)
      L.fact_positions.push_back(P + static_cast<int32_t>(L.trace.size() + static_cast<size_t>(i)));
    L.trace.insert(L.trace.end(), fact.begin(), fact.end());
    const int64_t gap =
        k + 1 < n ? dist[static_cast<size_t>(k)] - dist[static_cast<size_t>(k + 1)] - F : dist[static_cast<size_t>(k)];
    append_filler(L.trace, gap, tok, opts, rng, cursor);
  }
  const std::vector<int32_t> q = tok.encode(kQuestion, false);
  L.trace.insert(L.trace.end(), q.begin(), q.end());
  L.answer = tok.encode(L.code, false);
  return L;
}

ProbeTrial run_probe_trial(Engine& engine, const Policy& policy, const EvictionConfig& cfg, const ProbeLayout& layout,
                           uint64_t sequence_id) {
  const auto P = static_cast<int64_t>(layout.prompt.size());
  const auto T = static_cast<int64_t>(layout.trace.size());
  const auto A = static_cast<int64_t>(layout.answer.size());
  auto seq = engine.new_sequence(sequence_id, policy, cfg, P, T + A);
  std::vector<float> logits;
  engine.prefill(*seq, layout.prompt, logits);
  for (const int32_t t : layout.trace) engine.decode(*seq, t, logits);

  ProbeTrial r;
  const KvShape& shape = seq->kv.shape();
  std::vector<int32_t> fact = layout.fact_positions;
  std::sort(fact.begin(), fact.end());
  int64_t kept = 0;
  for (int l = 0; l < shape.n_layers; ++l)
    for (int h = 0; h < shape.n_kv_heads; ++h) {
      const int32_t* pos = seq->kv.positions(l, h);
      for (int64_t i = 0; i < seq->kv.length(l); ++i) kept += std::binary_search(fact.begin(), fact.end(), pos[i]);
    }
  const double sites = static_cast<double>(shape.n_layers) * shape.n_kv_heads;
  r.fact_kept = fact.empty() ? 0.0 : static_cast<double>(kept) / (static_cast<double>(fact.size()) * sites);

  r.exact = true;
  r.answer_tokens = static_cast<int>(A);
  for (int64_t j = 0; j < A; ++j) {
    const int32_t want = layout.answer[static_cast<size_t>(j)];
    r.answer_logprob -= token_nll(logits, want);
    r.exact = r.exact && argmax(logits) == want;
    if (j + 1 < A) engine.decode(*seq, want, logits);
  }
  r.rounds = seq->stats.rounds;
  return r;
}

}  // namespace kvevict
