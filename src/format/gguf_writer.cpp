// GGUF v3 writer (layout: see gguf_writer.h).
#include "format/gguf_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "util/error.h"

namespace kvevict {
namespace {

template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}
void put_string(std::vector<uint8_t>& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

GgufWriter::GgufWriter(uint64_t alignment) : alignment_(alignment) {
  if (alignment < 8 || (alignment & (alignment - 1)) != 0)
    throw Error(fmt::format("GGUF alignment {} must be a power of two >= 8", alignment));
  if (alignment != 32) add_uint32("general.alignment", static_cast<uint32_t>(alignment));
}

void GgufWriter::begin_kv(const std::string& key, GgufValueType type) {
  if (std::find(keys_.begin(), keys_.end(), key) != keys_.end())
    throw Error(fmt::format("GGUF writer: metadata key '{}' added twice", key));
  keys_.push_back(key);
  ++n_kv_;
  put_string(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(type));
}

void GgufWriter::add_string(const std::string& key, const std::string& value) {
  begin_kv(key, GgufValueType::STRING);
  put_string(kv_bytes_, value);
}
void GgufWriter::add_uint32(const std::string& key, uint32_t value) {
  begin_kv(key, GgufValueType::UINT32);
  put(kv_bytes_, value);
}
void GgufWriter::add_int32(const std::string& key, int32_t value) {
  begin_kv(key, GgufValueType::INT32);
  put(kv_bytes_, value);
}
void GgufWriter::add_uint64(const std::string& key, uint64_t value) {
  begin_kv(key, GgufValueType::UINT64);
  put(kv_bytes_, value);
}
void GgufWriter::add_float32(const std::string& key, float value) {
  begin_kv(key, GgufValueType::FLOAT32);
  put(kv_bytes_, value);
}
void GgufWriter::add_bool(const std::string& key, bool value) {
  begin_kv(key, GgufValueType::BOOL);
  put<uint8_t>(kv_bytes_, value ? 1 : 0);
}
void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& values) {
  begin_kv(key, GgufValueType::ARRAY);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufValueType::STRING));
  put<uint64_t>(kv_bytes_, values.size());
  for (const std::string& s : values) put_string(kv_bytes_, s);
}
void GgufWriter::add_float32_array(const std::string& key, const std::vector<float>& values) {
  begin_kv(key, GgufValueType::ARRAY);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufValueType::FLOAT32));
  put<uint64_t>(kv_bytes_, values.size());
  for (float f : values) put(kv_bytes_, f);
}
void GgufWriter::add_int32_array(const std::string& key, const std::vector<int32_t>& values) {
  begin_kv(key, GgufValueType::ARRAY);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufValueType::INT32));
  put<uint64_t>(kv_bytes_, values.size());
  for (int32_t v : values) put(kv_bytes_, v);
}

int64_t GgufWriter::tensor_bytes(const std::vector<int64_t>& dims, GgmlType type) {
  if (dims.empty()) throw Error("GGUF writer: a tensor needs at least one dimension");
  int64_t outer = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] <= 0) throw Error(fmt::format("GGUF writer: dimension {} = {} is not positive", i, dims[i]));
    if (i > 0) outer *= dims[i];
  }
  return ggml_row_bytes(type, dims[0]) * outer;
}

void GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> dims, GgmlType type, Fill fill) {
  for (const Tensor& t : tensors_)
    if (t.name == name) throw Error(fmt::format("GGUF writer: tensor '{}' added twice", name));
  const int64_t n = tensor_bytes(dims, type);
  const uint64_t offset = round_up(data_size_, alignment_);
  data_size_ = offset + static_cast<uint64_t>(n);
  tensors_.push_back({name, std::move(dims), type, n, offset, std::move(fill)});
}

void GgufWriter::write(const std::string& path) {
  std::vector<uint8_t> head;
  head.insert(head.end(), {'G', 'G', 'U', 'F'});
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, n_kv_);
  head.insert(head.end(), kv_bytes_.begin(), kv_bytes_.end());
  for (const Tensor& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, t.offset);
  }
  head.resize(round_up(head.size(), alignment_), 0);

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(fmt::format("{}: cannot open for writing", path));
  out.write(reinterpret_cast<const char*>(head.data()), static_cast<std::streamsize>(head.size()));
  uint64_t pos = 0;
  std::vector<uint8_t> buf;
  for (Tensor& t : tensors_) {
    if (t.offset > pos) {
      const std::vector<char> pad(t.offset - pos, 0);
      out.write(pad.data(), static_cast<std::streamsize>(pad.size()));
    }
    buf.assign(static_cast<size_t>(t.n_bytes), 0);
    if (t.fill) t.fill(buf.data(), t.n_bytes);
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    pos = t.offset + static_cast<uint64_t>(t.n_bytes);
  }
  out.flush();
  if (!out) throw Error(fmt::format("{}: write failed (disk full?)", path));
}

}  // namespace kvevict
