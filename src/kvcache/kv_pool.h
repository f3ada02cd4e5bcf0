// A byte budget for KV caches shared by many sequences: admission control for continuous
// batching.
//
// Source: vLLM's KV-cache manager (Kwon et al., arXiv 2309.06180 §4) admits a sequence only when
// its blocks fit in a fixed GPU memory pool. kvevict allocates each sequence's cache once at its
// worst-case capacity (kv_cache.h), so the pool needs no blocks: a reservation is the byte size of
// that allocation, taken before the cache is made and returned when the sequence ends. A bounded
// policy reserves (max(prompt, B) + r) slots, `full` prompt + max new tokens, so at equal pool
// size bounded policies admit more sequences. Sequences sharing one prompt (kv_cache.h) reserve
// the shared segment once and each its own slots.
#pragma once

#include <cstdint>
#include <mutex>

#include "kvcache/kv_cache.h"

namespace kvevict {

/// Thread-safe byte counter with a fixed capacity. Holds no memory itself.
class KvMemoryPool {
 public:
  /// capacity_bytes: the budget (bytes, > 0). Throws kvevict::Error otherwise.
  explicit KvMemoryPool(int64_t capacity_bytes);

  /// Reserves `bytes` (>= 0) when they fit in what is free; returns false (and reserves nothing)
  /// otherwise. Throws kvevict::Error for negative bytes.
  bool try_reserve(int64_t bytes);
  /// Returns `bytes` earlier reserved. Throws kvevict::Error when more is released than is in use
  /// (a bookkeeping bug must not go unnoticed).
  void release(int64_t bytes);

  int64_t capacity() const { return capacity_; }  ///< bytes
  int64_t used() const;                           ///< bytes reserved now
  int64_t free() const;                           ///< capacity - used, bytes
  /// True when a reservation of `bytes` could ever succeed (bytes <= capacity).
  bool could_fit(int64_t bytes) const { return bytes <= capacity_; }

 private:
  const int64_t capacity_;
  mutable std::mutex mu_;
  int64_t used_ = 0;
};

/// Bytes of KV memory one sequence's cache occupies at `capacity` slots per (layer, KV head):
/// capacity × layers × KV heads × (2 × head_dim × element bytes + 4 bytes of position), exactly
/// what SequenceKv allocates (SequenceKv::allocated_bytes).
int64_t kv_bytes_for_capacity(const KvShape& shape, int64_t capacity);

/// Bytes a sequence that reads `shared_slots` slots from a shared prompt (kv_cache.h) allocates
/// itself: keys and values of capacity - shared_slots slots, positions of all capacity slots
/// (SequenceKv::allocated_bytes). The shared segment is counted once per group of sequences:
/// shared_prompt_bytes(shape, shared_slots).
int64_t kv_bytes_for_capacity(const KvShape& shape, int64_t capacity, int64_t shared_slots);

}  // namespace kvevict
