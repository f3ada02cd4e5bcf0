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

#include "eviction/registry.h"
#include "eviction/schedule.h"
#include "serve/scheduler.h"

namespace kvevict::serve {

/// A rendered chat prompt: text with the template's special tokens spelled out (tokenized with
/// parse_special), and whether the tokenizer adds BOS/EOS (false when the text holds BOS).
struct ChatPrompt {
  std::string text;
  bool add_special = true;
};
/// Renders chat messages (role, content) with the model's chat template; enable_thinking is the
/// request's chat_template_kwargs.enable_thinking (Qwen3 / DeepSeek-R1 templates). May throw
/// kvevict::Error (answered with 400).
using ChatRenderer =
    std::function<ChatPrompt(const std::vector<std::pair<std::string, std::string>>& messages, bool enable_thinking)>;

/// Settings of the HTTP front end.
struct ApiOptions {
  std::string model_name;            ///< reported by /v1/models and in responses
  std::string api_key;               ///< empty: no authentication
  int64_t max_tokens_limit = 0;      ///< largest max_tokens accepted (tokens, >= 1)
  int64_t max_body_bytes = 4 << 20;  ///< larger bodies get 413
  int max_n = 16;                    ///< largest `n` (choices per request)
  /// Server defaults that per-request kv_* fields override.
  Policy policy = make_policy("full");  ///< the server's policy (--policy, --param, --sinks)
  int64_t budget = 0;                   ///< 0 = none given (then an evicting kv_policy needs kv_budget)
  int64_t recent = 64;
  LongPromptMode long_prompt = LongPromptMode::PinHead;
  uint64_t seed = 0;  ///< base of the seeds of requests that give none
  /// Renders chat messages; null when the model has no usable chat template.
  ChatRenderer chat;
  /// Why chat is unavailable (the message of the 400 /v1/chat/completions answers with).
  std::string chat_unavailable;
  int retry_after_s = 1;  ///< Retry-After of 429/503 answers, seconds
};

/// An API error: HTTP status and OpenAI error object fields.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  ///< empty -> null
};

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
