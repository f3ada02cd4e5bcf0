#include "bench/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "engine/engine.h"
#include "eviction/registry.h"
#include "model/model.h"
#include "model/synth.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr int64_t kPromptLen = 16;

// Bytes of weights one decode step streams: every matrix once, the output matrix once, one
// embedding row (the embedding matrix is read whole only when it doubles as the output).
int64_t weight_bytes_per_step(const Model& m) {
  const auto mat = [](const WeightMatrix& w) { return w.rows * w.row_bytes; };
  int64_t b = 0;
  for (const LayerWeights& L : m.layers())
    b += mat(L.wq) + mat(L.wk) + mat(L.wv) + mat(L.wo) + mat(L.w_gate) + mat(L.w_up) + mat(L.w_down) +
        static_cast<int64_t>((L.attn_norm.size() + L.ffn_norm.size()) * sizeof(float));
  b += mat(m.output()) + m.token_embedding().row_bytes;
  return b;
}

// Bytes of keys+values one decode step reads at `slots` live slots per (layer, KV head).
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

// Fast-forwards a prefilled sequence (prompt of kPromptLen tokens) to `generated` tokens seen:
// fills slots [kPromptLen, n_slots) with synthetic rows at increasing positions ending at
// L - 1 (n_slots = L for a sequence that never evicts, else min(L, B)), sets n_seen = L.
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

struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
};

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

}  // namespace

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

Summary copy_bandwidth_gbps(ThreadPool& pool, int64_t bytes, int reps) {
  if (bytes < (1 << 20) || reps < 1) throw Error("copy bandwidth: need >= 1 MiB and >= 1 repetition");
  const int64_t n = bytes / static_cast<int64_t>(sizeof(double));
  std::vector<double> a(static_cast<size_t>(n), 1.0), b(static_cast<size_t>(n), 0.0);
  const auto copy = [&] {
    pool.parallel_for(64, [&](int64_t c0, int64_t c1) {
      const int64_t i0 = n * c0 / 64, i1 = n * c1 / 64;
      std::memcpy(b.data() + i0, a.data() + i0, static_cast<size_t>(i1 - i0) * sizeof(double));
    });
  };
  copy();  // first touch / warm-up
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    copy();
    gbps.push_back(2.0 * static_cast<double>(n * static_cast<int64_t>(sizeof(double))) / seconds_since(t0) / 1e9);
  }
  return summarize(gbps);
}

Summary read_bandwidth_gbps(ThreadPool& pool, int64_t bytes, int reps) {
  if (bytes < (1 << 20) || reps < 1) throw Error("read bandwidth: need >= 1 MiB and >= 1 repetition");
  const int64_t n = bytes / static_cast<int64_t>(sizeof(float)) / 32 * 32;
  std::vector<float> a(static_cast<size_t>(n), 1.0f);
  std::vector<float> sums(64, 0.0f);
  const auto read = [&] {
    pool.parallel_for(64, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t i0 = n * c / 64 / 32 * 32, i1 = n * (c + 1) / 64 / 32 * 32;
        float acc[32] = {};
        for (int64_t i = i0; i < i1; i += 32)
          for (int j = 0; j < 32; ++j) acc[j] += a[static_cast<size_t>(i + j)];
        float s = 0;
        for (float v : acc) s += v;
        sums[static_cast<size_t>(c)] = s;
      }
    });
  };
  read();
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    read();
    gbps.push_back(static_cast<double>(n * static_cast<int64_t>(sizeof(float))) / seconds_since(t0) / 1e9);
  }
  if (sums[0] < 0) throw Error("read bandwidth: impossible sum");  // keeps the loads alive
  return summarize(gbps);
}

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
  fmt::print("\n## decode step time vs generated length (full vs {} B = {}, r = {})\n", cfg.policy, cfg.budget,
             cfg.common.recent);
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
      EvictionConfig ec;
      ec.budget = cfg.budget;
      ec.recent = cfg.common.recent;
      ec.seed = cfg.common.seed;
      // Bounded runs time two recent buffers' worth of steps per repetition (2 rounds each).
      const int steps = bounded ? static_cast<int>(2 * cfg.common.recent) : cfg.steps;
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
  out["load_after"] = load_average();
  print_load("after");
  return out;
}

