// The OpenAI-compatible HTTP API over a Scheduler: /v1/completions, /v1/chat/completions,
// /v1/models, /health, /metrics, as one route table (each also without the /v1 prefix) on the
// transport of serve/http_transport.h.
//
// Source: OpenAI API reference (Completions, Chat Completions, Models; error object
// {"error": {"message", "type", "param", "code"}}; streaming as Server-Sent Events ending in
// `data: [DONE]`), as vLLM's and llama-server's OpenAI front ends implement it (extra body
// fields such as `ignore_eos` and `top_k`; `code` = HTTP status). HTTP: libmicrohttpd (why:
// docs/serving.md); JSON: nlohmann-json.
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
  /// Validates the options (kvevict::Error naming the bad one) and builds the route table.
  ApiServer(Scheduler& scheduler, ApiOptions opt);
  ~ApiServer();
  /// Binds host:port (port 0 picks a free port). Returns the bound port. Throws kvevict::Error
  /// naming host and port when the bind fails.
  int bind(const std::string& host, int port);
  /// Starts serving in the background (the transport's threads). Call after bind(), or without
  /// it to serve only add_connection() sockets.
  void start();
  /// start(), then serves until stop().
  void run();
  /// /health turns 503 and new generation requests get 503 (call before Scheduler::shutdown).
  void begin_shutdown();
  /// Stops accepting connections, gives waiting replies their last answer, and makes run()
  /// return. Idempotent.
  void stop();
  /// Serves one connected stream socket (the fuzz harness's socketpair); owned by the server.
  void add_connection(int fd);
  /// Connections open now.
  int64_t open_connections() const;
  /// --max-connections as fitted to the open-file limit at start().
  int max_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvevict::serve
