// `bench decode` (bench.h): decode speed against the memory-bandwidth roofline (short context, and
// step time vs generated length, full vs bounded), prefill, and one synthetic model per weight
// type against one roofline.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <thread>

#include "bench/bench.h"
#include "bench/common.h"
#include "model/synth.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {

using namespace bench_detail;

namespace {

// Times reps x steps decode steps of `seq` after 2 warm-up steps; seconds per step per repetition.
Summary time_decode_steps(Engine& engine, Sequence& seq, int steps, int reps, std::vector<float>& logits) {
  const int32_t V = engine.model().config().n_vocab;
  std::vector<double> per_step;
  for (int w = 0; w < 2; ++w) engine.decode(seq, step_token(seq.n_seen, V), logits);
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) engine.decode(seq, step_token(seq.n_seen, V), logits);
    per_step.push_back(seconds_since(t0) / steps);
  }
  return summarize(per_step);
}

// Decode row measurements that do not depend on the roofline (filled in later).
struct DecodeRow {
  Summary step_s;    ///< seconds per step
  double bytes = 0;  ///< weights + live keys/values read per step
  int64_t context = 0;
};

// Short context, full cache: the kPromptLen-token prompt, then timed decode steps.
DecodeRow short_decode(Engine& engine, const DecodeBenchConfig& cfg) {
  const Model& m = engine.model();
  std::vector<float> logits;
  const auto seq =
      engine.new_sequence(0, make_policy("full"), {}, kPromptLen, 2 + int64_t{cfg.common.reps} * cfg.steps);
  engine.prefill(*seq, random_tokens(kPromptLen, m.config().n_vocab, cfg.common.seed), logits);
  DecodeRow r;
  r.step_s = time_decode_steps(engine, *seq, cfg.steps, cfg.common.reps, logits);
  r.context = seq->kv.length(0);
  r.bytes = static_cast<double>(weight_bytes_per_step(m) + kv_bytes_per_step(engine.kv_shape(), r.context));
  return r;
}

nlohmann::json decode_row_json(const DecodeRow& r, double copy_gbps, double read_gbps) {
  const double gbps = r.bytes / r.step_s.median / 1e9;
  return {{"step_ms", Summary{r.step_s.median * 1e3, r.step_s.min * 1e3, r.step_s.max * 1e3, {}}.to_json()},
          {"tok_per_s", 1.0 / r.step_s.median},
          {"bytes_per_token", r.bytes},
          {"achieved_gbps", gbps},
          {"roofline_pct", 100.0 * gbps / copy_gbps},
          {"read_roofline_pct", 100.0 * gbps / read_gbps},
          {"roofline_tok_per_s", copy_gbps * 1e9 / r.bytes},
          {"context", r.context}};
}

// Prefill of a P-token prompt (one pass, full cache): reps timed passes after one warm-up.
nlohmann::json prefill_json(Engine& engine, int64_t P, const BenchCommon& c) {
  const int32_t V = engine.model().config().n_vocab;
  const auto prompt = random_tokens(P, V, c.seed);
  std::vector<float> logits;
  std::vector<double> secs;
  for (int r = -1; r < c.reps; ++r) {
    auto seq = engine.new_sequence(0, make_policy("full"), {}, P, 1);
    const auto t0 = Clock::now();
    engine.prefill(*seq, prompt, logits);
    if (r >= 0) secs.push_back(seconds_since(t0));
  }
  const Summary s = summarize(secs);
  return {{"prompt_tokens", P},
          {"prefill_ms", Summary{s.median * 1e3, s.min * 1e3, s.max * 1e3, {}}.to_json()},
          {"tok_per_s", static_cast<double>(P) / s.median}};
}

// Weight types of the model's matrices by share of bytes, largest first ("q4_k 71%, q6_k 21%").
std::string type_mix(const Model& m) {
  std::map<std::string, int64_t> bytes;
  int64_t total = 0;
  const auto add = [&](const WeightMatrix& w) {
    bytes[ggml_type_name(static_cast<uint32_t>(w.type))] += w.rows * w.row_bytes;
    total += w.rows * w.row_bytes;
  };
  for (const LayerWeights& L : m.layers())
    for (const WeightMatrix* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) add(*w);
  add(m.output());
  if (m.output().data != m.token_embedding().data) add(m.token_embedding());  // untied: its bytes too
  std::vector<std::pair<int64_t, std::string>> order;
  for (const auto& [name, b] : bytes) order.emplace_back(-b, name);
  std::sort(order.begin(), order.end());
  std::string out;
  for (const auto& [nb, name] : order)
    out += fmt::format("{}{} {:.0f}%", out.empty() ? "" : ", ", name,
                       100.0 * static_cast<double>(-nb) / static_cast<double>(total));
  return out;
}