nlohmann::json bench_evict_round(const EvictBenchConfig& cfg) {
  Loaded L = load(cfg.common);
  const Model& m = *L.model;
  Engine& engine = *L.engine;
  nlohmann::json out = header(cfg.common, m, engine);
  print_load("before");
  const int32_t V = m.config().n_vocab;
  const int n_layers = m.config().n_layers;
  const auto prompt = random_tokens(kPromptLen, V, cfg.common.seed);
  std::vector<float> logits;
  nlohmann::json rows = nlohmann::json::array(), skipped = nlohmann::json::array();
  fmt::print("\n## eviction round cost per layer (ms; median over {} rounds, min-max), r = {}\n", cfg.common.reps,
             cfg.common.recent);
  fmt::print(
      "| policy | B | score ms/layer | compact ms/layer | total ms/layer | total (min-max) "
      "|\n|---|---|---|---|---|---|\n");
  for (const std::string& name : policy_list(cfg.policies, true)) {
    for (int64_t B : cfg.budgets) {
      try {
        const Policy pol = policy_with_params(name, cfg.params);
        if (!pol.evicts) continue;
        EvictionConfig ec;
        ec.budget = B;
        ec.recent = cfg.common.recent;
        ec.seed = cfg.common.seed;
        auto seq = engine.new_sequence(2, pol, ec, kPromptLen, 1 << 30);
        engine.prefill(*seq, prompt, logits);
        // Synthetic slots up to B + r - warmup, then real decode steps up to the first round.
        const int64_t warm = std::min<int64_t>(cfg.warmup_steps, B + ec.recent - kPromptLen - 1);
        fast_forward(*seq, B + ec.recent - warm, cfg.common.seed);
        std::vector<double> score, compact, total;
        const auto cell_t0 = Clock::now();
        while (static_cast<int>(score.size()) < cfg.common.reps &&
               (score.empty() || seconds_since(cell_t0) < cfg.max_cell_seconds)) {
          const SequenceStats before = seq->stats;
          while (seq->stats.rounds == before.rounds) engine.decode(*seq, step_token(seq->n_seen, V), logits);
          score.push_back((seq->stats.score_ms - before.score_ms) / n_layers);
          compact.push_back((seq->stats.compact_ms - before.compact_ms) / n_layers);
          total.push_back(score.back() + compact.back());
        }
        const Summary ss = summarize(score), cs = summarize(compact), ts = summarize(total);
        rows.push_back({{"policy", pol.name},
                        {"budget", B},
                        {"rounds_timed", score.size()},
                        {"score_ms_per_layer", ss.to_json()},
                        {"compact_ms_per_layer", cs.to_json()},
                        {"total_ms_per_layer", ts.to_json()}});
        fmt::print("| {} | {} | {:.4f} | {:.4f} | {:.4f} | {:.4f}-{:.4f}{} |\n", pol.name, B, ss.median, cs.median,
                   ts.median, ts.min, ts.max,
                   static_cast<int>(score.size()) < cfg.common.reps
                       ? fmt::format(" ({} rounds: time cap)", score.size())
                       : "");
        if (cfg.common.on_cell) cfg.common.on_cell(fmt::format("{} B={}", pol.name, B));
        std::fflush(stdout);
      } catch (const Error& e) {
        skipped.push_back({{"policy", name}, {"budget", B}, {"reason", e.what()}});
        fmt::print("| {} | {} | skipped: {} | | | |\n", name, B, e.what());
      }
    }
  }
  out["rows"] = rows;
  out["skipped"] = skipped;
  out["recent"] = cfg.common.recent;
  out["load_after"] = load_average();
  print_load("after");
  return out;
}

namespace {

// Wraps a selector so that the forward pass computes attention probabilities for it (needs()
// adds `attention`) while selection is the inner selector's, unchanged: the probabilities are
// counted and dropped, the inner state sees exactly what it asked for.
class ProbsForcingState final : public SelectorState {
 public:
  ProbsForcingState(std::unique_ptr<SelectorState> inner, SelectorNeeds inner_needs)
      : inner_(std::move(inner)), needs_(inner_needs) {}
  void observe(const AttentionObservation& obs) override {
    if (obs.probs) ++prob_observations;
    if (!inner_ || !needs_.any()) return;
    AttentionObservation o = obs;
    if (!needs_.attention) o.probs = nullptr;
    inner_->observe(o);
  }
  void on_compact(int layer, int kv_head, std::span<const int32_t> keep) override {
    if (inner_) inner_->on_compact(layer, kv_head, keep);
  }
  SelectorState* inner() { return inner_.get(); }
  int64_t prob_observations = 0;  ///< (token, layer) observations that carried probabilities

