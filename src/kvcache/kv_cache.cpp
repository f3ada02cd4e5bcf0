#include "kvcache/kv_cache.h"

#include <fmt/format.h>

#include <cstring>

#include "kernels/attention.h"
#include "util/error.h"

namespace kvevict {

std::string kv_type_name(KvType t) { return t == KvType::F16 ? "f16" : "f32"; }

KvType parse_kv_type(const std::string& name) {
  if (name == "f32") return KvType::F32;
  if (name == "f16") return KvType::F16;
  throw Error(fmt::format("KV type '{}' is not supported (f32, f16)", name));
}

namespace {
constexpr int64_t kMaxKvBytes = int64_t{64} << 30;

// Raw element rows as float32 (n elements).
void to_f32(KvType t, const void* src, float* dst, int64_t n) {
  if (t == KvType::F16)
    fp16_to_fp32_row(static_cast<const uint16_t*>(src), dst, n);
  else
    std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
}
}  // namespace

SharedPromptKv::SharedPromptKv(const KvShape& shape, int64_t n_slots) : shape_(shape), n_slots_(n_slots) {
  if (n_slots <= 0) throw Error(fmt::format("shared prompt KV of {} slots: must be positive", n_slots));
  if (shared_prompt_bytes(shape, n_slots) > kMaxKvBytes)
    throw Error(fmt::format("shared prompt KV of {} slots needs {} bytes, over the 64 GiB limit", n_slots,
                            shared_prompt_bytes(shape, n_slots)));
  const auto elems = static_cast<size_t>(int64_t{shape.n_layers} * shape.n_kv_heads * n_slots * shape.head_dim);
  if (shape.type == KvType::F16) {
    kh_.assign(elems, 0);
    vh_.assign(elems, 0);
  } else {
    k_.assign(elems, 0.0f);
    v_.assign(elems, 0.0f);
  }
}

int64_t SharedPromptKv::bytes() const {
  return static_cast<int64_t>((k_.size() + v_.size()) * sizeof(float) + (kh_.size() + vh_.size()) * sizeof(uint16_t));
}

const void* SharedPromptKv::keys(int layer, int kv_head) const {
  return shape_.type == KvType::F16 ? static_cast<const void*>(kh_.data() + offset(layer, kv_head))
                                    : static_cast<const void*>(k_.data() + offset(layer, kv_head));
}
const void* SharedPromptKv::values(int layer, int kv_head) const {
  return shape_.type == KvType::F16 ? static_cast<const void*>(vh_.data() + offset(layer, kv_head))
                                    : static_cast<const void*>(v_.data() + offset(layer, kv_head));
}

int64_t shared_prompt_bytes(const KvShape& shape, int64_t n_slots) {
  return n_slots * shape.n_layers * shape.n_kv_heads * 2 * shape.head_dim * kv_type_bytes(shape.type);
}

SequenceKv::SequenceKv(const KvShape& shape, int64_t capacity) : SequenceKv(shape, capacity, nullptr, false) {}

SequenceKv::SequenceKv(const KvShape& shape, int64_t capacity, std::shared_ptr<SharedPromptKv> shared)
    : SequenceKv(shape, capacity, std::move(shared), true) {}

SequenceKv::SequenceKv(const KvShape& shape, int64_t capacity, std::shared_ptr<SharedPromptKv> shared,
                       bool want_shared)
    : shape_(shape), capacity_(capacity), own_(capacity), shared_(std::move(shared)),
      mu_(std::make_unique<std::mutex>()) {
  if (capacity <= 0) throw Error(fmt::format("KV cache capacity must be positive, got {}", capacity));
  if (want_shared) {
    if (!shared_) throw Error("KV cache: a shared prompt segment is required");
    const KvShape& ss = shared_->shape();
    if (ss.n_layers != shape.n_layers || ss.n_kv_heads != shape.n_kv_heads || ss.head_dim != shape.head_dim ||
        ss.type != shape.type)
      throw Error("KV cache: the shared prompt segment has another shape");
    if (shared_->n_slots() >= capacity)
      throw Error(fmt::format("KV cache: shared prompt of {} slots leaves no room in a capacity of {}",
                              shared_->n_slots(), capacity));
    own_ = capacity - shared_->n_slots();
  }
  const int64_t bytes = shape.bytes_per_token() * capacity;
  if (bytes > kMaxKvBytes)
    throw Error(fmt::format("KV cache of {} slots needs {} bytes, over the 64 GiB limit", capacity, bytes));
  const size_t blocks = static_cast<size_t>(shape.n_layers) * static_cast<size_t>(shape.n_kv_heads);
  const size_t elems = blocks * static_cast<size_t>(own_) * static_cast<size_t>(shape.head_dim);
  if (shape.type == KvType::F16) {
    kh_.assign(elems, 0);
    vh_.assign(elems, 0);
  } else {
    k_.assign(elems, 0.0f);
    v_.assign(elems, 0.0f);
  }
  pos_.assign(blocks * static_cast<size_t>(capacity), 0);
  length_.assign(static_cast<size_t>(shape.n_layers), 0);
}

SequenceKv::SequenceKv(SequenceKv&&) noexcept = default;
SequenceKv& SequenceKv::operator=(SequenceKv&&) noexcept = default;
SequenceKv::~SequenceKv() = default;

SequenceKv SequenceKv::fork() const {
  if (!shared_) {
    SequenceKv out(shape_, capacity_);
    out.k_ = k_, out.v_ = v_, out.kh_ = kh_, out.vh_ = vh_, out.pos_ = pos_, out.length_ = length_;
    return out;
  }
  for (int l = 0; l < shape_.n_layers; ++l)
    if (length(l) < shared_slots())
      throw Error(fmt::format("KV cache fork: layer {} holds {} slots, fewer than the {} shared ones", l, length(l),
                              shared_slots()));
  shared_->frozen_ = true;
  SequenceKv out(shape_, capacity_, shared_);
  out.k_ = k_, out.v_ = v_, out.kh_ = kh_, out.vh_ = vh_, out.pos_ = pos_, out.length_ = length_;
  return out;
}

void SequenceKv::require(KvType t, const char* what) const {
  if (shape_.type != t)
    throw Error(fmt::format("KV cache stores {} but {} needs {}", kv_type_name(shape_.type), what, kv_type_name(t)));
}

void SequenceKv::require_unshared(const char* what) const {
  if (shared_) throw Error(fmt::format("KV cache: {} is not available for a sequence with a shared prompt", what));
}

float* SequenceKv::keys(int layer, int kv_head) {
  require(KvType::F32, "mutable keys()");
  require_unshared("mutable keys()");
  return k_.data() + block(layer, kv_head) * shape_.head_dim;
}
float* SequenceKv::values(int layer, int kv_head) {
  require(KvType::F32, "mutable values()");
  require_unshared("mutable values()");
  return v_.data() + block(layer, kv_head) * shape_.head_dim;
}
const float* SequenceKv::keys(int layer, int kv_head) const {
  if (shape_.type == KvType::F32 && !shared_) return k_.data() + block(layer, kv_head) * shape_.head_dim;
  return mirror(true, k_mirror_, layer, kv_head);
}
const float* SequenceKv::values(int layer, int kv_head) const {
  if (shape_.type == KvType::F32 && !shared_) return v_.data() + block(layer, kv_head) * shape_.head_dim;
  return mirror(false, v_mirror_, layer, kv_head);
}
uint16_t* SequenceKv::keys_f16(int layer, int kv_head) {
  require(KvType::F16, "keys_f16()");
  require_unshared("keys_f16()");
  return kh_.data() + block(layer, kv_head) * shape_.head_dim;
}
const uint16_t* SequenceKv::keys_f16(int layer, int kv_head) const {
  require(KvType::F16, "keys_f16()");
  require_unshared("keys_f16()");
  return kh_.data() + block(layer, kv_head) * shape_.head_dim;
}
uint16_t* SequenceKv::values_f16(int layer, int kv_head) {
  require(KvType::F16, "values_f16()");
  require_unshared("values_f16()");
  return vh_.data() + block(layer, kv_head) * shape_.head_dim;
}
const uint16_t* SequenceKv::values_f16(int layer, int kv_head) const {
  require(KvType::F16, "values_f16()");
  require_unshared("values_f16()");
  return vh_.data() + block(layer, kv_head) * shape_.head_dim;
}

const void* SequenceKv::own_keys(int layer, int kv_head) const {
  const int64_t off = own_block(layer, kv_head) * shape_.head_dim;
  return shape_.type == KvType::F16 ? static_cast<const void*>(kh_.data() + off)
                                    : static_cast<const void*>(k_.data() + off);
}
const void* SequenceKv::own_values(int layer, int kv_head) const {
  const int64_t off = own_block(layer, kv_head) * shape_.head_dim;
  return shape_.type == KvType::F16 ? static_cast<const void*>(vh_.data() + off)
                                    : static_cast<const void*>(v_.data() + off);
}

const float* SequenceKv::mirror(bool keys, std::vector<float>& dst, int layer, int kv_head) const {
  const size_t full = static_cast<size_t>(int64_t{shape_.n_layers} * shape_.n_kv_heads * capacity_ * shape_.head_dim);
  {
    std::lock_guard<std::mutex> lock(*mu_);
    if (dst.size() != full) dst.assign(full, 0.0f);
  }
  const int hd = shape_.head_dim;
  const int64_t off = block(layer, kv_head) * hd;
  const int64_t len = length(layer), ns = std::min(len, shared_slots());
  if (ns > 0)
    to_f32(shape_.type, keys ? shared_->keys(layer, kv_head) : shared_->values(layer, kv_head), dst.data() + off,
           ns * hd);
  to_f32(shape_.type, keys ? own_keys(layer, kv_head) : own_values(layer, kv_head), dst.data() + off + ns * hd,
         (len - ns) * hd);
  return dst.data() + off;
}

void SequenceKv::release_mirrors() {
  std::lock_guard<std::mutex> lock(*mu_);
  std::vector<float>().swap(k_mirror_);
  std::vector<float>().swap(v_mirror_);
}

void SequenceKv::store(int layer, int kv_head, int64_t slot, const float* key, const float* value) {
  const int hd = shape_.head_dim;
  const int64_t ns = shared_slots();
  if (slot < ns) {
    if (shared_->frozen_)
      throw Error(fmt::format("KV cache: slot {} belongs to a shared prompt that is read-only", slot));
    const int64_t off = shared_->offset(layer, kv_head) + slot * hd;
    if (shape_.type == KvType::F16) {
      fp32_to_fp16_row(key, shared_->kh_.data() + off, hd);
      fp32_to_fp16_row(value, shared_->vh_.data() + off, hd);
    } else {
      std::memcpy(shared_->k_.data() + off, key, sizeof(float) * static_cast<size_t>(hd));
      std::memcpy(shared_->v_.data() + off, value, sizeof(float) * static_cast<size_t>(hd));
    }
    return;
  }
  const int64_t off = (own_block(layer, kv_head) + slot - ns) * hd;
  if (shape_.type == KvType::F16) {
    fp32_to_fp16_row(key, kh_.data() + off, hd);
    fp32_to_fp16_row(value, vh_.data() + off, hd);
  } else {
    std::memcpy(k_.data() + off, key, sizeof(float) * static_cast<size_t>(hd));
    std::memcpy(v_.data() + off, value, sizeof(float) * static_cast<size_t>(hd));
  }
}

void SequenceKv::set_length(int layer, int64_t n) {
  if (n < 0 || n > capacity_)
    throw Error(fmt::format("KV cache layer {}: length {} outside [0, capacity {}]", layer, n, capacity_));
  length_[static_cast<size_t>(layer)] = n;
}

void SequenceKv::compact(int layer, int kv_head, std::span<const int32_t> keep) {
  const int64_t len = length(layer);
  const int hd = shape_.head_dim;
  const int64_t esz = kv_type_bytes(shape_.type);
  const int64_t ns = shared_slots();
  const int64_t off = own_block(layer, kv_head) * hd * esz;
  uint8_t* k =
      shape_.type == KvType::F16 ? reinterpret_cast<uint8_t*>(kh_.data()) : reinterpret_cast<uint8_t*>(k_.data());
  uint8_t* v =
      shape_.type == KvType::F16 ? reinterpret_cast<uint8_t*>(vh_.data()) : reinterpret_cast<uint8_t*>(v_.data());
  k += off;
  v += off;
  const size_t row = static_cast<size_t>(hd * esz);
  int32_t* p = positions(layer, kv_head);
  if (static_cast<int64_t>(keep.size()) < ns)
    throw Error(fmt::format("keep-set of layer {} KV head {} keeps {} slots, fewer than the {} shared prompt slots",
                            layer, kv_head, keep.size(), ns));
  int64_t prev = -1;
  for (size_t i = 0; i < keep.size(); ++i) {
    const int64_t src = keep[i];
    if (src <= prev || src >= len)
      throw Error(
          fmt::format("keep-set of layer {} KV head {} is not ascending within [0, {}): "
                      "entry {} = {}",
                      layer, kv_head, len, i, src));
    prev = src;
    const auto dst = static_cast<int64_t>(i);
    if (dst < ns && src != dst)
      throw Error(fmt::format("keep-set of layer {} KV head {} drops shared prompt slot {} (entry {} = {})", layer,
                              kv_head, dst, i, src));
    if (dst == src) continue;  // src >= dst always, so a forward copy never overwrites a kept row
    const int64_t d = dst - ns, sr = src - ns;  // own rows (dst >= ns here: src > dst >= ns)
    std::memcpy(k + d * static_cast<int64_t>(row), k + sr * static_cast<int64_t>(row), row);
    std::memcpy(v + d * static_cast<int64_t>(row), v + sr * static_cast<int64_t>(row), row);
    p[dst] = p[src];
  }
}

int64_t SequenceKv::allocated_bytes() const {
  return static_cast<int64_t>(k_.size() * sizeof(float) + v_.size() * sizeof(float) + kh_.size() * sizeof(uint16_t) +
                              vh_.size() * sizeof(uint16_t) + pos_.size() * sizeof(int32_t));
}

}  // namespace kvevict
