#include "eval/keeplog.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "util/error.h"

namespace kvevict {
namespace {

int64_t count_in(const std::vector<int32_t>& sorted, int64_t lo, int64_t hi) {
  return std::lower_bound(sorted.begin(), sorted.end(), hi) - std::lower_bound(sorted.begin(), sorted.end(), lo);
}

std::vector<int32_t> sorted_union(const std::vector<std::vector<int32_t>>& sets) {
  std::vector<int32_t> all;
  for (const auto& s : sets) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

std::string band_name(int64_t lo, int64_t hi) { return fmt::format("{}-{}", lo, hi - 1); }

}  // namespace

std::vector<std::pair<int64_t, int64_t>> keep_log_bands(int64_t n_seen) {
  std::vector<std::pair<int64_t, int64_t>> bands;
  for (int64_t lo = 0, hi = 256; lo < n_seen; lo = hi, hi *= 2) bands.emplace_back(lo, std::min(hi, n_seen));
  return bands;
}

LayerKeepStats layer_keep_stats(const SequenceKv& kv, int layer, int64_t recent, int64_t prompt_len, int64_t n_seen,
                                int64_t round, bool with_positions) {
  const KvShape& shape = kv.shape();
  if (layer < 0 || layer >= shape.n_layers)
    throw Error(fmt::format("keep log: layer {} outside [0, {})", layer, shape.n_layers));
  const int64_t len = kv.length(layer);
  if (recent < 0 || recent > len)
    throw Error(fmt::format("keep log: recent buffer {} exceeds the {} live slots", recent, len));
  LayerKeepStats s;
  s.round = round;
  s.layer = layer;
  s.n_seen = n_seen;
  s.prompt_len = prompt_len;
  s.slots = len;
  s.k_sel = len - recent;
  s.bands = keep_log_bands(n_seen);
  const int H = shape.n_kv_heads;
  std::vector<std::vector<int32_t>> kept(static_cast<size_t>(H)), selected(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) {
    const int32_t* p = kv.positions(layer, h);
    kept[static_cast<size_t>(h)].assign(p, p + len);  // strictly increasing (chronological compaction)
    selected[static_cast<size_t>(h)].assign(p, p + s.k_sel);
  }
  const auto frac = [](int64_t num, int64_t den) {
    return den > 0 ? static_cast<double>(num) / static_cast<double>(den) : 0.0;
  };
  for (const auto& k : kept) {
    s.prompt_survival.push_back(frac(count_in(k, 0, prompt_len), prompt_len));
    std::vector<double> bands;
    for (const auto& [lo, hi] : s.bands) bands.push_back(frac(count_in(k, lo, hi), hi - lo));
    s.band_survival.push_back(std::move(bands));
  }
  const std::vector<int32_t> all = sorted_union(kept);
  s.prompt_union_survival = frac(count_in(all, 0, prompt_len), prompt_len);
  s.union_survival = frac(static_cast<int64_t>(all.size()), n_seen);
  s.coverage = frac(static_cast<int64_t>(sorted_union(selected).size()), int64_t{H} * s.k_sel);
  if (H < 2) {
    s.jaccard = 1.0;
  } else {
    double sum = 0.0;
    for (int a = 0; a < H; ++a)
      for (int b = a + 1; b < H; ++b) {
        const auto& A = selected[static_cast<size_t>(a)];
        const auto& B = selected[static_cast<size_t>(b)];
        std::vector<int32_t> both;
        std::set_intersection(A.begin(), A.end(), B.begin(), B.end(), std::back_inserter(both));
        const auto inter = static_cast<int64_t>(both.size());
        const int64_t uni = static_cast<int64_t>(A.size() + B.size()) - inter;
        sum += uni > 0 ? static_cast<double>(inter) / static_cast<double>(uni) : 1.0;
      }
    s.jaccard = sum / (H * (H - 1) / 2.0);
  }
  if (with_positions) s.positions = std::move(kept);
  return s;
}

std::string keep_log_line(const LayerKeepStats& s, const std::string& policy) {
  nlohmann::json j;
  j["policy"] = policy;
  j["round"] = s.round;
  j["layer"] = s.layer;
  j["n_seen"] = s.n_seen;
  j["prompt_len"] = s.prompt_len;
  j["slots"] = s.slots;
  j["k_sel"] = s.k_sel;
  j["prompt_survival"] = s.prompt_survival;
  j["prompt_union_survival"] = s.prompt_union_survival;
  j["union_survival"] = s.union_survival;
  j["jaccard"] = s.jaccard;
  j["coverage"] = s.coverage;
  j["bands"] = s.bands;
  j["band_survival"] = s.band_survival;
  if (!s.positions.empty()) j["positions"] = s.positions;
  return j.dump();
}

KeepLogWriter::KeepLogWriter(const std::string& path, bool with_positions)
    : path_(path), with_positions_(with_positions), out_(path) {
  if (!out_) throw Error(fmt::format("{}: cannot open keep log for writing", path));
}

void KeepLogWriter::write_round(const Sequence& seq) {
  for (int l = 0; l < seq.kv.shape().n_layers; ++l)
    out_ << keep_log_line(layer_keep_stats(seq.kv, l, seq.eviction.recent, seq.prompt_len, seq.n_seen,
                                           seq.stats.rounds - 1, with_positions_),
                          seq.policy.name)
         << '\n';
  if (!out_.flush()) throw Error(fmt::format("{}: write failed", path_));
}

std::vector<KeepLogAverages> summarize_keep_log(const std::string& path, bool by_layer) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("{}: cannot open keep log", path));
  // Sums per layer (key -1 = all); bands summed per band index with their own counts.
  struct Acc {
    int64_t lines = 0;
    std::set<int64_t> rounds;
    double prompt = 0, prompt_union = 0, union_s = 0, jaccard = 0, coverage = 0;
    std::vector<double> band_sum;
    std::vector<int64_t> band_n;
  };
  std::map<int, Acc> acc;
  std::string line, policy;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      const auto mean = [](const std::vector<double>& v) {
        double s = 0;
        for (double x : v) s += x;
        return v.empty() ? 0.0 : s / static_cast<double>(v.size());
      };
      const auto ps = j.at("prompt_survival").get<std::vector<double>>();
      const auto bs = j.at("band_survival").get<std::vector<std::vector<double>>>();
      if (policy.empty()) policy = j.value("policy", std::string());
      for (int key : {-1, j.at("layer").get<int>()}) {
        if (key >= 0 && !by_layer) continue;
        Acc& a = acc[key];
        a.lines += 1;
        a.rounds.insert(j.at("round").get<int64_t>());
        a.prompt += mean(ps);
        a.prompt_union += j.at("prompt_union_survival").get<double>();
        a.union_s += j.at("union_survival").get<double>();
        a.jaccard += j.at("jaccard").get<double>();
        a.coverage += j.at("coverage").get<double>();
        const size_t n_bands = bs.empty() ? 0 : bs.front().size();
        if (a.band_sum.size() < n_bands) a.band_sum.resize(n_bands, 0.0), a.band_n.resize(n_bands, 0);
        for (size_t b = 0; b < n_bands; ++b) {
          double m = 0;
          for (const auto& head : bs) m += head.at(b);
          a.band_sum[b] += m / static_cast<double>(bs.size());
          a.band_n[b] += 1;
        }
      }
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}:{}: not a keep-log line ({})", path, line_no, e.what()));
    }
  }
  if (acc.empty()) throw Error(fmt::format("{}: keep log holds no rounds", path));
  std::vector<KeepLogAverages> rows;
  for (const auto& [layer, a] : acc) {
    KeepLogAverages r;
    r.label = policy.empty() ? path : fmt::format("{} ({})", policy, path);
    r.layer = layer;
    r.lines = a.lines;
    r.rounds = static_cast<int64_t>(a.rounds.size());
    const auto n = static_cast<double>(a.lines);
    r.prompt_survival = a.prompt / n;
    r.prompt_union_survival = a.prompt_union / n;
    r.union_survival = a.union_s / n;
    r.jaccard = a.jaccard / n;
    r.coverage = a.coverage / n;
    for (size_t b = 0; b < a.band_sum.size(); ++b)
      r.band_survival.push_back(a.band_sum[b] / static_cast<double>(a.band_n[b]));
    rows.push_back(std::move(r));
  }
  return rows;  // std::map order: -1 (all) first, then layers ascending
}

