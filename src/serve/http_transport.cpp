#include "serve/http_transport.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "serve/json_body.h"
#include "util/error.h"

namespace kvevict::serve {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// The table's key for a path: "/v1/x" and "/x" are one route.
std::string route_key(std::string_view path) {
  if (path.size() > 3 && path.compare(0, 4, "/v1/") == 0) path.remove_prefix(3);
  return std::string(path);
}

// Bytes a body may run past max_body_bytes (read and dropped) so that the 413 can still be sent
// once it ends; a body longer than that has its connection closed without an answer.
constexpr int64_t kDropAllowance = int64_t{64} << 20;

// Descriptors kept free beside the connections (model file, pipes, the listener, epoll, eventfds).
constexpr int kReservedFds = 64;

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return "";
}

bool HttpRequest::has_header(std::string_view name) const {
  return std::any_of(headers.begin(), headers.end(), [&](const auto& kv) { return iequals(kv.first, name); });
}

Reply Reply::answer(HttpResponse r) {
  Reply out;
  out.now = std::move(r);
  return out;
}

Reply Reply::later(std::function<std::optional<HttpResponse>(bool)> poll, std::function<void()> cancel) {
  Reply out;
  out.poll = std::move(poll);
  out.cancel = std::move(cancel);
  return out;
}

Reply Reply::stream(HttpResponse head, std::function<StreamPiece(bool)> pull, std::function<void()> cancel) {
  Reply out;
  out.head = std::move(head);
  out.pull = std::move(pull);
  out.cancel = std::move(cancel);
  return out;
}

// A reply that is not complete: its handler runs on a worker, or it waits for the scheduler.
// `mu` orders suspending (event thread) against waking (any thread): a connection is suspended
// and marked so under `mu`, and resumed only by whoever clears the mark under `mu`, so no wake
// is lost and a connection is never resumed twice.
struct PendingReply {
  std::mutex mu;
  MHD_Connection* conn = nullptr;  // valid while !closed
  int fd = -1;
  bool suspended = false;
  bool dispatched = false;  // the handler returned `reply`
  bool started = false;     // `reply` is being answered (queued, polled or streaming)
  bool finished = false;    // the whole answer was produced
  bool closed = false;      // the request ended: nothing may touch conn any more
  bool gone = false;        // the client hung up while the reply waited
  Reply reply;
  std::vector<std::pair<std::string, std::string>> cors;
  std::string out;  // streamed bytes not yet handed to the library
  size_t out_at = 0;

  // Under mu: suspend the connection (called on its event thread, in a callback).
  void suspend() {
    suspended = true;
    MHD_suspend_connection(conn);
  }
  // Under mu: resume it if it sleeps.
  void resume() {
    if (suspended && !closed) {
      suspended = false;
      MHD_resume_connection(conn);
    }
  }
};

void Waker::operator()() const {
  if (auto p = p_.lock()) {
    std::lock_guard<std::mutex> lock(p->mu);
    p->resume();
  }
}

// One request on one connection (the library's per-request pointer).
struct Exchange {
  std::string body;
  int64_t received = 0;
  bool too_large = false;
  std::shared_ptr<PendingReply> pending;
};

struct HttpServer::Impl {
  struct Job {
    std::shared_ptr<PendingReply> p;
    HttpRequest req;
    const Route* route;
  };

  std::vector<Route> routes;
  std::map<std::string, std::vector<const Route*>> by_path;  // route_key -> routes
  HttpOptions opt;
  MHD_Daemon* daemon = nullptr;
  int listen_fd = -1;
  int max_connections = 0;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> open{0};

  // start() and stop() run whole under this lock: a stop() from another thread while start() is
  // still creating the worker threads (the daemon already answers) would otherwise return with
  // threads not yet joined, and destroying them would terminate the process.
  std::mutex lifecycle_mu;
  std::mutex state_mu;  // stopped, registry; taken before any PendingReply::mu
  std::condition_variable state_cv;
  bool started = false, stopped = false;
  std::unordered_map<PendingReply*, std::shared_ptr<PendingReply>> registry;  // replies not complete

