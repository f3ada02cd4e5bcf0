#include "util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "util/error.h"

namespace kvevict {

MappedFile MappedFile::open(const std::string& path) {
  MappedFile m;
  m.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    const bool regular = S_ISREG(st.st_mode);
    ::close(fd);
    throw Error(path + ": cannot read: " + (regular ? std::strerror(err) : "not a regular file"));
  }
  m.size_ = static_cast<uint64_t>(st.st_size);
  if (m.size_ > 0) {
    void* p = mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping keeps its own reference to the file
    if (p == MAP_FAILED) throw Error(path + ": cannot mmap: " + std::strerror(err));
    m.base_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  return m;
}

MappedFile::MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { unmap(); }

void MappedFile::unmap() {
  if (base_ != nullptr) munmap(const_cast<uint8_t*>(base_), size_);
  base_ = nullptr;
}

}  // namespace kvevict
