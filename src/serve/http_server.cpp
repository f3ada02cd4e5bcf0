#include "serve/http_server.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <span>
#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>

#include "kvcache/kv_cache.h"
#include "engine/reasoning.h"
#include "serve/json_body.h"
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
    case 414:
    case 431:
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

// Longest error message sent, bytes: a backstop for messages that quote request text (the
// field readers quote values through quote_value already).
constexpr size_t kMaxErrorMessageBytes = 1024;

HttpResponse error_response(const ApiError& e, int retry_after_s = 0) {
  ApiError shown = e;
  if (shown.message.size() > kMaxErrorMessageBytes) {
    size_t cut = kMaxErrorMessageBytes;
    while (cut > 0 && (static_cast<unsigned char>(shown.message[cut]) & 0xC0) == 0x80) --cut;
    shown.message = shown.message.substr(0, cut) + "...";
  }
  HttpResponse r{e.status, dump(error_json(shown)), "application/json", {}};
  if ((e.status == 429 || e.status == 503) && retry_after_s > 0)
    r.headers.emplace_back("Retry-After", std::to_string(retry_after_s));
  return r;
}

HttpResponse json_response(const json& j) { return HttpResponse{200, dump(j), "application/json", {}}; }

// A field outside `allowed` is a 400 naming it (as the generation endpoints refuse unknown fields).
void check_only(const json& body, std::initializer_list<std::string_view> allowed, const char* route) {
  for (const auto& [key, value] : body.items())
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      throw ApiError{400, fmt::format("{}: unknown field for {}", quote_text(key), route), quote_text(key)};
}

bool bool_field(const json& body, const char* key, bool fallback) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw ApiError{400, fmt::format("{} {}: must be true or false", key, quote_value(*it)), key};
  return it->get<bool>();
}

// A token's text as the list of its UTF-8 bytes (OpenAI's `bytes`: a piece may be part of a
// character, which no JSON string can carry).
json token_bytes(const std::string& piece) {
  json b = json::array();
  for (const char ch : piece) b.push_back(static_cast<unsigned char>(ch));
  return b;
}

