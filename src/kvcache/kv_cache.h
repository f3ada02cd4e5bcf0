// Budgeted KV cache storage for one sequence: per (layer, KV head) a fixed-capacity block of
// post-RoPE keys, values and each slot's logical position.
//
// Source: eviction-spec.md §1-2 (slots, budget B, recent buffer r, logical positions). Storage is
// allocated once at construction (capacity = B + r for a bounded sequence, not a mask over a
// full-length cache). Slots [0, length(layer)) are live and chronological; compaction keeps that
// order. All KV heads of a layer always hold the same number of slots (rounds run for all heads
// at once), but each head keeps its own positions.
//
// Layout (float32): keys/values [n_layers][n_kv_heads][capacity][head_dim], positions
// [n_layers][n_kv_heads][capacity]. A (layer, KV head) block is contiguous so attention streams
// it and compaction moves rows within it. This type holds no policy state and no sequence
// bookkeeping, so a shared pool can later hand out such blocks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvevict {

/// How RoPE positions are assigned to cached keys and to the current query.
/// Source: eviction-spec.md §2.1 (logical) and §3 `streaming` (StreamingLLM §3.2, positions
/// within the cache).
enum class PositionMode {
  Logical,  ///< position = tokens seen before this one; eviction never re-rotates (default)
  Cache,    ///< position = slot index; keys are re-rotated after every compaction, so positions
            ///< never exceed the cache capacity (needed past a model's trained context)
};

/// Shape of a KV cache: what a model needs per token.
struct KvShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  /// Bytes one token occupies across all layers and KV heads (keys + values + position).
  int64_t bytes_per_token() const {
    return int64_t{n_layers} * n_kv_heads * (2 * head_dim * int64_t{sizeof(float)} + int64_t{sizeof(int32_t)});
  }
};

/// KV storage of one sequence. Move-only.
class SequenceKv {
 public:
  /// Allocates capacity slots per (layer, KV head). Throws kvevict::Error if capacity <= 0 or
  /// the allocation would exceed 64 GiB.
  SequenceKv(const KvShape& shape, int64_t capacity);
  SequenceKv(SequenceKv&&) = default;
  SequenceKv& operator=(SequenceKv&&) = default;
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  const KvShape& shape() const { return shape_; }
  int64_t capacity() const { return capacity_; }  ///< slots per (layer, KV head)
  /// Live slots of `layer` (same for each of its KV heads).
  int64_t length(int layer) const { return length_[static_cast<size_t>(layer)]; }
  void set_length(int layer, int64_t n);

  /// Keys of (layer, KV head): [capacity, head_dim]; rows [0, length) are live.
  float* keys(int layer, int kv_head) { return k_.data() + block(layer, kv_head) * shape_.head_dim; }
  const float* keys(int layer, int kv_head) const { return k_.data() + block(layer, kv_head) * shape_.head_dim; }
  /// Values of (layer, KV head): [capacity, head_dim].
  float* values(int layer, int kv_head) { return v_.data() + block(layer, kv_head) * shape_.head_dim; }
  const float* values(int layer, int kv_head) const { return v_.data() + block(layer, kv_head) * shape_.head_dim; }
  /// Logical positions of (layer, KV head): [capacity]; strictly increasing over live slots.
  int32_t* positions(int layer, int kv_head) { return pos_.data() + block(layer, kv_head); }
  const int32_t* positions(int layer, int kv_head) const { return pos_.data() + block(layer, kv_head); }

  /// Keeps exactly the slots `keep` (ascending, unique, < length) of (layer, KV head), moving
  /// them to [0, keep.size()) in order, in place. Does not change length(): call set_length once
  /// every head of the layer is compacted. Throws kvevict::Error on an unsorted or out-of-range
  /// keep-set (a selector bug must not corrupt the cache).
  void compact(int layer, int kv_head, std::span<const int32_t> keep);

  /// Bytes allocated for this sequence (keys, values, positions).
  int64_t allocated_bytes() const;

 private:
  int64_t block(int layer, int kv_head) const {
    return (int64_t{layer} * shape_.n_kv_heads + kv_head) * capacity_;
  }
  KvShape shape_;
  int64_t capacity_;
  std::vector<int64_t> length_;
  std::vector<float> k_, v_;
  std::vector<int32_t> pos_;
};

}  // namespace kvevict
