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

SequenceKv::SequenceKv(const KvShape& shape, int64_t capacity)
    : shape_(shape), capacity_(capacity), mu_(std::make_unique<std::mutex>()) {
  if (capacity <= 0) throw Error(fmt::format("KV cache capacity must be positive, got {}", capacity));
  const int64_t bytes = shape.bytes_per_token() * capacity;
  if (bytes > (int64_t{64} << 30))
    throw Error(fmt::format("KV cache of {} slots needs {} bytes, over the 64 GiB limit", capacity, bytes));
  const size_t blocks =
      static_cast<size_t>(shape.n_layers) * static_cast<size_t>(shape.n_kv_heads) * static_cast<size_t>(capacity);
  const size_t elems = blocks * static_cast<size_t>(shape.head_dim);
  if (shape.type == KvType::F16) {
    kh_.assign(elems, 0);
    vh_.assign(elems, 0);
  } else {
    k_.assign(elems, 0.0f);
    v_.assign(elems, 0.0f);
  }
  pos_.assign(blocks, 0);
  length_.assign(static_cast<size_t>(shape.n_layers), 0);
}

SequenceKv::SequenceKv(SequenceKv&&) noexcept = default;
SequenceKv& SequenceKv::operator=(SequenceKv&&) noexcept = default;
SequenceKv::~SequenceKv() = default;

void SequenceKv::require(KvType t, const char* what) const {
  if (shape_.type != t)
    throw Error(fmt::format("KV cache stores {} but {} needs {}", kv_type_name(shape_.type), what, kv_type_name(t)));
}

float* SequenceKv::keys(int layer, int kv_head) {
  require(KvType::F32, "mutable keys()");
  return k_.data() + block(layer, kv_head) * shape_.head_dim;
}
float* SequenceKv::values(int layer, int kv_head) {
  require(KvType::F32, "mutable values()");
  return v_.data() + block(layer, kv_head) * shape_.head_dim;
}
const float* SequenceKv::keys(int layer, int kv_head) const {
  if (shape_.type == KvType::F32) return k_.data() + block(layer, kv_head) * shape_.head_dim;
  return mirror(kh_, k_mirror_, layer, kv_head);
}
const float* SequenceKv::values(int layer, int kv_head) const {
  if (shape_.type == KvType::F32) return v_.data() + block(layer, kv_head) * shape_.head_dim;
  return mirror(vh_, v_mirror_, layer, kv_head);
}
uint16_t* SequenceKv::keys_f16(int layer, int kv_head) {
  require(KvType::F16, "keys_f16()");
  return kh_.data() + block(layer, kv_head) * shape_.head_dim;
}
const uint16_t* SequenceKv::keys_f16(int layer, int kv_head) const {
  require(KvType::F16, "keys_f16()");
  return kh_.data() + block(layer, kv_head) * shape_.head_dim;
}
uint16_t* SequenceKv::values_f16(int layer, int kv_head) {
  require(KvType::F16, "values_f16()");
  return vh_.data() + block(layer, kv_head) * shape_.head_dim;
}
const uint16_t* SequenceKv::values_f16(int layer, int kv_head) const {
  require(KvType::F16, "values_f16()");
  return vh_.data() + block(layer, kv_head) * shape_.head_dim;
}

const float* SequenceKv::mirror(const std::vector<uint16_t>& src, std::vector<float>& dst, int layer,
                                int kv_head) const {
  {
    std::lock_guard<std::mutex> lock(*mu_);
    if (dst.size() != src.size()) dst.assign(src.size(), 0.0f);
  }
  const int64_t off = block(layer, kv_head) * shape_.head_dim;
  fp16_to_fp32_row(src.data() + off, dst.data() + off, length(layer) * shape_.head_dim);
  return dst.data() + off;
}

void SequenceKv::store(int layer, int kv_head, int64_t slot, const float* key, const float* value) {
  const int hd = shape_.head_dim;
  const int64_t off = (block(layer, kv_head) + slot) * hd;
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
  const int64_t off = block(layer, kv_head) * hd * esz;
  uint8_t* k =
      shape_.type == KvType::F16 ? reinterpret_cast<uint8_t*>(kh_.data()) : reinterpret_cast<uint8_t*>(k_.data());
  uint8_t* v =
      shape_.type == KvType::F16 ? reinterpret_cast<uint8_t*>(vh_.data()) : reinterpret_cast<uint8_t*>(v_.data());
  k += off;
  v += off;
  const size_t row = static_cast<size_t>(hd * esz);
  int32_t* p = positions(layer, kv_head);
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
    if (dst == src) continue;  // src >= dst always, so a forward copy never overwrites a kept row
    std::memcpy(k + dst * static_cast<int64_t>(row), k + src * static_cast<int64_t>(row), row);
    std::memcpy(v + dst * static_cast<int64_t>(row), v + src * static_cast<int64_t>(row), row);
    p[dst] = p[src];
  }
}

int64_t SequenceKv::allocated_bytes() const {
  return static_cast<int64_t>(k_.size() * sizeof(float) + v_.size() * sizeof(float) + kh_.size() * sizeof(uint16_t) +
                              vh_.size() * sizeof(uint16_t) + pos_.size() * sizeof(int32_t));
}

}  // namespace kvevict