 private:
  std::unique_ptr<SelectorState> inner_;
  SelectorNeeds needs_;
};

class ProbsForcingSelector final : public Selector {
 public:
  explicit ProbsForcingSelector(std::shared_ptr<const Selector> inner) : inner_(std::move(inner)) {}
  SelectorNeeds needs() const override {
    SelectorNeeds n = inner_->needs();
    n.attention = true;
    return n;
  }
  std::unique_ptr<SelectorState> make_state(const KvShape& shape) const override {
    return std::make_unique<ProbsForcingState>(inner_->make_state(shape), inner_->needs());
  }
  void score(const RoundInput& in, SelectorState* state, std::span<float> scores) const override {
    inner_->score(in, state ? static_cast<ProbsForcingState*>(state)->inner() : nullptr, scores);
  }

 private:
  std::shared_ptr<const Selector> inner_;
};

int64_t prob_observations(const Sequence& s) {
  const auto* st = dynamic_cast<const ProbsForcingState*>(s.state.get());
  return st ? st->prob_observations : 0;
}

struct ThroughputRun {
  double tok_per_s = 0;
  double round_ms_per_step = 0;          ///< eviction rounds (score + compact), all sequences, per timed step
  int64_t rounds_timed = 0;              ///< eviction rounds inside the timed steps, all sequences
  double observe_ms_per_step = 0;        ///< selectors' per-token observation work, per timed step
  int64_t forced_prob_observations = 0;  ///< probability observations a forcing wrapper saw (timed steps)
  Summary step_ms;
  int64_t kv_bytes_per_seq = 0;
};

// `batch` sequences of one policy, prefilled with kPromptLen random tokens, fast-forwarded to
// start_length and advanced by 64 untimed batched steps; then timed in blocks of steps.
class BatchRun {
 public:
  BatchRun(Engine& engine, const Policy& pol, const ThroughputBenchConfig& cfg, int batch)
      : engine_(engine), V_(engine.model().config().n_vocab), toks_(static_cast<size_t>(batch)) {
    EvictionConfig ec;
    ec.budget = cfg.budget;
    ec.recent = cfg.common.recent;
    ec.seed = cfg.common.seed;
    const int warm = 64;
    const int64_t max_new = cfg.start_length + warm + int64_t{cfg.common.reps} * cfg.steps + 2;
    for (int i = 0; i < batch; ++i) {
      auto s = engine.new_sequence(static_cast<uint64_t>(i), pol, ec, kPromptLen, max_new);
      engine.prefill(*s, random_tokens(kPromptLen, V_, cfg.common.seed + static_cast<uint64_t>(i)), logits_);
      fast_forward(*s, cfg.start_length, cfg.common.seed + static_cast<uint64_t>(i));
      ptrs_.push_back(s.get());
      seqs_.push_back(std::move(s));
    }
    for (int w = 0; w < warm; ++w) step();
    round0_ = selector_ms(true);
    observe0_ = selector_ms(false);
    rounds0_ = rounds();
    probs0_ = probs();
  }
  /// Runs n batched steps; returns ms per step.
  double time_steps(int n) {
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) step();
    return seconds_since(t0) * 1e3 / n;
  }
  /// Selector and schedule counters since the end of the warm-up.
  void finish(ThroughputRun& out, double timed_steps) const {
    out.rounds_timed = rounds() - rounds0_;
    out.forced_prob_observations = probs() - probs0_;
    out.round_ms_per_step = (selector_ms(true) - round0_) / timed_steps;
    out.observe_ms_per_step = (selector_ms(false) - observe0_) / timed_steps;
    out.kv_bytes_per_seq = seqs_[0]->kv.allocated_bytes();
  }

