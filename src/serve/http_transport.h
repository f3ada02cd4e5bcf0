// The HTTP/1.1 transport of `kvevict serve`: one route table (method, path, handler) over
// libmicrohttpd, with the limits that keep one client from holding the server: request line and
// header size (414 / 431, the library's per-connection memory limit), header count (431), body
// size whatever the transfer encoding (413), an inactivity timeout while a request is read or a
// connection idles, a deadline for reading a whole request, and caps on connections in total and
// per client address. No thread belongs to a connection: a few event-loop threads (poll) do every
// socket's I/O, handlers that may take long (tokenising a large prompt) run on a small worker
// pool, and a reply that waits for the scheduler (a generation) suspends its connection until a
// Waker resumes it.
//
// Also here: 404/405 derived from the table (405 with Allow, RFC 9110 §15.5.6), OPTIONS and CORS
// (Fetch standard, "CORS protocol"), a Bearer API key, pipelined requests answered in order, and
// clients that hang up while their reply waits noticed within disconnect_check_ms.
//
// Why libmicrohttpd (docs/serving.md, "HTTP layer"): it enforces these limits itself (Debian
// bookworm 0.9.75: MHD_OPTION_CONNECTION_LIMIT, PER_IP_CONNECTION_LIMIT, CONNECTION_TIMEOUT,
// CONNECTION_MEMORY_LIMIT, an internal thread pool, suspend/resume); the body limit, the header
// count and the read deadline are the checks made here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvevict::serve {

/// What one client may make the server hold. Defaults are `kvevict serve`'s.
struct HttpLimits {
  int64_t max_body_bytes = 4 << 20;    ///< request body, Content-Length or chunked; larger -> 413
  /// Request line + headers (the library's per-connection buffer, so also what an idle or slow
  /// connection can hold): a longer request line -> 414, headers -> 431.
  int64_t max_header_bytes = 32 << 10;
  int max_headers = 100;               ///< header fields per request; more -> 431
  int timeout_s = 30;  ///< a connection that sends or takes no byte for this long (reading a request, idling, or
                       ///< not reading its reply) is closed; one waiting for the scheduler never times out
  /// A request (line, headers and body) must have arrived within this many seconds of the
  /// connection opening or its previous answer ending, else the connection is closed: a client
  /// trickling bytes (never inactive for timeout_s) cannot hold its connection for longer.
  int read_timeout_s = 60;
  int max_connections = 1024;           ///< open at once; more wait in the listen backlog until one closes
  int max_connections_per_client = 256;  ///< per client IP address; more are closed as they arrive
  int event_threads = 2;                 ///< threads doing the sockets' I/O (poll)
  int workers = 4;                       ///< threads running handlers not marked fast
  /// How often connections whose reply waits (queued, prefilling, not streamed) are checked for
  /// a client that hung up, ms: such a request is cancelled within about this long.
  int disconnect_check_ms = 100;
};

/// One received request (the whole body already read).
struct HttpRequest {
  std::string method;  ///< as sent: "GET", "POST", ...
  std::string path;    ///< URL path, percent-decoded, without the query string
  std::vector<std::pair<std::string, std::string>> headers;  ///< in the order sent
  std::string body;
  std::string client;  ///< client IP address
  /// The value of header `name` (ASCII case-insensitive); "" when absent.
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

/// A complete answer. The transport adds Content-Length, Date and CORS headers.
struct HttpResponse {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;  ///< extra headers (Retry-After, Allow, ...)
};

/// The next piece of a streamed reply: bytes to send ("" = nothing yet: the connection sleeps
/// until woken) and whether the stream ends after them.
struct StreamPiece {
  std::string data;
  bool end = false;
};

struct PendingReply;  // the transport's state of a reply that is not complete yet

/// Wakes the connection of a deferred or streamed reply, so that its poll() or pull() runs
/// again. Callable from any thread, any number of times; a no-op once the connection ended.
class Waker {
 public:
  void operator()() const;

