#include "serve/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <sys/socket.h>
#include <atomic>
#include <cmath>
#include <csignal>
#include <ctime>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "serve/text_stream.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/utf8.h"

namespace kvevict::serve {
namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const char* error_type(int status) {
  switch (status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 405:
      return "invalid_request_error";
    case 413:
      return "invalid_request_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable";
    default:
      return "server_error";
  }
}

json error_json(const ApiError& e) {
  return json{{"error",
               {{"message", e.message},
                {"type", error_type(e.status)},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.status}}}};
}

void send_error(httplib::Response& res, const ApiError& e, int retry_after_s = 0) {
  res.status = e.status;
  if ((e.status == 429 || e.status == 503) && retry_after_s > 0)
    res.set_header("Retry-After", std::to_string(retry_after_s));
  res.set_content(dump(error_json(e)), "application/json");
}

// Typed field readers: a field of the wrong type or out of range is a 400 naming it.
ApiError bad(const std::string& param, const std::string& msg) {
  return ApiError{400, fmt::format("{}: {}", param, msg), param};
}

// A value out of its range or of the wrong type, worded as the CLI's option errors:
// "kv_budget 100000000: must be in [1, 1048576]".
ApiError bad_value(const std::string& param, const std::string& value, const std::string& rule) {
  return ApiError{400, fmt::format("{} {}: must be {}", param, value, rule), param};
}

// Largest kv_budget / kv_buffer / kv_sinks a request may ask for: the CLI's bound on token
// counts (limits::kTokens, 2^20), so a request cannot ask for what `generate` would refuse.
constexpr int64_t kMaxKvTokens = int64_t{1} << 20;

std::optional<int64_t> get_int(const json& body, const std::string& key, int64_t lo, int64_t hi) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() && !(it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()))
    throw bad_value(key, dump(*it), "an integer");
  // Unsigned values above INT64_MAX read as out of range.
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw bad_value(key, dump(*it), fmt::format("in [{}, {}]", lo, hi));
  const int64_t v = it->is_number_float() ? static_cast<int64_t>(it->get<double>()) : it->get<int64_t>();
  if (v < lo || v > hi) throw bad_value(key, std::to_string(v), fmt::format("in [{}, {}]", lo, hi));
  return v;
}

std::optional<double> get_number(const json& body, const std::string& key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) throw bad_value(key, dump(*it), "a number");
  return it->get<double>();
}

std::optional<bool> get_bool(const json& body, const std::string& key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) throw bad_value(key, dump(*it), "true or false");
  return it->get<bool>();
}

std::optional<std::string> get_string(const json& body, const std::string& key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw bad_value(key, dump(*it), "a string");
  return it->get<std::string>();
}

enum class Endpoint { Completions, Chat };

// One parsed generation request.
struct Parsed {
  GenerationParams gen;
  bool stream = false;
  bool include_usage = false;
  int64_t budget = 0, recent = 0;
};

}  // namespace

struct ApiServer::Impl {
  Scheduler& sched;
  ApiOptions opt;
  httplib::Server http;
  std::atomic<bool> shutting_down{false};
  std::atomic<uint64_t> request_counter{0};
  std::atomic<int> listen_fd{-1};

  Impl(Scheduler& s, ApiOptions o) : sched(s), opt(std::move(o)) {}

