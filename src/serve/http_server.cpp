#include "serve/http_server.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>

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

  json usage_json(const ParsedRequest& p, const std::vector<ChoiceOutcome>& out) const {
    int64_t completion = 0, rounds = 0, peak = 0, bytes = 0, shared = 0;
    for (const auto& o : out) {
      completion += o.completion_tokens;
      rounds += o.eviction_rounds;
      peak = std::max(peak, o.peak_slots);
      bytes += o.kv_bytes + o.shared_kv_bytes;
      shared += o.shared_kv_bytes;
    }
    const auto prompt = static_cast<int64_t>(p.gen.prompt.size());
    json kv = {{"policy", p.gen.kv.policy().name},
               {"budget", p.gen.kv.policy().evicts ? json(p.budget) : json(nullptr)},
               {"buffer", p.gen.kv.policy().evicts ? json(p.recent) : json(nullptr)},
               {"eviction_rounds", rounds},
               {"peak_slots_per_kv_head", peak},
               {"kv_bytes_reserved", bytes},
               {"kv_shared_prompt_bytes", shared}};
    return json{{"prompt_tokens", prompt},
                {"completion_tokens", completion},
                {"total_tokens", prompt + completion},
                {"kv", kv}};
  }

  // Runs on an HTTP worker: parse, admit, then answer when the scheduler has (Reply::later) or
  // as it goes (Reply::stream); the request's events wake the connection.
  Reply generate(const HttpRequest& hreq, const Waker& wake, Endpoint ep) {
    auto fail = [this](const ApiError& e) { return Reply::answer(error_response(e, opt.retry_after_s)); };
    if (shutting_down) return fail({503, "the server is shutting down", ""});
    ParsedRequest p;
    try {
      p = parse_generation_request(hreq.body, ep, sched.model().tokenizer(), sched.model().config().context_length,
                                   opt, request_counter);
    } catch (const ApiError& e) {
      return fail(e);
    }
    auto req = std::make_shared<Request>(p.gen);
    req->set_event_listener(wake);
    switch (sched.submit(req)) {
      case Admission::Queued:
        break;
      case Admission::TooLarge:
        if (p.gen.n > sched.options().max_seqs)
          return fail({400,
                       fmt::format("n: {} choices exceed the {} sequences the server runs at once (--max-seqs)",
                                   p.gen.n, sched.options().max_seqs),
                       "n"});
        return fail({400,
                     fmt::format("the request needs {} bytes of KV memory ({} sequence(s) of {} bytes) but the "
                                 "KV pool holds {} bytes (--kv-memory); {}",
                                 sched.sequence_bytes(p.gen) * p.gen.n, p.gen.n, sched.sequence_bytes(p.gen),
                                 sched.pool().capacity(),
                                 p.gen.kv.policy().evicts ? "lower kv_budget, kv_buffer, n or the prompt"
                                                     : "lower max_tokens, n or the prompt, or use a bounded kv_policy"),
                     p.gen.kv.policy().evicts ? "kv_budget" : "max_tokens"});
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
    const std::string id =
        fmt::format("{}-{:016x}", ep == Endpoint::Chat ? "chatcmpl" : "cmpl",
                    splitmix64(id_base + id_counter.fetch_add(1)));
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    auto cancel = [req] { req->cancel(); };
    if (p.stream) return stream_reply(req, std::move(p), ep, id, created);
    return Reply::later(
        [this, req, p = std::move(p), ep, id, created](bool stopping) -> std::optional<HttpResponse> {
          while (auto e = req->next_event(std::chrono::milliseconds(0))) {
            if (e->kind == RequestEvent::Kind::Failed) return error_response({e->status, e->text, ""}, opt.retry_after_s);
            if (e->kind == RequestEvent::Kind::Done) return json_response(completion_json(p, req->outcomes(), ep, id, created));
          }
          if (!stopping) return std::nullopt;
          req->cancel();
          return error_response({503, "the server is shutting down", ""}, opt.retry_after_s);
        },
        cancel);
  }

  json completion_json(const ParsedRequest& p, const std::vector<ChoiceOutcome>& out, Endpoint ep,
                       const std::string& id, int64_t created) const {
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
    return {{"id", id},           {"object", ep == Endpoint::Chat ? "chat.completion" : "text_completion"},
            {"created", created}, {"model", opt.model_name},
            {"choices", choices}, {"usage", usage_json(p, out)}};
  }

  json chunk(const std::string& id, int64_t created, Endpoint ep, json choices) const {
    return json{{"id", id},
                {"object", ep == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", opt.model_name},
                {"choices", std::move(choices)}};
  }

  // Server-Sent Events: each pull sends every event that arrived since the last one.
  Reply stream_reply(const std::shared_ptr<Request>& req, ParsedRequest p, Endpoint ep, const std::string& id,
                     int64_t created) {
    auto started = std::make_shared<bool>(false);
    HttpResponse head{200, "", "text/event-stream", {{"Cache-Control", "no-cache"}}};
    auto pull = [this, req, p = std::move(p), ep, id, created, started](bool stopping) -> StreamPiece {
      StreamPiece out;
      auto send = [&](const json& j) { out.data += "data: " + dump(j) + "\n\n"; };
      auto finish = [&] {
        out.data += "data: [DONE]\n\n";
        out.end = true;
        return out;
      };
      if (!*started) {
        *started = true;
        if (ep == Endpoint::Chat) {
          json ch = json::array();
          for (int c = 0; c < p.gen.n; ++c)
            ch.push_back({{"index", c},
                          {"delta", {{"role", "assistant"}, {"content", ""}}},
                          {"logprobs", nullptr},
                          {"finish_reason", nullptr}});
          send(chunk(id, created, ep, ch));
        }
      }
      while (auto e = req->next_event(std::chrono::milliseconds(0))) {
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
            send(chunk(id, created, ep, json::array({ch})));
            break;
          case RequestEvent::Kind::ChoiceDone:
            if (e->finish == FinishReason::Cancelled || e->finish == FinishReason::Error) break;
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
            send(chunk(id, created, ep, json::array({ch})));
            break;
          case RequestEvent::Kind::Done:
            if (p.include_usage) {
              json u = chunk(id, created, ep, json::array());
              u["usage"] = usage_json(p, req->outcomes());
              send(u);
            }
            return finish();
          case RequestEvent::Kind::Failed:
            // The stream already started (status 200): the error travels as an event.
            send(error_json({e->status, e->text, ""}));
            return finish();
        }
      }
      if (!stopping) return out;
      req->cancel();
      send(error_json({503, "the server is shutting down", ""}));
      return finish();
    };
    return Reply::stream(std::move(head), std::move(pull), [req] { req->cancel(); });
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
