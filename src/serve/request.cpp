#include "serve/request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string_view>
#include <limits>
#include <nlohmann/json.hpp>

#include "serve/json_body.h"
#include "util/error.h"
#include "util/limits.h"
#include "util/rng.h"

namespace kvevict::serve {
namespace {

using json = nlohmann::json;

// Typed field readers: a field of the wrong type or out of range is a 400 naming it.
ApiError bad(const std::string& param, const std::string& msg) {
  return ApiError{400, fmt::format("{}: {}", param, msg), param};
}

// A value out of its range or of the wrong type, worded as the CLI's option errors:
// "kv_budget 100000000: must be in [1, 1048576]".
ApiError bad_value(const std::string& param, const std::string& value, const std::string& rule) {
  return ApiError{400, fmt::format("{} {}: must be {}", param, value, rule), param};
}

// An integer field within [lo, hi]; `note` is appended to the range in the error. A float
// such as 1e300 is compared as a double first: converting it to int64 would be undefined.
std::optional<int64_t> get_int(const json& body, const std::string& key, int64_t lo, int64_t hi,
                               const std::string& note = "") {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() && !(it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()))
    throw bad_value(key, quote_value(*it), "an integer");
  const std::string range = fmt::format("in [{}, {}]{}", lo, hi, note);
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi) && std::abs(d) < 9.0e18))
      throw bad_value(key, quote_value(*it), range);
    return static_cast<int64_t>(d);
  }
  // Unsigned values above INT64_MAX read as out of range.
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw bad_value(key, quote_value(*it), range);
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) throw bad_value(key, std::to_string(v), range);
  return v;
}

std::optional<double> get_number(const json& body, const std::string& key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) throw bad_value(key, quote_value(*it), "a number");
  return it->get<double>();
}

std::optional<bool> get_bool(const json& body, const std::string& key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) throw bad_value(key, quote_value(*it), "true or false");
  return it->get<bool>();
}

std::optional<std::string> get_string(const json& body, const std::string& key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw bad_value(key, quote_value(*it), "a string");
  return it->get<std::string>();
}

// Every field a request may carry. A field outside these is refused (400 naming it), never
// ignored: a misspelt "max_tokns" or an unimplemented "tools" would otherwise change nothing
// and return 200. "user" (OpenAI's end-user id) is accepted: it changes no computation.
constexpr std::string_view kCommonFields[] = {
    "model",          "max_tokens",         "max_completion_tokens", "n",          "temperature",
    "top_p",          "top_k",              "min_p",                 "seed",       "stop",
    "stop_token_ids", "stream",             "stream_options",        "ignore_eos", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "logit_bias",           "min_tokens", "echo",
    "logprobs",       "best_of",            "kv_policy",             "kv_budget",  "kv_buffer",
    "kv_sinks",       "user",               "top_logprobs",          "kv_round_interval"};
// OpenAI fields kvevict does not implement: named as unsupported rather than unknown.
constexpr std::string_view kUnsupportedFields[] = {
    "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls", "response_format",
    "suffix", "reasoning_effort", "audio", "modalities", "prediction", "web_search_options"};

// Chat-only fields of the thinking trace (llama-server's reasoning_format, vLLM's
// thinking_token_budget).
constexpr std::string_view kReasoningFields[] = {"reasoning_format", "thinking_token_budget"};

void check_fields(const json& body, Endpoint ep) {
  for (const auto& [key, value] : body.items()) {
    if (std::find(std::begin(kCommonFields), std::end(kCommonFields), key) != std::end(kCommonFields)) continue;
    if (ep == Endpoint::Chat &&
        std::find(std::begin(kReasoningFields), std::end(kReasoningFields), key) != std::end(kReasoningFields))
      continue;
    if (ep == Endpoint::Completions && key == "prompt") continue;
    if (ep == Endpoint::Chat && (key == "messages" || key == "chat_template_kwargs")) continue;
    const std::string shown = key.size() > 64 ? key.substr(0, 64) + "..." : key;
    if (std::find(std::begin(kUnsupportedFields), std::end(kUnsupportedFields), key) != std::end(kUnsupportedFields)) {
      if (value.is_null()) continue;  // an explicit null asks for nothing
      throw bad(shown, "is not supported by this server");
    }
    throw bad(shown, fmt::format("unknown field for {} (docs/serving.md lists the fields)", endpoint_path(ep)));
  }
}