void print_prefill_table(const nlohmann::json& rows) {
  fmt::print("\n## prefill (one pass over the prompt, full cache)\n");
  fmt::print("| model | --type | prompt tokens | prefill ms (min-max) | tok/s |\n|---|---|---|---|---|\n");
  for (const nlohmann::json& r : rows) {
    const nlohmann::json& ms = r["prefill_ms"];
    fmt::print("| {} | {} | {} | {:.1f} ({:.1f}-{:.1f}) | {:.1f} |\n", r["model"].get<std::string>(),
               r["type"].get<std::string>(), r["prompt_tokens"].get<int64_t>(), ms["median"].get<double>(),
               ms["min"].get<double>(), ms["max"].get<double>(), r["tok_per_s"].get<double>());
  }
}

// `bench decode --shape S --type A,B,...`: one synthesised model per type, one roofline.
nlohmann::json bench_decode_types(const DecodeBenchConfig& cfg) {
  if (cfg.types.empty()) throw Error("bench decode: --type lists no type");
  if (cfg.common.reps < 1) throw Error(fmt::format("--reps {}: must be >= 1", cfg.common.reps));
  const SynthShape shape = synth_shape(cfg.shape);
  std::vector<SynthTypes> types;
  for (const std::string& t : cfg.types) types.push_back(parse_synth_types(t));  // all names checked first
  std::filesystem::create_directories(cfg.synth_dir);
  nlohmann::json out = {{"shape", cfg.shape},      {"types", cfg.types}, {"kv_type", kv_type_name(cfg.common.kv_type)},
                        {"reps", cfg.common.reps}, {"steps", cfg.steps}, {"load_before", load_average()}};
  print_load("before");
  Summary bw_before, rbw_before;
  {
    ThreadPool pool(cfg.common.threads > 0 ? cfg.common.threads
                                           : static_cast<int>(std::thread::hardware_concurrency()));
    bw_before = copy_bandwidth_gbps(pool, int64_t{256} << 20, cfg.common.reps);
    rbw_before = read_bandwidth_gbps(pool, int64_t{256} << 20, cfg.common.reps);
    out["threads"] = pool.size();
  }
  fmt::print("# copy bandwidth before: best {:.2f} GB/s (median {:.2f}, min {:.2f}); read-only: best {:.2f}\n",
             bw_before.max, bw_before.median, bw_before.min, rbw_before.max);
  std::vector<DecodeRow> rows;
  nlohmann::json prefill = nlohmann::json::array(), models = nlohmann::json::array();
  for (const SynthTypes& t : types) {
    const std::string path = fmt::format("{}/{}-{}-s{}.gguf", cfg.synth_dir, cfg.shape, t.name, cfg.common.seed);
    if (!std::filesystem::exists(path)) {
      fmt::print("# writing {}\n", path);
      std::fflush(stdout);
      write_synth_gguf(shape, t, cfg.common.seed, path);
    } else {
      fmt::print("# reusing {} (a pure function of shape, type and seed)\n", path);
    }
    BenchCommon c = cfg.common;
    c.model = path;
    Loaded L = load(c);
    rows.push_back(short_decode(*L.engine, cfg));
    models.push_back({{"type", t.name},
                      {"path", path},
                      {"mix", type_mix(*L.model)},
                      {"weight_mib", static_cast<double>(weight_bytes_per_step(*L.model)) / (1 << 20)}});
    fmt::print("# {}: {:.2f} tok/s ({})\n", t.name, 1.0 / rows.back().step_s.median,
               models.back()["mix"].get<std::string>());
    std::fflush(stdout);
    for (int64_t P : cfg.prefill_lengths) {
      nlohmann::json p = prefill_json(*L.engine, P, c);
      p["model"] = cfg.shape;
      p["type"] = t.name;
      prefill.push_back(p);
    }
  }
  Summary bw_after, rbw_after;
  {
    ThreadPool pool(cfg.common.threads > 0 ? cfg.common.threads
                                           : static_cast<int>(std::thread::hardware_concurrency()));
    bw_after = copy_bandwidth_gbps(pool, int64_t{256} << 20, cfg.common.reps);
    rbw_after = read_bandwidth_gbps(pool, int64_t{256} << 20, cfg.common.reps);
  }
  fmt::print("# copy bandwidth after: best {:.2f} GB/s (median {:.2f}, min {:.2f}); read-only: best {:.2f}\n",
             bw_after.max, bw_after.median, bw_after.min, rbw_after.max);
  const double copy = std::max(bw_before.max, bw_after.max), read = std::max(rbw_before.max, rbw_after.max);
  out["copy_bandwidth_gbps"] = {{"before", bw_before.to_json()}, {"after", bw_after.to_json()}, {"roofline", copy}};
  out["read_bandwidth_gbps"] = {{"before", rbw_before.to_json()}, {"after", rbw_after.to_json()}, {"roofline", read}};
  fmt::print(
      "\n## decode, full cache, short context ({} tokens), {} shape; roofline = best copy bandwidth of the run, {:.2f} "
      "GB/s\n",
      kPromptLen, cfg.shape, copy);
  fmt::print(
      "| model | --type | matrix types (bytes) | MiB/token | tok/s | step ms (min-max) | GB/s | % of copy roofline | % "
      "of read roofline |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::json decode = nlohmann::json::array();
  for (size_t i = 0; i < rows.size(); ++i) {
    nlohmann::json j = decode_row_json(rows[i], copy, read);
    j["type"] = types[i].name;
    j["mix"] = models[i]["mix"];
    decode.push_back(j);
    const DecodeRow& r = rows[i];
    fmt::print("| {} | {} | {} | {:.1f} | {:.2f} | {:.2f} ({:.2f}-{:.2f}) | {:.2f} | {:.1f}% | {:.1f}% |\n", cfg.shape,
               types[i].name, models[i]["mix"].get<std::string>(), r.bytes / (1 << 20), 1.0 / r.step_s.median,
               r.step_s.median * 1e3, r.step_s.min * 1e3, r.step_s.max * 1e3, j["achieved_gbps"].get<double>(),
               j["roofline_pct"].get<double>(), j["read_roofline_pct"].get<double>());
  }
  out["decode"] = decode;
  out["models"] = models;
  if (!prefill.empty()) print_prefill_table(prefill);
  out["prefill"] = prefill;
  out["load_after"] = load_average();
  print_load("after");
  return out;
}

}  // namespace

