#include "kvcache/kv_pool.h"

#include <fmt/format.h>

#include "kvcache/kv_cache.h"
#include "util/error.h"

namespace kvevict {

KvMemoryPool::KvMemoryPool(int64_t capacity_bytes) : capacity_(capacity_bytes) {
  if (capacity_bytes <= 0) throw Error(fmt::format("KV memory pool of {} bytes: must be > 0", capacity_bytes));
}

bool KvMemoryPool::try_reserve(int64_t bytes) {
  if (bytes < 0) throw Error(fmt::format("KV pool: cannot reserve {} bytes", bytes));
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > capacity_ - used_) return false;
  used_ += bytes;
  return true;
}

void KvMemoryPool::release(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes < 0 || bytes > used_)
    throw Error(fmt::format("KV pool: releasing {} bytes but only {} are reserved", bytes, used_));
  used_ -= bytes;
}

int64_t KvMemoryPool::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

int64_t KvMemoryPool::free() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_ - used_;
}

int64_t kv_bytes_for_capacity(const KvShape& shape, int64_t capacity) { return capacity * shape.bytes_per_token(); }

int64_t kv_bytes_for_capacity(const KvShape& shape, int64_t capacity, int64_t shared_slots) {
  return kv_bytes_for_capacity(shape, capacity) - shared_prompt_bytes(shape, shared_slots);
}

}  // namespace kvevict
