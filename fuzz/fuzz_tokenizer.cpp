// libFuzzer harness: the tokenizer facade (kvevict::Tokenizer), with the vocabulary of the
// shared stories260K model (SPM; any tokenizer the facade dispatches to is covered when its model
// is passed as KVEVICT_FUZZ_TOKENIZER_MODEL). encode never crashes; for valid UTF-8 input, decode
// of encode is valid UTF-8.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "format/gguf.h"
#include "fuzz_util.h"
#include "model/tokenizer.h"

namespace {
const kvevict::Tokenizer& tokenizer() {
  static const std::unique_ptr<kvevict::Tokenizer> tok = [] {
    const char* env = std::getenv("KVEVICT_FUZZ_TOKENIZER_MODEL");
    const std::string path =
        env != nullptr && *env != '\0' ? env : kvevict::fuzz::shared_dir() + "/models/stories260K/stories260K.gguf";
    const kvevict::GgufFile f = kvevict::GgufFile::open(path);
    return std::make_unique<kvevict::Tokenizer>(kvevict::Tokenizer::from_gguf(f));
  }();
  return *tok;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const kvevict::Tokenizer& tok = tokenizer();
  for (const bool bos : {false, true}) {
    const std::vector<int32_t> ids = tok.encode(text, bos);
    for (const int32_t id : ids)
      if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
    const std::string back = tok.decode(ids);
    if (kvevict::fuzz::valid_utf8(text) && !kvevict::fuzz::valid_utf8(back)) __builtin_trap();
  }
  return 0;
}
