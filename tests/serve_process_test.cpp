// `kvevict serve` as a process: the ready line, the official `openai` Python client against
// /v1/completions and /v1/chat/completions (tests/serve_openai_client.py) on the project's own
// model and stories260K, and SIGTERM with requests in flight (exit 0, every request answered).
#include <gtest/gtest.h>

#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "test_paths.h"

namespace kvevict {
namespace {

using json = nlohmann::json;

// A `kvevict serve` child on an ephemeral loopback port; killed (SIGKILL) if a test fails early.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> args) {
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      close(out[0]);
      close(out[1]);
      std::vector<char*> argv;
      static std::string bin = test::kvevict_binary();
      argv.push_back(bin.data());
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    close(out[1]);
    out_ = fdopen(out[0], "r");
    char line[4096];
    if (fgets(line, sizeof line, out_)) ready_ = line;
    std::smatch m;
    if (std::regex_search(ready_, m, std::regex(R"(http://127\.0\.0\.1:(\d+))"))) port_ = std::stoi(m[1]);
  }
  ~ServerProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_) fclose(out_);
  }
  int port() const { return port_; }
  const std::string& ready_line() const { return ready_; }
  /// Sends `sig` and waits (bounded, 60 s) for the exit; returns the exit status or -1.
  int signal_and_wait(int sig) {
    kill(pid_, sig);
    for (int i = 0; i < 6000; ++i) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  std::string ready_;
  int port_ = 0;
  bool reaped_ = false;
};

void run_openai_client(const std::string& model_path, const std::string& name, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"serve", "-m",          model_path, "--port",  "0", "-t",
                                   "1",     "--kv-memory", "64MiB",    "--alias", name};
  args.insert(args.end(), extra.begin(), extra.end());
  ServerProcess s(args);
  ASSERT_GT(s.port(), 0) << "no ready line: " << s.ready_line();
  EXPECT_NE(s.ready_line().find("admits up to"), std::string::npos) << s.ready_line();
  const std::string script = kvevict::test::source_path("tests/serve_openai_client.py");
  const std::string cmd =
      "python3 '" + script + "' http://127.0.0.1:" + std::to_string(s.port()) + "/v1 '" + name + "'";
  const int rc = std::system(cmd.c_str());
  const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  if (code == 3) {
    const char* ci = std::getenv("CI");
    if (ci && std::string(ci) == "true")
      FAIL() << "the openai package is missing under CI (scripts/setup.sh installs it)";
    GTEST_SKIP() << "python3 `openai` package not installed (pip install openai)";
  }
  EXPECT_EQ(code, 0) << cmd;
  EXPECT_EQ(s.signal_and_wait(SIGINT), 0);
}

TEST(ServeProcess, OpenAIClientOnTheDefaultModel) { run_openai_client(test::reasoner_model(), "reasoner"); }

TEST(ServeProcess, OpenAIClientOnStories260K) {
  if (!std::filesystem::exists(test::stories260k())) GTEST_SKIP() << "missing " << test::stories260k();
  run_openai_client(test::stories260k(), "stories260K");
}

// stories260K has no chat template; --chat-template chatml gives it one, so the client's chat
// calls run (streamed text must equal the non-streamed text).
TEST(ServeProcess, OpenAIClientChatWithTemplateOverride) {
  if (!std::filesystem::exists(test::stories260k())) GTEST_SKIP() << "missing " << test::stories260k();
  run_openai_client(test::stories260k(), "stories260K", {"--chat-template", "chatml"});
}

TEST(ServeProcess, SigtermFinishesInFlightRequestsAndExitsZero) {
  ServerProcess s({"serve", "-m", test::reasoner_model(), "--port", "0", "-t", "1", "--kv-memory", "64MiB",
                   "--shutdown-grace", "0.5"});
  ASSERT_GT(s.port(), 0) << s.ready_line();
  // Four long streaming requests in flight; SIGTERM lands while they run. Each must end with an
  // answer: a complete stream, or an error event followed by [DONE] (never a silent cut).
  std::vector<std::string> bodies(4);
  std::vector<bool> got(4, false);
  std::vector<std::thread> th;
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&, k] {
      httplib::Client c("127.0.0.1", s.port());
      c.set_read_timeout(60, 0);
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.set_header("Content-Type", "application/json");
      req.body = json{{"prompt", "AB\n"}, {"max_tokens", 2000},    {"ignore_eos", true}, {"stream", true},
                      {"seed", k},        {"kv_policy", "random"}, {"kv_budget", 32},    {"kv_buffer", 8}}
                     .dump();
      req.content_receiver = [&, k](const char* d, size_t n, uint64_t, uint64_t) {
        bodies[static_cast<size_t>(k)].append(d, n);
        got[static_cast<size_t>(k)] = true;
        return true;
      };
      c.send(req);
    });
  for (int i = 0; i < 2000; ++i) {
    bool all = true;
    for (int k = 0; k < 4; ++k) all = all && got[static_cast<size_t>(k)];
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(s.signal_and_wait(SIGTERM), 0);
  for (auto& t : th) t.join();
  for (int k = 0; k < 4; ++k) {
    const std::string& b = bodies[static_cast<size_t>(k)];
    EXPECT_NE(b.find("data: [DONE]"), std::string::npos) << "request " << k << " ended without [DONE]";
    const bool complete = b.find("\"finish_reason\":\"length\"") != std::string::npos;
    const bool error = b.find("\"error\"") != std::string::npos && b.find("shutting down") != std::string::npos;
    EXPECT_TRUE(complete || error) << "request " << k << ": neither complete nor told why";
  }
}

