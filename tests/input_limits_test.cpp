// Whole-file inputs have a size limit (read_file_limited, limits::kFileBytes): a file over it, a
// directory, /dev/zero and a pipe. Expected values: the sizes written by the test, the limit
// documented in cli/common.h (2^30 bytes) and the CLI contract (one line, exit 2).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "cli_run.h"
#include "eval/task_file.h"
#include "eval_cli_helpers.h"
#include "test_paths.h"
#include "util/error.h"
#include "util/file.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class InputLimits : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::fresh_dir("input_limits"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& data) {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << data;
    return p;
  }
  std::string dir_;
};

TEST_F(InputLimits, RegularFileAtTheLimitReadsOverItIsRefusedBeforeReading) {
  const std::string at = write("at.txt", std::string(100, 'a'));
  EXPECT_EQ(read_file_limited(at, 100, "-f"), std::string(100, 'a'));
  const std::string over = write("over.txt", std::string(101, 'a'));
  const std::string e = error_of([&] { read_file_limited(over, 100, "-f"); });
  EXPECT_NE(e.find("-f " + over + ": 101 bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("limit of 100 bytes"), std::string::npos) << e;
  // A sparse 8 GiB file: refused by its size, nothing is read (an unbounded read would take 8 GiB).
  const std::string sparse = dir_ + "/sparse.txt";
  { std::ofstream(sparse) << ""; }
  fs::resize_file(sparse, 8ULL << 30);
  EXPECT_NE(error_of([&] { read_file_limited(sparse, 1 << 20, "--filler"); }).find("8589934592 bytes"),
            std::string::npos);
}

TEST_F(InputLimits, DirectoryMissingFileDevZeroAndPipe) {
  EXPECT_NE(error_of([&] { read_file_limited(dir_, 100, "-f"); }).find("-f " + dir_ + ": is a directory"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_file_limited(dir_ + "/none", 100, "-f"); }).find(dir_ + "/none: cannot open"),
            std::string::npos);
  // /dev/zero never ends: read up to the limit, then refused.
  const std::string z = error_of([&] { read_file_limited("/dev/zero", 4096, "-f"); });
  EXPECT_NE(z.find("-f /dev/zero: not a regular file"), std::string::npos) << z;
  EXPECT_NE(z.find("limit of 4096 bytes"), std::string::npos) << z;
  // A pipe shorter than the limit reads whole (as `-f <(cmd)` does).
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary) << "hello pipe"; });
  EXPECT_EQ(read_file_limited(fifo, 4096, "-f"), "hello pipe");
  writer.join();
}

TEST_F(InputLimits, TaskFileOverTheLimitNamesOptionAndLimit) {
  const std::string line = "{\"id\": \"t1\", \"problem\": \"p\", \"answer\": \"a\"}\n";
  TaskReadOptions o;
  o.max_bytes = static_cast<int64_t>(line.size());
  o.option = "-f";
  EXPECT_EQ(read_tasks(write("one.jsonl", line), o).tasks.size(), 1u);
  const std::string two = write("two.jsonl", line + line);
  const std::string e = error_of([&] { read_tasks(two, o); });
  EXPECT_NE(e.find("-f " + two + ": " + std::to_string(2 * line.size()) + " bytes"), std::string::npos) << e;
}

// Reproducer: `perplexity -f /dev/zero` read until memory ran out (`eval -f` too). Now
// one line naming the file and the limit, exit 2. The child runs under a 6 GiB address-space cap
// (not under ASan, whose shadow memory needs more) so a regression fails instead of swapping.
test::CliResult run_capped(const std::string& args) {
#if defined(__SANITIZE_ADDRESS__)
  const std::string cap;
#else
  const std::string cap = "ulimit -v 6291456; ";
#endif
  return test::run_shell("bash -c '" + cap + "exec " + test::kvevict_binary() + " " + args + "' 2>&1");
}

TEST(InputLimitsCli, DevZeroIsRefusedNamingFileAndLimit) {
  if (!fs::exists(test::stories260k())) KVEVICT_SKIP_UNLESS_CI("stories260K not found under " << test::shared_dir());
  const std::string m = test::stories260k();
  // perplexity reads text through cli::read_file, eval through read_tasks (tasks eval and
  // calibrate share perplexity's path; each run reads 1 GiB from /dev/zero, so two suffice).
  for (const std::string& args : {"perplexity -m " + m + " -f /dev/zero", "eval -m " + m + " -f /dev/zero"}) {
    const test::CliResult r = run_capped(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("kvevict: error: -f /dev/zero: not a regular file"), std::string::npos) << args << "\n"
                                                                                                 << r.out;
    EXPECT_NE(r.out.find("limit of 1073741824 bytes"), std::string::npos) << args << "\n" << r.out;
  }
}

}  // namespace
}  // namespace kvevict
