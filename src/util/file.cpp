#include "util/file.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <fstream>

#include "util/error.h"

namespace kvevict {
namespace {

// "OPTION PATH", or "PATH" when no option is named.
std::string subject(const std::string& option, const std::string& path) {
  return option.empty() ? path : option + " " + path;
}

std::string too_large(const std::string& option, const std::string& path, const std::string& what, int64_t max_bytes) {
  return fmt::format("{}: {} more than the limit of {} bytes ({:.0f} MiB) for an input file", subject(option, path),
                     what, max_bytes, static_cast<double>(max_bytes) / (1 << 20));
}

}  // namespace

std::string read_file_limited(const std::string& path, int64_t max_bytes, const std::string& option) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error(fmt::format("{}: cannot open file", subject(option, path)));
  if (S_ISDIR(st.st_mode)) throw Error(fmt::format("{}: is a directory, expected a file", subject(option, path)));
  const bool regular = S_ISREG(st.st_mode);
  if (regular && st.st_size > max_bytes)
    throw Error(too_large(option, path, fmt::format("{} bytes,", static_cast<int64_t>(st.st_size)), max_bytes));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open file", subject(option, path)));
  std::string out;
  if (regular) out.reserve(static_cast<size_t>(st.st_size));
  // Chunked reads: a pipe or device reports no size, so stop one byte past the limit.
  char buf[1 << 16];
  while (f) {
    const auto want = static_cast<std::streamsize>(
        std::min<int64_t>(static_cast<int64_t>(sizeof buf), max_bytes + 1 - static_cast<int64_t>(out.size())));
    if (want <= 0) break;
    f.read(buf, want);
    out.append(buf, static_cast<size_t>(f.gcount()));
  }
  if (f.bad()) throw Error(fmt::format("{}: read error", subject(option, path)));
  if (static_cast<int64_t>(out.size()) > max_bytes)
    throw Error(too_large(option, path, regular ? "grew while read to" : "not a regular file; it supplied", max_bytes));
  return out;
}

}  // namespace kvevict
