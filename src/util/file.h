// Whole-file reads with a size limit: a text or task file given on the command line is read into
// memory, so a huge file, /dev/zero or an endless pipe must be refused instead of exhausting it.
#pragma once

#include <cstdint>
#include <string>

namespace kvevict {

/// Reads the whole file at `path` into memory, refusing more than `max_bytes` bytes (> 0).
/// A regular file is checked by its size before anything is read; anything else that can be
/// opened (a pipe, `<(cmd)`, a character device such as /dev/zero) is read up to max_bytes + 1
/// bytes and refused when that much arrives. `option` names the command-line option the path came
/// from (e.g. "-f"); it leads every message (empty: messages start with the path). Throws
/// kvevict::Error, one line naming the option and path: "cannot open", "is a directory", "read
/// error", or the size (bytes, when known) and the limit (bytes).
std::string read_file_limited(const std::string& path, int64_t max_bytes, const std::string& option);

}  // namespace kvevict
