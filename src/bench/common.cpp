// Helpers shared by the bench measurements (common.h) and the summary statistics and load
// averages of bench.h.
#include "bench/common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "util/binomial.h"
#include "util/error.h"
#include "util/rng.h"

namespace kvevict {

namespace bench_detail {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int64_t weight_bytes_per_step(const Model& m) {
  const auto mat = [](const WeightMatrix& w) { return w.rows * w.row_bytes; };
  int64_t b = 0;
  for (const LayerWeights& L : m.layers())
    b += mat(L.wq) + mat(L.wk) + mat(L.wv) + mat(L.wo) + mat(L.w_gate) + mat(L.w_up) + mat(L.w_down) +
        static_cast<int64_t>((L.attn_norm.size() + L.ffn_norm.size()) * sizeof(float));
  b += mat(m.output()) + m.token_embedding().row_bytes;
  return b;
}

int64_t kv_bytes_per_step(const KvShape& s, int64_t slots) {
  return slots * int64_t{s.n_layers} * s.n_kv_heads * 2 * s.head_dim * kv_type_bytes(s.type);
}

std::vector<int32_t> random_tokens(int64_t n, int32_t n_vocab, uint64_t seed) {
  Rng rng(stream_id({seed, 0x70726F6DULL}));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = static_cast<int32_t>(rng() % static_cast<uint64_t>(n_vocab));
  return t;
}

int32_t step_token(int64_t i, int32_t n_vocab) { return static_cast<int32_t>((i * 7919 + 13) % n_vocab); }

EvictionConfig eviction_config(const BenchCommon& c, int64_t budget) {
  EvictionConfig ec;
  ec.budget = budget;
  ec.recent = c.recent;
  ec.interval = c.interval;
  ec.seed = c.seed;
  return ec;
}

std::string schedule_label(const BenchCommon& c) {
  return c.interval > 0 ? fmt::format("r = {}, s = {}", c.recent, c.interval) : fmt::format("r = {}", c.recent);
}

void fast_forward(Sequence& seq, int64_t L, uint64_t seed) {
  SequenceKv& kv = seq.kv;
  const KvShape& s = kv.shape();
  const int64_t n_slots = seq.eviction_off() ? L : std::min(L, seq.eviction.budget);
  if (n_slots > kv.capacity()) throw Error(fmt::format("bench: {} slots exceed capacity {}", n_slots, kv.capacity()));
  const int64_t have = kv.length(0);
  Rng rng(stream_id({seed, 0x66667764ULL}));
  const int64_t pool_rows = 4096;
  std::vector<float> rows(static_cast<size_t>(pool_rows * s.head_dim));
  for (float& v : rows) v = static_cast<float>(2.0 * rng.uniform() - 1.0);
  for (int l = 0; l < s.n_layers; ++l)
    for (int h = 0; h < s.n_kv_heads; ++h) {
      int32_t* pos = kv.positions(l, h);
      for (int64_t slot = have; slot < n_slots; ++slot) {
        const int64_t a = (slot * 31 + l * 7 + h) % pool_rows, b = (slot * 17 + l * 3 + h + 1) % pool_rows;
        kv.store(l, h, slot, rows.data() + a * s.head_dim, rows.data() + b * s.head_dim);
        // Positions: evenly spread over [have, L) so the newest slot holds L - 1.
        const int64_t span = L - have, k = n_slots - have;
        pos[slot] = static_cast<int32_t>(have + (k <= 1 ? span - 1 : (slot - have) * (span - 1) / (k - 1)));
      }
    }
  for (int l = 0; l < s.n_layers; ++l) kv.set_length(l, n_slots);
  seq.n_seen = L;
}

Loaded load(const BenchCommon& c) {
  if (c.reps < 1) throw Error(fmt::format("--reps {}: must be >= 1", c.reps));
  Loaded l;
  l.model = Model::load(c.model);
  l.engine = std::make_unique<Engine>(*l.model, c.threads, c.kv_type);
  return l;
}

nlohmann::json header(const BenchCommon& c, const Model& m, Engine& e) {
  const ModelConfig& mc = m.config();
  return {{"model", c.model},
          {"weight_type", ggml_type_name(static_cast<uint32_t>(m.weight_type()))},
          {"n_layers", mc.n_layers},
          {"n_heads", mc.n_heads},
          {"n_kv_heads", mc.n_kv_heads},
          {"head_dim", mc.head_dim},
          {"dim", mc.dim},
          {"n_vocab", mc.n_vocab},
          {"threads", e.pool().size()},
          {"kv_type", kv_type_name(c.kv_type)},
          {"reps", c.reps},
          {"load_before", load_average()}};
}

Policy policy_with_params(const std::string& name, const std::vector<std::string>& params) {
  // [POLICY:]NAME=VALUE, as everywhere (eviction/registry.h); a parameter this policy does not
  // take is an error only when it names the policy.
  std::vector<std::string> mine, prefixed;
  for (const std::string& p : params) {
    const auto one = params_for_policy({p}, name);
    if (one.empty()) continue;
    (one[0] == p ? mine : prefixed).push_back(one[0]);
  }
  mine.insert(mine.end(), prefixed.begin(), prefixed.end());
  const SelectorParams sp = SelectorParams::parse(mine);
  Policy pol = make_policy(name, std::nullopt, std::nullopt, sp, /*check_params=*/false);
  for (const std::string& key : sp.unused())
    for (const std::string& p : prefixed)
      if (p.substr(0, p.find('=')) == key) sp.check_all_used(name);
  return pol;
}

std::vector<std::string> policy_list(const std::vector<std::string>& given, bool evicting_only) {
  if (!given.empty()) return given;
  std::vector<std::string> out;
  for (const PolicyInfo* p : all_policies())
    if (p->evicts || !evicting_only) out.push_back(p->name);
  return out;
}

void print_load(const char* when) { fmt::print("# load average {}: {}\n", when, load_average()); }

}  // namespace bench_detail

int64_t round_interval(const BenchCommon& c) { return bench_detail::eviction_config(c, 1).round_interval(); }

nlohmann::json Summary::to_json() const {
  return {{"median", median}, {"min", min}, {"max", max}, {"spread_pct", spread_pct()}, {"samples", samples}};
}

Summary summarize(std::vector<double> samples) {
  if (samples.empty()) throw Error("summarize: no samples");
  Summary s;
  s.samples = samples;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  s.median = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  s.min = samples.front();
  s.max = samples.back();
  return s;
}

nlohmann::json MedianCi::to_json() const {
  return {{"median", median}, {"lo", lo}, {"hi", hi}, {"coverage", coverage}, {"valid", valid}};
}

MedianCi median_ci(std::vector<double> samples, double level) {
  if (samples.empty()) throw Error("median_ci: no samples");
  if (!(level > 0 && level < 1)) throw Error(fmt::format("median_ci: level {} is not in (0, 1)", level));
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  MedianCi ci;
  ci.median = summarize(samples).median;
  ci.lo = samples.front();
  ci.hi = samples.back();
  // The largest k with P(X <= k - 1) <= (1 - level) / 2, X ~ Binomial(n, 1/2): the k-th smallest
  // and k-th largest samples bound the median with coverage 1 - 2 P(X <= k - 1).
  const double alpha_half = (1 - level) / 2;
  double tail = 0;  // P(X <= k - 1) of the best k so far
  size_t k = 0;
  for (size_t j = 0; j < n / 2; ++j) {
    const double cdf = binomial_half_cdf(static_cast<int64_t>(n), static_cast<int64_t>(j));
    if (cdf > alpha_half) break;
    k = j + 1;
    tail = cdf;
  }
  if (k == 0) return ci;
  ci.valid = true;
  ci.lo = samples[k - 1];
  ci.hi = samples[n - k];
  ci.coverage = 1 - 2 * tail;
  return ci;
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "? ? ?";
  return a + " " + b + " " + c;
}

double load_average_1m() {
  std::ifstream f("/proc/loadavg");
  double a = -1;
  if (!(f >> a)) return -1;
  return a;
}

}  // namespace kvevict