std::string format_keep_log_table(const std::vector<KeepLogAverages>& rows) {
  size_t n_bands = 0, label_w = 6;
  for (const auto& r : rows)
    n_bands = std::max(n_bands, r.band_survival.size()), label_w = std::max(label_w, r.label.size());
  std::string out = fmt::format("{:<{}} {:>5} {:>6} {:>7} {:>8} {:>7} {:>7} {:>8}", "log", label_w, "layer", "rounds",
                                "prompt", "prompt_U", "union", "jaccard", "coverage");
  for (size_t b = 0; b < n_bands; ++b) {
    const int64_t lo = b == 0 ? 0 : int64_t{256} << (b - 1), hi = int64_t{256} << b;
    out += fmt::format(" {:>9}", band_name(lo, hi));
  }
  out += '\n';
  for (const auto& r : rows) {
    out += fmt::format("{:<{}} {:>5} {:>6} {:>7.3f} {:>8.3f} {:>7.3f} {:>7.3f} {:>8.3f}", r.label, label_w,
                       r.layer < 0 ? std::string("all") : std::to_string(r.layer), r.rounds, r.prompt_survival,
                       r.prompt_union_survival, r.union_survival, r.jaccard, r.coverage);
    for (size_t b = 0; b < n_bands; ++b)
      out += b < r.band_survival.size() ? fmt::format(" {:>9.3f}", r.band_survival[b]) : fmt::format(" {:>9}", "-");
    out += '\n';
  }
  return out;
}

}  // namespace kvevict