 private:
  void step() {
    for (size_t i = 0; i < ptrs_.size(); ++i) toks_[i] = step_token(ptrs_[i]->n_seen + static_cast<int64_t>(i), V_);
    engine_.decode_batch(ptrs_, toks_, logits_);
  }
  double selector_ms(bool rounds) const {
    double t = 0;
    for (const Sequence* s : ptrs_) t += rounds ? s->stats.score_ms + s->stats.compact_ms : s->stats.observe_ms;
    return t;
  }
  int64_t rounds() const {
    int64_t n = 0;
    for (const Sequence* s : ptrs_) n += s->stats.rounds;
    return n;
  }
  int64_t probs() const {
    int64_t n = 0;
    for (const Sequence* s : ptrs_) n += prob_observations(*s);
    return n;
  }
  Engine& engine_;
  int32_t V_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
  std::vector<Sequence*> ptrs_;
  std::vector<int32_t> toks_;
  std::vector<float> logits_;
  double round0_ = 0, observe0_ = 0;
  int64_t rounds0_ = 0, probs0_ = 0;
};

// Runs `batch` sequences of `pol` (BatchRun), then reps x steps timed batched steps.
// tok/s = batch * steps / time.
ThroughputRun run_batch(Engine& engine, const Policy& pol, const ThroughputBenchConfig& cfg, int batch) {
  BatchRun run(engine, pol, cfg, batch);
  std::vector<double> ms;
  for (int r = 0; r < cfg.common.reps; ++r) ms.push_back(run.time_steps(cfg.steps));
  ThroughputRun out;
  run.finish(out, static_cast<double>(cfg.common.reps) * cfg.steps);
  out.step_ms = summarize(ms);
  out.tok_per_s = batch * 1e3 / out.step_ms.median;
  return out;
}

/// The probability kernel's cost measured in pairs: two batches of the same policy, one with the
/// kernel forced to produce probabilities, timed in alternating blocks of kPairBlock steps
/// (A B, then B A, ...), so slow drifts of a shared machine's load hit both alike.
struct PairedRun {
  ThroughputRun plain, forced;  ///< step_ms: per-block ms per step
  Summary diff_ms;              ///< forced - plain, per pair of blocks, ms per step
};
constexpr int kPairBlock = 8;

PairedRun run_paired(Engine& engine, const Policy& plain, const Policy& forced, const ThroughputBenchConfig& cfg) {
  BatchRun a(engine, plain, cfg, cfg.batch), b(engine, forced, cfg, cfg.batch);
  const int blocks = std::max(1, cfg.common.reps * cfg.steps / kPairBlock);
  std::vector<double> ma, mb, diff;
  for (int i = 0; i < blocks; ++i) {
    double ta, tb;
    if (i % 2 == 0) {
      ta = a.time_steps(kPairBlock);
      tb = b.time_steps(kPairBlock);
    } else {
      tb = b.time_steps(kPairBlock);
      ta = a.time_steps(kPairBlock);
    }
    ma.push_back(ta);
    mb.push_back(tb);
    diff.push_back(tb - ta);
  }
  PairedRun out;
  const double timed = static_cast<double>(blocks) * kPairBlock;
  a.finish(out.plain, timed);
  b.finish(out.forced, timed);
  out.plain.step_ms = summarize(ma);
  out.forced.step_ms = summarize(mb);
  out.plain.tok_per_s = cfg.batch * 1e3 / out.plain.step_ms.median;
  out.forced.tok_per_s = cfg.batch * 1e3 / out.forced.step_ms.median;
  out.diff_ms = summarize(diff);
  return out;
}

}  // namespace

