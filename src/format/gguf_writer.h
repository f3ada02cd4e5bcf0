// GGUF v3 writer: metadata key/values, tensor infos and tensor data, streamed to a file.
//
// Source: GGUF specification (ggml docs/gguf.md), the same layout gguf.h reads: little-endian;
// magic "GGUF"; uint32 version 3; uint64 tensor_count; uint64 metadata_kv_count; metadata KVs
// (gguf_string key, uint32 value type, value); tensor infos (name, uint32 n_dims,
// uint64 dims[n_dims] innermost first, uint32 ggml type, uint64 offset from the data section);
// zero padding to the alignment; tensor data, each tensor starting at an aligned offset.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "format/ggml_types.h"
#include "format/gguf.h"

namespace kvevict {

/// Builds a GGUF file in memory (metadata, tensor infos) and streams tensor data to disk.
/// Tensor payloads are produced by callbacks at write time, so multi-GiB models are never held
/// whole in memory. Not thread-safe.
class GgufWriter {
 public:
  /// Produces a tensor's payload: fills dst[n_bytes] (n_bytes = ggml row bytes of dims[0] times
  /// the product of the outer dims).
  using Fill = std::function<void(uint8_t* dst, int64_t n_bytes)>;

  /// alignment: bytes (power of two, >= 8); written as `general.alignment` when not 32.
  /// Throws kvevict::Error for a bad alignment.
  explicit GgufWriter(uint64_t alignment = 32);

  /// Scalar metadata. A repeated key throws kvevict::Error.
  void add_string(const std::string& key, const std::string& value);
  void add_uint32(const std::string& key, uint32_t value);
  void add_int32(const std::string& key, int32_t value);
  void add_uint64(const std::string& key, uint64_t value);
  void add_float32(const std::string& key, float value);
  void add_bool(const std::string& key, bool value);
  /// Array metadata (element type STRING, FLOAT32, INT32).
  void add_string_array(const std::string& key, const std::vector<std::string>& values);
  void add_float32_array(const std::string& key, const std::vector<float>& values);
  void add_int32_array(const std::string& key, const std::vector<int32_t>& values);

  /// Declares a tensor: dims in GGUF order (dims[0] innermost, e.g. {cols, rows} for a weight
  /// [rows, cols]); `fill` writes its bytes when write() runs. Throws kvevict::Error for a
  /// repeated name, no or non-positive dims, or dims[0] not a multiple of the type's block size.
  void add_tensor(const std::string& name, std::vector<int64_t> dims, GgmlType type, Fill fill);

  /// Bytes a tensor of these dims and type occupies (Error as add_tensor).
  static int64_t tensor_bytes(const std::vector<int64_t>& dims, GgmlType type);

  /// Writes the file to `path` (truncating). Throws kvevict::Error naming the path when it
  /// cannot be written. May be called once per writer.
  void write(const std::string& path);

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    GgmlType type;
    int64_t n_bytes;
    uint64_t offset;
    Fill fill;
  };
  void begin_kv(const std::string& key, GgufValueType type);
  uint64_t alignment_;
  uint64_t n_kv_ = 0;
  std::vector<uint8_t> kv_bytes_;
  std::vector<std::string> keys_;
  std::vector<Tensor> tensors_;
  uint64_t data_size_ = 0;
};

}  // namespace kvevict
