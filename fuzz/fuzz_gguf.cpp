// libFuzzer harness: GGUF reader and model loader. Any input must either load or raise
// kvevict::Error; a crash, sanitizer report, other exception or hang is a finding.
#include <cstdint>

#include "format/gguf.h"
#include "fuzz_util.h"
#include "model/model.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvevict::fuzz::write_scratch(data, size, ".gguf");
  try {
    const kvevict::GgufFile f = kvevict::GgufFile::open(path);
    // Touch every getter path the loaders use.
    for (const auto& [key, v] : f.metadata()) {
      (void)key;
      (void)v;
    }
    for (const kvevict::GgufTensor& t : f.tensors()) (void)t.n_elements();
  } catch (const kvevict::Error&) {
    return 0;
  }
  try {
    const auto model = kvevict::Model::load(path);
    (void)model;
  } catch (const kvevict::Error&) {
  }
  return 0;
}
