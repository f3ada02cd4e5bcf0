#include "util/json_file.h"

#include "util/error.h"
#include "util/file.h"

namespace kvevict {

nlohmann::json read_json_file(const std::string& path, int64_t max_bytes) {
  const std::string text = read_file_limited(path, max_bytes, "");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    if (const size_t p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);  // "[json.exception...] "
    throw Error(path + ": not valid JSON: " + what);
  }
}

}  // namespace kvevict
