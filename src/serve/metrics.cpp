#include "serve/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvevict::serve {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t b = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  std::lock_guard<std::mutex> lock(mu_);
  counts_[b] += 1;
  sum_ += value;
  n_ += 1;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_, name, n_);
}

namespace {
// Latency buckets (seconds) as vLLM's TTFT / inter-token histograms, extended down to 0.1 ms
// because a CPU round on a small model takes well under a millisecond.
std::vector<double> latency_buckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,
          0.3,    0.4,     0.5,    0.75,  1.0,    2.5,   5.0,  7.5,   10.0, 20.0,  40.0, 80.0};
}

void counter(std::string& out, const std::string& name, const std::string& help, uint64_t v) {
  out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
}
void gauge(std::string& out, const std::string& name, const std::string& help, int64_t v) {
  out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
}
}  // namespace

ServerMetrics::ServerMetrics()
    : round_seconds(latency_buckets()),
      ttft_seconds(latency_buckets()),
      itl_seconds(latency_buckets()),
      e2e_seconds(latency_buckets()) {}

std::string render_metrics(const ServerMetrics& m, const MetricsGauges& g) {
  std::string out;
  gauge(out, "kvevict:num_requests_running", "Requests with at least one sequence admitted (prefill or decode).",
        g.requests_running);
  gauge(out, "kvevict:num_requests_waiting", "Requests queued for KV memory or a sequence slot.", g.requests_waiting);
  gauge(out, "kvevict:num_sequences_running", "Sequences holding a KV reservation.", g.sequences_running);
  gauge(out, "kvevict:num_sequences_running_peak", "Most sequences ever running at once.", g.peak_sequences_running);
  gauge(out, "kvevict:kv_pool_used_bytes", "KV memory pool bytes reserved by running sequences.", g.kv_pool_used_bytes);
  gauge(out, "kvevict:kv_shared_prompt_bytes",
        "Part of kv_pool_used_bytes held by shared prompt KV segments (the choices of a request, or requests "
        "served from the prompt cache; each segment counted once).",
        g.kv_shared_prompt_bytes);
  gauge(out, "kvevict:kv_pool_free_bytes", "KV memory pool bytes free.", g.kv_pool_free_bytes);
  gauge(out, "kvevict:kv_pool_capacity_bytes", "KV memory pool size in bytes (--kv-memory).", g.kv_pool_capacity_bytes);
  gauge(out, "kvevict:http_connections_open", "HTTP connections open (idle, reading, waiting or streaming).",
        g.http_connections_open);
  gauge(out, "kvevict:prompt_cache_entries", "Prefilled prompts held by the prompt cache (--prompt-cache).",
        g.prompt_cache_entries);
  gauge(out, "kvevict:prompt_cache_bytes",
        "Bytes the prompt cache holds (its own budget, not part of kv_pool_used_bytes).", g.prompt_cache_bytes);
  gauge(out, "kvevict:prompt_cache_capacity_bytes", "Prompt cache budget in bytes (--prompt-cache; 0 = off).",
        g.prompt_cache_capacity_bytes);
  counter(out, "kvevict:prompt_cache_hits_total",
          "Requests whose prompt was served from the prompt cache (no prefill).", g.prompt_cache_hits);
  counter(out, "kvevict:prompt_cache_misses_total",
          "Requests that could use the prompt cache (policy pins the prompt) but found no entry.",
          g.prompt_cache_misses);
  counter(out, "kvevict:prompt_cache_evictions_total", "Prompt cache entries evicted (least recently used first).",
          g.prompt_cache_evictions);
  counter(out, "kvevict:prompt_tokens_total", "Prompt tokens prefilled.", m.prompt_tokens.load());
  counter(out, "kvevict:prefill_chunks_total", "Prefill calls (chunks of at most --prefill-chunk tokens).",
          m.prefill_chunks.load());
  counter(out, "kvevict:generation_tokens_total", "Tokens generated.", m.generation_tokens.load());
  counter(out, "kvevict:request_success_total", "Requests finished with finish_reason stop or length.",
          m.requests_success.load());
  counter(out, "kvevict:requests_rejected_total",
          "Requests refused because the queue was full or the server was stopping.", m.requests_rejected.load());
  counter(out, "kvevict:requests_cancelled_total", "Requests cancelled (client disconnected, or shutdown).",
          m.requests_cancelled.load());
  counter(out, "kvevict:requests_failed_total", "Requests that failed inside the engine.", m.requests_failed.load());
  counter(out, "kvevict:eviction_rounds_total", "Eviction rounds run over all sequences.", m.eviction_rounds.load());
  m.round_seconds.render("kvevict:eviction_round_seconds", "Time of one eviction round (scoring + compaction).", out);
  m.ttft_seconds.render("kvevict:time_to_first_token_seconds", "Request arrival to its first generated token.", out);
  m.itl_seconds.render("kvevict:inter_token_latency_seconds", "Time between consecutive tokens of a sequence.", out);
  m.e2e_seconds.render("kvevict:e2e_request_latency_seconds", "Request arrival to its last token.", out);
  return out;
}

}  // namespace kvevict::serve
