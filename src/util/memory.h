// What the machine can hold: a KV cache is allocated whole (kv_cache.h), so an allocation larger
// than the memory left must be refused with a message instead of meeting the kernel's OOM killer.
#pragma once

#include <cstdint>

namespace kvevict {

/// Bytes of memory available now for new allocations without swapping: MemAvailable of
/// /proc/meminfo (Linux, kernel 3.14+). 0 when it cannot be read (then callers skip their check).
int64_t available_memory_bytes();

}  // namespace kvevict
