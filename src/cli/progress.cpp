#include "cli/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace kvevict::cli {

using Clock = std::chrono::steady_clock;

Progress::Progress(std::string what, int64_t total, std::string unit, int64_t done, bool allow_bar)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      total_(total),
      done_(done),
      start_done_(done),
      interval_s_(30.0),
      t0_(Clock::now()),
      last_(t0_) {
  mode_ = allow_bar && isatty(fileno(stderr)) != 0 ? Mode::Bar : Mode::Lines;
  if (const char* m = std::getenv("KVEVICT_PROGRESS")) {
    const std::string_view v(m);
    if (v == "0")
      mode_ = Mode::Off;
    else if (v == "1")
      mode_ = Mode::Lines;
    else if (v == "bar")
      mode_ = Mode::Bar;
  }
  if (const char* s = std::getenv("KVEVICT_PROGRESS_SECONDS")) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end != s && v >= 0) interval_s_ = v;
  }
}

Progress::~Progress() { finish(); }

std::string Progress::format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s / 60 % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string Progress::line() const {
  const double secs = std::chrono::duration<double>(Clock::now() - t0_).count();
  const int64_t fresh = done_ - start_done_;
  std::string eta = "?";
  if (fresh > 0 && total_ >= done_)
    eta = format_duration(secs / static_cast<double>(fresh) * static_cast<double>(total_ - done_));
  const double pct = total_ > 0 ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_) : 100.0;
  return fmt::format("{}/{} {} ({:.1f}%){} | elapsed {} | ETA {}", done_, total_, unit_, pct,
                     note_.empty() ? "" : " | " + note_, format_duration(secs), eta);
}

void Progress::draw(bool force) {
  const auto now = Clock::now();
  const double since = std::chrono::duration<double>(now - last_).count();
  if (mode_ == Mode::Bar) {
    if (!force && drawn_ && since < 0.1 && done_ < total_) return;  // at most ~10 redraws a second
    constexpr int kWidth = 30;
    const double frac = total_ > 0 ? std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_)) : 1.0;
    const int fill = static_cast<int>(frac * kWidth);
    fmt::print(stderr, "\r{}: [{}{}] {}   ", what_, std::string(static_cast<size_t>(fill), '#'),
               std::string(static_cast<size_t>(kWidth - fill), '.'), line());
  } else if (mode_ == Mode::Lines) {
    if (!force && since < interval_s_) return;
    fmt::print(stderr, "{}: {}\n", what_, line());
  } else {
    return;
  }
  std::fflush(stderr);
  drawn_ = true;
  last_ = now;
}

void Progress::add(int64_t n, const std::string& note) {
  done_ += n;
  if (!note.empty()) note_ = note;
  draw(false);
}

void Progress::clear() {
  if (mode_ != Mode::Bar || !drawn_) return;
  fmt::print(stderr, "\r\033[K");
  std::fflush(stderr);
}

void Progress::message(const std::string& text) {
  if (mode_ == Mode::Bar && drawn_) fmt::print(stderr, "\r\033[K");
  fmt::print(stderr, "{}\n", text);
  if (mode_ == Mode::Bar && drawn_) draw(true);
  std::fflush(stderr);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (mode_ == Mode::Bar && drawn_) {
    draw(true);
    fmt::print(stderr, "\n");
  } else if (mode_ == Mode::Lines && drawn_) {  // short runs stay quiet
    draw(true);
  }
}

}  // namespace kvevict::cli