// Completions' `prompt`: a string, an array of token ids, or an array of strings or of token-id
// arrays (one prompt each, as OpenAI's API and vLLM take it). Token ids are checked against the
// vocabulary; an error names the prompt's index and the token's.
std::vector<std::vector<int32_t>> completion_prompts(const json& body, const Tokenizer& tok) {
  const int n_vocab = tok.n_vocab();
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw bad("prompt", "is required");
  const std::string shape =
      "must be a non-empty string, an array of token ids, or an array of strings or of token-id arrays";
  auto ids = [&](const json& arr, const std::string& where) {
    std::vector<int32_t> out;
    if (arr.empty()) throw bad(where, "must not be empty");
    for (size_t k = 0; k < arr.size(); ++k) {
      const json& t = arr[k];
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
        throw bad(where, fmt::format("token {} = {}: must be a token id in [0, {})", k, quote_value(t), n_vocab));
      out.push_back(t.get<int32_t>());
    }
    return out;
  };
  auto text = [&](const json& s, const std::string& where) {
    const std::string t = s.get<std::string>();
    if (t.empty()) throw bad(where, "must not be empty");
    // Special-token text (`<|im_end|>`) is the special token, as llama-server's and vLLM's
    // completions read it and as /tokenize does by default: a hand-formatted chat prompt works.
    return tok.encode(t, true, /*parse_special=*/true);
  };
  const json& pr = *it;
  if (pr.is_string()) return {text(pr, "prompt")};
  if (!pr.is_array() || pr.empty()) throw bad("prompt", shape);
  if (pr[0].is_number()) return {ids(pr, "prompt")};  // one prompt of token ids
  if (pr.size() > static_cast<size_t>(kMaxPrompts))
    throw bad("prompt", fmt::format("has {} prompts, more than the {} one request may carry", pr.size(), kMaxPrompts));
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < pr.size(); ++i) {
    const std::string where = fmt::format("prompt[{}]", i);
    if (pr[i].is_string())
      out.push_back(text(pr[i], where));
    else if (pr[i].is_array())
      out.push_back(ids(pr[i], where));
    else
      throw bad(where, fmt::format("{}: must be a string or an array of token ids", quote_value(pr[i])));
  }
  return out;
}

