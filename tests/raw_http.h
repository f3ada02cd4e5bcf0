// Raw HTTP over loopback sockets, for requests an HTTP client library will not send (no
// Content-Length, two requests in one write, a 256 MiB request line, a client that stalls) and
// for connections from a chosen 127.0.0.x source address (per-client caps).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace kvevict::test {

/// A connected TCP socket to 127.0.0.1:port from source address `from` (any 127.0.0.0/8 address
/// works on Linux loopback); -1 on failure.
inline int connect_from(int port, const char* from = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  inet_pton(AF_INET, from, &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(port));
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// Sends all of `data` (false when the peer closed or reset first).
inline bool send_all(int fd, const std::string& data) {
  size_t at = 0;
  while (at < data.size()) {
    const ssize_t n = ::send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

/// Reads until the peer closes, `timeout_s` passes, or `enough` returns true for what came.
template <typename Enough>
std::string read_for(int fd, double timeout_s, Enough enough) {
  std::string out;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[65536];
  while (!enough(out)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, static_cast<int>(left.count())) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

/// Reads until the peer closes or `timeout_s` passes.
inline std::string read_all(int fd, double timeout_s = 10) {
  return read_for(fd, timeout_s, [](const std::string&) { return false; });
}

/// True when the peer closed (or reset) the connection within `timeout_s`, reading and
/// dropping anything it sent first.
inline bool closed_by_peer(int fd, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, static_cast<int>(left.count())) <= 0) return false;
    if (::recv(fd, buf, sizeof buf, 0) <= 0) return true;
  }
}

/// Sends `raw` (whole requests) on a fresh connection and returns everything that comes back
/// until the server closes it (or 10 s pass).
inline std::string raw_http(int port, const std::string& raw, const char* from = "127.0.0.1") {
  const int fd = connect_from(port, from);
  if (fd < 0) return "";
  std::string out;
  if (send_all(fd, raw)) out = read_all(fd);
  ::close(fd);
  return out;
}

/// The status code of the first response in `raw`, 0 when there is none.
inline int status_of(const std::string& raw) {
  int code = 0;
  return std::sscanf(raw.c_str(), "HTTP/1.%*d %d", &code) == 1 ? code : 0;
}

/// The body of the last response in `raw` (after its blank line).
inline std::string body_of(const std::string& raw) {
  const size_t at = raw.rfind("\r\n\r\n");
  return at == std::string::npos ? "" : raw.substr(at + 4);
}

/// Peak resident memory of this process so far (VmHWM), bytes; -1 when unknown.
inline long long peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string key;
  long long kib = 0;
  std::string unit;
  while (f >> key) {
    if (key == "VmHWM:") return (f >> kib) ? kib * 1024 : -1;
    std::getline(f, unit);
  }
  return -1;
}

/// Raises this process's open-file soft limit to at least `want` (as far as the hard limit
/// allows); returns the soft limit now.
inline long long raise_fd_limit(long long want) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur != RLIM_INFINITY && static_cast<long long>(rl.rlim_cur) < want) {
    rl.rlim_cur = (rl.rlim_max == RLIM_INFINITY || static_cast<long long>(rl.rlim_max) > want)
        ? static_cast<rlim_t>(want)
        : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur == RLIM_INFINITY ? want : static_cast<long long>(rl.rlim_cur);
}

}  // namespace kvevict::test
