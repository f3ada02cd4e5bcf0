// The OpenAI-compatible HTTP API over a Scheduler: /v1/completions, /v1/chat/completions,
// /v1/models, /health, /metrics.
//
// Source: OpenAI API reference (Completions, Chat Completions, Models; error object
// {"error": {"message", "type", "param", "code"}}; streaming as Server-Sent Events ending in
// `data: [DONE]`), as vLLM's and llama-server's OpenAI front ends implement it (extra body
// fields such as `ignore_eos` and `top_k`; `code` = HTTP status). HTTP: cpp-httplib; JSON:
// nlohmann-json.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "serve/request.h"
#include "serve/scheduler.h"

namespace kvevict::serve {

/// The HTTP server. Thread-safe to stop from another thread (or a signal-watching thread).
class ApiServer {
 public:
  /// Validates the options (kvevict::Error naming the bad one) and sets up the routes.
  ApiServer(Scheduler& scheduler, ApiOptions opt);
  ~ApiServer();
  /// Binds host:port (port 0 picks a free port). Returns the bound port. Throws kvevict::Error
  /// naming host and port when the bind fails.
  int bind(const std::string& host, int port);
  /// Serves until stop(). Call after bind().
  void run();
  /// /health turns 503 and new generation requests get 503 (call before Scheduler::shutdown).
  void begin_shutdown();
  /// Stops accepting connections and makes run() return.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvevict::serve