// Chat's `messages`, rendered with the model's chat template and tokenized. Adds a warning for
// what the template renders no trace of: a system message (Phi-3-mini's template drops it) or
// chat_template_kwargs.enable_thinking on a template without that switch.
std::vector<int32_t> chat_prompt(const json& body, const Tokenizer& tok, const ApiOptions& opt,
                                 std::vector<std::string>& warnings, bool& opens_thinking) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty())
    throw bad("messages", "must be a non-empty array of {role, content} objects");
  std::vector<std::pair<std::string, std::string>> msgs;
  bool has_system = false;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) throw bad("messages", fmt::format("{}: must be an object with role and content", where));
    auto r = m.find("role");
    if (r == m.end() || !r->is_string())
      throw bad("messages", fmt::format("{}: needs a role (a string: system, user, assistant, developer or tool){}",
                                        where, r == m.end() ? "" : ", not " + quote_value(*r)));
    const std::string role = r->get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool")
      throw bad("messages", fmt::format("{}: role {} is not one of system, user, assistant, developer, tool", where,
                                        quote_value(*r)));
    has_system = has_system || role == "system";
    // A message's other keys: `name` and an assistant's `reasoning_content` (clients send replies
    // back) are rendered by no template kvevict has, so they are named in a warning; tool calls
    // are refused like `tools`; anything else is a 400, as unknown request fields are.
    for (const auto& [key, value] : m.items()) {
      if (key == "role" || key == "content" || value.is_null()) continue;
      if (key == "name" || (key == "reasoning_content" && role == "assistant")) {
        warnings.push_back(fmt::format("{}.{} was not rendered: the chat template has no place for it", where, key));
        continue;
      }
      if (key == "tool_calls" || key == "tool_call_id" || key == "function_call")
        throw bad("messages", fmt::format("{}.{}: tool calls are not supported by this server", where, key));
      throw bad("messages", fmt::format("{}: unknown key {} (supported: role, content, name)", where, quote_value(json(key))));
    }
    std::string content;
    auto c = m.find("content");
    if (c != m.end() && c->is_string()) {
      content = c->get<std::string>();
    } else if (c != m.end() && c->is_array()) {
      // Content parts: only text parts are supported.
      for (const json& part : *c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          throw bad("messages", fmt::format("{}: only text content parts are supported", where));
        content += part["text"].get<std::string>();
      }
    } else if (!(c != m.end() && c->is_null() && role == "assistant")) {
      throw bad("messages", fmt::format("{}: needs content (a string)", where));
    }
    msgs.emplace_back(role, content);
  }
  if (!opt.chat) throw ApiError{400, opt.chat_unavailable, "messages"};
  bool thinking = true;
  if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
    if (!k->is_object()) throw bad("chat_template_kwargs", "must be an object");
    const auto given = get_bool(*k, "enable_thinking");
    thinking = given.value_or(true);
    for (const auto& [key, value] : k->items())
      if (key != "enable_thinking")
        throw bad("chat_template_kwargs",
                  fmt::format("unknown key {} (supported: enable_thinking)", quote_value(json(key))));
    if (given && !opt.chat_can_disable_thinking)
      warnings.push_back(fmt::format(
          "chat_template_kwargs.enable_thinking has no effect: the chat template '{}' has no thinking switch",
          opt.chat_template_name));
  }
  if (has_system && !opt.chat_renders_system)
    warnings.push_back(fmt::format(
        "the system message was dropped: the chat template '{}' renders no system message (put its text in the "
        "first user message)",
        opt.chat_template_name));
  ChatPrompt cp;
  try {
    cp = opt.chat(msgs, thinking);
  } catch (const Error& e) {
    throw bad("messages", e.what());
  }
  opens_thinking = cp.opens_thinking;
  // The template spells its special tokens (<|im_start|>, ...) as text: parse them.
  return tok.encode(cp.text, cp.add_special, /*parse_special=*/true);
}

// `logprobs` / `top_logprobs` -> GenerationConfig::logprobs (-1 = none, else the number of
// alternatives per token). Completions: `logprobs: N` (OpenAI's legacy shape). Chat:
// `logprobs: true` with `top_logprobs: N` (0 when absent); top_logprobs without logprobs is a 400
// (as OpenAI). N is at most kMaxLogprobs (OpenAI's 20).
int parse_logprobs(const json& body, Endpoint ep) {
  const std::string note = fmt::format(" (alternatives per token; at most {})", kMaxLogprobs);
  if (ep == Endpoint::Completions) {
    if (auto it = body.find("top_logprobs"); it != body.end() && !it->is_null())
      throw bad("top_logprobs", "is a chat field: /v1/completions takes logprobs: N (alternatives per token)");
    auto it = body.find("logprobs");
    if (it != body.end() && it->is_boolean()) {
      if (!it->get<bool>()) return -1;
      throw bad_value("logprobs", "true", fmt::format("an integer in [0, {}] on /v1/completions", kMaxLogprobs));
    }
    return static_cast<int>(get_int(body, "logprobs", 0, kMaxLogprobs, note).value_or(-1));
  }
  const bool on = get_bool(body, "logprobs").value_or(false);
  const auto top = get_int(body, "top_logprobs", 0, kMaxLogprobs, note);
  if (top && !on) throw bad("top_logprobs", "needs logprobs: true");
  return on ? static_cast<int>(top.value_or(0)) : -1;
}

