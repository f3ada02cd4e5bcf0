// Safetensors reader: memory-maps one `*.safetensors` file, parses and validates its header, and
// exposes each tensor's bytes in place (no copy).
//
// Source: the safetensors format specification (github.com/huggingface/safetensors, README
// "Format"): 8 bytes N (unsigned little-endian 64-bit) = header size; N bytes of UTF-8 JSON
// starting with '{' (trailing spaces allowed), an object mapping each tensor name to
// {"dtype": "F16", "shape": [..], "data_offsets": [BEGIN, END]} with offsets relative to the byte
// buffer that follows the header, plus an optional "__metadata__" object of string -> string;
// duplicate keys are disallowed; the byte buffer must be entirely indexed, without holes (which
// also rules out overlaps); little-endian, row-major ('C' order); a shape [] is a scalar and a
// zero-sized tensor has BEGIN == END. The checks follow the reference implementation's
// `Metadata::validate` (safetensors/src/tensor.rs): contiguous offsets from 0, END - BEGIN equal
// to elements x dtype bits / 8, the last END equal to the buffer size, and a 100,000,000-byte cap
// on the header (MAX_HEADER_SIZE).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "util/mapped_file.h"

namespace kvevict {

/// Largest header accepted, bytes (the reference implementation's MAX_HEADER_SIZE).
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

/// Bits per element of a safetensors dtype as the spec names it ("F32" 32, "BF16" 16, "F8_E4M3"
/// 8, "F4" 4, ...), or 0 for a name the spec does not define.
uint32_t safetensors_dtype_bits(std::string_view dtype);

/// The dtype names of the spec, comma-separated (for error messages).
std::string safetensors_dtype_names();

/// One tensor of the header.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;              ///< as written, one of the spec's names
  std::vector<int64_t> shape;     ///< row-major: shape[0] is the outermost dimension; [] = scalar
  uint64_t begin = 0, end = 0;    ///< data_offsets, bytes relative to the start of the byte buffer
  const uint8_t* data = nullptr;  ///< begin's address in the mapping (nullptr for an empty file)
  int64_t n_elements() const;     ///< product of shape (1 for a scalar)
  uint64_t n_bytes() const { return end - begin; }
};

/// A memory-mapped safetensors file. Move-only.
/// Errors (kvevict::Error, one line starting with the path): the file cannot be opened or is
/// not a regular file; shorter than 8 bytes; header size N above the 100 MB cap or beyond the end
/// of the file; header not starting with '{', not valid JSON / UTF-8 (with the byte position),
/// nested deeper than the format allows, or not of the format's shape (each naming the tensor and
/// the field: a missing or unknown field, a wrong JSON type, a negative or fractional number,
/// `data_offsets` of other than two entries, a non-string `__metadata__` value); a duplicate key;
/// an empty tensor name; an unknown dtype; a dimension or element count that overflows; END <
/// BEGIN; a size END - BEGIN that differs from the shape and dtype; two tensors whose bytes
/// overlap or a hole between them; bytes after the last tensor or a last END beyond the file.
class SafetensorsFile {
 public:
  /// Opens, maps and validates `path`. Throws kvevict::Error as above.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  uint64_t file_size() const { return file_.size(); }
  uint64_t header_size() const { return header_size_; }      ///< N
  uint64_t data_offset() const { return 8 + header_size_; }  ///< file offset of the byte buffer
  /// `__metadata__` (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Tensors in ascending order of their data offsets.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  /// Tensor by name or nullptr.
  const SafetensorsTensor* find(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  void parse();

  MappedFile file_;
  uint64_t header_size_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace kvevict