  // Every open connection: its socket and whether it is reading a request (since when), for the
  // read deadline. An entry goes (NOTIFY_CLOSED) before the library closes its socket, so a
  // descriptor found here under conn_mu is still this connection's.
  struct Conn {
    int fd = -1;
    std::chrono::steady_clock::time_point since;  // opened, or its previous answer ended
    bool reading = true;                          // its next request has not fully arrived yet
    bool cut = false;                             // shut down for missing the deadline
  };
  std::mutex conn_mu;
  std::unordered_map<const MHD_Connection*, Conn> conns;

  std::mutex job_mu;
  std::condition_variable job_cv;
  std::deque<Job> jobs;
  bool jobs_closed = false;
  std::vector<std::thread> workers;
  std::thread watcher;

  HttpResponse error(int status, const std::string& message) const {
    if (opt.error_page) return opt.error_page(status, message);
    return HttpResponse{status, message + "\n", "text/plain; charset=utf-8", {}};
  }

  // CORS response headers for a request from `origin` ("" = not a cross-origin request).
  std::vector<std::pair<std::string, std::string>> cors_headers(const std::string& origin) const {
    if (origin.empty() || opt.cors_origins.empty()) return {};
    for (const auto& o : opt.cors_origins) {
      if (o == "*") return {{"Access-Control-Allow-Origin", "*"}};
      if (o == origin) return {{"Access-Control-Allow-Origin", origin}, {"Vary", "Origin"}};
    }
    return {};
  }

  static std::string lookup(MHD_Connection* c, const char* name) {
    const char* v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
    return v != nullptr ? v : "";
  }

  MHD_Result queue(MHD_Connection* c, const HttpResponse& r,
                   const std::vector<std::pair<std::string, std::string>>& cors) {
    MHD_Response* m =
        MHD_create_response_from_buffer(r.body.size(), const_cast<char*>(r.body.data()), MHD_RESPMEM_MUST_COPY);
    if (m == nullptr) return MHD_NO;
    if (r.status != 204) MHD_add_response_header(m, "Content-Type", r.content_type.c_str());
    for (const auto& [k, v] : r.headers) MHD_add_response_header(m, k.c_str(), v.c_str());
    for (const auto& [k, v] : cors) MHD_add_response_header(m, k.c_str(), v.c_str());
    const MHD_Result ok = MHD_queue_response(c, static_cast<unsigned>(r.status), m);
    MHD_destroy_response(m);
    return ok;
  }

  MHD_Result queue_error(MHD_Connection* c, int status, const std::string& message) {
    return queue(c, error(status, message), cors_headers(lookup(c, "Origin")));
  }