// reasoning_format and thinking_token_budget of a chat request, over the server's defaults.
void read_reasoning_fields(const json& body, const ReasoningOptions& ro, bool opens_thinking, ParsedRequest& p) {
  p.chat = true;
  bool split = ro.split;
  if (const auto f = get_string(body, "reasoning_format")) {
    if (*f != "none" && *f != "deepseek")
      throw bad_value("reasoning_format", quote_value(json(*f)), "\"none\" or \"deepseek\"");
    split = *f == "deepseek";
  }
  ThinkingConfig& th = p.gen.generation.thinking;
  th.track = ro.template_has_thinking;
  th.starts_open = ro.template_has_thinking && opens_thinking;
  p.split_reasoning = split && th.track;
  const auto budget = get_int(body, "thinking_token_budget", -1, limits::kTokens);
  if (budget && *budget >= 0 && !ro.template_has_thinking)
    throw bad("thinking_token_budget", "the chat template's replies have no thinking trace to bound");
  th.budget = budget.value_or(ro.template_has_thinking ? ro.budget : -1);
  if (th.budget >= 0) th.close_tokens = ro.close_tokens;
}

ParsedRequest parse_body(const json& body, Endpoint ep, const Tokenizer& tok, int64_t context_length,
                         const ApiOptions& opt, std::atomic<uint64_t>& request_counter) {
  if (!body.is_object()) throw ApiError{400, "the request body must be a JSON object", ""};
  check_fields(body, ep);
  ParsedRequest p;
  GenerationParams& g = p.gen;
  const int n_vocab = tok.n_vocab();
  get_string(body, "model");  // any model name is accepted (one model per server); type checked
  if (ep == Endpoint::Completions) {
    p.prompts = completion_prompts(body, tok);
  } else {
    bool opens_thinking = false;
    p.prompts.push_back(chat_prompt(body, tok, opt, p.warnings, opens_thinking));
    read_reasoning_fields(body, opt.reasoning, opens_thinking, p);
    // enable_thinking: false pre-closes the trace (the template writes an empty one): a budget
    // has no trace left to bound.
    const json* kw = body.contains("chat_template_kwargs") ? &body["chat_template_kwargs"] : nullptr;
    const bool thinking_off = kw != nullptr && kw->is_object() && kw->contains("enable_thinking") &&
                              (*kw)["enable_thinking"].is_boolean() && !(*kw)["enable_thinking"].get<bool>();
    if (thinking_off && opt.chat_can_disable_thinking && body.contains("thinking_token_budget") &&
        !body["thinking_token_budget"].is_null())
      p.warnings.push_back(
          "thinking_token_budget has no effect: chat_template_kwargs.enable_thinking is false, so the reply has no "
          "thinking trace");
  }
  g.prompt = p.prompts.front();
  const std::string prompt_param = ep == Endpoint::Chat ? "messages" : "prompt";
  // Positions past the model's context were never trained (RoPE); /v1/models reports the same
  // number as max_model_len. Eviction bounds the cache, not the prompt's positions.
  const int64_t context = context_length;
  // As vLLM's max_model_len: prompt + generated tokens <= context (the CLI's -c rule too), so a
  // prompt of the whole context leaves no room.
  size_t longest = 0;  // index of the longest prompt: it bounds max_tokens
  for (size_t i = 0; i < p.prompts.size(); ++i) {
    const std::string which = p.prompts.size() > 1 ? fmt::format("{}[{}]", prompt_param, i) : prompt_param;
    if (p.prompts[i].empty()) throw bad(which, "produced no tokens");
    if (static_cast<int64_t>(p.prompts[i].size()) >= context)
      throw bad(which, fmt::format("the prompt is {} tokens; the model's context of {} tokens (max_model_len) "
                                   "leaves no room to generate; shorten it",
                                   p.prompts[i].size(), context));
    if (p.prompts[i].size() > p.prompts[longest].size()) longest = i;
  }
  const int64_t room = context - static_cast<int64_t>(p.prompts[longest].size());
  const std::string longest_name =
      p.prompts.size() > 1 ? fmt::format("{}[{}]'s", prompt_param, longest) : std::string("the prompt's");

  const int64_t limit = opt.max_tokens_limit;
  const std::string mt_note = " (the upper limit is the server's --max-tokens)";
  auto mt = get_int(body, "max_completion_tokens", 1, limit, mt_note);
  if (!mt) mt = get_int(body, "max_tokens", 1, limit, mt_note);
  const std::string mt_name = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()
      ? "max_completion_tokens"
      : "max_tokens";
  // Defaults: OpenAI's legacy completions default of 16 tokens; chat has none, so the limit.
  GenerationConfig& gc = g.generation;
  gc.max_new_tokens = mt ? *mt : (ep == Endpoint::Completions ? std::min<int64_t>(16, limit) : limit);
  // Prompt + generated tokens stay inside the context (as vLLM's max_model_len: a request that
  // would decode past it is refused, not run into untrained RoPE positions): an explicit
  // max_tokens past it is refused with the numbers; the default shrinks to what is left.
  if (mt && *mt > room)
    throw bad(mt_name, fmt::format("{} + {} {} tokens exceed the model's context of {} tokens "
                                   "(max_model_len); at most {}",
                                   *mt, longest_name, p.prompts[longest].size(), context, room));
  if (!mt) gc.max_new_tokens = std::min(gc.max_new_tokens, room);
  if (gc.max_new_tokens < 1 || gc.max_new_tokens > limit)
    throw bad_value(mt_name, std::to_string(gc.max_new_tokens),
                    fmt::format("in [1, {}] (the upper limit is the server's --max-tokens)", limit));

  g.n = static_cast<int>(get_int(body, "n", 1, opt.max_n).value_or(1));
  const double temp = get_number(body, "temperature").value_or(opt.sampling.temperature);
  if (!(temp >= 0) || !std::isfinite(temp))
    throw bad_value("temperature", fmt::format("{}", temp), "a finite number >= 0");
  const double top_p = get_number(body, "top_p").value_or(opt.sampling.top_p);
  if (!(top_p > 0 && top_p <= 1)) throw bad_value("top_p", fmt::format("{}", top_p), "in (0, 1]");
  int64_t top_k = get_int(body, "top_k", -1, n_vocab).value_or(std::min<int64_t>(opt.sampling.top_k, n_vocab));
  if (top_k < 0) top_k = 0;  // vLLM's -1 = off
  // seed: an unsigned 64-bit integer; without one the server derives a per-request seed.
  uint64_t seed = 0;
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (it->is_number_unsigned())
      seed = it->get<uint64_t>();
    else if (it->is_number_integer()) {
      if (it->get<int64_t>() < 0) throw bad_value("seed", std::to_string(it->get<int64_t>()), ">= 0");
      seed = static_cast<uint64_t>(it->get<int64_t>());
    } else
      throw bad_value("seed", quote_value(*it), "an integer >= 0");
  } else {
    seed = stream_id({opt.policy_settings.seed, request_counter.fetch_add(1)});
  }
  gc.sampler = SamplerConfig{static_cast<float>(temp), static_cast<float>(top_p), static_cast<int>(top_k), seed};

  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string())
      gc.stop.push_back(it->get<std::string>());
    else if (it->is_array() && it->size() <= 16) {
      for (const json& s : *it) {
        if (!s.is_string()) throw bad("stop", "must be a string or an array of strings");
        gc.stop.push_back(s.get<std::string>());
      }
    } else
      throw bad("stop", "must be a string or an array of at most 16 strings");
  }
  p.stream = get_bool(body, "stream").value_or(false);
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad("stream_options", "must be an object");
    if (!p.stream) throw bad("stream_options", "is only allowed with stream: true");
    for (const auto& [key, value] : it->items())
      if (key != "include_usage")
        throw bad("stream_options", fmt::format("unknown key {} (supported: include_usage)", quote_value(json(key))));
    p.include_usage = get_bool(*it, "include_usage").value_or(false);
  }
  gc.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  // vLLM / llama-server sampling fields (engine/sampler.h gives each formula); their ranges are
  // checked by validate_generation below, so a 400 names the field as the request spells it.
  gc.sampler.min_p = static_cast<float>(get_number(body, "min_p").value_or(opt.sampling.min_p));
  gc.sampler.repetition_penalty = static_cast<float>(get_number(body, "repetition_penalty").value_or(1.0));
  gc.sampler.presence_penalty = static_cast<float>(get_number(body, "presence_penalty").value_or(0.0));
  gc.sampler.frequency_penalty = static_cast<float>(get_number(body, "frequency_penalty").value_or(0.0));
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    // OpenAI's shape: {"token id": bias}; the id is a decimal string (JSON keys are strings).
    if (!it->is_object()) throw bad("logit_bias", "must be an object mapping token ids to numbers");
    if (it->size() > static_cast<size_t>(n_vocab))
      throw bad("logit_bias", fmt::format("has {} entries, more than the vocabulary of {}", it->size(), n_vocab));
    for (const auto& [key, v] : it->items()) {
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != key.size() || id < 0 || id >= n_vocab)
        throw bad("logit_bias", fmt::format("key {}: must be a token id in [0, {})", quote_value(json(key)), n_vocab));
      if (!v.is_number()) throw bad("logit_bias", fmt::format("token {}: the bias {} must be a number", id, quote_value(v)));
      gc.sampler.logit_bias[static_cast<int32_t>(id)] = static_cast<float>(v.get<double>());
    }
  }
  gc.min_tokens = get_int(body, "min_tokens", 0, gc.max_new_tokens, fmt::format(" (max_tokens is {})", gc.max_new_tokens))
                      .value_or(0);
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) throw bad("stop_token_ids", "must be an array of token ids");
    if (it->size() > static_cast<size_t>(n_vocab))
      throw bad("stop_token_ids", fmt::format("has {} entries, more than the vocabulary of {}", it->size(), n_vocab));
    for (const json& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
        throw bad("stop_token_ids", fmt::format("token id {}: must be an integer in [0, {})", quote_value(t), n_vocab));
      gc.stop_token_ids.push_back(t.get<int32_t>());
    }
  }
  if (get_bool(body, "echo").value_or(false)) throw bad("echo", "is not supported");
  gc.logprobs = parse_logprobs(body, ep);
  if (auto it = body.find("best_of");
      it != body.end() && !it->is_null() && !(it->is_number_integer() && it->get<int64_t>() == 1))
    throw bad("best_of", "is not supported (only 1)");

  // Per-request eviction settings: the server's settings with the request's kv_* fields, through
  // the builder the CLI uses (engine/policy_settings.h), so both check the same things.
  const auto policy_name = get_string(body, "kv_policy");
  const auto sinks = get_int(body, "kv_sinks", 0, limits::kTokens);
  PolicySettings s = opt.policy_settings;
  s.seed = seed;
  try {
    Policy policy = opt.policy;  // the server's policy, with its --param values (e.g. TriAttention's stats)
    if ((policy_name && *policy_name != opt.policy.name) || sinks) {
      // The request's own policy, with that policy's defaults: the server's --param, --sinks and
      // prompt protection describe the server's policy.
      s.policy = policy_name.value_or(opt.policy.name);
      s.sinks = sinks ? std::optional<int>(static_cast<int>(*sinks)) : std::nullopt;
      s.protect_prompt = std::nullopt;
      s.params.clear();
      policy = build_policy(s, s.policy);
    }
    s.budget = get_int(body, "kv_budget", 1, limits::kTokens).value_or(s.budget);
    s.recent = get_int(body, "kv_buffer", 1, limits::kTokens).value_or(s.recent);
    if (const auto iv = get_int(body, "kv_round_interval", 1, limits::kTokens)) s.interval = *iv;
    // Under a policy that keeps every token the schedule fields would change nothing: refused,
    // as no field is ignored (the CLI warns that --budget is unused there).
    if (!policy.evicts)
      for (const char* f : {"kv_budget", "kv_buffer", "kv_round_interval", "kv_sinks"})
        if (auto it = body.find(f); it != body.end() && !it->is_null())
          throw bad(f, fmt::format("is unused: policy '{}' keeps every token (set kv_policy to an evicting policy)",
                                   policy.name));
    // A selector built for this request is an object no other request shares, so no other
    // request's prompt-cache key could ever match it (serve/prompt_cache.h): keep it out.
    g.prompt_cache = policy.selector == nullptr || policy.selector == opt.policy.selector;
    g.kv = build_schedule(s, policy);
  } catch (const FieldError& e) {
    throw api_error(e);
  }
  try {
    validate_generation(gc, n_vocab);  // what the fields above did not already check
  } catch (const FieldError& e) {
    throw api_error(e);
  }
  p.budget = g.kv.eviction().budget;
  p.recent = g.kv.eviction().recent;
  return p;
}

}  // namespace

