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
//
// Shared prompt: under a policy whose prompt pin keeps the prompt (docs/eviction-spec.md §2.4:
// pinned slots are the oldest, so compaction never moves them), slots [0, n) of every (layer, KV
// head) never change after prefill, so sequences with the same prompt can read one copy. A
// SharedPromptKv holds those n slots' keys and values; a SequenceKv made with one stores only
// its slots [n, capacity) itself (positions stay per sequence: 4 bytes a slot). Its first
// sequence writes the segment during prefill; SequenceKv::fork freezes it and hands out further
// references (std::shared_ptr: freed with its last sequence).
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

/// Keys and values of slots [0, n_slots) of every (layer, KV head), shared read-only by the
/// sequences of one prompt (header). Layout as SequenceKv's without positions:
/// [n_layers][n_kv_heads][n_slots][head_dim] of shape.type.
class SharedPromptKv {
 public:
  /// Throws kvevict::Error if n_slots <= 0 or the allocation would exceed 64 GiB.
  SharedPromptKv(const KvShape& shape, int64_t n_slots);
  const KvShape& shape() const { return shape_; }
  int64_t n_slots() const { return n_slots_; }
  /// Bytes of keys and values held (n_slots × layers × KV heads × 2 × head_dim × element bytes).
  int64_t bytes() const;
  /// True once a second sequence reads it (SequenceKv::fork): no slot may be written again.
  bool frozen() const { return frozen_; }
  /// Start of (layer, KV head)'s block as raw storage (float or fp16 bits per shape.type).
  const void* keys(int layer, int kv_head) const;
  const void* values(int layer, int kv_head) const;

 private:
  friend class SequenceKv;
  int64_t offset(int layer, int kv_head) const {
    return (int64_t{layer} * shape_.n_kv_heads + kv_head) * n_slots_ * shape_.head_dim;
  }
  KvShape shape_;
  int64_t n_slots_;
  bool frozen_ = false;
  std::vector<float> k_, v_;       // KvType::F32
  std::vector<uint16_t> kh_, vh_;  // KvType::F16
};

/// Bytes of keys and values of n_slots shared slots: what SharedPromptKv(shape, n).bytes() holds.
int64_t shared_prompt_bytes(const KvShape& shape, int64_t n_slots);

/// KV storage of one sequence. Move-only.
class SequenceKv {
 public:
  /// Allocates capacity slots per (layer, KV head) of shape.type. Throws kvevict::Error if
  /// capacity <= 0 or the allocation would exceed 64 GiB.
  SequenceKv(const KvShape& shape, int64_t capacity);
  /// The same, but slots [0, shared->n_slots()) of every (layer, KV head) live in `shared`
  /// (written through store() while it is not frozen, read-only afterwards); this sequence
  /// allocates keys and values of the other capacity - n_slots slots and positions of all.
  /// Throws kvevict::Error if shared is null, of another shape, or n_slots >= capacity.
  SequenceKv(const KvShape& shape, int64_t capacity, std::shared_ptr<SharedPromptKv> shared);
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

  /// Slots [0, shared_slots()) of every (layer, KV head) are read from a SharedPromptKv; 0 when
  /// this sequence owns all its storage.
  int64_t shared_slots() const { return shared_ ? shared_->n_slots() : 0; }
  const SharedPromptKv* shared_prompt() const { return shared_.get(); }

  /// A second cache with the same contents: same capacity, lengths and positions; a shared
  /// prompt is referenced (and frozen from now on), every other slot copied. Throws
  /// kvevict::Error when a slot of the shared prompt is not yet written (length(layer) <
  /// shared_slots()).
  SequenceKv fork() const;