  // Routing: everything decided from the request line and headers, without calling a handler.
  // Returns the route to call, or sets `now` to the answer.
  const Route* route(const HttpRequest& req, std::optional<HttpResponse>& now) const {
    const auto it = by_path.find(route_key(req.path));
    const std::vector<const Route*>* rs = it == by_path.end() ? nullptr : &it->second;
    auto methods = [&] {
      std::string s;
      for (const Route* r : *rs) s += (s.empty() ? "" : ", ") + r->method;
      return s;
    };
    if (req.method == "OPTIONS") {
      if (rs == nullptr && req.path != "*") {
        now = error(404, fmt::format("no route {} {}", req.method, quote_text(req.path)));
        return nullptr;
      }
      // A CORS preflight (or a plain OPTIONS): no API key, no body (Fetch standard §3.2.2).
      HttpResponse r{204, "", "text/plain", {}};
      const std::string allow = rs != nullptr ? methods() + ", OPTIONS" : "GET, POST, OPTIONS";
      r.headers.emplace_back("Allow", allow);
      if (!cors_headers(req.header("Origin")).empty()) {
        r.headers.emplace_back("Access-Control-Allow-Methods", allow);
        const std::string asked = req.header("Access-Control-Request-Headers");
        r.headers.emplace_back("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
        r.headers.emplace_back("Access-Control-Max-Age", "600");
      }
      now = std::move(r);
      return nullptr;
    }
    const Route* match = nullptr;
    if (rs != nullptr)
      for (const Route* r : *rs)
        if (r->method == req.method || (req.method == "HEAD" && r->method == "GET")) match = r;
    if (!opt.api_key.empty() && !(match != nullptr && match->open) &&
        req.header("Authorization") != "Bearer " + opt.api_key) {
      now = error(401, "missing or wrong API key (send Authorization: Bearer KEY)");
      now->headers.emplace_back("WWW-Authenticate", "Bearer");
      return nullptr;
    }
    if (rs == nullptr) {
      now = error(404, fmt::format("no route {} {}", quote_text(req.method), quote_text(req.path)));
      return nullptr;
    }
    if (match == nullptr) {
      // A known path asked with another method: 405 with Allow (RFC 9110 §15.5.6), not 404.
      now = error(405, fmt::format("{} {}: method not allowed (use {})", quote_text(req.method), quote_text(req.path),
                                   methods()));
      now->headers.emplace_back("Allow", methods());
      return nullptr;
    }
    if (match->method == "POST" && !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) {
      now = error(400, fmt::format("the request has no body: {} {} takes a JSON body (with a Content-Length header, "
                                   "or chunked)",
                                   req.method, quote_text(req.path)));
      return nullptr;
    }
    return match;
  }

  static Reply call(const Route& r, const HttpRequest& req, const Waker& w, const Impl& self) {
    try {
      return r.handler(req, w);
    } catch (const std::exception& e) {
      return Reply::answer(self.error(500, e.what()));
    } catch (...) {
      return Reply::answer(self.error(500, "internal error"));
    }
  }

  HttpRequest collect(MHD_Connection* c, const char* url, const char* method, std::string body) const {
    HttpRequest req;
    req.method = method;
    req.path = url;
    req.body = std::move(body);
    MHD_get_connection_values(
        c, MHD_HEADER_KIND,
        [](void* cls, MHD_ValueKind, const char* k, const char* v) {
          static_cast<HttpRequest*>(cls)->headers.emplace_back(k, v != nullptr ? v : "");
          return MHD_YES;
        },
        &req);
    if (const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        info != nullptr && info->client_addr != nullptr) {
      char buf[INET6_ADDRSTRLEN] = {0};
      const sockaddr* sa = info->client_addr;
      if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
      else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
      req.client = buf;
    }
    return req;
  }

  // The handler's reply is known: answer it (under p.mu).
  MHD_Result start_reply(MHD_Connection* c, const std::shared_ptr<PendingReply>& pp) {
    PendingReply& p = *pp;
    p.started = true;
    if (p.gone && p.reply.cancel) p.reply.cancel();
    Reply& r = p.reply;
    if (r.now) {
      p.finished = true;
      return queue(c, *r.now, p.cors);
    }
    if (r.poll) return poll_reply(c, p);
    if (r.pull && r.head) {
      auto* keep = new StreamCtx{this, pp};
      MHD_Response* m =
          MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, &Impl::read_stream, keep,
                                            [](void* cls) { delete static_cast<StreamCtx*>(cls); });
      if (m == nullptr) {
        delete keep;
        return MHD_NO;
      }
      MHD_add_response_header(m, "Content-Type", r.head->content_type.c_str());
      for (const auto& [k, v] : r.head->headers) MHD_add_response_header(m, k.c_str(), v.c_str());
      for (const auto& [k, v] : p.cors) MHD_add_response_header(m, k.c_str(), v.c_str());
      const MHD_Result ok = MHD_queue_response(c, static_cast<unsigned>(r.head->status), m);
      MHD_destroy_response(m);
      return ok;
    }
    p.finished = true;
    return queue(c, error(500, "the handler gave no reply"), p.cors);
  }

  // A deferred reply: its response, or sleep until woken (under p.mu).
  MHD_Result poll_reply(MHD_Connection* c, PendingReply& p) {
    const bool stop = stopping;
    std::optional<HttpResponse> r = p.reply.poll(stop);
    if (!r && stop) r = error(503, "the server is shutting down");
    if (!r) {
      p.suspend();
      return MHD_YES;
    }
    p.finished = true;
    return queue(c, *r, p.cors);
  }

