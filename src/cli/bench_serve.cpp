// `kvevict bench serve`: drives a running `kvevict serve` with K concurrent streaming clients
// per policy (kv_policy per request, so one server and one KV pool serve every row) and prints
// output tok/s, requests/s, TTFT and inter-token latency p50/p99 and peak concurrent sequences.
//
// Source: the paper's serving comparison (throughput at equal KV memory per policy) and vLLM's
// benchmark_serving.py metric definitions (serve/load_client.h).
#include <fmt/format.h>
#include <httplib.h>
#include <CLI/CLI.hpp>

#include <unistd.h>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "serve/load_client.h"
#include "util/error.h"
#include "util/rng.h"

namespace kvevict::cli {
namespace {

struct BenchServeArgs {
  std::string host = "127.0.0.1", api_key, policies = "full,random,random-shared,h2o,tova,snapkv,triattention";
  int port = 8080, clients = 16, requests = 32, prompt_tokens = 128, vocab_lo = 3;
  int64_t max_tokens = 2048, budget = 0, buffer = 64;
  bool buffer_given = false;  ///< -r/--buffer was on the command line
  double time_limit_s = 600;
  uint64_t seed = 0;
  std::string json_out;
};

int run_bench_serve(const BenchServeArgs& a) {
  if (a.buffer_given) warn_if_recent_looks_like_reps(a.buffer, "--requests per policy");
  httplib::Client c(a.host, a.port);
  c.set_read_timeout(10, 0);
  httplib::Headers h;
  if (!a.api_key.empty()) h.emplace("Authorization", "Bearer " + a.api_key);
  auto models = c.Get("/v1/models", h);
  if (!models || models->status != 200)
    throw Error(
        fmt::format("no kvevict server answers at http://{}:{} (start one with kvevict serve)", a.host, a.port));
  const auto mj = nlohmann::json::parse(models->body);
  const std::string model = mj["data"][0]["id"];
  auto metrics = c.Get("/metrics", h);
  const double pool = metrics ? serve::metric_value(metrics->body, "kvevict:kv_pool_capacity_bytes") : -1;
  // The prompt: prompt_tokens token ids drawn from [vocab_lo, 256 + vocab_lo) with the seed, the
  // same for every request (a synthetic model has no meaningful text).
  nlohmann::json prompt = nlohmann::json::array();
  Rng rng(stream_id({a.seed, 0x70726F6DULL}));
  for (int i = 0; i < a.prompt_tokens; ++i) prompt.push_back(a.vocab_lo + static_cast<int>(rng() % 256));
  char hostname[256] = {0};
  gethostname(hostname, sizeof(hostname) - 1);
  double load[3] = {0, 0, 0};
  const bool have_load = getloadavg(load, 3) == 3;
  fmt::print(
      "bench serve: model {} | KV pool {:.0f} MiB | {} clients, {} requests per policy, prompt {} tokens, "
      "max_tokens {} (ignore_eos), B={} r={} | load average before: {:.2f}\n",
      model, pool / (1024.0 * 1024.0), a.clients, a.requests, a.prompt_tokens, a.max_tokens, a.budget, a.buffer,
      have_load ? load[0] : -1.0);
  fmt::print(
      "| policy | requests ok/err | output tok/s | requests/s | TTFT p50 / p99 (s) | ITL p50 / p99 (ms) | peak "
      "concurrent seqs | wall (s) | load avg |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& p : split_list(a.policies, "--policies")) {
    serve::LoadOptions lo;
    lo.host = a.host;
    lo.port = a.port;
    lo.api_key = a.api_key;
    lo.clients = a.clients;
    lo.requests = a.requests;
    lo.time_limit_s = a.time_limit_s;
    lo.seed0 = a.seed;
    lo.body = {{"model", model},     {"prompt", prompt},   {"max_tokens", a.max_tokens},
               {"ignore_eos", true}, {"temperature", 0.6}, {"top_p", 0.95},
               {"kv_policy", p}};
    if (p != "full") lo.body["kv_budget"] = a.budget, lo.body["kv_buffer"] = a.buffer;
    const serve::LoadResult r = serve::run_load(lo);
    getloadavg(load, 3);
    const double tps = r.wall_s > 0 ? static_cast<double>(r.output_tokens) / r.wall_s : 0;
    const double rps = r.wall_s > 0 ? static_cast<double>(r.ok) / r.wall_s : 0;
    fmt::print("| {} | {}/{} | {:.1f} | {:.3f} | {:.2f} / {:.2f} | {:.1f} / {:.1f} | {} | {:.1f} | {:.2f} |\n", p, r.ok,
               r.errors, tps, rps, serve::quantile(r.ttft_s, 0.5), serve::quantile(r.ttft_s, 0.99),
               1000 * serve::quantile(r.itl_s, 0.5), 1000 * serve::quantile(r.itl_s, 0.99), r.peak_sequences, r.wall_s,
               load[0]);
    std::fflush(stdout);
    for (const auto& m : r.error_messages) warn(fmt::format("{}: {}", p, m));
    rows.push_back({{"policy", p},
                    {"ok", r.ok},
                    {"errors", r.errors},
                    {"output_tokens", r.output_tokens},
                    {"wall_s", r.wall_s},
                    {"output_tok_s", tps},
                    {"requests_s", rps},
                    {"ttft_p50_s", serve::quantile(r.ttft_s, 0.5)},
                    {"ttft_p99_s", serve::quantile(r.ttft_s, 0.99)},
                    {"itl_p50_s", serve::quantile(r.itl_s, 0.5)},
                    {"itl_p99_s", serve::quantile(r.itl_s, 0.99)},
                    {"peak_sequences", r.peak_sequences},
                    {"load_avg_1m", load[0]}});
  }
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out);
    if (!f) throw Error(fmt::format("{}: cannot write", a.json_out));
    f << nlohmann::json{{"model", model}, {"pool_bytes", pool}, {"host", hostname}, {"rows", rows}}.dump(1) << "\n";
  }
  return 0;
}

}  // namespace

