// JSON files read whole (model configs, tokenizer files): size-limited like every input file
// (util/file.h), parsed with nlohmann-json, errors on one line naming the file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace kvevict {

/// Parses the JSON file at `path` (at most `max_bytes` bytes). Throws kvevict::Error "<path>:
/// ..." when it cannot be read, is larger than the limit, or is not valid JSON (with the byte
/// position nlohmann reports).
nlohmann::json read_json_file(const std::string& path, int64_t max_bytes);

}  // namespace kvevict