  // What a streamed response's reader needs; owned by the library's response object.
  struct StreamCtx {
    Impl* server;
    std::shared_ptr<PendingReply> p;
  };

  // The library asks for the next bytes of a stream: hand out what pull() produced, or sleep.
  static ssize_t read_stream(void* cls, uint64_t pos, char* buf, size_t max) {
    try {
      return read_stream_bytes(static_cast<StreamCtx*>(cls), pos, buf, max);
    } catch (...) {
      return MHD_CONTENT_READER_END_WITH_ERROR;  // no exception may cross into the C library
    }
  }

  static ssize_t read_stream_bytes(StreamCtx* ctx, uint64_t, char* buf, size_t max) {
    PendingReply& p = *ctx->p;
    std::lock_guard<std::mutex> lock(p.mu);
    while (p.out_at == p.out.size()) {
      if (p.finished) return MHD_CONTENT_READER_END_OF_STREAM;
      p.out.clear();
      p.out_at = 0;
      const bool stop = ctx->server->stopping;
      StreamPiece s = p.reply.pull(stop);
      p.out = std::move(s.data);
      p.finished = s.end || stop;
      if (p.out.empty() && !p.finished) {
        p.suspend();
        return 0;
      }
    }
    const size_t n = std::min(max, p.out.size() - p.out_at);
    std::memcpy(buf, p.out.data() + p.out_at, n);
    p.out_at += n;
    return static_cast<ssize_t>(n);
  }