  Parsed parse(const json& body, Endpoint ep) {
    if (!body.is_object()) throw ApiError{400, "the request body must be a JSON object", ""};
    Parsed p;
    GenerationParams& g = p.gen;
    const Tokenizer& tok = sched.model().tokenizer();
    const int n_vocab = tok.n_vocab();
    get_string(body, "model");  // any model name is accepted (one model per server); type checked
    if (ep == Endpoint::Completions) {
      auto it = body.find("prompt");
      if (it == body.end() || it->is_null()) throw bad("prompt", "is required");
      const json* pr = &*it;
      if (pr->is_array() && pr->size() == 1 && (*pr)[0].is_string()) pr = &(*pr)[0];
      if (pr->is_string()) {
        const std::string text = pr->get<std::string>();
        if (text.empty()) throw bad("prompt", "must not be empty");
        g.prompt = tok.encode(text, true);
      } else if (pr->is_array() && !pr->empty() && (*pr)[0].is_number_integer()) {
        for (const json& t : *pr) {
          if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
            throw bad("prompt", fmt::format("token id {}: must be an integer in [0, {})", dump(t), n_vocab));
          g.prompt.push_back(t.get<int32_t>());
        }
      } else if (pr->is_array() && pr->size() > 1) {
        throw bad("prompt", "only one prompt per request is supported (send one request per prompt)");
      } else {
        throw bad("prompt", "must be a non-empty string or an array of token ids");
      }
    } else {
      auto it = body.find("messages");
      if (it == body.end() || !it->is_array() || it->empty())
        throw bad("messages", "must be a non-empty array of {role, content} objects");
      std::vector<std::pair<std::string, std::string>> msgs;
      for (const json& m : *it) {
        if (!m.is_object()) throw bad("messages", "each message must be an object with role and content");
        const auto role = get_string(m, "role");
        if (!role ||
            (*role != "system" && *role != "user" && *role != "assistant" && *role != "developer" && *role != "tool"))
          throw bad("messages", "each message needs a role: system, user, assistant, developer or tool");
        std::string content;
        auto c = m.find("content");
        if (c != m.end() && c->is_string()) {
          content = c->get<std::string>();
        } else if (c != m.end() && c->is_array()) {
          // Content parts: only text parts are supported.
          for (const json& part : *c) {
            if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
                !part["text"].is_string())
              throw bad("messages", "only text content parts are supported");
            content += part["text"].get<std::string>();
          }
        } else if (!(c != m.end() && c->is_null() && *role == "assistant")) {
          throw bad("messages", "each message needs content (a string)");
        }
        msgs.emplace_back(*role, content);
      }
      if (!opt.chat) throw ApiError{400, opt.chat_unavailable, "messages"};
      bool thinking = true;
      if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
        if (!k->is_object()) throw bad("chat_template_kwargs", "must be an object");
        thinking = get_bool(*k, "enable_thinking").value_or(true);
      }
      ChatPrompt cp;
      try {
        cp = opt.chat(msgs, thinking);
      } catch (const Error& e) {
        throw bad("messages", e.what());
      }
      // The template spells its special tokens (<|im_start|>, ...) as text: parse them.
      g.prompt = tok.encode(cp.text, cp.add_special, /*parse_special=*/true);
    }
    const std::string prompt_param = ep == Endpoint::Chat ? "messages" : "prompt";
    if (g.prompt.empty()) throw bad(prompt_param, "produced no tokens");
    // Positions past the model's context were never trained (RoPE); /v1/models reports the same
    // number as max_model_len. Eviction bounds the cache, not the prompt's positions.
    const int64_t context = sched.model().config().context_length;
    if (static_cast<int64_t>(g.prompt.size()) > context)
      throw bad(prompt_param, fmt::format("the prompt is {} tokens, more than the model's context of {} tokens "
                                          "(max_model_len); shorten it",
                                          g.prompt.size(), context));

    const int64_t limit = opt.max_tokens_limit;
    auto mt = get_int(body, "max_completion_tokens", std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max());
    if (!mt) mt = get_int(body, "max_tokens", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    const std::string mt_name = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()
        ? "max_completion_tokens"
        : "max_tokens";
    // Defaults: OpenAI's legacy completions default of 16 tokens; chat has none, so the limit.
    g.max_tokens = mt ? *mt : (ep == Endpoint::Completions ? std::min<int64_t>(16, limit) : limit);
    if (g.max_tokens < 1 || g.max_tokens > limit)
      throw bad_value(mt_name, std::to_string(g.max_tokens),
                      fmt::format("in [1, {}] (the upper limit is the server's --max-tokens)", limit));

    g.n = static_cast<int>(get_int(body, "n", 1, opt.max_n).value_or(1));
    const double temp = get_number(body, "temperature").value_or(1.0);
    if (!(temp >= 0) || !std::isfinite(temp))
      throw bad_value("temperature", fmt::format("{}", temp), "a finite number >= 0");
    const double top_p = get_number(body, "top_p").value_or(1.0);
    if (!(top_p > 0 && top_p <= 1)) throw bad_value("top_p", fmt::format("{}", top_p), "in (0, 1]");
    int64_t top_k = get_int(body, "top_k", -1, n_vocab).value_or(0);
    if (top_k < 0) top_k = 0;  // vLLM's -1 = off
    // seed: an unsigned 64-bit integer; without one the server derives a per-request seed.
    uint64_t seed = 0;
    if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
      if (it->is_number_unsigned())
        seed = it->get<uint64_t>();
      else if (it->is_number_integer()) {
        if (it->get<int64_t>() < 0)
          throw bad_value("seed", std::to_string(it->get<int64_t>()), ">= 0");
        seed = static_cast<uint64_t>(it->get<int64_t>());
      } else
        throw bad_value("seed", dump(*it), "an integer >= 0");
    } else {
      seed = stream_id({opt.seed, request_counter.fetch_add(1)});
    }
    g.sampler = SamplerConfig{static_cast<float>(temp), static_cast<float>(top_p), static_cast<int>(top_k), seed};

    if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
      if (it->is_string())
        g.stop.push_back(it->get<std::string>());
      else if (it->is_array() && it->size() <= 16) {
        for (const json& s : *it) {
          if (!s.is_string()) throw bad("stop", "must be a string or an array of strings");
          g.stop.push_back(s.get<std::string>());
        }
      } else
        throw bad("stop", "must be a string or an array of at most 16 strings");
    }
    p.stream = get_bool(body, "stream").value_or(false);
    if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
      if (!it->is_object()) throw bad("stream_options", "must be an object");
      if (!p.stream) throw bad("stream_options", "is only allowed with stream: true");
      p.include_usage = get_bool(*it, "include_usage").value_or(false);
    }
    g.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
    if (get_bool(body, "echo").value_or(false)) throw bad("echo", "is not supported");
    if (auto it = body.find("logprobs"); it != body.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>()))
      throw bad("logprobs", "is not supported");
    if (auto it = body.find("best_of");
        it != body.end() && !it->is_null() && !(it->is_number_integer() && it->get<int64_t>() == 1))
      throw bad("best_of", "is not supported (only 1)");

    // Per-request eviction settings, validated as the CLI validates --policy/--budget/--buffer/--sinks.
    const auto policy_name = get_string(body, "kv_policy");
    const auto sinks = get_int(body, "kv_sinks", 0, kMaxKvTokens);
    if ((!policy_name || *policy_name == opt.policy.name) && !sinks) {
      g.policy = opt.policy;  // the server's policy, with its --param values (e.g. TriAttention's stats)
    } else {
      const std::string name = policy_name.value_or(opt.policy.name);
      try {
        g.policy = make_policy(name);
      } catch (const Error& e) {
        throw bad("kv_policy", e.what());
      }
      try {
        if (sinks) g.policy = make_policy(name, std::nullopt, static_cast<int>(*sinks));
      } catch (const Error& e) {
        throw bad("kv_sinks", e.what());
      }
    }
    g.eviction.budget = get_int(body, "kv_budget", 1, kMaxKvTokens).value_or(opt.budget);
    g.eviction.recent = get_int(body, "kv_buffer", 1, kMaxKvTokens).value_or(opt.recent);
    g.eviction.long_prompt = opt.long_prompt;
    g.eviction.seed = seed;
    if (g.policy.evicts && g.eviction.budget == 0)
      throw bad("kv_budget", fmt::format("policy '{}' needs kv_budget (the server has no --budget)", g.policy.name));
    if (g.policy.evicts) {
      try {
        validate_eviction(g.eviction, g.policy);
      } catch (const Error& e) {
        // The schedule's message names CLI options; name the body fields instead.
        std::string msg = e.what();
        for (const auto& [cli, field] : {std::pair<std::string, std::string>{"--budget", "kv_budget"},
                                         {"--buffer", "kv_buffer"},
                                         {"--sinks", "kv_sinks"}})
          for (size_t at; (at = msg.find(cli)) != std::string::npos;) msg.replace(at, cli.size(), field);
        const std::string param = msg.rfind("kv_sinks", 0) == 0 ? "kv_sinks"
            : msg.rfind("kv_buffer", 0) == 0                    ? "kv_buffer"
                                                                : "kv_budget";
        throw ApiError{400, msg, param};
      }
    }
    p.budget = g.eviction.budget;
    p.recent = g.eviction.recent;
    return p;
  }

  json usage_json(const Parsed& p, const std::vector<ChoiceOutcome>& out) const {
    int64_t completion = 0, rounds = 0, peak = 0, bytes = 0;
    for (const auto& o : out) {
      completion += o.completion_tokens;
      rounds += o.eviction_rounds;
      peak = std::max(peak, o.peak_slots);
      bytes += o.kv_bytes;
    }
    const auto prompt = static_cast<int64_t>(p.gen.prompt.size());
    json kv = {{"policy", p.gen.policy.name},
               {"budget", p.gen.policy.evicts ? json(p.budget) : json(nullptr)},
               {"buffer", p.gen.policy.evicts ? json(p.recent) : json(nullptr)},
               {"eviction_rounds", rounds},
               {"peak_slots_per_kv_head", peak},
               {"kv_bytes_reserved", bytes}};
    return json{{"prompt_tokens", prompt},
                {"completion_tokens", completion},
                {"total_tokens", prompt + completion},
                {"kv", kv}};
  }

  void handle_generate(const httplib::Request& hreq, httplib::Response& res, Endpoint ep) {
    if (shutting_down) return send_error(res, {503, "the server is shutting down", ""}, opt.retry_after_s);
    if (hreq.body.find_first_not_of(" \t\r\n") == std::string::npos)
      return send_error(res, {400,
                              fmt::format("the request body is empty: POST {} takes a JSON object ({})", hreq.path,
                                          ep == Endpoint::Chat ? R"({"messages": [...], ...})" : R"({"prompt": "...", ...})"),
                              ""});
    if (!utf8_valid(hreq.body)) return send_error(res, {400, "the request body is not valid UTF-8", ""});
    json body;
    try {
      body = json::parse(hreq.body);
    } catch (const json::exception& e) {  // syntax errors, and numbers that overflow a double (1e999)
      return send_error(res, {400, fmt::format("the request body is not valid JSON: {}", e.what()), ""});
    }
    Parsed p;
    try {
      p = parse(body, ep);
    } catch (const ApiError& e) {
      return send_error(res, e);
    } catch (const json::exception& e) {  // a field of an unexpected JSON type the checks did not name
      return send_error(res, {400, fmt::format("invalid request field: {}", e.what()), ""});
    }
    auto req = std::make_shared<Request>(p.gen);
    switch (sched.submit(req)) {
      case Admission::Queued:
        break;
      case Admission::TooLarge:
        if (p.gen.n > sched.options().max_seqs)
          return send_error(res,
                            {400,
                             fmt::format("n: {} choices exceed the {} sequences the server runs at once (--max-seqs)",
                                         p.gen.n, sched.options().max_seqs),
                             "n"});
        return send_error(
            res,
            {400,
             fmt::format("the request needs {} bytes of KV memory ({} sequence(s) of {} bytes) but the "
                         "KV pool holds {} bytes (--kv-memory); {}",
                         sched.sequence_bytes(p.gen) * p.gen.n, p.gen.n, sched.sequence_bytes(p.gen),
                         sched.pool().capacity(),
                         p.gen.policy.evicts ? "lower kv_budget, kv_buffer, n or the prompt"
                                             : "lower max_tokens, n or the prompt, or use a bounded kv_policy"),
             p.gen.policy.evicts ? "kv_budget" : "max_tokens"});
      case Admission::QueueFull:
        sched.metrics().requests_rejected += 1;
        return send_error(
            res,
            {429,
             fmt::format("the queue is full ({} requests wait; --max-queue); retry later", sched.options().max_queue),
             ""},
            opt.retry_after_s);
      case Admission::ShuttingDown:
        sched.metrics().requests_rejected += 1;
        return send_error(res, {503, "the server is shutting down", ""}, opt.retry_after_s);
    }
    const std::string id =
        fmt::format("{}-{:016x}", ep == Endpoint::Chat ? "chatcmpl" : "cmpl",
                    stream_id({reinterpret_cast<uintptr_t>(req.get()), static_cast<uint64_t>(std::time(nullptr))}));
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    if (p.stream) return stream_response(res, req, p, ep, id, created);

    // Non-streaming: wait for the request to end.
    while (true) {
      auto e = req->next_event(std::chrono::milliseconds(1000));
      if (!e) continue;
      if (e->kind == RequestEvent::Kind::Failed) return send_error(res, {e->status, e->text, ""}, opt.retry_after_s);
      if (e->kind == RequestEvent::Kind::Done) break;
    }
    const auto out = req->outcomes();
    json choices = json::array();
    for (size_t c = 0; c < out.size(); ++c) {
      if (ep == Endpoint::Chat)
        choices.push_back({{"index", c},
                           {"message", {{"role", "assistant"}, {"content", out[c].text}}},
                           {"logprobs", nullptr},
                           {"finish_reason", finish_reason_name(out[c].finish)}});
      else
        choices.push_back({{"index", c},
                           {"text", out[c].text},
                           {"logprobs", nullptr},
                           {"finish_reason", finish_reason_name(out[c].finish)}});
    }
    json r = {{"id", id},           {"object", ep == Endpoint::Chat ? "chat.completion" : "text_completion"},
              {"created", created}, {"model", opt.model_name},
              {"choices", choices}, {"usage", usage_json(p, out)}};
    res.set_content(dump(r), "application/json");
  }

  json chunk(const std::string& id, int64_t created, Endpoint ep, json choices) const {
    return json{{"id", id},
                {"object", ep == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", opt.model_name},
                {"choices", std::move(choices)}};
  }

  void stream_response(httplib::Response& res, const std::shared_ptr<Request>& req, const Parsed& p, Endpoint ep,
                       const std::string& id, int64_t created) {
    struct State {
      bool started = false;
      bool finished = false;
    };
    auto st = std::make_shared<State>();
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, req, p, ep, id, created, st](size_t, httplib::DataSink& sink) -> bool {
          auto send = [&](const json& j) {
            const std::string s = "data: " + dump(j) + "\n\n";
            return sink.write(s.data(), s.size());
          };
          if (!st->started) {
            st->started = true;
            if (ep == Endpoint::Chat) {
              json ch = json::array();
              for (int c = 0; c < p.gen.n; ++c)
                ch.push_back({{"index", c},
                              {"delta", {{"role", "assistant"}, {"content", ""}}},
                              {"logprobs", nullptr},
                              {"finish_reason", nullptr}});
              if (!send(chunk(id, created, ep, ch))) return false;
            }
          }
          auto e = req->next_event(std::chrono::milliseconds(200));
          if (!e) return true;  // nothing yet; httplib calls again
          json ch;
          switch (e->kind) {
            case RequestEvent::Kind::Text:
              if (ep == Endpoint::Chat)
                ch = {{"index", e->choice},
                      {"delta", {{"content", e->text}}},
                      {"logprobs", nullptr},
                      {"finish_reason", nullptr}};
              else
                ch = {{"index", e->choice}, {"text", e->text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
              return send(chunk(id, created, ep, json::array({ch})));
            case RequestEvent::Kind::ChoiceDone:
              if (e->finish == FinishReason::Cancelled || e->finish == FinishReason::Error) return true;
              if (ep == Endpoint::Chat)
                ch = {{"index", e->choice},
                      {"delta", json::object()},
                      {"logprobs", nullptr},
                      {"finish_reason", finish_reason_name(e->finish)}};
              else
                ch = {{"index", e->choice},
                      {"text", ""},
                      {"logprobs", nullptr},
                      {"finish_reason", finish_reason_name(e->finish)}};
              return send(chunk(id, created, ep, json::array({ch})));
            case RequestEvent::Kind::Done: {
              if (p.include_usage) {
                json u = chunk(id, created, ep, json::array());
                u["usage"] = usage_json(p, req->outcomes());
                if (!send(u)) return false;
              }
              static const std::string done = "data: [DONE]\n\n";
              if (!sink.write(done.data(), done.size())) return false;
              st->finished = true;
              sink.done();
              return true;
            }
            case RequestEvent::Kind::Failed: {
              // The stream already started (status 200): the error travels as an event.
              if (!send(error_json({e->status, e->text, ""}))) return false;
              static const std::string done = "data: [DONE]\n\n";
              sink.write(done.data(), done.size());
              st->finished = true;
              sink.done();
              return true;
            }
          }
          return true;
        },
        [req, st](bool success) {
          // The client went away (or the server stopped) before the end: free its KV memory.
          if (!success || !st->finished) req->cancel();
        });
  }

  void setup_routes() {
    http.set_payload_max_length(static_cast<size_t>(opt.max_body_bytes));
    // Remember the listening socket: bind() widens its accept backlog after httplib listened.
    http.set_socket_options([this](socket_t sock) {
      httplib::default_socket_options(sock);
      listen_fd = sock;
    });
    // One worker per connection: streaming responses hold theirs for the whole generation, so
    // the pool must cover every sequence that can run plus the queue.
    const size_t workers = static_cast<size_t>(sched.options().max_seqs + sched.options().max_queue + 16);
    http.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (opt.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + opt.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, {401, "missing or wrong API key (send Authorization: Bearer KEY)", ""});
      return httplib::Server::HandlerResponse::Handled;
    });
    // Errors httplib raises itself (no route, body too large) get OpenAI error objects too.
    http.set_error_handler(
        httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
          if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
          std::string msg;
          // A known route asked with another method: 405 with Allow (RFC 9110 §15.5.6), not 404.
          static const std::map<std::string, std::string> allowed = {{"/v1/completions", "POST"},
                                                                     {"/v1/chat/completions", "POST"},
                                                                     {"/v1/models", "GET"},
                                                                     {"/health", "GET"},
                                                                     {"/metrics", "GET"}};
          if (const auto it = allowed.find(req.path); res.status == 404 && it != allowed.end()) {
            res.status = 405;
            res.set_header("Allow", it->second);
            msg = fmt::format("{} {}: method not allowed (use {})", req.method, req.path, it->second);
          } else if (res.status == 404)
            msg = fmt::format("no route {} {}", req.method, req.path);
          else if (res.status == 400 && (req.method == "POST" || req.method == "PUT") &&
                   !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding"))
            // httplib refuses a POST without Content-Length before any route sees it.
            msg = fmt::format("the request has no body: {} {} takes a JSON object with a Content-Length header",
                              req.method, req.path);
          else if (res.status == 413)
            msg = fmt::format("the request body exceeds {} bytes", opt.max_body_bytes);
          else
            msg = fmt::format("HTTP {}", res.status);
          res.set_content(dump(error_json({res.status, msg, ""})), "application/json");
          return httplib::Server::HandlerResponse::Handled;
        }));
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string msg = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        msg = e.what();
      } catch (...) {
      }
      send_error(res, {500, msg, ""});
    });
    http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) {
      handle_generate(q, r, Endpoint::Completions);
    });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, Endpoint::Chat); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json m = {{"id", opt.model_name},
                {"object", "model"},
                {"created", static_cast<int64_t>(std::time(nullptr))},
                {"owned_by", "kvevict"},
                {"max_model_len", sched.model().config().context_length}};
      res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (shutting_down) return send_error(res, {503, "the server is shutting down", ""}, opt.retry_after_s);
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(render_metrics(sched.metrics(), sched.gauges()), "text/plain; version=0.0.4");
    });
  }
};

