// Runs the kvevict binary through the shell (popen) and captures stdout + stderr together.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "test_paths.h"

namespace kvevict::test {

struct CliResult {
  int code = -1;    ///< exit code, -1 when killed by a signal or not started
  std::string out;  ///< stdout and stderr, interleaved
};

/// Runs the shell command line `cmd` (popen; the caller redirects stderr if it wants it) to
/// completion and captures its stdout.
inline CliResult run_shell(const std::string& cmd) {
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// Runs `kvevict <args>` (args are passed through the shell unquoted) to completion.
inline CliResult run_cli(const std::string& args) { return run_shell(kvevict_binary() + " " + args + " 2>&1"); }

}  // namespace kvevict::test
