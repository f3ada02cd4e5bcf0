// Server metrics in the Prometheus text exposition format (version 0.0.4).
//
// Source: Prometheus "Exposition formats" (text format: # HELP / # TYPE lines, histograms as
// cumulative _bucket{le=...}, _sum, _count). Names follow vLLM's `vllm:` metrics
// (num_requests_running, time_to_first_token_seconds, inter_token_latency_seconds, ...) with a
// `kvevict:` prefix, plus the KV pool and eviction series vLLM does not have.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace kvevict::serve {

/// A cumulative histogram with fixed upper bounds (seconds). Thread-safe.
class Histogram {
 public:
  /// bounds: ascending finite upper bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  /// Adds one sample (seconds).
  void observe(double value);
  /// Appends `name`_bucket / _sum / _count lines (HELP and TYPE included).
  void render(const std::string& name, const std::string& help, std::string& out) const;
  /// Samples observed so far.
  uint64_t count() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  ///< per bucket (not cumulative), last = +Inf
  double sum_ = 0;
  uint64_t n_ = 0;
};

/// Every series the server exports. Counters are atomics; gauges are passed in at render time.
struct ServerMetrics {
  /// Latency buckets from 0.1 ms to 80 s for every histogram.
  ServerMetrics();
  std::atomic<uint64_t> prompt_tokens{0};       ///< prompt tokens prefilled
  std::atomic<uint64_t> prefill_chunks{0};      ///< prefill calls (one --prefill-chunk or less each)
  std::atomic<uint64_t> generation_tokens{0};   ///< tokens generated
  std::atomic<uint64_t> requests_success{0};    ///< requests finished (stop or length)
  std::atomic<uint64_t> requests_rejected{0};   ///< 429/503: queue full or shutting down
  std::atomic<uint64_t> requests_cancelled{0};  ///< client disconnected or shutdown cancelled
  std::atomic<uint64_t> requests_failed{0};     ///< engine error while running
  std::atomic<uint64_t> eviction_rounds{0};
  Histogram round_seconds;  ///< one eviction round (score + compaction), seconds
  Histogram ttft_seconds;   ///< request arrival to first token, seconds
  Histogram itl_seconds;    ///< between consecutive tokens of one sequence, seconds
  Histogram e2e_seconds;    ///< request arrival to its last token, seconds
};

/// Instantaneous values read from the scheduler when /metrics is served.
struct MetricsGauges {
  int64_t requests_running = 0;
  int64_t requests_waiting = 0;
  int64_t sequences_running = 0;
  int64_t kv_pool_used_bytes = 0;
  int64_t kv_shared_prompt_bytes = 0;  ///< part of kv_pool_used_bytes in shared prompt segments
  int64_t kv_pool_free_bytes = 0;
  int64_t kv_pool_capacity_bytes = 0;
  int64_t peak_sequences_running = 0;
  int64_t http_connections_open = 0;  ///< filled in by the HTTP layer
  /// Prefix cache of pinned prompts (serve/prompt_cache.h): lookups that found an entry, that
  /// found none (both only for requests that may use the cache), entries evicted (counters);
  /// entries and bytes held now, the budget (--prompt-cache) in bytes (gauges).
  uint64_t prompt_cache_hits = 0, prompt_cache_misses = 0, prompt_cache_evictions = 0;
  int64_t prompt_cache_entries = 0, prompt_cache_bytes = 0, prompt_cache_capacity_bytes = 0;
};

/// The whole /metrics page.
std::string render_metrics(const ServerMetrics& m, const MetricsGauges& g);

}  // namespace kvevict::serve
