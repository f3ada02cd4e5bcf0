#include "util/memory.h"

#include <fmt/format.h>

#include <fstream>
#include <string>

namespace kvevict {

int64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

void check_available_memory(int64_t bytes, const std::string& what) {
  const int64_t available = available_memory_bytes();
  if (available <= 0 || bytes <= available) return;
  constexpr double kMiB = 1024.0 * 1024.0;
  throw MemoryError(fmt::format("{} needs {} bytes ({:.1f} MiB), more than the {:.1f} MiB of memory available now",
                                what, bytes, static_cast<double>(bytes) / kMiB,
                                static_cast<double>(available) / kMiB));
}

}  // namespace kvevict
