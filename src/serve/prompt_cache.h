// Prefix cache of pinned prompts: identical prompts of concurrent and repeated requests start from
// one prefill.
//
// A request whose policy pins its prompt (Engine::shared_prompt_slots > 0) prefills choice 0 into
// a sequence whose pinned prompt slots live in a read-only SharedPromptKv (kvcache/kv_cache.h).
// Right after that prefill the scheduler forks a *template* of it (Engine::fork: the segment is
// referenced, the sequence's other slots and its selector state copied) and stores it here with
// the prompt's last-position logits. A later request with the same key forks its choices from the
// template (Engine::fork again) instead of prefilling, and samples its first token from the
// stored logits, so its output equals a fresh prefill's bit for bit (fork is exact; the logits are
// those the prefill produced).
//
// Key (PromptCacheKey): what the post-prefill state depends on: the prompt's token ids, the
// selector object (so its parameters), the policy's pins (protect_prompt, sinks), B, r, the
// long-prompt mode, the position mode and the cache capacity (slots per (layer, KV head); it
// depends on max_tokens under `full`). The seed is not part of it: no selector state depends on
// it (Selector::make_state takes none) and the forked sequence gets its request's schedule. The
// model, KV element type and RoPE settings are fixed per server (one Engine).
//
// Memory: an entry's bytes (PromptCacheEntry::bytes) count against this cache's own byte budget
// (--prompt-cache), never against the KV memory pool. While a running request reads an entry's
// segment the pool holds that segment once (the scheduler's pool lease, scheduler.h); the entry
// is then in use and never evicted. Eviction: least recently used among entries no running
// request uses, only when an insertion needs room.
//
// Not thread-safe: the scheduler thread owns it. Counters are atomics for /metrics.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace kvevict::serve {

/// What a prefilled prompt's cache and selector state depend on besides the model (see the file
/// comment). Two requests with equal keys end their prefill in the same state.
struct PromptCacheKey {
  std::vector<int32_t> tokens;          ///< the whole prompt, BOS included
  const Selector* selector = nullptr;   ///< selector object (null for `full`); its parameters
  std::string policy;                   ///< policy name as given
  bool protect_prompt = false;
  int sinks = 0;
  int64_t budget = 0, recent = 0;       ///< B, r (slots)
  int64_t interval = 0;                 ///< s, the round interval in force (tokens)
  LongPromptMode long_prompt = LongPromptMode::PinHead;
  PositionMode positions = PositionMode::Logical;
  int64_t capacity = 0;                 ///< slots per (layer, KV head) of the sequence's cache
  /// The key of a prompt under `kv` with a cache of `capacity` slots.
  static PromptCacheKey make(const std::vector<int32_t>& prompt, const CheckedPolicy& kv, int64_t capacity);
  bool operator==(const PromptCacheKey&) const = default;
};

/// Hash of a key (FNV-1a over the token ids and the other fields).
struct PromptCacheKeyHash {
  size_t operator()(const PromptCacheKey& k) const;
};

/// One cached prefill.
struct PromptCacheEntry {
  PromptCacheKey key;
  /// The prefilled sequence to fork from (Engine::fork); it never decodes. Its cache references
  /// the shared prompt segment.
  std::unique_ptr<Sequence> tmpl;
  /// Next-token logits of the prompt's last position, [n_vocab] (shared with requests that
  /// still have to sample their first token from them).
  std::shared_ptr<const std::vector<float>> logits;
  /// Bytes held: the template's own KV allocation (SequenceKv::allocated_bytes), its shared
  /// prompt segment (SharedPromptKv::bytes) and the logits (4 × n_vocab). The selector state is
  /// not counted (none for `random` and `full`; see docs/serving.md).
  int64_t bytes = 0;
  /// Alive while a running request reads the segment (the scheduler's pool lease): the entry is
  /// in use and is not evicted.
  std::weak_ptr<const void> in_use;
};

/// LRU cache of prefilled prompts with a byte budget. Scheduler thread only (but its counters).
class PromptCache {
 public:
  /// budget_bytes >= 0; 0 disables the cache (every find misses, nothing is inserted). Throws
  /// kvevict::Error for a negative budget.
  explicit PromptCache(int64_t budget_bytes);
  bool enabled() const { return budget_ > 0; }
  int64_t budget() const { return budget_; }  ///< bytes

  /// The entry of `key` or nullptr. Changes neither recency nor counters: the caller calls
  /// use() once the request is admitted (an admission that waits for pool memory retries).
  PromptCacheEntry* peek(const PromptCacheKey& key);
  /// Marks `e` most recently used and counts a hit.
  void use(PromptCacheEntry& e);
  /// Counts a miss (a request that could have used the cache and found no entry).
  void count_miss() { misses_ += 1; }

  /// Bytes an entry of this template and logits would hold (PromptCacheEntry::bytes).
  static int64_t entry_bytes(const Sequence& tmpl, const std::vector<float>& logits);
  /// True when insert() of an entry of `bytes` under `key` would store it (so the caller can
  /// skip forking a template that would be dropped).
  bool fits(const PromptCacheKey& key, int64_t bytes) const;
  /// Stores a prefilled template under `key`, evicting least recently used entries that are not
  /// in use until it fits the budget. Returns false (and stores nothing) when the key is already
  /// cached, the cache is off, or the entry cannot fit even after evicting every unused entry
  /// (then nothing is evicted). `in_use`: the pool lease of the request that prefilled it.
  bool insert(PromptCacheKey key, std::unique_ptr<Sequence> tmpl, std::vector<float> logits,
              std::weak_ptr<const void> in_use);

  int64_t bytes() const { return bytes_.load(); }  ///< held by every entry now, <= budget()
  int64_t entries() const { return entries_.load(); }
  uint64_t hits() const { return hits_.load(); }
  uint64_t misses() const { return misses_.load(); }
  uint64_t evictions() const { return evictions_.load(); }

 private:
  using Lru = std::list<PromptCacheEntry>;  // front = most recently used
  int64_t budget_;
  Lru lru_;
  std::unordered_map<PromptCacheKey, Lru::iterator, PromptCacheKeyHash> index_;
  std::atomic<int64_t> bytes_{0}, entries_{0};
  std::atomic<uint64_t> hits_{0}, misses_{0}, evictions_{0};
};

}  // namespace kvevict::serve