void add_bench_serve(CLI::App& root, std::vector<Command>& out) {
  CLI::App* bench = root.get_subcommand("bench");  // registered by add_bench (main.cpp lists it earlier)
  auto a = std::make_shared<BenchServeArgs>();
  auto* cmd = bench->add_subcommand("serve",
                                    "Throughput of a running kvevict serve per policy at equal KV memory "
                                    "(K concurrent streaming clients over loopback)");
  cmd->add_option("--host", a->host, "Server address")->capture_default_str();
  cmd->add_option("--port", a->port, "Server port")->check(CLI::Range(1, 65535))->capture_default_str();
  cmd->add_option("--api-key", a->api_key, "API key of the server");
  cmd->add_option("--policies", a->policies, "Policies, comma-separated (one table row each)")->capture_default_str();
  cmd->add_option("--clients", a->clients, "Concurrent streaming clients")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--requests", a->requests, "Requests per policy")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "Prompt length (random token ids)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-tokens", a->max_tokens, "Tokens generated per request (ignore_eos)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--budget,-B", a->budget, "kv_budget of the bounded policies")->check(at_least(1))->required();
  cmd->add_option("--buffer,-r", a->buffer, "kv_buffer of the bounded policies")
      ->check(at_least(1))
      ->each([a](const std::string&) { a->buffer_given = true; })
      ->capture_default_str();
  cmd->add_option("--time-limit", a->time_limit_s, "Seconds per policy after which clients start no new request")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the prompt and of request i (seed + i)")
      ->check(seed_value())
      ->capture_default_str();
  cmd->add_option("--json", a->json_out, "Also write the rows as JSON to this file");
  // `bench` dispatches its subcommands in cli/bench.cpp: run this one before handing over.
  for (Command& c : out)
    if (c.app == bench) {
      c.run = [cmd, a, rest = c.run] { return cmd->parsed() ? run_bench_serve(*a) : rest(); };
      return;
    }
  throw Error("bench serve: the bench command must be registered first");
}

}  // namespace kvevict::cli
