// The 64-client streaming load test (serve_test.cpp's LoadTest64ConcurrentStreamingClients) run
// while three hostile clients are active, each from its own loopback address so the per-client
// connection cap applies to it alone:
//  * slowloris (127.0.0.2): keeps up to 150 connections open, trickling one header byte every
//    200 ms (the server's read timeout is set to 1 s here, so each is closed and reopened);
//  * malformed and oversized requests (127.0.0.3): invalid JSON, a 100,000-level nested body, an
//    unknown field, a body over --max-body by Content-Length and chunked, a request line over the
//    header limit, bytes that are no HTTP: every one must get a 4xx (or, for non-HTTP, a close);
//  * hang-ups (127.0.0.4): streaming requests of 2,000 tokens dropped after the first event
//    (left running, they would hold the pool for many seconds).
// Pass: every well-formed request of the load completes with its tokens, no hostile request gets
// a 2xx or 5xx, the KV pool returns to 0 bytes and nothing runs afterwards, the server still
// answers. Figures (requests, errors, p99 latency, peak RSS of this process, which holds the
// server) are printed for the record; they are not asserted (no timed assertions).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <sys/socket.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "raw_http.h"
#include "serve_fixture.h"

namespace kvevict {
namespace {

using json = nlohmann::json;

TEST(ServeFaults, LoadTestCompletesWhileSlowMalformedAndHangingUpClientsAreActive) {
  test::raise_fd_limit(4096);
  serve::ApiOptions ao;
  ao.http.read_timeout_s = 1;
  ao.http.timeout_s = 1;
  ao.http.max_connections_per_client = 100;
  ao.http.max_body_bytes = 64 << 10;
  TestServer s(test::reasoner_model(), small_opts(), ao);
  const int port = s.port();
  std::atomic<bool> stop{false};
  std::atomic<int64_t> slow_opened{0}, bad_sent{0}, bad_wrong{0}, hangups{0};
  std::vector<std::string> wrong_answers;
  std::mutex wrong_mu;

  std::thread slowloris([&] {
    std::vector<int> fds;
    const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: t\r\nX-Slow: ";
    std::vector<size_t> sent;
    while (!stop) {
      while (fds.size() < 150) {
        const int fd = test::connect_from(port, "127.0.0.2");
        if (fd < 0) break;
        fds.push_back(fd);
        sent.push_back(0);
        slow_opened += 1;
      }
      for (size_t i = 0; i < fds.size();) {
        // One byte each; a connection the server closed (timeout or cap) is replaced next round.
        const char c = sent[i] < head.size() ? head[sent[i]] : 'a';
        char b;
        const ssize_t got = ::recv(fds[i], &b, 1, MSG_DONTWAIT);  // 0: closed; >0: an answer (e.g. 408)
        if (got >= 0 || !test::send_all(fds[i], std::string(1, c))) {
          ::close(fds[i]);
          fds.erase(fds.begin() + static_cast<long>(i));
          sent.erase(sent.begin() + static_cast<long>(i));
          continue;
        }
        sent[i] += 1;
        ++i;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    for (const int fd : fds) ::close(fd);
  });

  std::thread malformed([&] {
    auto post = [](const std::string& body, const std::string& extra = "") {
      return "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nConnection: close\r\n" +
             extra + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    };
    const std::string chunk = std::string(16 << 10, 'x');
    std::string chunked = "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    for (int i = 0; i < 8; ++i) chunked += fmt::format("{:x}\r\n{}\r\n", chunk.size(), chunk);  // 128 KiB > 64 KiB
    chunked += "0\r\n\r\n";
    const std::vector<std::string> cases = {
        post(R"({"prompt": "A", "max_tokens": )"),                                           // invalid JSON
        post(R"({"prompt":"Hi","model":)" + std::string(100000, '[') + std::string(100000, ']') + "}"),
        post(R"({"prompt": "A", "max_tokns": 4})"),                                          // unknown field
        post(std::string(100 << 10, ' ')),                                                   // over --max-body
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000000\r\nConnection: close\r\n\r\n{",
        chunked,
        "GET /" + std::string(64 << 10, 'a') + " HTTP/1.1\r\nHost: t\r\n\r\n",               // request line too long
        post(R"({"prompt": "A"})", "X-Big: " + std::string(40 << 10, 'b') + "\r\n"),         // headers too long
    };
    for (size_t k = 0; !stop; k = (k + 1) % (cases.size() + 1)) {
      if (k == cases.size()) {  // not HTTP at all: a 400 or a closed connection
        // A TLS-like hello (its NUL byte included): sizeof, not a counted length (18 read past it).
        static constexpr char kNotHttp[] = "\x16\x03\x01\x02\x00garbage\r\n\r\n";
        const std::string got = test::raw_http(port, std::string(kNotHttp, sizeof kNotHttp - 1), "127.0.0.3");
        bad_sent += 1;
        if (!got.empty() && (test::status_of(got) < 400 || test::status_of(got) >= 500)) bad_wrong += 1;
        continue;
      }
      const std::string got = test::raw_http(port, cases[k], "127.0.0.3");
      bad_sent += 1;
      const int st = test::status_of(got);
      if (st < 400 || st >= 500) {
        bad_wrong += 1;
        std::lock_guard<std::mutex> lock(wrong_mu);
        if (wrong_answers.size() < 4) wrong_answers.push_back(fmt::format("case {}: {}", k, got.substr(0, 200)));
      }
    }
  });

  std::thread hangup([&] {
    const std::string body = R"({"prompt": "AB\nCD\n", "max_tokens": 2000, "ignore_eos": true, "stream": true})";
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    while (!stop) {
      const int fd = test::connect_from(port, "127.0.0.4");
      if (fd < 0) continue;
      if (test::send_all(fd, req))
        test::read_for(fd, 30, [](const std::string& got) { return got.find("data: {") != std::string::npos; });
      ::close(fd);  // mid-stream
      hangups += 1;
    }
  });

  // The hostile clients are at work before the load starts.
  for (int i = 0; i < 500 && (slow_opened < 150 || bad_sent < 9 || hangups < 1); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  serve::LoadOptions lo;
  lo.port = port;
  lo.clients = 64;
  lo.requests = 640;
  lo.time_limit_s = 120;
  lo.body = {{"prompt", "AB\nCD\n"}, {"max_tokens", 24}, {"ignore_eos", true}, {"temperature", 0.7}};
  const serve::LoadResult r = serve::run_load(lo);
  stop = true;
  slowloris.join();
  malformed.join();
  hangup.join();

  EXPECT_EQ(r.errors, 0) << (r.error_messages.empty() ? "" : r.error_messages[0]);
  EXPECT_EQ(r.ok, 640);
  EXPECT_EQ(r.output_tokens, 640 * 24);
  EXPECT_GT(slow_opened, 150);  // connections were closed by the server and reopened
  EXPECT_GE(bad_sent, static_cast<int64_t>(9));
  EXPECT_EQ(bad_wrong, 0) << (wrong_answers.empty() ? "" : wrong_answers[0]);
  EXPECT_GE(hangups, 1);
  // Hung-up requests are cancelled within a step: the pool drains to 0 and nothing runs.
  double pool = -1, running = -1;
  for (int i = 0; i < 500; ++i) {
    pool = s.metric("kvevict:kv_pool_used_bytes");
    running = s.metric("kvevict:num_requests_running");
    if (pool == 0 && running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(pool, 0);
  EXPECT_EQ(running, 0);
  EXPECT_EQ(s.client()->Get("/health")->status, 200);
  // Every hang-up was cancelled (none of their 2,000 tokens could finish first).
  EXPECT_EQ(s.metric("kvevict:requests_cancelled_total"), static_cast<double>(hangups));
  double load1 = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load1) != 1) load1 = -1;
    std::fclose(f);
  }
  std::printf(
      "[load with faults] %lld requests ok, %lld errors, %.2f s, latency p50 %.3f s p99 %.3f s, TTFT p99 %.3f s; "
      "hostile: %lld slow connections opened, %lld malformed/oversized sent (%lld answered wrongly), %lld hang-ups; "
      "cancelled %.0f; peak RSS %.1f MiB; load average %.2f\n",
      static_cast<long long>(r.ok), static_cast<long long>(r.errors), r.wall_s, serve::quantile(r.latency_s, 0.5),
      serve::quantile(r.latency_s, 0.99), serve::quantile(r.ttft_s, 0.99), static_cast<long long>(slow_opened),
      static_cast<long long>(bad_sent), static_cast<long long>(bad_wrong), static_cast<long long>(hangups),
      s.metric("kvevict:requests_cancelled_total"), static_cast<double>(test::peak_rss_bytes()) / 1048576.0, load1);
}

}  // namespace
}  // namespace kvevict
