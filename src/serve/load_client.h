// A closed-loop load generator for a running `kvevict serve`: K client threads each send
// streaming /v1/completions requests back to back over loopback and time every token.
//
// Used by `kvevict bench serve` and the serving load test. Metrics as vLLM's
// benchmark_serving.py defines them: time to first token (request sent -> first text chunk),
// inter-token latency (between consecutive text chunks of one request), output tokens from the
// usage block (stream_options.include_usage).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvevict::serve {

/// What to send.
struct LoadOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  int clients = 8;            ///< concurrent streaming clients (>= 1)
  int requests = 64;          ///< requests in all (>= 1)
  double time_limit_s = 600;  ///< clients stop starting requests after this, seconds
  /// Request body fields (prompt, max_tokens, kv_policy, ...); "stream" and "stream_options"
  /// are set by the client. Request i gets "seed": seed0 + i unless the body has a seed.
  nlohmann::json body;
  uint64_t seed0 = 0;
  double read_timeout_s = 600;  ///< per request, seconds
};

/// What came back.
struct LoadResult {
  int64_t ok = 0;                           ///< requests complete: finish_reason, usage and [DONE]
  int64_t errors = 0;                       ///< HTTP errors, error events, incomplete streams
  std::vector<std::string> error_messages;  ///< first few
  int64_t output_tokens = 0;                ///< sum of usage.completion_tokens of complete requests
  double wall_s = 0;                        ///< first request sent -> last response ended, seconds
  std::vector<double> ttft_s;               ///< per complete request, seconds
  std::vector<double> itl_s;                ///< every gap between text chunks, seconds
  std::vector<double> latency_s;            ///< per complete request, end to end, seconds
  int64_t peak_sequences = 0;      ///< max kvevict:num_sequences_running seen on /metrics (sampled every 20 ms)
  std::vector<std::string> texts;  ///< output text of request i (choice 0)
};

/// Runs the load. Never throws for server-side failures (they are counted); throws
/// kvevict::Error for invalid options.
LoadResult run_load(const LoadOptions& opt);

/// q-quantile (0..1) of `v` by linear interpolation between order statistics; 0 when empty.
double quantile(std::vector<double> v, double q);

/// Reads one sample `name` (no labels) from a Prometheus text page; -1 when absent.
double metric_value(const std::string& page, const std::string& name);

}  // namespace kvevict::serve