  MHD_Result on_access(MHD_Connection* c, const char* url, const char* method, const char* upload,
                       size_t* upload_size, void** con_cls) {
    auto* x = static_cast<Exchange*>(*con_cls);
    if (x == nullptr) {
      // Headers complete, body not read yet: the limits the headers alone decide.
      x = new Exchange;
      *con_cls = x;
      const int n = MHD_get_connection_values(c, MHD_HEADER_KIND, nullptr, nullptr);
      if (n > opt.limits.max_headers)
        return queue_error(c, 431,
                           fmt::format("the request has {} header fields, more than the limit of {}", n,
                                       opt.limits.max_headers));
      const std::string length = lookup(c, "Content-Length");
      if (!length.empty()) {
        // The library has checked that it is a decimal number (else 400 Bad Request).
        const bool huge = length.size() > 18 || std::strtoll(length.c_str(), nullptr, 10) > opt.limits.max_body_bytes;
        if (huge)
          return queue_error(c, 413,
                             fmt::format("the request body exceeds {} bytes (Content-Length {})",
                                         opt.limits.max_body_bytes, quote_text(length)));
      }
      return MHD_YES;
    }
    if (*upload_size > 0) {
      const auto n = static_cast<int64_t>(*upload_size);
      x->received += n;
      if (!x->too_large && x->received > opt.limits.max_body_bytes) {
        x->too_large = true;  // a chunked body over the limit: drop what came, answer 413 at its end
        std::string().swap(x->body);
      }
      if (!x->too_large) x->body.append(upload, *upload_size);
      *upload_size = 0;
      return x->too_large && x->received > opt.limits.max_body_bytes + kDropAllowance ? MHD_NO : MHD_YES;
    }
    if (x->pending) return resumed(c, x->pending);
    set_reading(c, false);
    if (x->too_large)
      return queue_error(c, 413, fmt::format("the request body exceeds {} bytes", opt.limits.max_body_bytes));

    HttpRequest req = collect(c, url, method, std::move(x->body));
    std::optional<HttpResponse> now;
    const Route* r = route(req, now);
    auto cors = cors_headers(req.header("Origin"));
    if (r == nullptr) return queue(c, *now, cors);

    auto p = std::make_shared<PendingReply>();
    p->conn = c;
    p->cors = std::move(cors);
    if (const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD))
      p->fd = info->connect_fd;
    Waker w;
    w.p_ = p;
    if (r->fast) {
      p->reply = call(*r, req, w, *this);
      p->dispatched = true;
      if (p->reply.now) return queue(c, *p->reply.now, p->cors);  // the common case: nothing to keep
    }
    {
      std::lock_guard<std::mutex> lock(state_mu);
      if (stopped) return queue(c, error(503, "the server is shutting down"), p->cors);
      registry.emplace(p.get(), p);
    }
    x->pending = p;
    std::lock_guard<std::mutex> lock(p->mu);
    if (p->dispatched) return start_reply(c, p);
    // Run the handler on a worker; the connection sleeps until it is done.
    p->suspend();
    {
      std::lock_guard<std::mutex> jl(job_mu);
      jobs.push_back(Job{p, std::move(req), r});
    }
    job_cv.notify_one();
    return MHD_YES;
  }

  // The access callback again for a request that already has a PendingReply: after a wake.
  MHD_Result resumed(MHD_Connection* c, const std::shared_ptr<PendingReply>& pp) {
    PendingReply& p = *pp;
    std::lock_guard<std::mutex> lock(p.mu);
    if (!p.dispatched) {
      if (stopping) {
        p.finished = true;
        return queue(c, error(503, "the server is shutting down"), p.cors);
      }
      p.suspend();  // woken before its handler finished
      return MHD_YES;
    }
    if (!p.started) return start_reply(c, pp);
    if (p.reply.poll && !p.finished) return poll_reply(c, p);
    return MHD_YES;
  }

  // The connection's request is read (false) or its answer ended and the next may come (true).
  void set_reading(const MHD_Connection* c, bool reading) {
    std::lock_guard<std::mutex> lock(conn_mu);
    if (auto it = conns.find(c); it != conns.end()) {
      it->second.reading = reading;
      if (reading) it->second.since = std::chrono::steady_clock::now();
    }
  }

  void on_connection(MHD_Connection* c, MHD_ConnectionNotificationCode code) {
    std::lock_guard<std::mutex> lock(conn_mu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
      Conn& k = conns[c];
      if (const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD))
        k.fd = info->connect_fd;
      k.since = std::chrono::steady_clock::now();
      open += 1;
    } else {
      conns.erase(c);
      open -= 1;
    }
  }

  // Connections that have been reading one request for longer than read_timeout_s (a client
  // trickling bytes, which the inactivity timeout never catches) are shut down: the library
  // then reads end-of-file and closes them.
  void enforce_read_deadline() {
    const auto now = std::chrono::steady_clock::now();
    const auto limit = std::chrono::seconds(opt.limits.read_timeout_s);
    std::lock_guard<std::mutex> lock(conn_mu);
    for (auto& [c, k] : conns)
      if (k.reading && !k.cut && k.fd >= 0 && now - k.since > limit) {
        ::shutdown(k.fd, SHUT_RDWR);
        k.cut = true;
      }
  }

  void on_completed(MHD_Connection* c, void** con_cls, MHD_RequestTerminationCode toe) {
    set_reading(c, true);
    std::unique_ptr<Exchange> x(static_cast<Exchange*>(*con_cls));
    *con_cls = nullptr;
    if (x == nullptr) return;
    if (auto p = x->pending) {
      bool cancel = false;
      {
        std::lock_guard<std::mutex> lock(p->mu);
        p->closed = true;
        p->suspended = false;
        cancel = p->dispatched && (!p->finished || toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
      }
      if (cancel && p->reply.cancel) p->reply.cancel();
      std::lock_guard<std::mutex> lock(state_mu);
      registry.erase(p.get());
    }
  }

  void work() {
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(job_mu);
        job_cv.wait(lock, [&] { return jobs_closed || !jobs.empty(); });
        if (jobs.empty()) return;
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      Waker w;
      w.p_ = job.p;
      Reply r = call(*job.route, job.req, w, *this);
      bool orphan = false;
      {
        std::lock_guard<std::mutex> lock(job.p->mu);
        orphan = job.p->closed;
        job.p->reply = std::move(r);
        job.p->dispatched = true;
        job.p->resume();
      }
      // The connection ended while the handler ran: release what the reply holds.
      if (orphan && job.p->reply.cancel) job.p->reply.cancel();
    }
  }

  // Notices clients that hung up while their reply sleeps (the library reads nothing from a
  // suspended connection): the reply is cancelled, which wakes it, and the write that follows
  // fails and closes the connection.
  void watch() {
    std::unique_lock<std::mutex> lock(state_mu);
    while (!stopped) {
      state_cv.wait_for(lock, std::chrono::milliseconds(opt.limits.disconnect_check_ms));
      if (stopped) break;
      enforce_read_deadline();
      std::vector<std::shared_ptr<PendingReply>> gone;
      for (auto& [raw, p] : registry) {
        std::lock_guard<std::mutex> pl(p->mu);
        if (!p->suspended || p->closed || p->gone || p->fd < 0) continue;
        pollfd pf{p->fd, POLLRDHUP, 0};
        if (::poll(&pf, 1, 0) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
          p->gone = true;
          if (p->dispatched) gone.push_back(p);
        }
      }
      lock.unlock();
      for (auto& p : gone)
        if (p->reply.cancel) p->reply.cancel();
      lock.lock();
    }
  }
};