nlohmann::json bench_decode(const DecodeBenchConfig& cfg) {
  if (cfg.steps < 1) throw Error(fmt::format("--steps {}: must be >= 1", cfg.steps));
  if (!cfg.shape.empty()) return bench_decode_types(cfg);
  Loaded L = load(cfg.common);
  const Model& m = *L.model;
  Engine& engine = *L.engine;
  nlohmann::json out = header(cfg.common, m, engine);
  print_load("before");
  const Summary bw = copy_bandwidth_gbps(engine.pool(), int64_t{256} << 20, cfg.common.reps);
  out["copy_bandwidth_gbps"] = bw.to_json();
  fmt::print(
      "# STREAM-style copy bandwidth: best {:.2f} GB/s (median {:.2f}, min {:.2f}); the roofline uses the best, as "
      "STREAM does\n",
      bw.max, bw.median, bw.min);
  const Summary rbw = read_bandwidth_gbps(engine.pool(), int64_t{256} << 20, cfg.common.reps);
  out["read_bandwidth_gbps"] = rbw.to_json();
  fmt::print("# read-only bandwidth: best {:.2f} GB/s (median {:.2f}, min {:.2f})\n", rbw.max, rbw.median, rbw.min);
  const int64_t wbytes = weight_bytes_per_step(m);
  const KvShape shape = engine.kv_shape();
  const int32_t V = m.config().n_vocab;
  const auto prompt = random_tokens(kPromptLen, V, cfg.common.seed);
  std::vector<float> logits;
  const std::string mix = type_mix(m);
  out["mix"] = mix;

  const auto time_steps = [&](Sequence& seq, int steps) {
    return time_decode_steps(engine, seq, steps, cfg.common.reps, logits);
  };
  const auto roofline_row = [&](const Summary& step_s, int64_t slots) {
    return decode_row_json(DecodeRow{step_s, static_cast<double>(wbytes + kv_bytes_per_step(shape, slots)), slots},
                           bw.max, rbw.max);
  };

  // 1. Short context, full cache.
  {
    const DecodeRow r = short_decode(engine, cfg);
    const Summary& s = r.step_s;
    nlohmann::json row = decode_row_json(r, bw.max, rbw.max);
    out["short_context"] = row;
    fmt::print("\n## decode, full cache, short context ({} tokens), {} weights {:.1f} MiB\n", kPromptLen, mix,
               static_cast<double>(wbytes) / (1 << 20));
    fmt::print(
        "| tok/s | step ms (min-max) | MB/token | GB/s | copy-roofline tok/s | % of copy roofline | % of read roofline "
        "|\n|---|---|---|---|---|---|---|\n");
    fmt::print("| {:.2f} | {:.2f} ({:.2f}-{:.2f}) | {:.1f} | {:.2f} | {:.2f} | {:.1f}% | {:.1f}% |\n",
               row["tok_per_s"].get<double>(), s.median * 1e3, s.min * 1e3, s.max * 1e3,
               row["bytes_per_token"].get<double>() / 1e6, row["achieved_gbps"].get<double>(),
               row["roofline_tok_per_s"].get<double>(), row["roofline_pct"].get<double>(),
               row["read_roofline_pct"].get<double>());
  }
  if (!cfg.prefill_lengths.empty()) {
    nlohmann::json prefill = nlohmann::json::array();
    for (int64_t P : cfg.prefill_lengths) {
      nlohmann::json p = prefill_json(engine, P, cfg.common);
      p["model"] = cfg.common.model;
      p["type"] = mix;
      prefill.push_back(p);
    }
    print_prefill_table(prefill);
    out["prefill"] = prefill;
  }
  if (!cfg.sweep) {
    out["load_after"] = load_average();
    print_load("after");
    return out;
  }

  // 2. Step time vs generated length, full vs bounded.
  fmt::print("\n## decode step time vs generated length (full vs {} B = {}, {})\n", cfg.policy, cfg.budget,
             schedule_label(cfg.common));
  fmt::print(
      "| generated | mode | live slots | step ms (min-max) | tok/s | % of roofline | vs first length "
      "|\n|---|---|---|---|---|---|---|\n");
  nlohmann::json sweep = nlohmann::json::array();
  double first_full = 0, first_bounded = 0;
  for (int64_t len : cfg.lengths) {
    if (len > cfg.max_length) continue;
    if (len < kPromptLen + 1) throw Error(fmt::format("--lengths: {} is below the {}-token prompt", len, kPromptLen));
    for (const bool bounded : {false, true}) {
      const Policy pol = bounded ? make_policy(cfg.policy) : make_policy("full");
      const EvictionConfig ec = eviction_config(cfg.common, cfg.budget);
      // Bounded runs time two round intervals' worth of steps per repetition (2 rounds each).
      const int steps = bounded ? static_cast<int>(2 * ec.round_interval()) : cfg.steps;
      auto seq = engine.new_sequence(1, pol, ec, kPromptLen, len + 2 + int64_t{cfg.common.reps} * steps);
      engine.prefill(*seq, prompt, logits);
      fast_forward(*seq, len, cfg.common.seed);
      const int64_t slots0 = seq->kv.length(0);
      const Summary s = time_steps(*seq, steps);
      nlohmann::json row = roofline_row(s, slots0);
      double& first = bounded ? first_bounded : first_full;
      if (first == 0) first = s.median;
      row["generated"] = len;
      row["mode"] = bounded ? "bounded" : "full";
      row["policy"] = pol.name;
      row["live_slots"] = slots0;
      row["rounds"] = seq->stats.rounds;
      row["ratio_to_first"] = s.median / first;
      sweep.push_back(row);
      fmt::print("| {} | {} | {} | {:.2f} ({:.2f}-{:.2f}) | {:.2f} | {:.1f}% | {:.3f}x |\n", len,
                 bounded ? "bounded" : "full", slots0, s.median * 1e3, s.min * 1e3, s.max * 1e3, 1.0 / s.median,
                 row["roofline_pct"].get<double>(), s.median / first);
      std::fflush(stdout);
      if (cfg.common.on_cell) cfg.common.on_cell(fmt::format("{} {}", len, bounded ? "bounded" : "full"));
    }
  }
  out["length_sweep"] = sweep;
  out["budget"] = cfg.budget;
  out["recent"] = cfg.common.recent;
  out["round_interval"] = round_interval(cfg.common);
  out["load_after"] = load_average();
  print_load("after");
  return out;
}

}  // namespace kvevict
