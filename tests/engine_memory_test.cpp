// A KV cache is allocated whole when its sequence is made (kvcache/kv_cache.h). One larger than
// the machine's available memory must be refused by Engine::new_sequence with an error that gives
// the terms of its size, not zero-filled until the kernel kills the process. The reference is the
// machine's own MemAvailable (/proc/meminfo), read here independently of util/memory.h.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "engine/engine.h"
#include "eviction/registry.h"
#include "model_fixture.h"
#include "util/memory.h"

namespace kvevict {
namespace {

int64_t meminfo_available() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("MemAvailable:", 0) == 0) return std::stoll(line.substr(13)) * 1024;
  return 0;
}

TEST(EngineMemory, AvailableMemoryIsMeminfos) {
  const int64_t a = available_memory_bytes(), b = meminfo_available();
  if (b == 0) GTEST_SKIP() << "no MemAvailable in /proc/meminfo";
  // Two reads a moment apart: equal up to what other processes did in between (1 GiB).
  EXPECT_GT(a, 0);
  EXPECT_LT(std::llabs(a - b), int64_t{1} << 30) << a << " vs " << b;
}

TEST(EngineMemory, ACacheLargerThanTheMemoryIsRefusedWithTheTermsOfItsSize) {
  KVEVICT_REQUIRE_MODEL(m);
  if (meminfo_available() == 0) GTEST_SKIP() << "no MemAvailable in /proc/meminfo";
  Engine e(*m, 1);
  // `full` holds prompt + max new tokens: 10^12 slots are petabytes, beyond any machine here
  // (and beyond kv_cache's own 64 GiB limit, whose plain Error this must come before).
  try {
    e.new_sequence(0, make_policy("full"), {}, 8, int64_t{1'000'000'000'000});
    FAIL() << "no error";
  } catch (const MemoryError& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("KV cache of 1000000000008 slots per (layer, KV head) = prompt 8 + up to 1000000000000 new "
                       "tokens needs "),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("MiB of memory available now"), std::string::npos) << msg;
  }
  // The same sequence at a size that fits is made.
  EXPECT_EQ(e.new_sequence(0, make_policy("full"), {}, 8, 100)->kv.capacity(), 108);
}

}  // namespace
}  // namespace kvevict
