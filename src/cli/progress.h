// Progress of a long command on stderr: a bar with ETA redrawn in place on a terminal, plain
// lines at a fixed interval otherwise (a batch job's log shows the run advancing).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace kvevict::cli {

/// Counts units of work (rollouts, trials, chunks, tokens) toward a known total. Not thread-safe:
/// call from one thread. Everything goes to stderr; stdout stays the command's result.
class Progress {
 public:
  /// `what` names the command ("eval"), `unit` the counted things ("rollouts"). `done` units were
  /// finished before this run (a resumed eval): they count toward the bar but not the ETA.
  /// Plain lines come every KVEVICT_PROGRESS_SECONDS seconds (default 30) when stderr is not a
  /// terminal; KVEVICT_PROGRESS=0 turns all output off, =1 forces plain lines, =bar forces the bar.
  /// `allow_bar` = false keeps to plain lines even on a terminal (for commands whose stdout
  /// prints rows as it goes, which a redrawn bar would garble).
  Progress(std::string what, int64_t total, std::string unit, int64_t done = 0, bool allow_bar = true);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Marks `n` more units done; `note` (e.g. "acc 0.412") is shown after the counts.
  void add(int64_t n = 1, const std::string& note = "");
  /// Erases the bar from the terminal line (before printing a result row to stdout); the next
  /// add() draws it again. No effect in plain-line mode.
  void clear();
  /// Prints `text` as its own stderr line without breaking the bar (which is redrawn below it).
  void message(const std::string& text);
  /// Ends the bar's line (terminal) or prints a last plain line. Idempotent; the destructor calls it.
  void finish();

  /// "1h02m", "3m07s", "12s".
  static std::string format_duration(double seconds);

 private:
  void draw(bool force);
  std::string line() const;

  enum class Mode { Off, Bar, Lines };
  Mode mode_;
  std::string what_, unit_, note_;
  int64_t total_, done_, start_done_;
  double interval_s_;
  bool drawn_ = false, finished_ = false;
  std::chrono::steady_clock::time_point t0_, last_;
};

}  // namespace kvevict::cli
