#include "eviction/query_stats.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace kvevict {
namespace {

constexpr const char* kFormat = "kvevict-query-stats";
constexpr int kVersion = 1;

nlohmann::json nest(const QueryStats& s, const std::vector<double>& flat) {
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < s.n_layers; ++l) {
    nlohmann::json heads = nlohmann::json::array();
    for (int h = 0; h < s.n_heads; ++h)
      heads.push_back(std::vector<double>(
          flat.begin() + static_cast<ptrdiff_t>(s.index(l, h, 0)),
          flat.begin() + static_cast<ptrdiff_t>(s.index(l, h, 0) + static_cast<size_t>(s.n_bands()))));
    layers.push_back(std::move(heads));
  }
  return layers;
}

std::vector<double> flatten(const QueryStats& s, const nlohmann::json& j, const std::string& key,
                            const std::string& path) {
  const auto bad = [&](const std::string& why) { return Error(fmt::format("{}: \"{}\" {}", path, key, why)); };
  if (!j.contains(key) || !j.at(key).is_array()) throw bad("is missing or not an array");
  const auto& layers = j.at(key);
  if (static_cast<int>(layers.size()) != s.n_layers)
    throw bad(fmt::format("has {} layers, expected {}", layers.size(), s.n_layers));
  std::vector<double> out;
  out.reserve(static_cast<size_t>(s.n_layers) * static_cast<size_t>(s.n_heads) * static_cast<size_t>(s.n_bands()));
  for (const auto& heads : layers) {
    if (!heads.is_array() || static_cast<int>(heads.size()) != s.n_heads)
      throw bad(fmt::format("needs {} heads per layer", s.n_heads));
    for (const auto& bands : heads) {
      if (!bands.is_array() || static_cast<int>(bands.size()) != s.n_bands())
        throw bad(fmt::format("needs {} bands per head", s.n_bands()));
      for (const auto& v : bands) {
        if (!v.is_number()) throw bad("holds a non-number");
        out.push_back(v.get<double>());
      }
    }
  }
  return out;
}

}  // namespace

void QueryStats::validate(const std::string& what) const {
  if (n_layers < 1 || n_heads < 1 || n_kv_heads < 1 || head_dim < 2 || head_dim % 2 != 0 || n_heads % n_kv_heads != 0)
    throw Error(fmt::format("{}: bad shape: {} layers, {} heads, {} KV heads, head_dim {}", what, n_layers, n_heads,
                            n_kv_heads, head_dim));
  if (!(rope_theta > 0)) throw Error(fmt::format("{}: rope_theta {} must be > 0", what, rope_theta));
  const size_t n = static_cast<size_t>(n_layers) * static_cast<size_t>(n_heads) * static_cast<size_t>(n_bands());
  if (mean_re.size() != n || mean_im.size() != n || mean_abs.size() != n)
    throw Error(fmt::format("{}: statistics arrays hold {}/{}/{} values, expected {}", what, mean_re.size(),
                            mean_im.size(), mean_abs.size(), n));
  if (!rope_inv_freq.empty() && rope_inv_freq.size() != static_cast<size_t>(n_bands()))
    throw Error(fmt::format("{}: rope_inv_freq holds {} values, expected {}", what, rope_inv_freq.size(), n_bands()));
  for (size_t f = 0; f < rope_inv_freq.size(); ++f)
    if (!(std::isfinite(rope_inv_freq[f]) && rope_inv_freq[f] >= 0))
      throw Error(fmt::format("{}: rope_inv_freq[{}] = {} must be finite and >= 0", what, f, rope_inv_freq[f]));
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(mean_re[i]) || !std::isfinite(mean_im[i]) || !std::isfinite(mean_abs[i]) || mean_abs[i] < 0)
      throw Error(fmt::format("{}: non-finite or negative statistic at flat index {}", what, i));
}

void save_query_stats(const QueryStats& s, const std::string& path) {
  s.validate(path);
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["model"] = s.model;
  j["source"] = s.source;
  j["n_layers"] = s.n_layers;
  j["n_heads"] = s.n_heads;
  j["n_kv_heads"] = s.n_kv_heads;
  j["head_dim"] = s.head_dim;
  j["rope_theta"] = s.rope_theta;
  if (!s.rope_inv_freq.empty()) j["rope_inv_freq"] = s.rope_inv_freq;
  j["tokens"] = s.tokens;
  j["q_mean_re"] = nest(s, s.mean_re);
  j["q_mean_im"] = nest(s, s.mean_im);
  j["q_abs_mean"] = nest(s, s.mean_abs);
  std::ofstream f(path);
  if (!f) throw Error(fmt::format("{}: cannot open for writing", path));
  f << j.dump() << '\n';
  if (!f.flush()) throw Error(fmt::format("{}: write failed", path));
}

QueryStats load_query_stats(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(fmt::format("{}: cannot open query statistics (write them with `kvevict calibrate`)", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
  if (!j.is_object() || j.value("format", std::string()) != kFormat)
    throw Error(fmt::format("{}: not a kvevict query-statistics file (\"format\" must be \"{}\")", path, kFormat));
  if (j.value("version", 0) != kVersion)
    throw Error(fmt::format("{}: version {} not supported (expected {})", path, j.value("version", 0), kVersion));
  QueryStats s;
  try {
    s.model = j.value("model", std::string());
    s.source = j.value("source", std::string());
    s.n_layers = j.at("n_layers").get<int>();
    s.n_heads = j.at("n_heads").get<int>();
    s.n_kv_heads = j.at("n_kv_heads").get<int>();
    s.head_dim = j.at("head_dim").get<int>();
    s.rope_theta = j.at("rope_theta").get<double>();
    s.tokens = j.at("tokens").get<int64_t>();
    if (j.contains("rope_inv_freq")) s.rope_inv_freq = j.at("rope_inv_freq").get<std::vector<double>>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: missing or mistyped header field ({})", path, e.what()));
  }
  if (s.n_layers < 1 || s.n_heads < 1 || s.head_dim < 2 || s.n_layers > 4096 || s.n_heads > 4096 || s.head_dim > 65536)
    throw Error(fmt::format("{}: implausible shape {} layers x {} heads x head_dim {}", path, s.n_layers, s.n_heads,
                            s.head_dim));
  s.mean_re = flatten(s, j, "q_mean_re", path);
  s.mean_im = flatten(s, j, "q_mean_im", path);
  s.mean_abs = flatten(s, j, "q_abs_mean", path);
  s.validate(path);
  return s;
}

}  // namespace kvevict