HttpServer::HttpServer(std::vector<Route> routes, HttpOptions opt) : impl_(std::make_unique<Impl>()) {
  const HttpLimits& l = opt.limits;
  auto at_least = [](const char* what, int64_t v, int64_t lo) {
    if (v < lo) throw Error(fmt::format("{} {}: must be >= {}", what, v, lo));
  };
  at_least("max body bytes", l.max_body_bytes, 1);
  at_least("max header bytes", l.max_header_bytes, 1024);
  at_least("max headers", l.max_headers, 1);
  at_least("timeout", l.timeout_s, 1);
  at_least("read timeout", l.read_timeout_s, 1);
  at_least("max connections", l.max_connections, 1);
  at_least("max connections per client", l.max_connections_per_client, 1);
  at_least("event threads", l.event_threads, 1);
  at_least("HTTP worker threads", l.workers, 1);
  at_least("disconnect check interval", l.disconnect_check_ms, 1);
  impl_->routes = std::move(routes);
  for (const Route& r : impl_->routes) {
    if (r.path.empty() || r.path[0] != '/') throw Error(fmt::format("route '{}': a path starts with '/'", r.path));
    auto& same = impl_->by_path[route_key(r.path)];
    for (const Route* o : same)
      if (o->method == r.method) throw Error(fmt::format("route {} {} is in the table twice", r.method, r.path));
    same.push_back(&r);
  }
  impl_->opt = std::move(opt);
  // A client that hangs up mid-answer must not kill the server with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    throw Error(fmt::format("cannot listen on {}:{}: {}", host, port, gai_strerror(rc)));
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr && impl_->listen_fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    // The backlog holds connections beyond max_connections until one closes.
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      impl_->listen_fd = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  freeaddrinfo(res);
  if (impl_->listen_fd < 0) throw Error(fmt::format("cannot listen on {}:{}: {}", host, port, why));
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                  : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

void HttpServer::start() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lifecycle(s.lifecycle_mu);
  {
    std::lock_guard<std::mutex> lock(s.state_mu);
    if (s.started || s.stopped) return;
  }
  const HttpLimits& l = s.opt.limits;
  // Each connection is a descriptor: raise the soft limit as far as the hard one allows, and
  // fit the connection cap under it.
  s.max_connections = l.max_connections;
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    const rlim_t want = static_cast<rlim_t>(l.max_connections) + kReservedFds;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
      rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
      setrlimit(RLIMIT_NOFILE, &rl);
      getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
      s.max_connections = std::max(1, static_cast<int>(rl.rlim_cur) - kReservedFds);
  }
  std::vector<MHD_OptionItem> ops = {
      {MHD_OPTION_CONNECTION_LIMIT, s.max_connections, nullptr},
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT, l.max_connections_per_client, nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT, l.timeout_s, nullptr},
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<intptr_t>(l.max_header_bytes), nullptr},
      {MHD_OPTION_NOTIFY_COMPLETED,
       reinterpret_cast<intptr_t>(+[](void* cls, MHD_Connection* c, void** con_cls, MHD_RequestTerminationCode toe) {
         try {
           static_cast<Impl*>(cls)->on_completed(c, con_cls, toe);
         } catch (...) {
         }
       }),
       &s},
      {MHD_OPTION_NOTIFY_CONNECTION,
       reinterpret_cast<intptr_t>(
           +[](void* cls, MHD_Connection* c, void**, MHD_ConnectionNotificationCode code) {
             try {
               static_cast<Impl*>(cls)->on_connection(c, code);
             } catch (...) {  // out of memory: this connection goes without a read deadline
             }
           }),
       &s},
  };
  // The library splits the connection cap between its threads: at least one each.
  const int threads = std::min(l.event_threads, s.max_connections);
  if (threads > 1) ops.push_back({MHD_OPTION_THREAD_POOL_SIZE, threads, nullptr});
  if (s.listen_fd >= 0) ops.push_back({MHD_OPTION_LISTEN_SOCKET, s.listen_fd, nullptr});
  ops.push_back({MHD_OPTION_END, 0, nullptr});
  // poll(), not epoll: 0.9.75's edge-triggered epoll mode misses a FIN that arrived together with
  // the request (a client that half-closes after sending), leaving the connection open until the
  // timeout; poll() is level-triggered. Its cost grows with the connections per thread, a few
  // microseconds per wake-up at --max-connections 1024.
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME;
  if (s.listen_fd < 0) flags |= MHD_USE_NO_LISTEN_SOCKET;
  s.daemon = MHD_start_daemon(
      flags, 0, nullptr, nullptr,
      +[](void* cls, MHD_Connection* c, const char* url, const char* method, const char*, const char* upload,
          size_t* upload_size, void** con_cls) {
        // No exception may cross into the C library: out of memory closes the connection.
        try {
          return static_cast<Impl*>(cls)->on_access(c, url, method, upload, upload_size, con_cls);
        } catch (...) {
          return MHD_NO;
        }
      },
      &s, MHD_OPTION_ARRAY, ops.data(), MHD_OPTION_END);
  if (s.daemon == nullptr) throw Error("cannot start the HTTP server (libmicrohttpd refused the options)");
  s.listen_fd = -1;  // the library owns (and closes) it now
  {
    std::lock_guard<std::mutex> lock(s.state_mu);
    s.started = true;
  }
  for (int i = 0; i < l.workers; ++i) s.workers.emplace_back([&s] { s.work(); });
  s.watcher = std::thread([&s] { s.watch(); });
}

