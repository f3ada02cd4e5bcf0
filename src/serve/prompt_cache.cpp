#include "serve/prompt_cache.h"

#include <fmt/format.h>

#include "util/error.h"

namespace kvevict::serve {

PromptCacheKey PromptCacheKey::make(const std::vector<int32_t>& prompt, const CheckedPolicy& kv, int64_t capacity) {
  const Policy& p = kv.policy();
  const EvictionConfig& e = kv.eviction();
  PromptCacheKey k;
  k.tokens = prompt;
  k.selector = p.selector.get();
  k.policy = p.name;
  k.protect_prompt = p.protect_prompt;
  k.sinks = p.sinks;
  k.budget = e.budget;
  k.recent = e.recent;
  k.interval = e.round_interval();
  k.long_prompt = e.long_prompt;
  k.positions = e.positions;
  k.capacity = capacity;
  return k;
}

size_t PromptCacheKeyHash::operator()(const PromptCacheKey& k) const {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xFF;
      h *= 1099511628211ULL;
    }
  };
  for (const int32_t t : k.tokens) mix(static_cast<uint32_t>(t));
  mix(reinterpret_cast<uintptr_t>(k.selector));
  mix(std::hash<std::string>{}(k.policy));
  mix(static_cast<uint64_t>(k.budget));
  mix(static_cast<uint64_t>(k.recent));
  mix(static_cast<uint64_t>(k.interval));
  mix(static_cast<uint64_t>(k.capacity));
  mix(static_cast<uint64_t>(k.sinks) * 4 + (k.protect_prompt ? 2 : 0) + (k.positions == PositionMode::Cache ? 1 : 0));
  mix(static_cast<uint64_t>(k.long_prompt));
  return static_cast<size_t>(h);
}

PromptCache::PromptCache(int64_t budget_bytes) : budget_(budget_bytes) {
  if (budget_bytes < 0) throw Error(fmt::format("--prompt-cache {}: must be >= 0 bytes (0 = off)", budget_bytes));
}

PromptCacheEntry* PromptCache::peek(const PromptCacheKey& key) {
  if (!enabled()) return nullptr;
  const auto it = index_.find(key);
  return it == index_.end() ? nullptr : &*it->second;
}

void PromptCache::use(PromptCacheEntry& e) {
  const auto it = index_.find(e.key);
  if (it == index_.end()) throw Error("prompt cache: use() of an entry that is not cached");
  lru_.splice(lru_.begin(), lru_, it->second);
  hits_ += 1;
}

int64_t PromptCache::entry_bytes(const Sequence& tmpl, const std::vector<float>& logits) {
  const SharedPromptKv* seg = tmpl.kv.shared_prompt();
  return tmpl.kv.allocated_bytes() + (seg ? seg->bytes() : 0) +
         static_cast<int64_t>(logits.size() * sizeof(float));
}

bool PromptCache::fits(const PromptCacheKey& key, int64_t bytes) const {
  if (!enabled() || index_.count(key)) return false;
  // Room that evicting every unused entry would make.
  int64_t freeable = 0;
  for (const PromptCacheEntry& e : lru_)
    if (e.in_use.expired()) freeable += e.bytes;
  return bytes_.load() - freeable + bytes <= budget_;
}

bool PromptCache::insert(PromptCacheKey key, std::unique_ptr<Sequence> tmpl, std::vector<float> logits,
                         std::weak_ptr<const void> in_use) {
  if (!tmpl) return false;
  const int64_t need = entry_bytes(*tmpl, logits);
  // Evict only when evicting can make room: a refused insertion leaves the cache as it was.
  if (!fits(key, need)) return false;
  for (auto it = lru_.end(); bytes_.load() + need > budget_ && it != lru_.begin();) {
    --it;
    if (!it->in_use.expired()) continue;
    bytes_ -= it->bytes;
    entries_ -= 1;
    evictions_ += 1;
    index_.erase(it->key);
    it = lru_.erase(it);
  }
  lru_.push_front(PromptCacheEntry{std::move(key), std::move(tmpl),
                                   std::make_shared<const std::vector<float>>(std::move(logits)), need,
                                   std::move(in_use)});
  index_.emplace(lru_.front().key, lru_.begin());
  bytes_ += need;
  entries_ += 1;
  return true;
}

}  // namespace kvevict::serve
