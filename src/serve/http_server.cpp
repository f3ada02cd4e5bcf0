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

}  // namespace

struct ApiServer::Impl {
  Scheduler& sched;
  ApiOptions opt;
  httplib::Server http;
  std::atomic<bool> shutting_down{false};
  std::atomic<uint64_t> request_counter{0};
  std::atomic<int> listen_fd{-1};

  Impl(Scheduler& s, ApiOptions o) : sched(s), opt(std::move(o)) {}

  json usage_json(const ParsedRequest& p, const std::vector<ChoiceOutcome>& out) const {
    int64_t completion = 0, rounds = 0, peak = 0, bytes = 0;
    for (const auto& o : out) {
      completion += o.completion_tokens;
      rounds += o.eviction_rounds;
      peak = std::max(peak, o.peak_slots);
      bytes += o.kv_bytes;
    }
    const auto prompt = static_cast<int64_t>(p.gen.prompt.size());
    json kv = {{"policy", p.gen.kv.policy().name},
               {"budget", p.gen.kv.policy().evicts ? json(p.budget) : json(nullptr)},
               {"buffer", p.gen.kv.policy().evicts ? json(p.recent) : json(nullptr)},
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
    ParsedRequest p;
    try {
      p = parse_generation_request(hreq.body, ep, sched.model().tokenizer(), sched.model().config().context_length,
                                   opt, request_counter);
    } catch (const ApiError& e) {
      return send_error(res, e);
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
                         p.gen.kv.policy().evicts ? "lower kv_budget, kv_buffer, n or the prompt"
                                                  : "lower max_tokens, n or the prompt, or use a bounded kv_policy"),
             p.gen.kv.policy().evicts ? "kv_budget" : "max_tokens"});
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

  void stream_response(httplib::Response& res, const std::shared_ptr<Request>& req, const ParsedRequest& p, Endpoint ep,
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
