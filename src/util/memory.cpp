#include "util/memory.h"

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

}  // namespace kvevict