void use_chat_template(ApiOptions& opt, const ChatTemplate& chat, const Tokenizer& tok) {
  opt.chat = [chat](const std::vector<std::pair<std::string, std::string>>& msgs, bool thinking) {
    std::vector<ChatMessage> m;
    for (const auto& [role, content] : msgs) m.push_back({role, content});
    // Thinking off pre-closes the trace where the template can (can_disable_thinking).
    const bool open = chat.opens_thinking() && (thinking || !chat.can_disable_thinking());
    return ChatPrompt{chat.render(m, ChatOptions{true, thinking}), !chat.renders_bos(), open};
  };
  opt.chat_template_name = chat.name();
  opt.chat_renders_system = chat.renders_system();
  opt.chat_can_disable_thinking = chat.can_disable_thinking();
  opt.reasoning.template_has_thinking = chat.has_thinking();
  opt.reasoning.close_tokens.clear();
  if (chat.has_thinking()) opt.reasoning.close_tokens = tok.encode(chat.thinking_end_text(), false, /*parse_special=*/true);
}

std::string_view api_field_name(Field field) {
  switch (field) {
    case Field::Policy:
      return "kv_policy";
    case Field::Budget:
      return "kv_budget";
    case Field::Recent:
      return "kv_buffer";
    case Field::RoundInterval:
      return "kv_round_interval";
    case Field::Sinks:
      return "kv_sinks";
    case Field::Seed:
      return "seed";
    case Field::MaxNewTokens:
      return "max_tokens";
    case Field::MaxTotalTokens:
      return "max_model_len";
    case Field::MinTokens:
      return "min_tokens";
    case Field::Stop:
      return "stop";
    case Field::StopTokenIds:
      return "stop_token_ids";
    case Field::Temperature:
      return "temperature";
    case Field::TopP:
      return "top_p";
    case Field::TopK:
      return "top_k";
    case Field::MinP:
      return "min_p";
    case Field::RepetitionPenalty:
      return "repetition_penalty";
    case Field::PresencePenalty:
      return "presence_penalty";
    case Field::FrequencyPenalty:
      return "frequency_penalty";
    case Field::LogitBias:
      return "logit_bias";
    case Field::Logprobs:
      return "logprobs";
    case Field::ReasoningBudget:
      return "thinking_token_budget";
    // Settings only the server's command line gives: spelled as its flags.
    case Field::ProtectPrompt:
    case Field::LongPrompt:
    case Field::PositionMode:
    case Field::Param:
    case Field::KvType:
      return flag_name(field);
  }
  return field_name(field);
}

