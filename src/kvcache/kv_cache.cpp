#include "kvcache/kv_cache.h"

#include <fmt/format.h>

#include <cstring>

#include "util/error.h"

namespace kvevict {

SequenceKv::SequenceKv(const KvShape& shape, int64_t capacity) : shape_(shape), capacity_(capacity) {
  if (capacity <= 0) throw Error(fmt::format("KV cache capacity must be positive, got {}", capacity));
  const int64_t bytes = shape.bytes_per_token() * capacity;
  if (bytes > (int64_t{64} << 30))
    throw Error(fmt::format("KV cache of {} slots needs {} bytes, over the 64 GiB limit", capacity, bytes));
  const size_t blocks = static_cast<size_t>(shape.n_layers) * static_cast<size_t>(shape.n_kv_heads) *
                        static_cast<size_t>(capacity);
  k_.assign(blocks * static_cast<size_t>(shape.head_dim), 0.0f);
  v_.assign(blocks * static_cast<size_t>(shape.head_dim), 0.0f);
  pos_.assign(blocks, 0);
  length_.assign(static_cast<size_t>(shape.n_layers), 0);
}

void SequenceKv::set_length(int layer, int64_t n) {
  if (n < 0 || n > capacity_)
    throw Error(fmt::format("KV cache layer {}: length {} outside [0, capacity {}]", layer, n, capacity_));
  length_[static_cast<size_t>(layer)] = n;
}

void SequenceKv::compact(int layer, int kv_head, std::span<const int32_t> keep) {
  const int64_t len = length(layer);
  const int hd = shape_.head_dim;
  float* k = keys(layer, kv_head);
  float* v = values(layer, kv_head);
  int32_t* p = positions(layer, kv_head);
  int64_t prev = -1;
  for (size_t i = 0; i < keep.size(); ++i) {
    const int64_t src = keep[i];
    if (src <= prev || src >= len)
      throw Error(fmt::format("keep-set of layer {} KV head {} is not ascending within [0, {}): "
                              "entry {} = {}", layer, kv_head, len, i, src));
    prev = src;
    const auto dst = static_cast<int64_t>(i);
    if (dst == src) continue;  // src >= dst always, so a forward copy never overwrites a kept row
    std::memcpy(k + dst * hd, k + src * hd, sizeof(float) * static_cast<size_t>(hd));
    std::memcpy(v + dst * hd, v + src * hd, sizeof(float) * static_cast<size_t>(hd));
    p[dst] = p[src];
  }
}

int64_t SequenceKv::allocated_bytes() const {
  return static_cast<int64_t>(k_.size() * sizeof(float) + v_.size() * sizeof(float) +
                              pos_.size() * sizeof(int32_t));
}

}  // namespace kvevict
