// libFuzzer harness: raw HTTP/1.1 bytes into `kvevict serve`'s connection handling. The input is
// written to one end of a socketpair whose other end the server (serve::ApiServer: the route
// table, the transport's limits, CORS, the request parser, the scheduler) serves as a client
// connection, then that end is half-closed and the answer read until the server closes it.
// The model is stories260K with at most 4 generated tokens per choice, so requests that reach
// the scheduler finish in milliseconds. Must hold: the server never crashes or trips a sanitizer,
// ends every connection (a half-closed one at once; anything within the server's 2 s timeout, and
// the harness gives it 6 s, under the -timeout of fuzz/run.sh), and never answers 500 (an
// exception no check named).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "model/chat_template.h"
#include "model/model.h"
#include "serve/http_server.h"
#include "serve/scheduler.h"

namespace {

struct Server {
  std::unique_ptr<kvevict::Model> model;
  std::unique_ptr<kvevict::serve::Scheduler> sched;
  std::unique_ptr<kvevict::serve::ApiServer> api;
  ~Server() {
    api->begin_shutdown();
    sched->shutdown(std::chrono::milliseconds(0));
    api->stop();
  }
};

Server& server() {
  static const std::unique_ptr<Server> s = [] {
    auto out = std::make_unique<Server>();
    out->model = kvevict::Model::load(kvevict::fuzz::shared_dir() + "/models/stories260K/stories260K.gguf");
    kvevict::serve::SchedulerOptions so;
    so.threads = 1;
    so.kv_memory_bytes = 8 << 20;
    so.max_seqs = 4;
    so.max_queue = 8;
    out->sched = std::make_unique<kvevict::serve::Scheduler>(*out->model, so);
    kvevict::serve::ApiOptions ao;
    ao.model_name = "fuzz";
    ao.max_tokens_limit = 4;
    ao.max_n = 2;
    kvevict::serve::use_chat_template(ao, kvevict::ChatTemplate::by_name("chatml"), out->model->tokenizer());
    ao.cors_origins = {"http://a"};
    // Small limits, so that short inputs reach every refusal; one thread each, so that a run is
    // as repeatable as threads allow. No disconnect checks: the harness half-closes its end
    // after writing, which would read as a client that left.
    ao.http.max_body_bytes = 16 << 10;
    ao.http.max_header_bytes = 4 << 10;
    ao.http.max_headers = 32;
    ao.http.timeout_s = 2;
    ao.http.max_connections = 64;
    ao.http.max_connections_per_client = 64;
    ao.http.event_threads = 1;
    ao.http.workers = 1;
    ao.http.disconnect_check_ms = 3600 * 1000;
    out->api = std::make_unique<kvevict::serve::ApiServer>(*out->sched, ao);
    out->api->start();
    return out;
  }();
  return *s;
}

bool starts_with_ci(std::string_view s, std::string_view p) {
  if (s.size() < p.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != std::tolower(static_cast<unsigned char>(p[i]))) return false;
  return true;
}

// Walks the answers in `out` while their framing is certain (Content-Length or chunked) and
// traps on a 500. Stops at anything it cannot frame (a HEAD answer, a body up to the close).
void check_answers(std::string_view out) {
  size_t at = 0;
  while (at < out.size()) {
    std::string_view r = out.substr(at);
    if (r.size() < 12 || r.substr(0, 9) != "HTTP/1.1 ") return;
    if (r.substr(9, 3) == "500") __builtin_trap();
    const size_t end = r.find("\r\n\r\n");
    if (end == std::string_view::npos) return;
    const std::string_view head = r.substr(0, end + 2);
    long long length = -1;
    bool chunked = false;
    for (size_t line = head.find("\r\n") + 2; line < head.size();) {
      const size_t eol = head.find("\r\n", line);
      const std::string_view h = head.substr(line, eol - line);
      if (starts_with_ci(h, "content-length: ")) length = std::atoll(std::string(h.substr(16)).c_str());
      if (starts_with_ci(h, "transfer-encoding: chunked")) chunked = true;
      line = eol + 2;
    }
    size_t body = end + 4;
    if (chunked) {
      while (true) {
        const size_t eol = r.find("\r\n", body);
        if (eol == std::string_view::npos) return;
        const size_t n = std::strtoull(std::string(r.substr(body, eol - body)).c_str(), nullptr, 16);
        body = eol + 2 + n + 2;
        if (n == 0 || body > r.size()) break;
      }
    } else if (length >= 0) {
      body += static_cast<size_t>(length);
    } else {
      return;
    }
    at += body;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Server& s = server();
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  s.api->add_connection(sv[1]);
  // The server may answer and close before it read everything (414, 431, 413): stop writing then.
  for (size_t at = 0; at < size;) {
    const ssize_t n = ::send(sv[0], data + at, size - at, MSG_NOSIGNAL);
    if (n <= 0) break;
    at += static_cast<size_t>(n);
  }
  ::shutdown(sv[0], SHUT_WR);
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(6);
  char buf[65536];
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) __builtin_trap();  // the server never ended the connection
    pollfd pf{sv[0], POLLIN, 0};
    if (::poll(&pf, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t n = ::recv(sv[0], buf, sizeof buf, 0);
    if (n <= 0) break;
    if (out.size() < (1u << 20)) out.append(buf, static_cast<size_t>(n));
  }
  ::close(sv[0]);
  check_answers(out);
  return 0;
}