ApiError api_error(const FieldError& e) {
  const std::string_view name = api_field_name(e.field());
  if (name.starts_with("--")) {
    // A server setting the request's kv_policy ran into (e.g. TriAttention without --param stats).
    return ApiError{400, fmt::format("kv_policy: {}", e.message(name)), "kv_policy"};
  }
  return ApiError{400, e.names_field() ? e.message(name) : fmt::format("{}: {}", name, e.message(name)),
                  std::string(name)};
}

const char* endpoint_path(Endpoint ep) { return ep == Endpoint::Chat ? "/v1/chat/completions" : "/v1/completions"; }

ParsedRequest parse_generation_request(const std::string& body, Endpoint ep, const Tokenizer& tok,
                                       int64_t context_length, const ApiOptions& opt,
                                       std::atomic<uint64_t>& request_counter) {
  if (body.find_first_not_of(" \t\r\n") == std::string::npos)
    throw ApiError{400,
                   fmt::format("the request body is empty: POST {} takes a JSON object ({})", endpoint_path(ep),
                               ep == Endpoint::Chat ? R"({"messages": [...], ...})" : R"({"prompt": "...", ...})"),
                   ""};
  const json j = parse_json_body(body);
  try {
    return parse_body(j, ep, tok, context_length, opt, request_counter);
  } catch (const json::exception& e) {  // a field of an unexpected JSON type the checks did not name
    throw ApiError{400, fmt::format("invalid request field: {}", e.what()), ""};
  }
}

}  // namespace kvevict::serve
