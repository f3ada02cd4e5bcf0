// Helpers for tests that run the kvevict binary (test_paths.h: kvevict::test::kvevict_binary()) as a
// child process and read an eval output directory.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_paths.h"
#include "test_tmp.h"

extern char** environ;

namespace kvevict::test {

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A running kvevict; stdout and stderr go to files.
struct Child {
  pid_t pid = -1;
  std::string out_path, err_path;
};

/// Starts `kvevict args...` with stdout/stderr redirected to files under `log_dir`.
inline Child spawn_kvevict(const std::vector<std::string>& args, const std::string& log_dir, const std::string& tag) {
  Child c;
  c.out_path = log_dir + "/" + tag + ".out";
  c.err_path = log_dir + "/" + tag + ".err";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, c.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, c.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> all = {kvevict_binary()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (posix_spawn(&c.pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return c;
}

/// Waits for the child; returns its exit code (-1 when it was killed by a signal).
inline int wait_child(const Child& c) {
  int status = 0;
  if (c.pid <= 0 || waitpid(c.pid, &status, 0) != c.pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

struct RunResult {
  int code = -1;
  std::string out, err;
};

/// Runs `kvevict args...` to completion.
inline RunResult run_kvevict(const std::vector<std::string>& args, const std::string& log_dir, const std::string& tag) {
  const Child c = spawn_kvevict(args, log_dir, tag);
  RunResult r;
  r.code = wait_child(c);
  r.out = slurp(c.out_path);
  r.err = slurp(c.err_path);
  return r;
}

/// Complete lines of a file (the text before the last '\n').
inline std::vector<std::string> complete_lines(const std::string& path) {
  const std::string data = slurp(path);
  std::vector<std::string> lines;
  size_t pos = 0;
  for (size_t nl = data.find('\n'); nl != std::string::npos; nl = data.find('\n', pos)) {
    lines.push_back(data.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return lines;
}

/// Rollout records of an output directory keyed by policy|budget|problem|rollout, with the
/// wall-clock timing fields removed (they differ between any two runs).
inline std::map<std::string, nlohmann::json> rollouts_without_timing(const std::string& dir) {
  std::map<std::string, nlohmann::json> out;
  for (const std::string& line : complete_lines(dir + "/rollouts.jsonl")) {
    nlohmann::json j = nlohmann::json::parse(line);
    for (const char* k : {"prefill_ms", "decode_ms", "score_ms", "compact_ms"}) j.erase(k);
    const std::string key = j["policy"].get<std::string>() + "|" + j["budget"].dump() + "|" +
        j["problem_id"].get<std::string>() + "|" + j["rollout"].dump();
    out[key] = j;
  }
  return out;
}

/// summary.json's cells without the timing-derived field.
inline nlohmann::json summary_cells_without_timing(const std::string& dir) {
  nlohmann::json cells = nlohmann::json::parse(slurp(dir + "/summary.json"))["cells"];
  for (auto& c : cells) c.erase("decode_tok_s");
  return cells;
}

}  // namespace kvevict::test
