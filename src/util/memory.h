// What the machine can hold: a KV cache is allocated whole (kv_cache.h), so an allocation larger
// than the memory left must be refused with a message instead of meeting the kernel's OOM killer.
#pragma once

#include <cstdint>
#include <string>

#include "util/error.h"

namespace kvevict {

/// An allocation refused because it exceeds the memory available now: the request may fit later
/// or elsewhere, so the server answers it 503, not 4xx (docs/serving.md).
class MemoryError : public Error {
 public:
  using Error::Error;
};

/// Throws MemoryError when `bytes` exceed available_memory_bytes() (no check when that is 0).
/// `what` names the allocation and how its size arose, e.g. "KV cache of 1,200 slots per (layer,
/// KV head) = max(budget 1,000, prompt 72) + round interval 200"; the message adds the bytes and
/// the memory available.
void check_available_memory(int64_t bytes, const std::string& what);

/// Bytes of memory available now for new allocations without swapping: MemAvailable of
/// /proc/meminfo (Linux, kernel 3.14+). 0 when it cannot be read (then callers skip their check).
int64_t available_memory_bytes();

}  // namespace kvevict