  /// Keys of (layer, KV head) as float32: [capacity, head_dim]; rows [0, length) are live.
  /// Mutable access requires KvType::F32 and no shared prompt (kvevict::Error otherwise: write
  /// f16 caches through keys_f16). Const access works for every cache: for F16, or with a
  /// shared prompt, the live rows are gathered as float32 into a mirror of the block (allocated
  /// on first use, capacity * head_dim floats per block; release_mirrors frees it) and the mirror
  /// is returned; it stays valid until the next const keys() of the same block.
  /// Calls for different blocks may run concurrently; for the same block they may not.
  float* keys(int layer, int kv_head);
  const float* keys(int layer, int kv_head) const;
  /// Values of (layer, KV head) as float32: [capacity, head_dim]; same rules as keys().
  float* values(int layer, int kv_head);
  const float* values(int layer, int kv_head) const;
  /// Keys / values of (layer, KV head) as fp16 bits: [capacity, head_dim]. KvType::F16 and no
  /// shared prompt only (kvevict::Error otherwise).
  uint16_t* keys_f16(int layer, int kv_head);
  const uint16_t* keys_f16(int layer, int kv_head) const;
  uint16_t* values_f16(int layer, int kv_head);
  const uint16_t* values_f16(int layer, int kv_head) const;

  /// This sequence's own rows of (layer, KV head): slots [shared_slots(), capacity) as raw
  /// storage of type(), row 0 = slot shared_slots(). The attention kernel reads the shared
  /// segment (shared_prompt()->keys) and these.
  const void* own_keys(int layer, int kv_head) const;
  const void* own_values(int layer, int kv_head) const;
  /// Frees the float32 mirrors of const keys()/values() (next call makes them again).
  void release_mirrors();

  /// Stores one key and value row (float32, head_dim each) at `slot` of (layer, KV head),
  /// converting to the storage type; a slot below shared_slots() goes to the shared prompt,
  /// which must not be frozen yet (kvevict::Error). No bounds check beyond capacity (debug builds).
  void store(int layer, int kv_head, int64_t slot, const float* key, const float* value);
  /// Logical positions of (layer, KV head): [capacity]; strictly increasing over live slots.
  int32_t* positions(int layer, int kv_head) { return pos_.data() + block(layer, kv_head); }
  const int32_t* positions(int layer, int kv_head) const { return pos_.data() + block(layer, kv_head); }

  /// Keeps exactly the slots `keep` (ascending, unique, < length) of (layer, KV head), moving
  /// them to [0, keep.size()) in order, in place (no allocation; rows move forward only). Does not change length():
  /// call set_length once every head of the layer is compacted. Throws kvevict::Error on an unsorted or out-of-range
  /// keep-set (a selector bug must not corrupt the cache), or one that does not keep every
  /// shared slot in place (keep[i] == i for i < shared_slots(): the pin guarantees it).
  void compact(int layer, int kv_head, std::span<const int32_t> keep);

  /// Bytes allocated for this sequence's storage (keys, values, positions; a shared prompt and
  /// the lazily made float32 mirrors are not counted).
  int64_t allocated_bytes() const;
  /// Bytes this cache would allocate alone: allocated_bytes() plus the shared prompt's bytes
  /// (what a record of one sequence reports, whether or not it shared its prompt).
  int64_t unshared_bytes() const { return allocated_bytes() + (shared_ ? shared_->bytes() : 0); }

 private:
  int64_t block(int layer, int kv_head) const { return (int64_t{layer} * shape_.n_kv_heads + kv_head) * capacity_; }
  // Offset (in rows) of (layer, KV head)'s own rows: own_ rows per block.
  int64_t own_block(int layer, int kv_head) const { return (int64_t{layer} * shape_.n_kv_heads + kv_head) * own_; }
  SequenceKv(const KvShape& shape, int64_t capacity, std::shared_ptr<SharedPromptKv> shared, bool want_shared);
  void require(KvType t, const char* what) const;
  void require_unshared(const char* what) const;
  const float* mirror(bool keys, std::vector<float>& dst, int layer, int kv_head) const;
  KvShape shape_;
  int64_t capacity_;
  int64_t own_;  // capacity_ - shared slots: rows per block stored here
  std::shared_ptr<SharedPromptKv> shared_;
  std::vector<int64_t> length_;
  std::vector<float> k_, v_;       // KvType::F32
  std::vector<uint16_t> kh_, vh_;  // KvType::F16
  std::vector<int32_t> pos_;
  // f16 only: float32 copies handed out by const keys()/values(); allocated once under mu_.
  mutable std::unique_ptr<std::mutex> mu_;
  mutable std::vector<float> k_mirror_, v_mirror_;
};

}  // namespace kvevict
