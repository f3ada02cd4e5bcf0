// `kvevict serve`: an OpenAI-compatible HTTP server with continuous batching over a KV memory
// pool (serve/scheduler.h, serve/http_server.h). Prints one line when ready; SIGINT/SIGTERM stop
// it cleanly (exit 0).
#include <fmt/format.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/common.h"
#include "kvcache/kv_pool.h"
#include "model/chat_template.h"
#include "model/model.h"
#include "serve/http_server.h"
#include "serve/scheduler.h"
#include "util/error.h"
#include "util/memory.h"

namespace kvevict::cli {

void add_bench_serve(CLI::App& root, std::vector<Command>& out);  // cli/bench_serve.cpp

namespace {

struct ServeArgs {
  std::string model, host = "127.0.0.1", alias, api_key, kv_memory, kv_type, chat_template;
  serve::SamplingDefaults sampling;
  int port = 8080;
  int max_seqs = 64, max_queue = 256, threads = 0;
  int64_t max_tokens = 0;      ///< 0 = the model's context length
  int64_t prefill_chunk = 64;  // SchedulerOptions::prefill_chunk says why
  bool no_share_prompt = false;
  std::string prompt_cache = "0";  ///< --prompt-cache: bytes or "0" (off)
  double shutdown_grace_s = 5;
  PolicyArgs policy;
  std::string max_body = "4MiB";
  serve::HttpLimits http = [] {
    serve::HttpLimits l;
    l.max_connections_per_client = 0;  // 0: derived from --max-seqs and --max-queue
    return l;
  }();
  std::vector<std::string> cors_origins;
  std::string reasoning_format = "deepseek";
  int64_t reasoning_budget = -1;
};

int g_signal_pipe[2] = {-1, -1};
void on_signal(int sig) {
  const ssize_t n = write(g_signal_pipe[1], &sig, sizeof sig);
  (void)n;
}

// "268435456", "256MiB", "256M", "1.5GiB", "512k" -> bytes (K/M/G and KiB/MiB/GiB are powers of
// 1024). Digits with at most one decimal point, then a unit: no sign, hex or exponent, and a
// value that is not a whole number of bytes ("1.5", "1.3k") is refused rather than truncated.
int64_t parse_bytes(const std::string& flag, const std::string& s) {
  const auto bad = [&](const char* why) {
    return Error(fmt::format("{} '{}': expected a positive size such as 268435456, 256MiB or 2GiB{}", flag, s, why));
  };
  size_t used = 0;
  bool dot = false;
  while (used < s.size() && (std::isdigit(static_cast<unsigned char>(s[used])) || (s[used] == '.' && !dot))) {
    dot = dot || s[used] == '.';
    ++used;
  }
  if (used == 0 || s[0] == '.' || s[used - 1] == '.') throw bad("");
  const double v = std::stod(s.substr(0, used));
  std::string unit = s.substr(used);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 0;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib" || unit == "kb")
    mult = 1024.0;
  else if (unit == "m" || unit == "mib" || unit == "mb")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib" || unit == "gb")
    mult = 1024.0 * 1024 * 1024;
  if (mult == 0 || !(v > 0) || v * mult > 1e15) throw bad("");
  if (v * mult != std::floor(v * mult)) throw bad(" (not a whole number of bytes)");
  return static_cast<int64_t>(v * mult);
}

int run_serve(const ServeArgs& a) {
  // SIGINT/SIGTERM: the handler only writes the signal number to a pipe (async-signal-safe,
  // and it works whichever thread receives the signal, OpenBLAS's included); a thread reading
  // the pipe shuts the server down in order.
  if (pipe(g_signal_pipe) != 0) throw Error("cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  if (!a.chat_template.empty()) (void)ChatTemplate::by_name(a.chat_template);  // bad name: fail before loading
  serve::check_cors_origins(a.cors_origins);
  const auto model = Model::load(a.model);
  const PolicySettings settings = policy_settings(a.policy);
  const CheckedPolicy kv = build_policy_config(settings);
  const Policy& policy = kv.policy();
  const EvictionConfig& cfg = kv.eviction();
  // f16 by default, as llama.cpp (half the memory; accuracy: docs/serving.md); f32 where keys are
  // re-rotated (position mode cache), which f16 cannot store, also for a request's kv_policy.
  const bool rerotates = cfg.positions == PositionMode::Cache;
  const KvType kv_type = !a.kv_type.empty() ? parse_kv_type(a.kv_type) : rerotates ? KvType::F32 : KvType::F16;
  check_kv_type(kv_type, kv);  // refused now, not by every request
  if (kv_type == KvType::F16 && rerotates)
    throw Error("--kv-type f16 cannot be combined with --position-mode cache (keys are re-rotated in float32); "
                "use --kv-type f32");
  const ModelConfig& mc = model->config();
  const KvShape shape{mc.n_layers, mc.n_kv_heads, mc.head_dim, kv_type};

  // Default pool: half of the memory available after the model is loaded.
  int64_t pool_bytes = 0;
  const int64_t available = available_memory_bytes();
  if (!a.kv_memory.empty()) {
    pool_bytes = parse_bytes("--kv-memory", a.kv_memory);
    // Every admitted sequence allocates its reservation whole, so a pool over what is free would
    // let requests run the machine out of memory instead of queueing.
    if (available > 0 && pool_bytes > available)
      throw Error(fmt::format("--kv-memory {}: {} bytes is more than the {} bytes ({:.1f} GiB) of memory available "
                              "now (MemAvailable); lower it",
                              a.kv_memory, pool_bytes, available, static_cast<double>(available) / (1 << 30)));
  } else {
    pool_bytes = available / 2;
    if (pool_bytes <= 0) throw Error("cannot read MemAvailable from /proc/meminfo: give --kv-memory BYTES");
  }
  serve::SchedulerOptions so;
  so.threads = a.threads;
  so.kv_type = kv_type;
  so.kv_memory_bytes = pool_bytes;
  so.max_seqs = a.max_seqs;
  so.max_queue = a.max_queue;
  so.prefill_chunk = a.prefill_chunk;
  so.share_prompt = !a.no_share_prompt;
  // 0 (the default) turns the prompt cache off; any other value must be a positive size.
  try {
    so.prompt_cache_bytes = a.prompt_cache == "0" ? 0 : parse_bytes("--prompt-cache", a.prompt_cache);
  } catch (const Error&) {
    throw Error(fmt::format("--prompt-cache '{}': expected 0 (off) or a positive size such as 268435456, 256MiB or 2GiB",
                            a.prompt_cache));
  }
  // The prompt cache holds its segments on top of the pool: both must fit what is free.
  if (available > 0 && so.prompt_cache_bytes > 0 && pool_bytes + so.prompt_cache_bytes > available)
    throw Error(fmt::format("--prompt-cache {}: {} bytes on top of the KV pool's {} is more than the {} bytes "
                            "({:.1f} GiB) of memory available now (MemAvailable); lower one of them",
                            a.prompt_cache, so.prompt_cache_bytes, pool_bytes, available,
                            static_cast<double>(available) / (1 << 30)));
  if (so.prompt_cache_bytes > 0 && a.no_share_prompt)
    throw Error("--prompt-cache needs shared prompt KV: it cannot be combined with --no-share-prompt");
  serve::ApiOptions ao;
  std::string chat_name = "none";
  ao.model_name = a.alias.empty() ? model_display_name(a.model) : a.alias;
  ao.api_key = a.api_key;
  ao.max_tokens_limit = a.max_tokens > 0 ? a.max_tokens : mc.context_length;
  ao.policy_settings = settings;
  ao.policy = policy;
  ao.sampling = a.sampling;
  // Chat: the GGUF's template, or --chat-template NAME; without one /v1/chat/completions
  // answers 400 with the reason.
  try {
    const ChatTemplate chat =
        ChatTemplate::from_text(model->chat_template(), model->path(), model->chat_template_key(), a.chat_template);
    serve::use_chat_template(ao, chat, model->tokenizer());
    chat_name = chat.name();
  } catch (const Error& e) {
    // The reason names the file and the --chat-template option (model/chat_template.h).
    ao.chat_unavailable =
        fmt::format("{} has no usable chat template: {}; or use /v1/completions", ao.model_name, e.what());
  }
  ao.reasoning.split = a.reasoning_format == "deepseek";
  ao.reasoning.budget = a.reasoning_budget;
  if (a.reasoning_budget >= 0 && !ao.reasoning.template_has_thinking)
    throw Error(fmt::format("--reasoning-budget {}: the chat template ({}) has no thinking trace to bound",
                            a.reasoning_budget, chat_name));
  ao.retry_after_s = 1;
  ao.http = a.http;
  if (a.http.max_connections_per_client == 0) ao.http.max_connections_per_client = a.max_seqs + a.max_queue + 64;
  ao.http.max_body_bytes = parse_bytes("--max-body", a.max_body);
  ao.cors_origins = a.cors_origins;

  // Sequences the pool admits at once for the server's default policy: B + s slots each for a
  // bounded policy (a prompt up to B; s the round interval, r by default), --max-tokens for `full`
  // (prompt + max_tokens <= that).
  const int64_t slots = policy.evicts ? cfg.budget + cfg.round_interval() : ao.max_tokens_limit;
  const int64_t per_seq = kv_bytes_for_capacity(shape, slots);
  const int64_t fit = std::min<int64_t>(pool_bytes / per_seq, a.max_seqs);
  if (fit < 1)
    throw Error(
        fmt::format("--kv-memory {} bytes holds no sequence of policy {}: one needs {} bytes ({} slots x {} "
                    "bytes/slot); raise --kv-memory or lower --budget/{}--max-tokens",
                    pool_bytes, policy.name, per_seq, slots, shape.bytes_per_token(),
                    cfg.interval > 0 ? "--round-interval/" : ""));
  serve::Scheduler sched(*model, so);
  serve::ApiServer api(sched, ao);
  const int port = api.bind(a.host, a.port);
  api.start();
  if (api.max_connections() < a.http.max_connections)
    fmt::print(stderr,
               "kvevict serve: --max-connections {} lowered to {}: the open-file limit (ulimit -n) leaves room for no "
               "more\n",
               a.http.max_connections, api.max_connections());
  fmt::print(
      "kvevict serve: listening on http://{}:{} | model {} ({} layers, {} KV heads) | policy {}{} | KV pool {} bytes "
      "({:.1f} MiB{}) | admits up to {} concurrent sequences ({} slots x {} bytes/slot each; --max-seqs {}) | chat "
      "template {} | KV {} | defaults temperature {} top_p {} top_k {} min_p {} seed {} max_tokens {} (chat: {}) | prompt cache {}\n",
      a.host, port, ao.model_name, mc.n_layers, mc.n_kv_heads, policy.name,
      policy.evicts ? fmt::format(" B={} r={}{}", cfg.budget, cfg.recent,
                                  cfg.interval > 0 ? fmt::format(" s={}", cfg.interval) : std::string())
                    : std::string(),
      pool_bytes,
      static_cast<double>(pool_bytes) / (1024.0 * 1024.0), a.kv_memory.empty() ? ", half of MemAvailable" : "", fit,
      slots, shape.bytes_per_token(), a.max_seqs, chat_name, kv_type_name(kv_type), a.sampling.temperature,
      a.sampling.top_p, a.sampling.top_k, a.sampling.min_p, settings.seed, std::min<int64_t>(16, ao.max_tokens_limit),
      ao.max_tokens_limit,
      so.prompt_cache_bytes > 0 ? fmt::format("{} bytes", so.prompt_cache_bytes) : std::string("off"));
  std::fflush(stdout);

  std::thread stopper([&] {
    int sig = 0;
    while (read(g_signal_pipe[0], &sig, sizeof sig) != static_cast<ssize_t>(sizeof sig)) {
    }
    fmt::print(stderr, "kvevict serve: {} received: finishing running requests (up to {:.0f} s), refusing new ones\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", a.shutdown_grace_s);
    api.begin_shutdown();
    sched.shutdown(std::chrono::milliseconds(static_cast<int64_t>(a.shutdown_grace_s * 1000)));
    // Let the HTTP workers write the last events of every stream before the listener closes.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    api.stop();
  });
  api.run();  // already started: serves until the stopper's stop()
  stopper.join();
  const serve::MetricsGauges g = sched.gauges();
  fmt::print(stderr,
             "kvevict serve: stopped ({} requests finished, {} cancelled, {} rejected, {} failed; peak {} sequences)\n",
             sched.metrics().requests_success.load(), sched.metrics().requests_cancelled.load(),
             sched.metrics().requests_rejected.load(), sched.metrics().requests_failed.load(),
             g.peak_sequences_running);
  return 0;
}

}  // namespace

void add_serve(CLI::App& root, std::vector<Command>& out) {
  auto s = std::make_shared<ServeArgs>();
  auto* cmd =
      root.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching over a KV memory pool");
  cmd->add_option("-m,--model", s->model, model_help())->required();
  cmd->add_option("--host", s->host, "Address to bind (loopback by default)")->capture_default_str();
  cmd->add_option("--port", s->port, "TCP port (0 = any free port; the ready line names it)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--kv-memory", s->kv_memory,
                  "KV memory pool: bytes, or with a K/M/G (KiB/MiB/GiB) suffix; default half of MemAvailable at start");
  cmd->add_option("--max-seqs", s->max_seqs, "Sequences running at once")->check(at_least(1))->capture_default_str();
  cmd->add_option("--max-queue", s->max_queue, "Requests waiting at once; more get 429 with Retry-After")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--max-tokens", s->max_tokens,
                  "Largest max_tokens a request may ask (default: the model's context length)")
      ->check(at_least(1));
  cmd->add_option("--prefill-chunk", s->prefill_chunk,
                  "Prompt tokens prefilled per scheduler step, at most 4096 (a long "
                  "prompt delays running sequences by at most one chunk; outputs do not depend on it)")
      ->check(CLI::Range(int64_t{1}, serve::kMaxPrefillChunk))
      ->capture_default_str();
  cmd->add_flag("--no-share-prompt", s->no_share_prompt,
                "Give each of a request's n choices its own copy of the prompt's KV (default: choices share "
                "the slots their policy never evicts, outputs unchanged)");
  cmd->add_option("--prompt-cache", s->prompt_cache,
                  "Prefix cache of pinned prompts: byte budget (K/M/G suffix allowed) on top of --kv-memory; a "
                  "request whose prompt and KV settings equal a cached one skips its prefill, outputs unchanged "
                  "(0 = off)")
      ->capture_default_str();
  cmd->add_option("--api-key", s->api_key, "Require Authorization: Bearer KEY on every endpoint but /health");
  cmd->add_option("--alias", s->alias, "Model name in responses and /v1/models (default: the file name)");
  cmd->add_option("-t,--threads", s->threads, "Engine threads (0 = all cores)")
      ->check(at_least(0))
      ->capture_default_str();
  cmd->add_option("--kv-type", s->kv_type,
                  "KV cache element type: f16 (default, as llama.cpp; f32 with --position-mode cache) or f32")
      ->check(CLI::IsMember({"f32", "f16"}));
  cmd->add_option("--temp", s->sampling.temperature,
                  "Default temperature of requests that give none (0 = greedy; request fields override)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  cmd->add_option("--top-p", s->sampling.top_p, "Default top_p, in (0, 1] (1 = off)")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  cmd->add_option("--top-k", s->sampling.top_k, "Default top_k (0 = off)")->check(at_least(0))->capture_default_str();
  cmd->add_option("--min-p", s->sampling.min_p, "Default min_p, in [0, 1] (0 = off)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--shutdown-grace", s->shutdown_grace_s,
                  "Seconds running requests may finish after SIGINT/SIGTERM before they are cancelled")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--chat-template", s->chat_template,
                  "Chat template for /v1/chat/completions instead of the GGUF's (" + ChatTemplate::names() + ")");
  cmd->add_option("--reasoning-format", s->reasoning_format,
                  "Thinking traces of chat replies: deepseek (in message.reasoning_content, as llama-server) or none "
                  "(left in content); a request's reasoning_format overrides it")
      ->check(CLI::IsMember({"none", "deepseek"}))
      ->capture_default_str();
  cmd->add_option("--reasoning-budget", s->reasoning_budget,
                  "Tokens a chat reply's thinking trace may hold before it is closed with the template's "
                  "end-of-thinking text (-1 = no limit); a request's thinking_token_budget overrides it")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--max-body", s->max_body,
                  "Largest request body (bytes, or with a K/M/G suffix), Content-Length or chunked; larger get 413")
      ->capture_default_str();
  cmd->add_option("--timeout", s->http.timeout_s,
                  "Seconds a connection may send or read nothing (while its request is read, between requests, "
                  "or while it does not read its answer) before it is closed")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  cmd->add_option("--read-timeout", s->http.read_timeout_s,
                  "Seconds within which a whole request (line, headers, body) must arrive, counted from the "
                  "connection opening or its previous answer; a slower client is disconnected")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  cmd->add_option("--max-connections", s->http.max_connections,
                  "Connections open at once; more wait in the listen backlog")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-connections-per-client", s->http.max_connections_per_client,
                  "Connections open at once from one client address; more are closed as they arrive (default: "
                  "--max-seqs + --max-queue + 64, so that one client, or a proxy, can fill the queue)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--threads-http", s->http.workers,
                  "Threads that parse and tokenize requests (sockets are served by 2 event threads)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--cors-origin", s->cors_origins,
                  "Origin browsers may call the API from (repeat for several; '*' = any); default none");
  add_policy_options(*cmd, s->policy);
  out.push_back({cmd, [s] { return run_serve(*s); }});
  add_bench_serve(root, out);
}

}  // namespace kvevict::cli
