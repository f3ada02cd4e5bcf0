// libFuzzer harness: safetensors reader and the Hugging Face checkpoint loader. The input is a
// model.safetensors placed in a scratch checkpoint directory whose config.json describes a tiny
// llama (hidden 8, 1 layer, 2 heads, FFN 16, vocabulary 8, tied embeddings), so an input that
// passes the reader goes on through the name mapping, shape and dtype checks and the weight
// reads. Any input must either load or raise kvevict::Error; a crash, sanitizer report, other
// exception or hang is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "format/safetensors.h"
#include "fuzz_util.h"
#include "model/model.h"
#include "util/error.h"

namespace {

// The scratch checkpoint directory of this process (created once, with its config.json).
const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    const std::string d =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kvevict-fuzz-st-" + std::to_string(getpid());
    const std::string cfg = d + "/config.json";
    const std::string mk = "mkdir -p '" + d + "'";
    if (std::system(mk.c_str()) != 0) std::abort();
    std::FILE* f = std::fopen(cfg.c_str(), "wb");
    const char* json =
        R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":8,"intermediate_size":16,)"
        R"("num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":2,"vocab_size":8,)"
        R"("max_position_embeddings":64,"rms_norm_eps":1e-5,"rope_theta":10000.0,"tie_word_embeddings":true})";
    if (f == nullptr || std::fputs(json, f) < 0 || std::fclose(f) != 0) std::abort();
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = scratch_dir();
  const std::string path = dir + "/model.safetensors";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) std::abort();
  try {
    const kvevict::SafetensorsFile st = kvevict::SafetensorsFile::open(path);
    for (const kvevict::SafetensorsTensor& t : st.tensors()) {
      (void)t.n_elements();
      if (t.n_bytes() > 0) (void)t.data[t.n_bytes() - 1];  // every byte the header claims is mapped
    }
  } catch (const kvevict::Error&) {
    return 0;
  }
  try {
    const auto model = kvevict::Model::load(dir, kvevict::LoadOptions{.tokenizer = false, .print_warnings = false});
    (void)model;
  } catch (const kvevict::Error&) {
  }
  return 0;
}
