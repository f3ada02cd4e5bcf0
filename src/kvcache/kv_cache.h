// Budgeted KV cache storage for one sequence: per (layer, KV head) a fixed-capacity block of
// post-RoPE keys, values and each slot's logical position.
//
// Source: docs/eviction-spec.md §1-2 (slots, budget B, recent buffer r, logical positions). Storage is
// allocated once at construction (capacity = B + r for a bounded sequence, not a mask over a
// full-length cache). Slots [0, length(layer)) are live and chronological; compaction keeps that
// order. All KV heads of a layer always hold the same number of slots (rounds run for all heads
// at once), but each head keeps its own positions.
//
// Layout: keys/values [n_layers][n_kv_heads][capacity][head_dim] in float32 or IEEE half (fp16,
// KvType::F16: half the bytes, ~3 significant decimal digits), positions
// [n_layers][n_kv_heads][capacity] int32. A (layer, KV head) block is contiguous so attention streams
// it and compaction moves rows within it. This type holds no policy state and no sequence
// bookkeeping; the server's memory pool (kvcache/kv_pool.h) accounts for its allocated bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace kvevict {

/// How RoPE positions are assigned to cached keys and to the current query.
/// Source: docs/eviction-spec.md §2.1 (logical) and §3 `streaming` (StreamingLLM §3.2, positions
/// within the cache).
enum class PositionMode {
  Logical,  ///< position = tokens seen before this one; eviction never re-rotates (default)
  Cache,    ///< position = slot index; keys are re-rotated after every compaction, so positions
            ///< never exceed the cache capacity (needed past a model's trained context)
};

/// Element type of cached keys and values.
enum class KvType {
  F32,  ///< float32 (default; exact)
  F16,  ///< IEEE half: keys/values rounded to nearest even when stored (relative error <= 2^-11)
};

/// Bytes of one key or value element (4 or 2).
inline int64_t kv_type_bytes(KvType t) { return t == KvType::F16 ? 2 : 4; }
/// "f32" / "f16".
std::string kv_type_name(KvType t);
/// Parses "f32" / "f16"; throws kvevict::Error naming the value otherwise.
KvType parse_kv_type(const std::string& name);

/// Shape of a KV cache: what a model needs per token.
struct KvShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  KvType type = KvType::F32;  ///< element type of keys and values
  /// Bytes one token occupies across all layers and KV heads (keys + values + position).
  int64_t bytes_per_token() const {
    return int64_t{n_layers} * n_kv_heads * (2 * head_dim * kv_type_bytes(type) + int64_t{sizeof(int32_t)});
  }
};

/// KV storage of one sequence. Move-only.
class SequenceKv {
 public:
  /// Allocates capacity slots per (layer, KV head) of shape.type. Throws kvevict::Error if
  /// capacity <= 0 or the allocation would exceed 64 GiB.
  SequenceKv(const KvShape& shape, int64_t capacity);
  SequenceKv(SequenceKv&&) noexcept;
  SequenceKv& operator=(SequenceKv&&) noexcept;
  ~SequenceKv();
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  const KvShape& shape() const { return shape_; }
  int64_t capacity() const { return capacity_; }  ///< slots per (layer, KV head)
  /// Live slots of `layer` (same for each of its KV heads).
  int64_t length(int layer) const { return length_[static_cast<size_t>(layer)]; }
  void set_length(int layer, int64_t n);

  KvType type() const { return shape_.type; }

  /// Keys of (layer, KV head) as float32: [capacity, head_dim]; rows [0, length) are live.
  /// Mutable access requires KvType::F32 (kvevict::Error otherwise: write f16 caches through
  /// keys_f16). Const access works for both types: for F16 the live rows are converted into a
  /// float32 mirror of the block (allocated on first use, capacity * head_dim floats per block)
  /// and the mirror is returned; it stays valid until the next const keys() of the same block.
  /// Calls for different blocks may run concurrently; for the same block they may not.
  float* keys(int layer, int kv_head);
  const float* keys(int layer, int kv_head) const;
  /// Values of (layer, KV head) as float32: [capacity, head_dim]; same rules as keys().
  float* values(int layer, int kv_head);
  const float* values(int layer, int kv_head) const;
  /// Keys / values of (layer, KV head) as fp16 bits: [capacity, head_dim]. KvType::F16 only
  /// (kvevict::Error otherwise).
  uint16_t* keys_f16(int layer, int kv_head);
  const uint16_t* keys_f16(int layer, int kv_head) const;
  uint16_t* values_f16(int layer, int kv_head);
  const uint16_t* values_f16(int layer, int kv_head) const;

  /// Stores one key and value row (float32, head_dim each) at `slot` of (layer, KV head),
  /// converting to the storage type. No bounds check beyond capacity (debug builds).
  void store(int layer, int kv_head, int64_t slot, const float* key, const float* value);
  /// Logical positions of (layer, KV head): [capacity]; strictly increasing over live slots.
  int32_t* positions(int layer, int kv_head) { return pos_.data() + block(layer, kv_head); }
  const int32_t* positions(int layer, int kv_head) const { return pos_.data() + block(layer, kv_head); }

  /// Keeps exactly the slots `keep` (ascending, unique, < length) of (layer, KV head), moving
  /// them to [0, keep.size()) in order, in place (no allocation; rows move forward only). Does not change length():
  /// call set_length once every head of the layer is compacted. Throws kvevict::Error on an unsorted or out-of-range
  /// keep-set (a selector bug must not corrupt the cache).
  void compact(int layer, int kv_head, std::span<const int32_t> keep);

  /// Bytes allocated for this sequence's storage (keys, values, positions; an f16 cache's
  /// lazily made float32 mirror is not counted).
  int64_t allocated_bytes() const;

 private:
  int64_t block(int layer, int kv_head) const { return (int64_t{layer} * shape_.n_kv_heads + kv_head) * capacity_; }
  void require(KvType t, const char* what) const;
  const float* mirror(const std::vector<uint16_t>& src, std::vector<float>& dst, int layer, int kv_head) const;
  KvShape shape_;
  int64_t capacity_;
  std::vector<int64_t> length_;
  std::vector<float> k_, v_;       // KvType::F32
  std::vector<uint16_t> kh_, vh_;  // KvType::F16
  std::vector<int32_t> pos_;
  // f16 only: float32 copies handed out by const keys()/values(); allocated once under mu_.
  mutable std::unique_ptr<std::mutex> mu_;
  mutable std::vector<float> k_mirror_, v_mirror_;
};

}  // namespace kvevict
