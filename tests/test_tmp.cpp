// The test program's temporary folder (test_tmp.h) and the environment that removes it.
#include "test_tmp.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <system_error>

namespace kvevict::test {
namespace {

namespace fs = std::filesystem;

std::mutex g_mu;
fs::path g_dir;  // empty until first use

// Removes the folder when the program ends (after the last test, also on failures).
class TmpDirEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_dir.empty()) return;
    std::error_code ec;
    fs::remove_all(g_dir, ec);
    g_dir.clear();
  }
};

[[maybe_unused]] ::testing::Environment* const g_env = ::testing::AddGlobalTestEnvironment(new TmpDirEnvironment);

}  // namespace

std::string tmp_dir() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_dir.empty()) {
    g_dir = fs::temp_directory_path() / ("kvevict-tests-" + std::to_string(::getpid()));
    fs::create_directories(g_dir);
  }
  return g_dir.string();
}

std::string tmp_path(const std::string& name) { return tmp_dir() + "/" + name; }

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(tmp_dir()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

}  // namespace kvevict::test
