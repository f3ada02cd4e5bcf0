// libFuzzer harness: safetensors reader. Any input must either open or raise kvevict::Error; a
// crash, sanitizer report, other exception or hang is a finding. Every byte a header claims is
// touched, so an offset the reader let through beyond the mapping would be reported.
#include <cstdint>
#include <string>

#include "format/safetensors.h"
#include "fuzz_util.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvevict::fuzz::write_scratch(data, size, ".safetensors");
  try {
    const kvevict::SafetensorsFile st = kvevict::SafetensorsFile::open(path);
    for (const kvevict::SafetensorsTensor& t : st.tensors()) {
      (void)t.n_elements();
      if (t.n_bytes() > 0) (void)t.data[t.n_bytes() - 1];
    }
  } catch (const kvevict::Error&) {
  }
  return 0;
}