 private:
  friend class HttpServer;
  std::weak_ptr<PendingReply> p_;
};

/// What a handler answers: a response now, one later, or a stream.
struct Reply {
  /// A response to send now.
  static Reply answer(HttpResponse r);
  /// A response that comes later: `poll` runs on the connection's event thread right away and
  /// again after each wake, and returns the response once there is one. `stopping` (the server
  /// is stopping) asks for a final response now (poll must return one). `cancel` runs once if
  /// the client goes away (or the server stops) before the response was sent; it must lead to a
  /// wake.
  static Reply later(std::function<std::optional<HttpResponse>(bool stopping)> poll, std::function<void()> cancel);
  /// A stream: `head`'s status, content type and headers are sent at once (chunked transfer
  /// encoding), then the bytes of each `pull` as they come (pull as poll above; with `stopping`
  /// it must end the stream). `cancel` as above.
  static Reply stream(HttpResponse head, std::function<StreamPiece(bool stopping)> pull, std::function<void()> cancel);

  std::optional<HttpResponse> now;
  std::function<std::optional<HttpResponse>(bool)> poll;
  std::optional<HttpResponse> head;
  std::function<StreamPiece(bool)> pull;
  std::function<void()> cancel;
};

/// A handler gets the request and the Waker of its reply (for the scheduler to call).
using Handler = std::function<Reply(const HttpRequest&, const Waker&)>;

/// One row of the route table.
struct Route {
  std::string method;  ///< "GET" (also answers HEAD) or "POST"
  /// "/v1/completions". Every route is reachable with and without the "/v1" prefix
  /// ("/completions", "/v1/health"), as llama-server's routes are.
  std::string path;
  Handler handler;
  bool open = false;  ///< served without the API key (health checks)
  bool fast = false;  ///< cheap and never blocks: runs on the event thread instead of a worker
};

/// Whether `origin` is "*" or a serialised origin scheme://host[:port] (RFC 6454 §6.2: no path,
/// no trailing '/', port in [1, 65535]), the only forms a browser's Origin header can match.
bool valid_cors_origin(std::string_view origin);

/// Throws kvevict::Error naming the first origin valid_cors_origin refuses (as `--cors-origin`).
void check_cors_origins(const std::vector<std::string>& origins);

/// Settings of the transport.
struct HttpOptions {
  HttpLimits limits;
  std::string api_key;  ///< non-empty: every route not marked open needs "Authorization: Bearer KEY" (else 401)
  /// Origins browsers may call from ("*" = any); empty = no CORS headers (a browser page on
  /// another origin cannot read the answers).
  std::vector<std::string> cors_origins;
  /// Body of the answers the transport gives itself (401, 404, 405, 413, 431, 400 for a POST
  /// without a body, 500 when a handler throws, 503 while stopping). Default: plain text.
  std::function<HttpResponse(int status, const std::string& message)> error_page;
};

/// The server. Thread-safe: stop() may be called from any thread (a signal-watching one).
class HttpServer {
 public:
  /// Checks the table (no duplicate method + path, paths start with '/'), the limits (each
  /// >= 1) and the CORS origins (valid_cors_origin); throws kvevict::Error naming the bad one.
  HttpServer(std::vector<Route> routes, HttpOptions opt);
  ~HttpServer();  ///< stop()
  /// Binds and listens on host:port (port 0 picks a free port; backlog SOMAXCONN). Returns the
  /// port. Throws kvevict::Error naming host and port when it fails.
  int bind(const std::string& host, int port);
  /// Starts the event and worker threads (after bind(); without it the server only serves
  /// connections given to add_connection). Raises the open-file limit to fit max_connections
  /// when it can, and lowers max_connections to fit when it cannot (effective_max_connections).
  /// Throws kvevict::Error when the library cannot start. Does nothing when already started.
  void start();
  /// Blocks until stop().
  void wait();
  /// Stops: replies still waiting get their final answer (poll/pull with stopping), the
  /// listener closes, connections close, threads are joined. Idempotent.
  void stop();
  /// Serves an already connected stream socket (tests and the fuzz harness use a socketpair);
  /// the server owns it from now on. Call after start().
  void add_connection(int fd);
  /// Connections open now.
  int64_t open_connections() const;
  /// max_connections after start() fitted it to the open-file limit.
  int effective_max_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvevict::serve