nlohmann::json bench_throughput(const ThroughputBenchConfig& cfg) {
  if (cfg.batch < 1 || cfg.steps < 1 || cfg.max_batch < 1 || cfg.pool_bytes <= 0)
    throw Error("bench throughput: --batch, --steps, --max-batch and --pool-mib must be positive");
  for (const std::string& name : cfg.probs_kernel)
    if (!policy_with_params(name, cfg.params).selector)
      throw Error(
          fmt::format("bench throughput: --probs-kernel policy '{}' has no selector to force "
                      "attention probabilities for (give an evicting policy)",
                      name));
  Loaded L = load(cfg.common);
  Engine& engine = *L.engine;
  nlohmann::json out = header(cfg.common, *L.model, engine);
  print_load("before");
  const KvShape shape = engine.kv_shape();
  const int64_t slot_bytes = shape.bytes_per_token();
  out["bytes_per_slot"] = slot_bytes;
  out["budget"] = cfg.budget;
  out["recent"] = cfg.common.recent;
  out["start_length"] = cfg.start_length;
  out["pool_bytes"] = cfg.pool_bytes;
  nlohmann::json iso_batch = nlohmann::json::array(), iso_mem = nlohmann::json::array(),
                 skipped = nlohmann::json::array();

  if (cfg.iso_batch) {
    fmt::print("\n## iso-batch: batch {}, B = {}, r = {}, timed from {} generated tokens ({} steps x {} reps)\n",
               cfg.batch, cfg.budget, cfg.common.recent, cfg.start_length, cfg.steps, cfg.common.reps);
    fmt::print(
        "| policy | tok/s | step ms (min-max) | of which rounds ms | of which observing ms | KV MiB/seq "
        "|\n|---|---|---|---|---|---|\n");
  }
  for (const std::string& name : cfg.iso_batch ? policy_list(cfg.policies, false) : std::vector<std::string>{}) {
    try {
      const Policy pol = policy_with_params(name, cfg.params);
      const SelectorNeeds pol_needs = pol.selector ? pol.selector->needs() : SelectorNeeds{};
      const ThroughputRun r = run_batch(engine, pol, cfg, cfg.batch);
      iso_batch.push_back({{"policy", pol.name},
                           // What the selector asks of the forward pass (model/observer.h).
                           {"needs_probs", pol_needs.attention},
                           {"needs_queries", pol_needs.queries},
                           {"batch", cfg.batch},
                           {"tok_per_s", r.tok_per_s},
                           {"round_ms_per_step", r.round_ms_per_step},
                           {"observe_ms_per_step", r.observe_ms_per_step},
                           {"step_ms", r.step_ms.to_json()},
                           {"kv_bytes_per_seq", r.kv_bytes_per_seq},
                           {"rounds_timed", r.rounds_timed}});
      if (pol.evicts && r.rounds_timed == 0)
        fmt::print(stderr,
                   "kvevict: warning: bench throughput: no eviction round fell inside the {} timed steps of '{}' "
                   "(a round comes every r = {} steps per sequence): its rounds cost is not measured\n",
                   int64_t{cfg.common.reps} * cfg.steps, pol.name, cfg.common.recent);
      fmt::print("| {} | {:.2f} | {:.2f} ({:.2f}-{:.2f}) | {:.2f} | {:.2f} | {:.1f} |\n", pol.name, r.tok_per_s,
                 r.step_ms.median, r.step_ms.min, r.step_ms.max, r.round_ms_per_step, r.observe_ms_per_step,
                 static_cast<double>(r.kv_bytes_per_seq) / (1 << 20));
      std::fflush(stdout);
      if (cfg.common.on_cell) cfg.common.on_cell("iso-batch " + pol.name);
    } catch (const Error& e) {
      skipped.push_back({{"policy", name}, {"table", "iso-batch"}, {"reason", e.what()}});
      fmt::print("| {} | skipped: {} | | |\n", name, e.what());
    }
  }

  nlohmann::json probs_kernel = nlohmann::json::array();
  if (!cfg.probs_kernel.empty())
    fmt::print(
        "\n## probability kernel, paired: batch {}, B = {}, r = {}, from {} generated tokens; the same policy with "
        "and without the attention kernel forced to produce probabilities, timed in alternating blocks of {} steps\n"
        "| policy | plain step ms (min-max) | forced step ms (min-max) | forced - plain ms/step, median of pairs "
        "(min-max) | % of plain |\n|---|---|---|---|---|\n",
        cfg.batch, cfg.budget, cfg.common.recent, cfg.start_length, kPairBlock);
  for (const std::string& name : cfg.probs_kernel) {
    const Policy plain = policy_with_params(name, cfg.params);
    Policy forced = plain;
    forced.selector = std::make_shared<ProbsForcingSelector>(plain.selector);
    const PairedRun r = run_paired(engine, plain, forced, cfg);
    const auto side = [](const ThroughputRun& t) {
      return nlohmann::json{{"tok_per_s", t.tok_per_s},
                            {"step_ms", t.step_ms.to_json()},
                            {"round_ms_per_step", t.round_ms_per_step},
                            {"observe_ms_per_step", t.observe_ms_per_step},
                            {"rounds_timed", t.rounds_timed},
                            {"forced_prob_observations", t.forced_prob_observations}};
    };
    probs_kernel.push_back({{"policy", plain.name},
                            {"batch", cfg.batch},
                            {"block_steps", kPairBlock},
                            {"blocks", r.diff_ms.samples.size()},
                            {"plain", side(r.plain)},
                            {"forced", side(r.forced)},
                            {"diff_ms_per_step", r.diff_ms.to_json()}});
    fmt::print("| {} | {:.2f} ({:.2f}-{:.2f}) | {:.2f} ({:.2f}-{:.2f}) | {:.2f} ({:.2f}-{:.2f}) | {:.1f}% |\n",
               plain.name, r.plain.step_ms.median, r.plain.step_ms.min, r.plain.step_ms.max, r.forced.step_ms.median,
               r.forced.step_ms.min, r.forced.step_ms.max, r.diff_ms.median, r.diff_ms.min, r.diff_ms.max,
               100.0 * r.diff_ms.median / r.plain.step_ms.median);
    std::fflush(stdout);
    if (cfg.common.on_cell) cfg.common.on_cell("probs kernel " + plain.name);
  }
  out["probs_kernel"] = probs_kernel;

  if (cfg.iso_memory) {
    fmt::print("\n## iso-memory: KV pool {:.0f} MiB, bytes per slot across layers and heads {}\n",
               static_cast<double>(cfg.pool_bytes) / (1 << 20), slot_bytes);
    fmt::print(
        "| policy | slots/seq | max batch = pool / (slots x bytes) | run batch | allocated = predicted | tok/s | "
        "rounds ms/step |\n|---|---|---|---|---|---|---|\n");
  }
  for (const std::string& name : cfg.iso_memory ? policy_list(cfg.policies, false) : std::vector<std::string>{}) {
    try {
      const Policy pol = policy_with_params(name, cfg.params);
      EvictionConfig ec;
      ec.budget = cfg.budget;
      ec.recent = cfg.common.recent;
      const int64_t max_new = cfg.start_length + 64 + int64_t{cfg.common.reps} * cfg.steps + 2;
      // Slots each sequence holds at its peak: B + r when it evicts, else all it will see.
      const int64_t slots = required_capacity(ec, pol, kPromptLen, max_new);
      const int64_t max_batch = cfg.pool_bytes / (slots * slot_bytes);
      if (max_batch < 1) throw Error("the pool does not hold one sequence");
      const int run = static_cast<int>(std::min<int64_t>(max_batch, cfg.max_batch));
      const ThroughputRun r = run_batch(engine, pol, cfg, run);
      const bool exact = r.kv_bytes_per_seq == slots * slot_bytes;
      iso_mem.push_back({{"policy", pol.name},
                         {"slots_per_seq", slots},
                         {"max_batch", max_batch},
                         {"run_batch", run},
                         {"capped", run < max_batch},
                         {"allocated_bytes_per_seq", r.kv_bytes_per_seq},
                         {"predicted_bytes_per_seq", slots * slot_bytes},
                         {"tok_per_s", r.tok_per_s},
                         {"round_ms_per_step", r.round_ms_per_step},
                         {"observe_ms_per_step", r.observe_ms_per_step},
                         {"step_ms", r.step_ms.to_json()}});
      fmt::print("| {} | {} | {} | {}{} | {} | {:.2f} | {:.2f} |\n", pol.name, slots, max_batch, run,
                 run < max_batch ? " (capped)" : "", exact ? "yes" : "NO", r.tok_per_s, r.round_ms_per_step);
      std::fflush(stdout);
      if (cfg.common.on_cell) cfg.common.on_cell("iso-memory " + pol.name);
    } catch (const Error& e) {
      skipped.push_back({{"policy", name}, {"table", "iso-memory"}, {"reason", e.what()}});
      fmt::print("| {} | skipped: {} | | | | |\n", name, e.what());
    }
  }
  out["iso_batch"] = iso_batch;
  out["iso_memory"] = iso_mem;
  out["skipped"] = skipped;
  out["load_after"] = load_average();
  print_load("after");
  return out;
}

}  // namespace kvevict
