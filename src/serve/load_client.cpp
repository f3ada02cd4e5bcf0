#include "serve/load_client.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <sstream>
#include <thread>

#include "util/error.h"

namespace kvevict::serve {
namespace {
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double metric_value(const std::string& page, const std::string& name) {
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > name.size() && line.compare(0, name.size(), name) == 0 && line[name.size()] == ' ')
      return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

LoadResult run_load(const LoadOptions& opt) {
  if (opt.clients < 1) throw Error(fmt::format("--clients {}: must be >= 1", opt.clients));
  if (opt.requests < 1) throw Error(fmt::format("--requests {}: must be >= 1", opt.requests));
  LoadResult R;
  R.texts.assign(static_cast<size_t>(opt.requests), "");
  std::mutex mu;
  std::atomic<int> next{0};
  std::atomic<bool> finished{false};
  const auto t0 = Clock::now();
  httplib::Headers headers;
  if (!opt.api_key.empty()) headers.emplace("Authorization", "Bearer " + opt.api_key);

  // Samples the server's running-sequence gauge while the load runs.
  std::thread sampler([&] {
    httplib::Client c(opt.host, opt.port);
    c.set_read_timeout(5, 0);
    while (!finished) {
      if (auto r = c.Get("/metrics", headers); r && r->status == 200) {
        const double v = metric_value(r->body, "kvevict:num_sequences_running");
        std::lock_guard<std::mutex> lock(mu);
        R.peak_sequences = std::max(R.peak_sequences, static_cast<int64_t>(v));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  auto client = [&] {
    httplib::Client c(opt.host, opt.port);
    c.set_read_timeout(static_cast<time_t>(opt.read_timeout_s), 0);
    c.set_write_timeout(30, 0);
    while (true) {
      const int i = next.fetch_add(1);
      if (i >= opt.requests || secs(t0, Clock::now()) > opt.time_limit_s) return;
      json body = opt.body;
      body["stream"] = true;
      body["stream_options"] = {{"include_usage", true}};
      if (!body.contains("seed")) body["seed"] = opt.seed0 + static_cast<uint64_t>(i);
      const std::string payload = body.dump();
      std::string buf, text, finish, error;
      bool done = false;
      int64_t tokens = -1;
      std::vector<double> gaps;
      Clock::time_point first{}, last{};
      const auto start = Clock::now();
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.headers = headers;
      req.set_header("Content-Type", "application/json");
      req.body = payload;
      req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
        buf.append(data, len);
        size_t pos;
        while ((pos = buf.find("\n\n")) != std::string::npos) {
          const std::string ev = buf.substr(0, pos);
          buf.erase(0, pos + 2);
          if (ev.rfind("data: ", 0) != 0) continue;
          const std::string d = ev.substr(6);
          if (d == "[DONE]") {
            done = true;
            continue;
          }
          json j = json::parse(d, nullptr, false);
          if (j.is_discarded()) {
            error = "unparsable event: " + d.substr(0, 80);
            continue;
          }
          if (j.contains("error")) {
            error = j["error"].value("message", "error event");
            continue;
          }
          if (j.contains("usage") && j["usage"].is_object())
            tokens = j["usage"].value("completion_tokens", int64_t{-1});
          for (const json& ch : j.value("choices", json::array())) {
            const std::string t = ch.value("text", "");
            if (!t.empty()) {
              const auto now = Clock::now();
              if (first == Clock::time_point{})
                first = now;
              else
                gaps.push_back(secs(last, now));
              last = now;
              text += t;
            }
            if (ch.contains("finish_reason") && ch["finish_reason"].is_string()) finish = ch["finish_reason"];
          }
        }
        return true;
      };
      auto res = c.send(req);
      const auto end = Clock::now();
      std::lock_guard<std::mutex> lock(mu);
      if (!res) error = fmt::format("HTTP client error: {}", httplib::to_string(res.error()));
      // With a content receiver the body of an error answer arrives there, not in res->body.
      else if (res->status != 200)
        error = fmt::format("HTTP {}: {}", res->status, (res->body.empty() ? buf : res->body).substr(0, 300));
      else if (error.empty() && (!done || finish.empty() || tokens < 0))
        error = fmt::format("incomplete stream (done={}, finish_reason='{}', usage={})", done, finish, tokens);
      if (!error.empty()) {
        R.errors += 1;
        if (R.error_messages.size() < 5) R.error_messages.push_back(error);
        continue;
      }
      R.ok += 1;
      R.output_tokens += tokens;
      R.texts[static_cast<size_t>(i)] = text;
      if (first != Clock::time_point{}) R.ttft_s.push_back(secs(start, first));
      R.itl_s.insert(R.itl_s.end(), gaps.begin(), gaps.end());
      R.latency_s.push_back(secs(start, end));
    }
  };
  std::vector<std::thread> threads;
  for (int k = 0; k < opt.clients; ++k) threads.emplace_back(client);
  for (auto& t : threads) t.join();
  R.wall_s = secs(t0, Clock::now());
  finished = true;
  sampler.join();
  return R;
}

}  // namespace kvevict::serve
