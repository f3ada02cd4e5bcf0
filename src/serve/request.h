// The OpenAI request parser of the HTTP API: one POST body of /v1/completions or
// /v1/chat/completions -> the GenerationParams the scheduler runs, or an ApiError (400) naming
// the field. Needs no socket and no model weights (a tokenizer and the context length), so the
// fuzz harness fuzz/fuzz_request.cpp calls it directly.
//
// Source: OpenAI API reference (Completions, Chat Completions; error object {"error": {"message",
// "type", "param", "code"}}), with vLLM's and llama-server's extra body fields (`ignore_eos`,
// `top_k`, `chat_template_kwargs`). JSON: nlohmann-json.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/policy_settings.h"
#include "eviction/registry.h"
#include "eviction/schedule.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "serve/api_error.h"
#include "serve/http_transport.h"
#include "serve/scheduler.h"
#include "util/field_error.h"

namespace kvevict::serve {

/// A rendered chat prompt: text with the template's special tokens spelled out (tokenized with
/// parse_special), and whether the tokenizer adds BOS/EOS (false when the text holds BOS).
struct ChatPrompt {
  std::string text;
  bool add_special = true;
  bool opens_thinking = false;  ///< the text ends inside an opened thinking trace (DeepSeek-R1's "<think>\n")
};

/// How chat replies' thinking traces are handled (engine/reasoning.h). Request fields
/// `reasoning_format` and `thinking_token_budget` override the server's defaults.
struct ReasoningOptions {
  /// The chat template's replies may hold a trace (ChatTemplate::has_thinking); without it a
  /// thinking_token_budget is refused and no reply has reasoning_content.
  bool template_has_thinking = false;
  /// ChatTemplate::thinking_end_text tokenised: forced when the budget is spent.
  std::vector<int32_t> close_tokens;
  /// --reasoning-format: true = "deepseek" (the trace in message.reasoning_content, as
  /// llama-server), false = "none" (the trace stays in content, tags included).
  bool split = true;
  int64_t budget = -1;  ///< --reasoning-budget: trace tokens allowed (-1 = no limit)
};
/// Renders chat messages (role, content) with the model's chat template; enable_thinking is the
/// request's chat_template_kwargs.enable_thinking (Qwen3 / DeepSeek-R1 templates). May throw
/// kvevict::Error (answered with 400).
using ChatRenderer =
    std::function<ChatPrompt(const std::vector<std::pair<std::string, std::string>>& messages, bool enable_thinking)>;

/// The server's sampling defaults (`kvevict serve --temp --top-p --top-k --min-p`): what a request
/// that does not give the field samples with. The seed default is policy_settings.seed.
struct SamplingDefaults {
  double temperature = 1.0;  ///< OpenAI's default; 0 = greedy
  double top_p = 1.0;        ///< (0, 1]; 1 = off
  int top_k = 0;             ///< 0 = off
  double min_p = 0.0;        ///< [0, 1]; 0 = off
};

/// Largest number of prompts in one completions request (`prompt` as an array).
inline constexpr int kMaxPrompts = 64;

/// Settings of the HTTP front end.
struct ApiOptions {
  std::string model_name;            ///< reported by /v1/models and in responses
  std::string api_key;               ///< empty: no authentication
  int64_t max_tokens_limit = 0;      ///< largest max_tokens accepted (tokens, >= 1)
  int max_n = 16;                    ///< largest `n` (choices per request)
  /// The server's policy settings (--policy, --budget, --buffer, --sinks, --param, ...), which
  /// per-request kv_* fields override; its seed is the base of the seeds of requests that give
  /// none. budget 0 = none given (then an evicting kv_policy needs kv_budget).
  PolicySettings policy_settings;
  /// The server's policy, built once from policy_settings (build_policy), so its --param values
  /// (e.g. TriAttention's statistics file) are read once, not per request.
  Policy policy = make_policy("full");
  /// Renders chat messages; null when the model has no usable chat template.
  ChatRenderer chat;
  /// Why chat is unavailable (the message of the 400 /v1/chat/completions answers with).
  std::string chat_unavailable;
  /// The chat template's family name (ChatTemplate::name(); "" without one), for /props.
  std::string chat_template_name;
  /// What the template renders (ChatTemplate::renders_system / can_disable_thinking): a request
  /// whose system message or enable_thinking would change nothing gets a warning, not silence.
  bool chat_renders_system = true;
  bool chat_can_disable_thinking = true;
  SamplingDefaults sampling;  ///< defaults of the sampling fields
  int retry_after_s = 1;  ///< Retry-After of 429/503 answers, seconds
  HttpLimits http;        ///< what one client may make the server hold (body size, connections, timeout)
  ReasoningOptions reasoning;  ///< chat replies' thinking traces
  /// Origins browsers may call the API from ("*" = any; empty = no CORS headers).
  std::vector<std::string> cors_origins;
};

/// Serves chat with `chat` (what `kvevict serve` does with the model's template or --chat-template):
/// sets opt.chat (renders messages; opens_thinking from the template), the template name and
/// capabilities (for /props and warnings), and opt.reasoning's template_has_thinking and
/// close_tokens (thinking_end_text tokenised with `tok`); opt.reasoning.split and .budget (the
/// server's flags) are left as they are.
void use_chat_template(ApiOptions& opt, const ChatTemplate& chat, const Tokenizer& tok);

/// How the API spells a field a FieldError names: the request field ("kv_budget",
/// "temperature", ...), or for a setting no request can give, the server flag ("--param").
std::string_view api_field_name(Field field);

/// The 400 answer to a FieldError: `param` is the request field (kv_policy for a server-only
/// setting), the message names it as api_field_name spells it.
ApiError api_error(const FieldError& e);

/// The two generation endpoints.
enum class Endpoint { Completions, Chat };

/// The route of an endpoint ("/v1/completions", "/v1/chat/completions").
const char* endpoint_path(Endpoint ep);

/// One parsed generation request.
struct ParsedRequest {
  GenerationParams gen;        ///< prompt (token ids), sampling, stop strings, n, policy and schedule
  /// Every prompt of the request (completions' `prompt` may be an array), token ids; gen.prompt
  /// is prompts[0]. Each runs as its own request of n choices; choice index = prompt index × n +
  /// choice (OpenAI's order).
  std::vector<std::vector<int32_t>> prompts;
  /// Notes for the client about parts of the request that change nothing on this model (e.g. a
  /// system message its chat template drops); answered in the response's `warnings`.
  std::vector<std::string> warnings;
  bool stream = false;         ///< answer with Server-Sent Events
  bool include_usage = false;  ///< stream_options.include_usage
  int64_t budget = 0, recent = 0;  ///< the schedule's B and r (tokens), for usage.kv
  bool chat = false;               ///< a chat request (usage gets completion_tokens_details)
  /// Chat replies: the trace goes to reasoning_content (reasoning_format "deepseek" on a template
  /// with thinking); gen.generation.thinking.starts_open says where it starts.
  bool split_reasoning = false;
};

/// Parses one request body (bytes as received) for endpoint `ep`: UTF-8, JSON, every field's
/// type and range, the prompt (tokenized with `tok`; at most `context_length` tokens), chat
/// messages (rendered with opt.chat), the per-request kv_* fields (through the settings builder
/// the CLI uses, engine/policy_settings.h). A request without `seed` takes one derived from
/// opt.policy_settings.seed and the next value of `request_counter`; a sampling field it does not
/// give takes opt.sampling's value. Throws ApiError (status 400, the field in `param`)
/// for any bad body; never another exception for any input (fuzz/fuzz_request.cpp).
ParsedRequest parse_generation_request(const std::string& body, Endpoint ep, const Tokenizer& tok,
                                       int64_t context_length, const ApiOptions& opt,
                                       std::atomic<uint64_t>& request_counter);

}  // namespace kvevict::serve
