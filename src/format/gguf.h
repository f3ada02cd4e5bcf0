// GGUF v3 reader: memory-maps the file, parses header, metadata and tensor infos, and exposes
// tensor data in place (no whole-file copy).
//
// Source: GGUF specification (ggml docs/gguf.md): little-endian; magic "GGUF"; uint32 version;
// uint64 tensor_count; uint64 metadata_kv_count; metadata KVs (gguf_string key, uint32 value type,
// value); tensor infos (name, uint32 n_dims, uint64 dims[n_dims], uint32 type, uint64 offset);
// padding to `general.alignment` (default 32); tensor data, each tensor at data_start + offset.
// Versions 2 and 3 share this layout; version 1 (32-bit counts) is refused.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "format/ggml_types.h"
#include "util/mapped_file.h"

namespace kvevict {

/// GGUF metadata value types (uint32 ids from the spec).
enum class GgufValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

/// One metadata value. Scalars are widened (integers to int64/uint64, floats to double);
/// `type` keeps the stored type. Arrays hold their element type and elements.
struct GgufValue {
  GgufValueType type = GgufValueType::UINT32;
  std::variant<uint64_t, int64_t, double, bool, std::string> scalar;
  GgufValueType elem_type = GgufValueType::UINT32;  // for ARRAY
  std::vector<GgufValue> array;                     // for ARRAY
};

/// One tensor as described by the file. dims are in GGUF/ggml order: dims[0] is the innermost
/// (contiguous) dimension, so a 2-D weight [out, in] is stored with dims = {in, out}.
struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;
  uint32_t type = 0;              ///< raw ggml type id (always supported once the file opened)
  uint64_t offset = 0;            ///< bytes from the start of the data section
  const uint8_t* data = nullptr;  ///< points into the mapping
  int64_t n_bytes = 0;
  int64_t n_elements() const;
  GgmlType ggml_type() const { return static_cast<GgmlType>(type); }
};

/// A memory-mapped GGUF file. Move-only; unmaps on destruction.
/// Errors (all kvevict::Error, message starts with the path): file missing/unreadable,
/// "not a GGUF file" (bad magic), "unsupported GGUF version N", "truncated" (any read past EOF,
/// naming what was being read), "tensor 'name' data [a, b) lies outside the file (size s)",
/// "tensor 'name' has unknown type id N", duplicate keys or tensor names, and what the spec
/// forbids: `general.alignment` not a power of two in [8, 65536] (spec: a multiple of 8; the
/// upper bound is kvevict's), a dimension of 0, an empty or non-UTF-8 key or tensor name, two
/// tensors whose data bytes overlap, and the typed tokenizer arrays with another element type
/// (`tokenizer.ggml.tokens`/`merges`/`added_tokens`: string, `scores`: float32, `token_type`:
/// int32; no conversion). With the alignment checked, every tensor's data is aligned to at
/// least 8 bytes in memory (the mapping is page-aligned), so typed loads are never misaligned.
class GgufFile {
 public:
  /// Opens and parses `path`. Throws kvevict::Error as above.
  static GgufFile open(const std::string& path);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  ///< bytes from file start to tensor data
  uint64_t file_size() const { return size_; }

  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }

  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  /// Typed getters. Missing key -> Error "<path>: missing required key '<key>'";
  /// wrong type -> Error naming the key, the expected and the stored type.
  const GgufValue& get(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const;  ///< any unsigned or non-negative signed int
  double get_float(const std::string& key) const;   ///< FLOAT32/FLOAT64 (or an integer)
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<float> get_float_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  /// Optional variants return `fallback` when the key is absent (still throw on a wrong type).
  uint64_t get_uint_or(const std::string& key, uint64_t fallback) const;
  double get_float_or(const std::string& key, double fallback) const;

  /// Tensor by name or nullptr.
  const GgufTensor* find_tensor(const std::string& name) const;
  /// Tensor by name; missing -> Error "<path>: missing tensor '<name>'".
  const GgufTensor& tensor(const std::string& name) const;

  /// Hands the whole pages inside [p, p + n) of the mapping back to the kernel (madvise
  /// MADV_DONTNEED): used for tensor data that was copied elsewhere, so it is not resident twice.
  /// The bytes stay readable (a later read maps them from the file again). Ranges outside the
  /// mapping are ignored.
  void release(const void* p, uint64_t n) const;

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  MappedFile file_;
  const uint8_t* base_ = nullptr;  ///< file_'s bytes
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

/// Name of a metadata value type ("uint32", "string", ...).
std::string gguf_value_type_name(GgufValueType t);

}  // namespace kvevict