ApiServer::ApiServer(Scheduler& scheduler, ApiOptions opt) {
  if (opt.max_tokens_limit < 1) throw Error(fmt::format("--max-tokens {}: must be >= 1", opt.max_tokens_limit));
  if (opt.max_body_bytes < 1) throw Error(fmt::format("max body bytes {}: must be >= 1", opt.max_body_bytes));
  if (opt.max_n < 1) throw Error(fmt::format("max n {}: must be >= 1", opt.max_n));
  // A client that disconnects mid-stream must not kill the server with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  impl_ = std::make_unique<Impl>(scheduler, std::move(opt));
  impl_->setup_routes();
}

ApiServer::~ApiServer() = default;

int ApiServer::bind(const std::string& host, int port) {
  int bound = -1;
  if (port == 0)
    bound = impl_->http.bind_to_any_port(host);
  else if (impl_->http.bind_to_port(host, port))
    bound = port;
  if (bound <= 0) throw Error(fmt::format("cannot listen on {}:{} (address in use or not local)", host, port));
  // httplib listens with a backlog of 5 connections; many clients connecting at once would
  // overflow it and wait for SYN retransmits (about 1 s each), so raise it to the system's limit.
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, SOMAXCONN);
  return bound;
}

void ApiServer::run() { impl_->http.listen_after_bind(); }

void ApiServer::begin_shutdown() { impl_->shutting_down = true; }

void ApiServer::stop() { impl_->http.stop(); }

}  // namespace kvevict::serve