// Characters (Unicode code points) of UTF-8 text: OpenAI's and vLLM's text_offset count characters
// of the text, so a client's text[offset:] starts at the token. A token that ends inside a
// character counts the character once, where its first byte is.
size_t utf8_chars(std::string_view s) {
  size_t n = 0;
  for (const char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

// Completions' `logprobs` object (OpenAI legacy shape) for tokens `lp`: their text, log-probability
// and alternatives (the `top` most likely, and always the sampled token, "up to logprobs+1
// elements"), and each token's offset in the output text in characters, counted on from `offset` (updated).
json completion_logprobs_json(const Tokenizer& tok, std::span<const TokenLogprobs> lp, size_t& offset) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprobs& t : lp) {
    const std::string piece = tok.piece(t.token, /*special=*/true);
    tokens.push_back(piece);
    values.push_back(t.logprob);
    json top = json::object();
    for (const auto& [id, v] : t.top) top[tok.piece(id, true)] = v;
    top[piece] = t.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += utf8_chars(tok.piece(t.token));  // what it adds to the text (nothing for a special token)
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// Chat's `logprobs` object: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob,
// bytes}]}], "refusal": null}, top_logprobs the request's top_logprobs most likely tokens.
json chat_logprobs_json(const Tokenizer& tok, std::span<const TokenLogprobs> lp) {
  json content = json::array();
  for (const TokenLogprobs& t : lp) {
    const std::string piece = tok.piece(t.token, /*special=*/true);
    json top = json::array();
    for (const auto& [id, v] : t.top) {
      const std::string p = tok.piece(id, true);
      top.push_back({{"token", p}, {"logprob", v}, {"bytes", token_bytes(p)}});
    }
    content.push_back({{"token", piece}, {"logprob", t.logprob}, {"bytes", token_bytes(piece)}, {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// The request's warnings (parts of it that change nothing on this model) as a top-level
// `warnings` array of strings; absent when there are none.
void add_warnings(json& response, const ParsedRequest& p) {
  if (!p.warnings.empty()) response["warnings"] = p.warnings;
}

// One HTTP generation request: its parsed fields and one scheduler request per prompt.
struct Job {
  ParsedRequest p;
  Endpoint ep = Endpoint::Completions;
  std::string id;
  int64_t created = 0;
  std::vector<std::shared_ptr<Request>> reqs;  ///< per prompt, in prompt order
  std::vector<bool> done;                      ///< per prompt: its Done event arrived
  void cancel() const {
    for (const auto& r : reqs) r->cancel();
  }
};

// The chat message of a finished reply: the thinking trace in reasoning_content when the
// request splits it (engine/reasoning.h), else all text in content.
json reasoning_message(const ParsedRequest& p, const std::string& text) {
  json m = {{"role", "assistant"}};
  if (!p.split_reasoning) {
    m["content"] = text;
    return m;
  }
  bool had_trace = false;
  ReasoningText rt = split_reasoning(text, p.gen.generation.thinking.starts_open, &had_trace);
  m["content"] = std::move(rt.content);
  if (had_trace) m["reasoning_content"] = std::move(rt.reasoning);
  return m;
}

// One streamed chat delta of reasoning and/or content text; null when both are empty.
json reasoning_delta(const ReasoningText& t) {
  json d = json::object();
  if (!t.reasoning.empty()) d["reasoning_content"] = t.reasoning;
  if (!t.content.empty()) d["content"] = t.content;
  return d.empty() ? json(nullptr) : d;
}

// usage.completion_tokens_details of a chat reply (OpenAI's shape): the trace's tokens.
json reasoning_usage(const std::vector<ChoiceOutcome>& out) {
  int64_t reasoning = 0;
  for (const auto& o : out) reasoning += o.reasoning_tokens;
  return json{{"reasoning_tokens", reasoning}};
}

}  // namespace

struct ApiServer::Impl {
  Scheduler& sched;
  ApiOptions opt;
  std::unique_ptr<HttpServer> http;
  std::atomic<bool> shutting_down{false};
  std::atomic<uint64_t> request_counter{0};
  // Response ids: splitmix64 (a bijection) of this start's clock reading plus a counter, so ids
  // never repeat within a run and differ between runs.
  const uint64_t id_base = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  std::atomic<uint64_t> id_counter{0};

  Impl(Scheduler& s, ApiOptions o) : sched(s), opt(std::move(o)) {}

  // A handler whose ApiError becomes the error answer.
  Reply answer(const HttpRequest& q, HttpResponse (Impl::*f)(const HttpRequest&) const) const {
    try {
      return Reply::answer((this->*f)(q));
    } catch (const ApiError& e) {
      return Reply::answer(error_response(e, opt.retry_after_s));
    }
  }

  // The route table: every endpoint of the API, once.
  std::vector<Route> routes() {
    auto fast = [](std::string method, std::string path, Handler h, bool open = false) {
      return Route{std::move(method), std::move(path), std::move(h), open, /*fast=*/true};
    };
    return {
        Route{"POST", "/v1/completions",
              [this](const HttpRequest& q, const Waker& w) { return generate(q, w, Endpoint::Completions); }},
        Route{"POST", "/v1/chat/completions",
              [this](const HttpRequest& q, const Waker& w) { return generate(q, w, Endpoint::Chat); }},
        fast("GET", "/v1/models", [this](const HttpRequest&, const Waker&) { return Reply::answer(models()); }),
        fast("GET", "/props", [this](const HttpRequest&, const Waker&) { return Reply::answer(props()); }),
        Route{"POST", "/tokenize", [this](const HttpRequest& q, const Waker&) { return answer(q, &Impl::tokenize); }},
        Route{"POST", "/detokenize",
              [this](const HttpRequest& q, const Waker&) { return answer(q, &Impl::detokenize); }},
        fast("GET", "/health", [this](const HttpRequest&, const Waker&) { return Reply::answer(health()); },
             /*open=*/true),
        fast("GET", "/metrics",
             [this](const HttpRequest&, const Waker&) {
               MetricsGauges g = sched.gauges();
               g.http_connections_open = http->open_connections();
               return Reply::answer(HttpResponse{200, render_metrics(sched.metrics(), g), "text/plain; version=0.0.4", {}});
             }),
    };
  }

  HttpResponse models() const {
    json m = {{"id", opt.model_name},
              {"object", "model"},
              {"created", static_cast<int64_t>(std::time(nullptr))},
              {"owned_by", "kvevict"},
              {"max_model_len", sched.model().config().context_length}};
    return json_response(json{{"object", "list"}, {"data", json::array({m})}});
  }

  HttpResponse health() const {
    if (shutting_down) return error_response({503, "the server is shutting down", ""}, opt.retry_after_s);
    return HttpResponse{200, R"({"status":"ok"})", "application/json", {}};
  }

  json usage_json(const Job& job, const std::vector<ChoiceOutcome>& out) const {
    const ParsedRequest& p = job.p;
    int64_t completion = 0, rounds = 0, peak = 0, bytes = 0, shared = 0, cached = 0;
    for (const auto& o : out) {
      cached += o.cached_prompt_tokens;
      completion += o.completion_tokens;
      rounds += o.eviction_rounds;
      peak = std::max(peak, o.peak_slots);
      bytes += o.kv_bytes + o.shared_kv_bytes;
      shared += o.shared_kv_bytes;
    }
    int64_t prompt = 0;  // every prompt's tokens (OpenAI's prompt_tokens for an array of prompts)
    for (const auto& pr : p.prompts) prompt += static_cast<int64_t>(pr.size());
    json kv = {{"policy", p.gen.kv.policy().name},
               {"budget", p.gen.kv.policy().evicts ? json(p.budget) : json(nullptr)},
               {"buffer", p.gen.kv.policy().evicts ? json(p.recent) : json(nullptr)},
               {"round_interval",
                p.gen.kv.policy().evicts ? json(p.gen.kv.eviction().round_interval()) : json(nullptr)},
               {"eviction_rounds", rounds},
               {"peak_slots_per_kv_head", peak},
               {"kv_bytes_reserved", bytes},
               {"kv_shared_prompt_bytes", shared}};
    json u = {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
    // OpenAI's field for prompt tokens served from a prompt cache (--prompt-cache).
    u["prompt_tokens_details"] = {{"cached_tokens", cached}};
    if (p.chat) u["completion_tokens_details"] = reasoning_usage(out);
    u["kv"] = kv;
    return u;
  }

  // The 400 for a request the scheduler can never run (Admission::TooLarge).
  ApiError too_large(const GenerationParams& g, Endpoint ep) const {
    if (g.n > sched.options().max_seqs)
      return {400,
              fmt::format("n: {} choices exceed the {} sequences the server runs at once (--max-seqs)", g.n,
                          sched.options().max_seqs),
              "n"};
    // A prompt above the budget is held whole until the first eviction round (no eviction in
    // prefill, eviction spec §2.2): then the prompt, not the budget, sets the size.
    const bool evicts = g.kv.policy().evicts;
    const bool prompt_sets_size = evicts && static_cast<int64_t>(g.prompt.size()) > g.kv.eviction().budget;
    const std::string advice =
        !evicts ? "lower max_tokens, n or the prompt, or use a bounded kv_policy"
        : prompt_sets_size
            ? fmt::format("the prompt's {} tokens, held whole until the first eviction round, set each sequence's size "
                          "(above kv_budget {}); lower n or the prompt",
                          g.prompt.size(), g.kv.eviction().budget)
        : g.kv.eviction().interval > 0 ? "lower kv_budget, kv_round_interval, n or the prompt"
                                        : "lower kv_budget, kv_buffer, n or the prompt";
    return {400,
            fmt::format("the request needs {} bytes of KV memory ({} sequence(s) of {} bytes) but the "
                        "KV pool holds {} bytes (--kv-memory); {}",
                        sched.sequence_bytes(g) * g.n, g.n, sched.sequence_bytes(g), sched.pool().capacity(), advice),
            !evicts ? "max_tokens" : prompt_sets_size ? (ep == Endpoint::Chat ? "messages" : "prompt") : "kv_budget"};
  }

  // Runs on an HTTP worker: parse, admit one scheduler request per prompt, then answer when the
  // scheduler has (Reply::later) or as it goes (Reply::stream); the requests' events wake the
  // connection.
  Reply generate(const HttpRequest& hreq, const Waker& wake, Endpoint ep) {
    auto fail = [this](const ApiError& e) { return Reply::answer(error_response(e, opt.retry_after_s)); };
    if (shutting_down) return fail({503, "the server is shutting down", ""});
    auto job = std::make_shared<Job>();
    try {
      job->p = parse_generation_request(hreq.body, ep, sched.model().tokenizer(),
                                        sched.model().config().context_length, opt, request_counter);
    } catch (const ApiError& e) {
      return fail(e);
    }
    job->ep = ep;
    job->id = fmt::format("{}-{:016x}", ep == Endpoint::Chat ? "chatcmpl" : "cmpl",
                          splitmix64(id_base + id_counter.fetch_add(1)));
    job->created = static_cast<int64_t>(std::time(nullptr));
    for (const std::string& w : job->p.warnings) fmt::print(stderr, "kvevict serve: {}: warning: {}\n", job->id, w);
    // One scheduler request per prompt, all of the same settings and seed (as separate requests
    // with that seed would be); if one cannot be queued, those already queued are cancelled.
    for (const auto& prompt : job->p.prompts) {
      GenerationParams g = job->p.gen;
      g.prompt = prompt;
      auto req = std::make_shared<Request>(std::move(g));
      req->set_event_listener(wake);
      const Admission a = sched.submit(req);
      if (a != Admission::Queued) job->cancel();
      switch (a) {
        case Admission::Queued:
          job->reqs.push_back(req);
          job->done.push_back(false);
          continue;
        case Admission::TooLarge:
          return fail(too_large(req->params, job->ep));
        case Admission::QueueFull:
          sched.metrics().requests_rejected += 1;
          return fail({429,
                       fmt::format("the queue is full ({} requests wait; --max-queue); retry later",
                                   sched.options().max_queue),
                       ""});
        case Admission::ShuttingDown:
          sched.metrics().requests_rejected += 1;
          return fail({503, "the server is shutting down", ""});
      }
    }
    auto cancel = [job] { job->cancel(); };
    if (job->p.stream) return stream_reply(job);
    return Reply::later(
        [this, job](bool stopping) -> std::optional<HttpResponse> {
          for (size_t i = 0; i < job->reqs.size(); ++i)
            while (!job->done[i]) {
              auto e = job->reqs[i]->next_event(std::chrono::milliseconds(0));
              if (!e) break;
              if (e->kind == RequestEvent::Kind::Failed) {
                job->cancel();
                return error_response({e->status, e->text, ""}, opt.retry_after_s);
              }
              if (e->kind == RequestEvent::Kind::Done) job->done[i] = true;
            }
          if (std::all_of(job->done.begin(), job->done.end(), [](bool d) { return d; }))
            return json_response(completion_json(*job));
          if (!stopping) return std::nullopt;
          job->cancel();
          return error_response({503, "the server is shutting down", ""}, opt.retry_after_s);
        },
        cancel);
  }

  json completion_json(const Job& job) const {
    const bool chat = job.ep == Endpoint::Chat;
    const Tokenizer& tok = sched.model().tokenizer();
    const bool want_logprobs = job.p.gen.generation.logprobs >= 0;
    std::vector<ChoiceOutcome> all;
    json choices = json::array();
    for (const auto& req : job.reqs)
      for (ChoiceOutcome& o : req->outcomes()) {
        json lp = nullptr;
        if (want_logprobs) {
          size_t offset = 0;
          lp = chat ? chat_logprobs_json(tok, o.logprobs) : completion_logprobs_json(tok, o.logprobs, offset);
        }
        json c = {{"index", all.size()}, {"logprobs", lp}, {"finish_reason", finish_reason_name(o.finish)}};
        if (chat)
          c["message"] = reasoning_message(job.p, o.text);
        else
          c["text"] = o.text;
        choices.push_back(std::move(c));
        all.push_back(std::move(o));
      }
    json out = {{"id", job.id},           {"object", chat ? "chat.completion" : "text_completion"},
                {"created", job.created}, {"model", opt.model_name},
                {"choices", choices},     {"usage", usage_json(job, all)}};
    add_warnings(out, job.p);
    return out;
  }

  json chunk(const Job& job, json choices) const {
    return json{{"id", job.id},
                {"object", job.ep == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
                {"created", job.created},
                {"model", opt.model_name},
                {"choices", std::move(choices)}};
  }

  // Server-Sent Events: each pull sends every event that arrived since the last one. Choice
  // indices are prompt index × n + choice.
  Reply stream_reply(const std::shared_ptr<Job>& job) {
    struct StreamState {
      bool started = false;
      std::vector<size_t> text_offset;  // completions' logprobs: output bytes per choice so far
      // Per choice: the thinking trace split off as the text arrives (when the request splits it).
      std::vector<ReasoningSplitter> splitters;
    };
    auto st = std::make_shared<StreamState>();
    const int n = job->p.gen.n;
    const size_t choices = job->reqs.size() * static_cast<size_t>(n);
    st->text_offset.assign(choices, 0);
    if (job->ep == Endpoint::Chat && job->p.split_reasoning)
      st->splitters.assign(choices, ReasoningSplitter(job->p.gen.generation.thinking.starts_open));
    // X-Accel-Buffering: a proxy (nginx) passes the events on as they come instead of buffering them.
    HttpResponse head{200, "", "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}}};
    auto pull = [this, job, st, n](bool stopping) -> StreamPiece {
      StreamPiece out;
      const bool chat = job->ep == Endpoint::Chat;
      const Tokenizer& tok = sched.model().tokenizer();
      auto send = [&](const json& j) { out.data += "data: " + dump(j) + "\n\n"; };
      auto finish = [&] {
        out.data += "data: [DONE]\n\n";
        out.end = true;
        return out;
      };
      if (!st->started) {
        st->started = true;
        if (chat) {
          json ch = json::array();
          for (size_t c = 0; c < job->reqs.size() * static_cast<size_t>(n); ++c)
            ch.push_back({{"index", c},
                          {"delta", {{"role", "assistant"}, {"content", ""}}},
                          {"logprobs", nullptr},
                          {"finish_reason", nullptr}});
          json first = chunk(*job, ch);
          add_warnings(first, job->p);
          send(first);
        } else if (!job->p.warnings.empty()) {
          json first = chunk(*job, json::array());
          add_warnings(first, job->p);
          send(first);
        }
      }
      for (size_t i = 0; i < job->reqs.size(); ++i)
        while (!job->done[i]) {
          auto e = job->reqs[i]->next_event(std::chrono::milliseconds(0));
          if (!e) break;
          const size_t index = i * static_cast<size_t>(n) + static_cast<size_t>(e->choice);
          json ch;
          switch (e->kind) {
            case RequestEvent::Kind::Text: {
              json lp = nullptr;
              if (!e->logprobs.empty())
                lp = chat ? chat_logprobs_json(tok, e->logprobs)
                          : completion_logprobs_json(tok, e->logprobs, st->text_offset[index]);
              if (chat && !st->splitters.empty()) {
                const json d = reasoning_delta(st->splitters[index].push(e->text));
                if (d.is_null() && lp.is_null()) break;
                ch = {{"index", index}, {"delta", d.is_null() ? json::object() : d}, {"logprobs", lp}, {"finish_reason", nullptr}};
              } else if (chat)
                ch = {{"index", index}, {"delta", {{"content", e->text}}}, {"logprobs", lp}, {"finish_reason", nullptr}};
              else
                ch = {{"index", index}, {"text", e->text}, {"logprobs", lp}, {"finish_reason", nullptr}};
              send(chunk(*job, json::array({ch})));
              break;
            }
            case RequestEvent::Kind::ChoiceDone:
              if (e->finish == FinishReason::Cancelled || e->finish == FinishReason::Error) break;
              if (chat && !st->splitters.empty()) {
                // What the splitter held back (part of a tag that never completed).
                const json d = reasoning_delta(st->splitters[index].flush());
                if (!d.is_null())
                  send(chunk(*job, json::array({{{"index", index},
                                                 {"delta", d},
                                                 {"logprobs", nullptr},
                                                 {"finish_reason", nullptr}}})));
              }
              if (chat)
                ch = {{"index", index},
                      {"delta", json::object()},
                      {"logprobs", nullptr},
                      {"finish_reason", finish_reason_name(e->finish)}};
              else
                ch = {{"index", index},
                      {"text", ""},
                      {"logprobs", nullptr},
                      {"finish_reason", finish_reason_name(e->finish)}};
              send(chunk(*job, json::array({ch})));
              break;
            case RequestEvent::Kind::Done:
              job->done[i] = true;
              break;
            case RequestEvent::Kind::Failed:
              // The stream already started (status 200): the error travels as an event.
              job->cancel();
              send(error_json({e->status, e->text, ""}));
              return finish();
          }
        }
      if (std::all_of(job->done.begin(), job->done.end(), [](bool d) { return d; })) {
        if (job->p.include_usage) {
          std::vector<ChoiceOutcome> all;
          for (const auto& req : job->reqs)
            for (ChoiceOutcome& o : req->outcomes()) all.push_back(std::move(o));
          json u = chunk(*job, json::array());
          u["usage"] = usage_json(*job, all);
          send(u);
        }
        return finish();
      }
      if (!stopping) return out;
      job->cancel();
      send(error_json({503, "the server is shutting down", ""}));
      return finish();
    };
    return Reply::stream(std::move(head), std::move(pull), [job] { job->cancel(); });
  }

  // GET /props: what a client needs to know about this server's defaults (llama-server's /props,
  // the fields kvevict has).
  HttpResponse props() const {
    const ModelConfig& mc = sched.model().config();
    const int64_t ctx = mc.context_length;
    const PolicySettings& ps = opt.policy_settings;
    const bool evicts = opt.policy.evicts;
    json params = {{"temperature", opt.sampling.temperature},
                   {"top_p", opt.sampling.top_p},
                   {"top_k", opt.sampling.top_k},
                   {"min_p", opt.sampling.min_p},
                   {"seed", ps.seed},
                   {"max_tokens", {{"completions", std::min<int64_t>(16, opt.max_tokens_limit)},
                                   {"chat", opt.max_tokens_limit}}}};
    json kv = {{"type", kv_type_name(sched.options().kv_type)},
               {"memory_bytes", sched.pool().capacity()},
               {"policy", opt.policy.name},
               {"budget", evicts ? json(ps.budget) : json(nullptr)},
               {"buffer", evicts ? json(ps.recent) : json(nullptr)},
               // The schedule's own rule (s unset = r), from the one settings builder.
               {"round_interval", evicts ? json(build_schedule(ps, opt.policy).eviction().round_interval()) : json(nullptr)}};
    json j = {{"model", opt.model_name},
              {"n_ctx", ctx},
              {"max_tokens", opt.max_tokens_limit},
              {"total_slots", sched.options().max_seqs},
              {"chat_template", opt.chat ? json(opt.chat_template_name) : json(nullptr)},
              {"chat_template_caps",
               opt.chat ? json{{"renders_system", opt.chat_renders_system},
                               {"can_disable_thinking", opt.chat_can_disable_thinking}}
                        : json(nullptr)},
              {"default_generation_settings", {{"n_ctx", ctx}, {"params", params}}},
              {"reasoning",
               {{"format", opt.reasoning.split ? "deepseek" : "none"},
                {"budget", opt.reasoning.budget},
                {"template_has_thinking", opt.reasoning.template_has_thinking}}},
              {"kv", kv}};
    return json_response(j);
  }

  HttpResponse tokenize(const HttpRequest& q) const {
    const Tokenizer& tok = sched.model().tokenizer();
    const json body = parse_json_body(q.body);
    if (!body.is_object()) throw ApiError{400, "the request body must be a JSON object", ""};
    check_only(body, {"content", "add_special", "parse_special", "with_pieces"}, "/tokenize");
    auto c = body.find("content");
    if (c == body.end() || !c->is_string())
      throw ApiError{400,
                     fmt::format("content: must be a string{}", c == body.end() ? "" : ", not " + quote_value(*c)),
                     "content"};
    const bool add_special = bool_field(body, "add_special", false);  // llama-server's defaults
    const bool parse_special = bool_field(body, "parse_special", true);
    const bool with_pieces = bool_field(body, "with_pieces", false);
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(c->get<std::string>(), add_special, parse_special);
    } catch (const Error& e) {
      throw ApiError{400, fmt::format("content: {}", e.what()), "content"};
    }
    json tokens = json::array();
    for (const int32_t id : ids) {
      if (!with_pieces) {
        tokens.push_back(id);
        continue;
      }
      // A piece that is not valid UTF-8 on its own (part of a character) is given as its bytes.
      const std::string piece = tok.piece(id, parse_special);
      tokens.push_back({{"id", id}, {"piece", utf8_valid(piece) ? json(piece) : token_bytes(piece)}});
    }
    return json_response(json{{"tokens", tokens}});
  }

  HttpResponse detokenize(const HttpRequest& q) const {
    const Tokenizer& tok = sched.model().tokenizer();
    const json body = parse_json_body(q.body);
    if (!body.is_object()) throw ApiError{400, "the request body must be a JSON object", ""};
    check_only(body, {"tokens"}, "/detokenize");
    auto t = body.find("tokens");
    if (t == body.end() || !t->is_array()) throw ApiError{400, "tokens: must be an array of token ids", "tokens"};
    std::vector<int32_t> ids;
    for (size_t k = 0; k < t->size(); ++k) {
      const json& v = (*t)[k];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok.n_vocab())
        throw ApiError{400,
                       fmt::format("tokens[{}] = {}: must be a token id in [0, {})", k, quote_value(v), tok.n_vocab()),
                       "tokens"};
      ids.push_back(v.get<int32_t>());
    }
    // Special tokens as their text, as llama-server's /detokenize.
    return json_response(json{{"content", tok.decode(ids, /*special=*/true)}});
  }
};

ApiServer::ApiServer(Scheduler& scheduler, ApiOptions opt) {
  if (opt.max_tokens_limit < 1) throw Error(fmt::format("--max-tokens {}: must be >= 1", opt.max_tokens_limit));
  if (opt.max_n < 1) throw Error(fmt::format("max n {}: must be >= 1", opt.max_n));
  impl_ = std::make_unique<Impl>(scheduler, std::move(opt));
  HttpOptions ho;
  ho.limits = impl_->opt.http;
  ho.api_key = impl_->opt.api_key;
  ho.cors_origins = impl_->opt.cors_origins;
  ho.error_page = [retry = impl_->opt.retry_after_s](int status, const std::string& message) {
    return error_response({status, message, ""}, retry);
  };
  impl_->http = std::make_unique<HttpServer>(impl_->routes(), std::move(ho));
}

ApiServer::~ApiServer() = default;

int ApiServer::bind(const std::string& host, int port) { return impl_->http->bind(host, port); }

void ApiServer::start() { impl_->http->start(); }

void ApiServer::run() {
  impl_->http->start();
  impl_->http->wait();
}

void ApiServer::begin_shutdown() { impl_->shutting_down = true; }

void ApiServer::stop() { impl_->http->stop(); }

void ApiServer::add_connection(int fd) { impl_->http->add_connection(fd); }

int64_t ApiServer::open_connections() const { return impl_->http->open_connections(); }

int ApiServer::max_connections() const { return impl_->http->effective_max_connections(); }

}  // namespace kvevict::serve
