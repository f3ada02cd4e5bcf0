// What `kvevict eval` keeps on disk: the run's settings (config.json) and one JSON line per
// finished rollout (rollouts.jsonl), appended as each rollout finishes, so an interrupted run
// resumes without recomputing anything and never mixes two configurations in one directory.
//
// Layout of an output directory:
//   config.json      EvalSettings::to_json(), written once when the directory is first used
//   rollouts.jsonl   RolloutRecord::to_json() per line, in completion order
//   summary.{md,csv,json}, *.png   derived from the two above (eval/summary.h)
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace kvevict {

/// One (policy, budget) cell of the grid. budget 0: the policy does not evict (`full`).
struct CellSpec {
  std::string policy;
  int64_t budget = 0;
  /// "full" or "random@256".
  std::string label() const;
  bool operator==(const CellSpec&) const = default;
};

/// Everything that determines the results of an eval run (thread count and output paths do not).
/// Two runs may share an output directory only when their settings are equal.
struct EvalSettings {
  std::string model_file;       ///< file name of the GGUF (not its directory, so a moved file still matches)
  uint64_t model_bytes = 0;     ///< its size
  /// FNV-1a 64 of its bytes (model_path_digest in cli/common.h), hex: a retrained file of the same
  /// name and size is another model, whose rollouts must not resume this run's. Empty in a
  /// config.json written before digests existed (omitted from to_json() then; such a run is not
  /// resumed, with a message saying why).
  std::string model_digest;
  std::string tasks_file;       ///< file name of the task file
  std::string tasks_format;     ///< "math500", "gsm8k" or "kvevict"
  int64_t n_tasks = 0;          ///< problems in the whole run (all shards)
  std::string tasks_digest;     ///< tasks_digest() of those problems
  std::vector<CellSpec> cells;  ///< grid, in report order
  std::string reference;        ///< policy the others are compared with
  int rollouts = 1;             ///< per problem and cell
  double temperature = 0.6, top_p = 0.95;
  int top_k = 0;
  int64_t max_length = 0;      ///< cap on prompt + generated tokens
  int64_t max_new_tokens = 0;  ///< cap on generated tokens (0 = none besides max_length)
  uint64_t seed = 0;
  nlohmann::json eviction;      ///< schedule options (r, sinks, protection, long-prompt mode, positions, params)
  std::string prompt_template;  ///< "plain" or "llama2"
  bool math_suffix = true;
  int bootstrap_resamples = 10000;
  int shard_index = 0, shard_count = 1;

  /// The config.json document: {"kvevict_eval_version": 1, "model": {...}, "tasks": {...},
  /// "cells": [...], ..., "shard": {"index", "count"}}.
  nlohmann::json to_json() const;
  /// Throws kvevict::Error naming `where` and the key when a field is missing or mistyped.
  static EvalSettings from_json(const nlohmann::json& j, const std::string& where);
  /// True when problem `index` belongs to this run's shard (index mod shard_count == shard_index).
  bool in_shard(int64_t index) const { return index % shard_count == shard_index; }
  /// Problems of this shard among the n_tasks.
  int64_t problems_in_shard() const;
};

/// One finished rollout.
struct RolloutRecord {
  std::string policy;
  int64_t budget = 0;  ///< 0 for a policy that does not evict
  std::string problem_id;
  int64_t problem_index = 0;  ///< EvalTask::index
  int rollout = 0;            ///< 0 .. rollouts-1
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  std::string finish;                    ///< "eos", "length" (cap reached) or "prompt_too_long" (nothing generated)
  std::string text;                      ///< generated text (prompt excluded)
  std::optional<std::string> extracted;  ///< graded answer taken from the text
  std::string gold;
  bool correct = false;
  std::string grade = "graded";  ///< grade_outcome_name: "graded", "no_answer", "answer_too_long", ...
  int64_t rounds = 0;            ///< eviction rounds
  int64_t peak_slots = 0;        ///< max live slots per (layer, KV head)
  int64_t peak_kv_bytes = 0;     ///< peak_slots x KvShape::bytes_per_token()
  int64_t kv_bytes = 0;          ///< bytes of the cache, a prompt shared with other rollouts counted in full
  double prefill_ms = 0, decode_ms = 0, score_ms = 0, compact_ms = 0;  ///< SequenceStats, ms
  /// For a task with a fact stated once (the `once` family's code slot, tasks/generator.h):
  /// whether any (layer, KV head) still held that prompt position when the rollout ended.
  /// Absent for other tasks. JSON key "fact_kept" (omitted when absent).
  std::optional<bool> fact_kept;

  CellSpec cell() const { return {policy, budget}; }
  /// Identity of the rollout within a run: policy, budget, problem id, rollout index.
  std::string key() const;
  /// One rollouts.jsonl object: every field above; budget null for 0, extracted null when absent.
  nlohmann::json to_json() const;
  /// Throws kvevict::Error naming `where` and the key when a field is missing or mistyped.
  static RolloutRecord from_json(const nlohmann::json& j, const std::string& where);
};

/// Key of a rollout as RolloutRecord::key() builds it.
std::string rollout_key(const std::string& policy, int64_t budget, const std::string& problem_id, int rollout);

/// First difference between two JSON documents as "PATH: A (there) vs B (here)", or "" when equal.
std::string json_difference(const nlohmann::json& there, const nlohmann::json& here);

/// The complete records of a rollouts.jsonl.
struct RolloutFile {
  std::vector<RolloutRecord> records;
  int64_t complete_bytes = 0;  ///< bytes up to and including the last newline
  int64_t torn_bytes = 0;      ///< bytes after it: a last line cut short by a kill (not parsed)
};

/// Reads a rollouts.jsonl line by line. A last line without its newline is not parsed (it is
/// reported in torn_bytes and, when `warn` is set, by a warning). Without `keep_text` each
/// record's text is dropped as it is read (summaries do not need it; traces can be long).
/// Throws kvevict::Error "FILE:LINE: ..." for any other unparseable line or a repeated key.
RolloutFile read_rollouts(const std::string& path, bool keep_text, const std::function<void(const std::string&)>& warn);

/// Reads DIR/config.json. Throws kvevict::Error when it is missing or malformed.
EvalSettings read_settings(const std::string& dir);

/// Checks that `dir` may hold a run with `settings`: a config.json there must equal them, and a
/// rollouts.jsonl there must come with a config.json. Returns whether a config.json with rollouts
/// beside it exists (one beside no rollouts.jsonl, or one without a complete line, is a run that
/// never finished a rollout: false, and the caller replaces it). Call it holding the directory's
/// DirLock, so that run is known to be over.
/// Throws kvevict::Error ("refusing to mix runs", naming the first difference) otherwise.
bool check_settings_match(const std::string& dir, const EvalSettings& settings);

/// An exclusive lock on an output directory (flock on DIR/.lock), held by the process that
/// writes the directory: two runs never append to one rollouts.jsonl, and a folder whose run is
/// still before its first rollout is never taken over (check_settings_match). Released when
/// destroyed or when the process ends, however it ends.
class DirLock {
 public:
  DirLock() = default;
  /// Throws kvevict::Error naming `dir` when another process holds its lock. Where the file
  /// system has no flock (an error other than "held"), the run goes on unlocked.
  static DirLock acquire(const std::string& dir);
  DirLock(DirLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  DirLock& operator=(DirLock&& o) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();

 private:
  int fd_ = -1;
};

/// An output directory opened for a run.
class ResultsDir {
 public:
  static constexpr const char* kConfig = "config.json";
  static constexpr const char* kRollouts = "rollouts.jsonl";

  /// Creates `dir` if needed, locks it (DirLock) for as long as this object lives and claims it
  /// for `settings`; truncates a torn last line of rollouts.jsonl. Throws kvevict::Error (leaving
  /// every file as it was) when: another process holds the lock; `dir` holds a config.json with
  /// different settings (the message names the first difference); it holds rollouts.jsonl but no config.json; it holds
  /// finished rollouts and `resume` is false; a file cannot be read or written.
  static ResultsDir open(const std::string& dir, const EvalSettings& settings, bool resume,
                         const std::function<void(const std::string&)>& warn);

  const std::string& path() const { return dir_; }
  /// Rollouts finished by earlier runs (text dropped, see read_rollouts).
  const std::vector<RolloutRecord>& existing() const { return existing_; }
  /// Appends one line and flushes it to the kernel. Throws kvevict::Error on a write error.
  void append(const RolloutRecord& r);

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const {
      if (f) std::fclose(f);
    }
  };
  DirLock lock_;
  std::string dir_;
  std::vector<RolloutRecord> existing_;
  std::unique_ptr<std::FILE, FileCloser> out_;
};

/// Writes `text` to `path` atomically (temporary file + rename). Throws kvevict::Error.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace kvevict
