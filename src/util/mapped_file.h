// A read-only memory mapping of a whole regular file, shared by the model file readers (GGUF,
// safetensors): weights stay in the page cache and are read in place, never copied.
#pragma once

#include <cstdint>
#include <string>

namespace kvevict {

/// The bytes of one regular file, mapped read-only (MAP_PRIVATE). Move-only; unmaps on
/// destruction. An empty file has size 0 and data() == nullptr (mmap refuses length 0).
class MappedFile {
 public:
  /// Maps `path`. Throws kvevict::Error "<path>: cannot open: <reason>", "<path>: cannot read:
  /// not a regular file" (directories, pipes, devices) or "<path>: cannot mmap: <reason>".
  static MappedFile open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  void unmap();
  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace kvevict