void HttpServer::wait() {
  std::unique_lock<std::mutex> lock(impl_->state_mu);
  impl_->state_cv.wait(lock, [&] { return impl_->stopped; });
}

void HttpServer::stop() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lifecycle(s.lifecycle_mu);
  {
    std::lock_guard<std::mutex> lock(s.state_mu);
    if (s.stopped) return;
    s.stopped = true;
    s.stopping = true;
    // Every sleeping reply gets its last poll (with stopping) before the library closes its
    // connection: it refuses to stop while a connection is suspended.
    for (auto& [raw, p] : s.registry) {
      std::lock_guard<std::mutex> pl(p->mu);
      p->resume();
    }
  }
  s.state_cv.notify_all();
  if (s.daemon != nullptr) MHD_stop_daemon(s.daemon);
  s.daemon = nullptr;
  if (s.listen_fd >= 0) ::close(s.listen_fd);
  s.listen_fd = -1;
  {
    std::lock_guard<std::mutex> lock(s.job_mu);
    s.jobs_closed = true;
    s.jobs.clear();
  }
  s.job_cv.notify_all();
  for (auto& t : s.workers) t.join();
  s.workers.clear();
  if (s.watcher.joinable()) s.watcher.join();
}

void HttpServer::add_connection(int fd) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (impl_->daemon == nullptr ||
      MHD_add_connection(impl_->daemon, fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != MHD_YES)
    ::close(fd);
}

int64_t HttpServer::open_connections() const { return impl_->open.load(); }

int HttpServer::effective_max_connections() const { return impl_->max_connections; }

}  // namespace kvevict::serve