TEST(ServeProcess, BadOptionsExitWithOneLineError) {
  const std::string cmd =
      test::kvevict_binary() + " serve -m '" + test::reasoner_model() + "' --port 0 --kv-memory lots 2>&1";
  const test::CliResult r = test::run_shell(cmd);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "kvevict: error: --kv-memory 'lots': expected a positive size such as 268435456, 256MiB or 2GiB\n");
  // No silent truncation or other number syntaxes: a fraction of a byte, hex, an exponent.
  for (const char* v : {"1.5", "1.3k", "0x10", "1e6", "-5", ".5M", "5."}) {
    const test::CliResult q = test::run_shell(test::kvevict_binary() + " serve -m '" + test::reasoner_model() +
                                              "' --port 0 --kv-memory " + v + " 2>&1");
    EXPECT_EQ(q.code, 2) << v;
    EXPECT_NE(q.out.find(std::string("--kv-memory '") + v + "': expected a positive size"), std::string::npos) << q.out;
  }
  // A pool over the machine's available memory would let admitted requests exhaust it (every
  // sequence allocates its reservation whole): refused at start. 100 TiB is over any machine here.
  const test::CliResult big = test::run_shell(test::kvevict_binary() + " serve -m '" + test::reasoner_model() +
                                              "' --port 0 --kv-memory 100000G 2>&1");
  EXPECT_EQ(big.code, 2);
  EXPECT_NE(big.out.find("kvevict: error: --kv-memory 100000G: 107374182400000 bytes is more than the "),
            std::string::npos)
      << big.out;
  EXPECT_NE(big.out.find("of memory available now (MemAvailable); lower it"), std::string::npos) << big.out;
  // An origin with a path could never match a browser's Origin header: refused before the model loads.
  const test::CliResult c = test::run_shell(test::kvevict_binary() + " serve -m '" + test::reasoner_model() +
                                            "' --port 0 --cors-origin http://localhost:3000/ 2>&1");
  EXPECT_EQ(c.code, 2);
  EXPECT_EQ(c.out, "kvevict: error: --cors-origin 'http://localhost:3000/': an origin is scheme://host[:port] (no "
                   "path, no trailing '/'; e.g. http://localhost:3000) or *\n");
  // f16 cannot hold keys re-rotated in float32: refused with the way out.
  const test::CliResult f = test::run_shell(test::kvevict_binary() + " serve -m '" + test::reasoner_model() +
                                            "' --port 0 --kv-type f16 --position-mode cache 2>&1");
  EXPECT_EQ(f.code, 2) << f.out;
  EXPECT_NE(f.out.find("--position-mode cache"), std::string::npos) << f.out;
  EXPECT_EQ(
      test::run_shell(test::kvevict_binary() + " serve -m '" + test::reasoner_model() + "' --port 0 --temp -1 2>&1")
          .code,
      2);
}

TEST(ServeProcess, PoolThatHoldsNoSequenceIsRefusedAtStart) {
  // 10 bytes cannot hold one (B + r)-slot sequence: refuse to start (exit 2, one line) instead of
  // reporting healthy and answering every request with 400.
  const std::string cmd = test::kvevict_binary() + " serve -m '" + test::reasoner_model() +
      "' --port 0 --policy random --budget 64 --buffer 16 --kv-memory 10 2>&1";
  const test::CliResult r = test::run_shell(cmd);
  const std::string& out = r.out;
  EXPECT_EQ(r.code, 2) << out;
  EXPECT_EQ(out.rfind("kvevict: error: --kv-memory 10 bytes holds no sequence of policy random", 0), 0u) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

TEST(ServeProcess, ReasoningBudgetWithoutAThinkingTemplateIsRefusedAtStart) {
  // The default model has no chat template (and chatml has no thinking trace): a budget would
  // bound nothing, so the server refuses to start rather than ignore it.
  for (const std::string extra : {"", " --chat-template chatml"}) {
    const std::string cmd = test::kvevict_binary() + " serve -m '" + test::reasoner_model() + "' --port 0" + extra +
        " --reasoning-budget 3 2>&1";
    const test::CliResult r = test::run_shell(cmd);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(r.out.rfind("kvevict: error: --reasoning-budget 3: the chat template (", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("has no thinking trace to bound"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace kvevict
